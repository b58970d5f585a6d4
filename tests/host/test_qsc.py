"""openqlink.qsc.QSC against a software QSC peer (tests/host/qsc_peer.py)."""

import struct
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from openqlink.dispatch import SlotRing
from openqlink.errors import FieldRangeError, QlinkError, UploadError, VersionMismatchError
from openqlink.isa import INSTRUCTION_BYTES, ISA_VERSION, PPUState
from openqlink.memory_map import (
    COUNTERS,
    ENV_OFFSET,
    IMEM_OFFSET,
    REGS_OFFSET,
    QSCParams,
    global_reg,
    ppu_base,
    ppu_reg,
    qp_reg,
    readout_reg,
    trace_addr,
    version_word,
)
from openqlink.qsc import QSC, RKeys
from openqlink.wire.packet import build_udp_frame
from openqlink.wire.roce import Opcode
from openqlink.wire.rpc import Request, Response

HOST_MAC, HOST_IP = "02:00:00:00:00:0a", "192.168.0.1"


class Ring(SlotRing):
    """The dispatcher's ring, recording what the host QP published."""

    def __init__(self, num_slots=4, slot_size=256):
        super().__init__(num_slots, slot_size)
        self.published: list[tuple[int, int]] = []

    def publish(self, slot: int, length: int) -> None:
        super().publish(slot, length)
        self.published.append((slot, length))


@pytest.fixture
def make(virtual_qsc):
    def make(params=None, **kw):
        link, peer = virtual_qsc(params or QSCParams(num_ppus=2))
        qsc = QSC(link, host_mac=HOST_MAC, host_ip=HOST_IP, params=params, timeout_s=0.05,
                  **kw)
        return qsc, peer, link
    return make


@pytest.fixture
def ready(make):
    qsc, peer, link = make()
    qsc.connect()
    ring = Ring()
    qsc.configure(0, ring)
    return qsc, peer, ring


def test_connect_reads_version_and_ppus(make):
    qsc, peer, _ = make()
    assert qsc.connect() == version_word(ISA_VERSION)
    assert (qsc.num_ppus, qsc.num_qps) == (2, 4)


@pytest.mark.parametrize(("version", "match"), [
    (version_word(ISA_VERSION) ^ (1 << 24), "major"),
    (version_word(ISA_VERSION) ^ (3 << 8), "ISA version"),
    (version_word(ISA_VERSION) & ~0xFF, "tag byte"),
])
def test_connect_refuses_other_versions(make, version, match):
    qsc, peer, _ = make()
    peer.regs[global_reg("VERSION")] = version
    with pytest.raises(VersionMismatchError, match=match):
        qsc.connect()


def test_connect_accepts_other_minor_and_checks_num_ppus(make):
    qsc, peer, _ = make()
    other_minor = version_word(ISA_VERSION) ^ (5 << 16)
    peer.regs[global_reg("VERSION")] = other_minor
    peer.regs[global_reg("NUM_PPUS")], peer.regs[global_reg("NUM_QPS")] = 3, 5
    assert qsc.connect() == other_minor and qsc.version == other_minor
    # without params, the QSC's own counts are adopted
    assert (qsc.num_ppus, qsc.num_qps) == (3, 5)
    qsc2, peer2, _ = make(QSCParams(num_ppus=1))
    peer2.regs[global_reg("NUM_PPUS")] = 3
    with pytest.raises(VersionMismatchError, match="NUM_PPUS"):
        qsc2.connect()
    for num_qps, match in ((1, "NUM_QPS: QSC reports 1, not 2..16"),      # fewer than PPUs
                           (17, "NUM_QPS: QSC reports 17, not 2..16"),
                           (5, "params.num_qps is 4")):
        qsc3, peer3, _ = make(QSCParams(num_ppus=2))
        peer3.regs[global_reg("NUM_QPS")] = num_qps
        with pytest.raises(VersionMismatchError, match=match):
            qsc3.connect()


def test_configure_writes_the_qp_contract(ready):
    qsc, peer, ring = ready
    r = peer.regs
    assert r[qp_reg(0, "PEER_MAC_HI")] == 0x0200 and r[qp_reg(0, "PEER_MAC_LO")] == 0x0A
    assert r[qp_reg(0, "PEER_IP")] == 0xC0A80001
    assert r[qp_reg(1, "PEER_IP")] == 0                 # PPU 1's QP: not configured
    keys = qsc.rkeys(0)
    assert r[qp_reg(0, "HOST_QPN")] == 0x200 and r[qp_reg(0, "HOST_RKEY")] == keys.ring
    assert (r[qp_reg(0, "NUM_SLOTS")], r[qp_reg(0, "SLOT_SIZE")]) == (4, 256)
    assert r[ppu_reg(0, "CALL_SLOTS")] == 4         # the PPU's limit of outstanding CALLs
    assert (r[qp_reg(0, "IMEM_RKEY")], r[qp_reg(0, "ENV_RKEY")], r[qp_reg(0, "REGS_RKEY")]) == \
        (keys.imem, keys.env, keys.regs)
    assert r[qp_reg(0, "RING_VA_LO")] == 0 and r[qp_reg(0, "RING_VA_HI")] == 0
    assert len({keys.ring, keys.imem, keys.env, keys.regs, 0}) == 5
    qp = qsc.qp(0)
    assert qp.qpn == 0x200 and qp.remote_qpn == 0x100
    assert qsc.read_qp_context(0)["HOST_QPN"] == 0x200
    qp1 = qsc.configure(1, None, host_qpn=0x321, imem_rkey=7)
    assert qp1.remote_qpn == 0x101 and r[qp_reg(1, "IMEM_RKEY")] == 7
    assert r[qp_reg(1, "HOST_QPN")] == 0x321 and qsc.rkeys(1).imem == 7
    with pytest.raises(FieldRangeError):
        qsc.configure(2)
    with pytest.raises(FieldRangeError):
        qsc.configure(0, SimpleNamespace(num_slots=0, slot_size=256, memory=bytearray()))
    assert r[qp_reg(0, "RESPONSE_BYTES")] == 64         # the QSC's own, untouched


@pytest.mark.parametrize(("pmtu_bytes", "code"), [(256, 1), (1024, 3), (4096, 5)])
def test_configure_writes_the_path_mtu(make, pmtu_bytes, code):
    """The QP's PMTU register takes the host's path MTU as its PathMTU code, so the QSC splits
    and checks messages as the host QP does."""
    qsc, peer, _ = make(pmtu_bytes=pmtu_bytes)
    qsc.connect()
    qsc.configure(0, Ring())
    assert peer.regs[qp_reg(0, "PMTU")] == code
    assert qsc.qp(0).pmtu_bytes == pmtu_bytes


@pytest.mark.parametrize("pmtu_bytes", [0, 1000, 8192])
def test_a_path_mtu_that_is_no_pmtu_is_refused(make, pmtu_bytes):
    with pytest.raises(FieldRangeError, match="pmtu_bytes"):
        make(pmtu_bytes=pmtu_bytes)


def test_configure_sets_the_qsc_qpn_and_response_size_for_a_gpu_bridge(ready):
    """CUDA-Q's GPU bridge: its remote QP 0x2 (QSC_QPN, written before HOST_QPN restarts the
    QP) and SENDs of 24 + payload size bytes (RESPONSE_BYTES); the host QP sends to it."""
    qsc, peer, _ = ready
    qp = qsc.configure(1, None, qsc_qpn=0x2, response_bytes=24 + 256)
    r = peer.regs
    assert (r[qp_reg(1, "QSC_QPN")], r[qp_reg(1, "RESPONSE_BYTES")]) == (0x2, 280)
    assert qp.remote_qpn == 0x2
    order = [a for a, _ in peer.reg_writes]
    assert order.index(qp_reg(1, "QSC_QPN")) < order.index(qp_reg(1, "HOST_QPN"))
    for bad in ({"qsc_qpn": 1 << 24}, {"response_bytes": 23}, {"response_bytes": 8192}):
        with pytest.raises(FieldRangeError) as e:
            qsc.configure(1, None, **bad)
        assert e.value.field in ("dest_qp", "response_bytes")


def test_upload_program_in_pmtu_packets(ready):
    qsc, peer, _ = ready
    words = bytes((i * 7) % 256 for i in range(200 * INSTRUCTION_BYTES))
    assert qsc.upload_program(0, words) == 4
    writes = peer.rdma
    assert [w.opcode for w in writes] == [Opcode.RDMA_WRITE_ONLY] * 4
    assert [len(w.payload) for w in writes] == [1024, 1024, 1024, 128]
    assert all(w.r_key == qsc.rkeys(0).imem and w.dest_qp == 0x100 for w in writes)
    base = ppu_base(0) + IMEM_OFFSET
    assert [w.va for w in writes] == [base, base + 1024, base + 2048, base + 3072]
    assert peer.read_memory(base, len(words)) == words
    assert [w.psn for w in writes] == [0, 1, 2, 3]
    # appending with a committed tail, unverified: the last packet carries ImmDt = new tail
    more = bytes(range(16)) * 3
    assert qsc.upload_program(0, more, start_index=200, commit_tail=True, verify=False) == 1
    last = peer.rdma[-1]
    assert last.opcode == Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE and last.imm == 203
    assert last.va == base + 200 * 16
    # verified: the data first, then (once it all landed) a TAIL write
    assert qsc.upload_program(0, more, start_index=203, commit_tail=True) == 1
    data_w, tail_w = peer.rdma[-2:]
    assert data_w.opcode == Opcode.RDMA_WRITE_ONLY and data_w.va == base + 203 * 16
    assert (tail_w.va, tail_w.payload, tail_w.r_key) == \
        (ppu_reg(0, "TAIL"), struct.pack("<I", 206), qsc.rkeys(0).regs)
    assert peer.regs[ppu_reg(0, "TAIL")] == 206


def test_a_lost_upload_packet_is_sent_again(ready):
    """UC does not retransmit: a lost RDMA WRITE leaves UPLOAD_WORDS short, and the verified
    upload sends the whole upload again; the trigger then carries the PPU's count."""
    qsc, peer, _ = ready
    words = bytes((i * 5) % 256 for i in range(100 * INSTRUCTION_BYTES))     # 2 packets
    peer.lose_rdma = 1
    assert qsc.upload_program(0, words) == 2
    assert len(peer.rdma) == 3                       # one lost, then both again
    assert peer.read_memory(ppu_base(0) + IMEM_OFFSET, len(words)) == words
    count = peer.regs[ppu_reg(0, "UPLOAD_WORDS")]
    assert count == 200 + 72                         # the packet that landed twice counts twice
    peer.lose_rdma = 1
    assert qsc.write_envelope(0, 2, [1, 2, 3, 4]) == 1     # VA 4 mod 8: 2 words
    assert peer.regs[ppu_reg(0, "UPLOAD_WORDS")] == count + 2
    qsc.trigger(0, 1000, 100)
    assert peer.regs[ppu_reg(0, "TRIGGER")] == 100 | 1 << 31 | (count + 2) << 16
    assert peer.regs[ppu_reg(0, "UPLOAD_WORDS")] == 0    # accepted: the count restarts


def test_an_upload_that_keeps_losing_packets_raises(ready):
    qsc, peer, _ = ready
    peer.lose_rdma = 5
    with pytest.raises(UploadError) as e:
        qsc.upload_program(0, bytes(16 * 70), retries=2)    # 2 packets, 3 attempts
    assert (e.value.ppu, e.value.region, e.value.words_sent, e.value.attempts) == \
        (0, "IMEM", 140, 3)
    assert e.value.words_landed == 140 - 128
    with pytest.raises(FieldRangeError) as e2:
        qsc.write_envelope(0, 0, [1], retries=-1)
    assert e2.value.field == "retries"


def test_an_unverified_upload_with_a_lost_packet_is_refused_by_the_trigger(ready):
    """Without verify, nothing is read back; the trigger's count does not match what
    landed, so the QSC refuses it (trigger_incomplete) instead of running a stale program."""
    qsc, peer, _ = ready
    peer.lose_rdma = 1
    assert qsc.upload_program(0, bytes(16 * 70), verify=False) == 2
    qsc.trigger(0, 1000, 70)
    assert (peer.regs[ppu_reg(0, "TRIGGER")] >> 16) & 0x7FFF == 140
    assert qsc.status(0).trigger_incomplete
    qsc.upload_program(0, bytes(16 * 70))            # verified: adopts the PPU's count
    qsc.trigger(0, 2000, 70)
    assert peer.regs[ppu_reg(0, "UPLOAD_WORDS")] == 0


def test_upload_program_checks(ready):
    qsc, _, _ = ready
    for bad in (b"", bytes(17)):
        with pytest.raises(FieldRangeError) as e:
            qsc.upload_program(0, bad)
        assert e.value.field == "words"
    with pytest.raises(FieldRangeError):
        qsc.upload_program(0, bytes(16), start_index=qsc.params.imem_depth)
    with pytest.raises(QlinkError, match="not configured"):
        qsc.upload_program(1, bytes(16))


def test_write_envelope(ready):
    qsc, peer, _ = ready
    samples = [(-1) ** i * (i * 97 % 32768) for i in range(700)]
    assert qsc.write_envelope(0, 100, samples) == 2
    base = ppu_base(0) + ENV_OFFSET
    assert [w.va for w in peer.rdma] == [base + 200, base + 200 + 1024]
    assert all(w.r_key == qsc.rkeys(0).env for w in peer.rdma)
    assert peer.read_memory(base + 200, 1400) == struct.pack("<700h", *samples)
    with pytest.raises(FieldRangeError, match="even"):
        qsc.write_envelope(0, 3, [0])
    with pytest.raises(FieldRangeError) as e:
        qsc.write_envelope(0, 0, [40000])
    assert e.value.field == "samples"
    with pytest.raises(FieldRangeError):
        qsc.write_envelope(0, qsc.params.env_depth - 2, [1, 2, 3])


def test_trigger_is_one_write_of_start_time_and_tail(ready):
    qsc, peer, _ = ready
    qsc.trigger(0, 0x1_2345_6789, tail=42)
    assert len(peer.rdma) == 1
    w = peer.rdma[0]
    assert w.opcode == Opcode.RDMA_WRITE_ONLY and w.r_key == qsc.rkeys(0).regs
    assert w.va == ppu_reg(0, "START_TIME_LO")
    # bit 31: check the upload, of 0 words here
    assert w.payload == struct.pack("<III", 0x2345_6789, 1, 42 | 1 << 31)
    assert peer.regs[ppu_reg(0, "TRIGGER")] == 42 | 1 << 31
    qsc.trigger(0, 0x1_2345_6789, tail=42, check_upload=False)
    assert peer.rdma[-1].payload == struct.pack("<III", 0x2345_6789, 1, 42)
    assert peer.regs[ppu_reg(0, "START_TIME_HI")] == 1
    assert w.va + 12 <= ppu_base(0) + REGS_OFFSET + 0x18
    with pytest.raises(FieldRangeError, match="64-bit timeline"):
        qsc.trigger(0, 1 << 64, 1)
    with pytest.raises(FieldRangeError) as info:
        qsc.trigger(0, 0, qsc.params.imem_depth)       # == 0 mod depth: would read as empty
    assert info.value.field == "tail"


def test_trigger_start_time_must_fit_the_builds_timeline(make):
    qsc, peer, _ = make(QSCParams(num_ppus=1, timeline_bits=48))
    qsc.connect()
    qsc.configure(0, Ring())
    with pytest.raises(FieldRangeError, match="48-bit timeline"):
        qsc.trigger(0, 1 << 48, 1)
    qsc.trigger(0, (1 << 48) - 1, 1)
    assert peer.regs[ppu_reg(0, "START_TIME_HI")] == 0xFFFF


def test_reads(ready):
    qsc, peer, _ = ready
    peer.regs[ppu_reg(0, "TIMELINE_LO")] = 0x89AB_CDEF
    peer.regs[ppu_reg(0, "TIMELINE_HI")] = 0x0123_4567
    assert qsc.timeline(0) == 0x0123_4567_89AB_CDEF
    peer.regs[ppu_reg(0, "STATUS")] = int(PPUState.ERROR.value) | 1 << 8 | 1 << 13
    st = qsc.status(0)
    assert st.state == PPUState.ERROR and st.underflow == 1 and st.trigger_busy == 1
    assert st.late == 0
    c = qsc.counters()
    assert list(c) == [n for n, _ in COUNTERS] and c["RX_FRAMES"] == 1000
    regs = qsc.read_registers(0)
    assert "TRIGGER" not in regs and regs["TIMELINE_HI"] == 0x0123_4567 and "R15" in regs
    assert qsc.read_register(0, "CALL_TIMEOUT_CYCLES") == 250_000


def test_poll_rx_routes_requests_to_the_ring_and_counts_the_rest(ready):
    qsc, peer, ring = ready
    req = Request(function_id=0x1234, request_id=7, ptp_timestamp=99, payload=b"\x01").pack()
    peer.send_rpc_request(0, req)
    peer.send_rpc_request(0, req)
    peer.send_rpc_request(0, req, dest_qp=0x999)            # no such host QP
    peer.t.send_frame(build_udp_frame(dst_mac=HOST_MAC, src_mac=peer.params.mac,
                                      src_ip=peer.params.ip, dst_ip=HOST_IP, src_port=5,
                                      dst_port=6, payload=b"x"))
    peer.t.send_frame(b"\x00" * 8)                            # malformed
    assert qsc.poll_rx() == 5
    assert ring.published == [(0, len(req)), (1, len(req))]
    assert Request.unpack(ring.memory[256:512]).request_id == 7
    assert qsc.rx_counts == {"roce": 2, "roce_unknown_qpn": 1, "control_unexpected": 0,
                             "malformed": 1, "other": 1, "udp_call": 0}
    assert qsc.poll_rx() == 0
    # a request arriving while a control transaction waits is routed by the transaction
    peer.noise_before_response = [peer.rpc_request_frame(0, req)]
    qsc.read_register(0, "PC")
    assert ring.published[-1] == (3, len(req))   # slot 2 went to the unknown QP


def test_poll_rx_yields_to_a_running_transaction(ready):
    qsc, peer, _ = ready
    peer.t.send_frame(b"\x00" * 60)
    held = threading.Event()
    release = threading.Event()

    def hold():
        with qsc.control.lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    try:
        assert qsc.poll_rx() == 0
    finally:
        release.set()
        t.join(10)
    assert qsc.poll_rx() == 1


def test_send_response_is_a_send_only_to_the_ppu_qp(ready):
    qsc, peer, _ = ready
    resp = Response(status=0, request_id=7, ptp_timestamp=99, result=b"\x02\x00\x00\x00").pack()
    qsc.send_response(0, 3, resp)
    w = peer.rdma[-1]
    assert w.opcode == Opcode.SEND_ONLY and w.dest_qp == 0x100 and peer.mailbox == [(0, resp)]
    with pytest.raises(FieldRangeError) as e:
        qsc.send_response(0, 4, resp)
    assert e.value.field == "slot"
    with pytest.raises(FieldRangeError):
        qsc.send_response(0, 0, bytes(65))


def test_psns_are_shared_by_writes_and_sends_of_one_qp(ready):
    qsc, peer, _ = ready
    qsc.upload_program(0, bytes(32))
    qsc.send_response(0, 0, bytes(24))
    qsc.trigger(0, 0, 2)
    assert [w.psn for w in peer.rdma] == [0, 1, 2]


def test_full_flow_over_a_threaded_peer(threaded_qsc):
    host_end, peer = threaded_qsc(QSCParams())
    try:
        qsc = QSC(host_end, host_mac=HOST_MAC, host_ip=HOST_IP, timeout_s=1.0)
        qsc.connect()
        ring = Ring()
        qsc.configure(0, ring)
        qsc.upload_program(0, bytes(range(16)) * 4)
        qsc.trigger(0, 1000, 4)
        # the peer applied the RDMA first; the trigger carries the upload's 8 words
        assert qsc.read_register(0, "TRIGGER") == 4 | 1 << 31 | 8 << 16
        peer.send_rpc_request(0, Request(1, 2, 3, b"").pack())
        for _ in range(1000):
            if qsc.poll_rx():
                break
            time.sleep(0.001)
        assert ring.published == [(0, 24)]
    finally:
        qsc.close()


# ---- Readout calibration --------------------------------------------------------------------

def _peer_iq(peer, ppu: int, channel: int, i: int, q: int, count: int) -> None:
    m = (1 << 32) - 1
    for name, value in (("I_LO", i & m), ("I_HI", (i >> 32) & m), ("Q_LO", q & m),
                        ("Q_HI", (q >> 32) & m), ("IQ_COUNT", count), ("WINDOW_COUNT", count + 1)):
        peer.regs[readout_reg(ppu, channel, name)] = value


def test_read_iq_reads_lo_first_and_sign_extends(make):
    params = QSCParams(num_ppus=2, readouts_per_ppu=3)
    qsc, peer, _ = make(params)
    qsc.connect()
    _peer_iq(peer, 1, 2, -0x7F_1234_5678, 0x12_3456_789A, 41)
    peer.control_log.clear()
    assert qsc.read_iq(1, channel=2) == (-0x7F_1234_5678, 0x12_3456_789A, 41)
    assert [r["addr"] for r in peer.control_log] == [
        readout_reg(1, 2, name) for name in ("I_LO", "I_HI", "Q_LO", "Q_HI", "IQ_COUNT")]
    assert qsc.window_count(1, 2) == 42
    for bad in (-1, 3):
        with pytest.raises(FieldRangeError, match="channel") as e:
            qsc.read_iq(0, channel=bad)
        assert e.value.field == "channel" and e.value.value == bad
    with pytest.raises(FieldRangeError, match="ppu"):
        qsc.read_iq(2)


def test_capture_and_read_trace(make):
    params = QSCParams(num_ppus=1, readouts_per_ppu=2, trace_depth=16)
    qsc, peer, _ = make(params)
    qsc.connect()
    qsc.capture_trace(0, channel=1)
    assert peer.regs[ppu_reg(0, "TRACE_ARM")] == 1
    st = qsc.trace_status(0)
    assert st.armed and not st.done and st.channel == 1 and st.count == 0
    # The capture, as the gateware leaves it: 7 samples, little-endian pairs.
    samples = [-32768, 32767, -2, 1, 1000, -1000, 5]
    for k in range(0, 8, 2):
        pair = samples[k:k + 2] + [0] * (2 - len(samples[k:k + 2]))
        peer.regs[trace_addr(0, k)] = (pair[0] & 0xFFFF) | (pair[1] & 0xFFFF) << 16
    peer.regs[ppu_reg(0, "TRACE_STATUS")] = 1 << 2 | 1 << 8
    peer.regs[ppu_reg(0, "TRACE_COUNT")] = 7
    st = qsc.trace_status(0)
    assert st.done and not st.armed and st.count == 7
    got = qsc.read_trace(0)
    assert got.dtype == np.int16 and got.shape == (7,) and got.tolist() == samples
    assert qsc.read_trace(0, 3).tolist() == samples[:3]
    assert qsc.read_trace(0, 0).shape == (0,)
    with pytest.raises(FieldRangeError, match="n_samples") as e:
        qsc.read_trace(0, 8)
    assert e.value.field == "n_samples"
    with pytest.raises(FieldRangeError, match="channel"):
        qsc.capture_trace(0, channel=2)


def test_capture_trace_refused_by_the_qsc_or_without_trace_memory(make):
    # The host believes in 3 readouts, the QSC has 2 (it refuses channel 2).
    qsc, peer, _ = make(QSCParams(num_ppus=1, readouts_per_ppu=2, trace_depth=16))
    qsc.params = QSCParams(num_ppus=1, readouts_per_ppu=3, trace_depth=16)
    qsc.connect()
    with pytest.raises(FieldRangeError, match="refused") as e:
        qsc.capture_trace(0, channel=2)
    assert e.value.field == "channel"
    qsc, peer, _ = make(QSCParams(num_ppus=1, trace_depth=0))
    qsc.connect()
    for call in (lambda: qsc.capture_trace(0), lambda: qsc.read_trace(0)):
        with pytest.raises(FieldRangeError, match="no trace memory") as e:
            call()
        assert e.value.field == "trace_depth"


def test_configure_qp_sets_up_an_extra_qp_with_its_map(ready):
    """An extra QP: its context in one WR_BLOCK (HOST_QPN's restart first, the PPU, the peer,
    the R_Keys of the regions named, no other), then RX_ENABLE; the host QP it returns sends to
    the QP's QSC_QPN, and rdma_write goes through it."""
    qsc, peer, _ = ready
    before = len(peer.reg_writes)
    qp = qsc.configure_qp(3, 1, rkeys={"IMEM": 0x1234, "ENV": 0x5678})
    writes = dict(peer.reg_writes[before:])
    order = [a for a, _ in peer.reg_writes[before:]]
    assert order[0] == qp_reg(3, "HOST_QPN") and order[-1] == global_reg("RX_ENABLE")
    assert (writes[qp_reg(3, "PPU")], writes[qp_reg(3, "IMEM_RKEY")],
            writes[qp_reg(3, "ENV_RKEY")]) == (1, 0x1234, 0x5678)
    assert qp_reg(3, "REGS_RKEY") not in writes                   # not in its map
    assert writes[qp_reg(3, "PEER_IP")] == 0xC0A80001 and writes[qp_reg(3, "HOST_QPN")] == 0x203
    assert (qp.qpn, qp.remote_qpn) == (0x203, 0x103)
    qsc.rdma_write(3, ppu_base(1) + IMEM_OFFSET + 16, b"\x5a" * 40, 0x1234)
    peer.step()
    rec = peer.rdma[-1]
    assert (rec.dest_qp, rec.va, rec.r_key, rec.payload) == (
        0x103, ppu_base(1) + IMEM_OFFSET + 16, 0x1234, b"\x5a" * 40)
    assert peer.read_memory(ppu_base(1) + IMEM_OFFSET + 16, 40) == b"\x5a" * 40
    # the three default keys of index 3 when no map is given; another peer's QP is not ours
    qsc.configure_qp(2, 0, peer_mac="02:00:00:00:00:0b", peer_ip="192.168.0.2")
    assert peer.regs[qp_reg(2, "REGS_RKEY")] == qsc.qp_rkeys(2)["REGS"]
    assert peer.regs[qp_reg(2, "PEER_IP")] == 0xC0A80002
    with pytest.raises(QlinkError, match="QP 2 is not configured with this host"):
        qsc.rdma_write(2, ppu_base(0), b"x" * 4, 1)


@pytest.mark.parametrize(("args", "field"), [
    ((0, 0), "qp"), ((1, 0), "qp"), ((4, 0), "qp"), ((2, 2), "ppu"),
    ((2, 0, {"rkeys": {"MAILBOX": 1}}), "rkeys"), ((2, 0, {"rkeys": {"IMEM": 1 << 32}}), "r_key"),
    ((2, 0, {"host_qpn": 1 << 24}), "dest_qp"), ((2, 0, {"qsc_qpn": -1}), "dest_qp"),
])
def test_configure_qp_refuses_what_the_qsc_lacks(ready, args, field):
    qsc, peer, _ = ready
    before = len(peer.reg_writes)
    with pytest.raises(FieldRangeError) as e:
        qsc.configure_qp(*args[:2], **(args[2] if len(args) > 2 else {}))
    assert e.value.field == field
    assert len(peer.reg_writes) == before                           # nothing written


def test_read_qp_counters_reads_the_qps_counters(ready):
    qsc, peer, _ = ready
    peer.regs[qp_reg(3, "RX_DROPS")] = 17
    assert qsc.read_qp_counters(3) == {"RX_PACKETS": 0, "RX_DROPS": 17, "RX_DROPS_PSN": 0,
                                       "TX_PACKETS": 0}
    assert qsc.read_qp_context(3)["PPU"] == 0
    with pytest.raises(FieldRangeError):
        qsc.read_qp_counters(4)


def test_a_zero_length_request_or_a_full_slot_never_raises_out_of_poll_rx(ready):
    """Anyone who can reach the host's QP (here its own peer) can send a zero-length
    WRITE_WITH_IMMEDIATE or a request into a slot still full: the receive path drops and
    counts them, and a control transaction running meanwhile is not disturbed."""
    qsc, peer, ring = ready
    peer.send_rpc_request(0, b"", slot=1)
    req = Request(function_id=1, request_id=2, ptp_timestamp=3, payload=b"").pack()
    peer.send_rpc_request(0, req, slot=2)
    peer.send_rpc_request(0, req, slot=2)                   # slot 2 not taken yet
    assert qsc.poll_rx() == 3
    assert ring.published == [(2, len(req))]
    c = qsc.qp(0).counters
    assert (c["DROP_LENGTH"], c["DROP_OVERFLOW"], c["RX_PUBLISHED"]) == (1, 1, 1)
    peer.noise_before_response = [peer.rpc_request_frame(0, b"", slot=3)]
    assert qsc.read_register(0, "PC") == peer.regs[ppu_reg(0, "PC")]
    assert qsc.qp(0).counters["DROP_LENGTH"] == 2


def test_default_rkeys_are_random_per_qp(make):
    """Predictable default R_Keys let anyone on the LAN write a region: each configure draws
    its own (non-zero, distinct)."""
    seen = []
    for _ in range(2):
        qsc, peer, _link = make()
        qsc.connect()
        qsc.configure(0, Ring())
        qsc.configure(1)
        qsc.configure_qp(2, 0)
        for keys in (qsc.rkeys(0), qsc.rkeys(1)):
            seen += [keys.ring, keys.imem, keys.env, keys.regs]
        seen += list(qsc.qp_rkeys(2).values())
        assert peer.regs[qp_reg(2, "IMEM_RKEY")] == qsc.qp_rkeys(2)["IMEM"]
    assert 0 not in seen and len(set(seen)) == len(seen) == 22
    assert RKeys.fixed(1) == RKeys.fixed(1) and RKeys.fixed(1).imem == 0x494D_0001
    with pytest.raises(QlinkError, match="QP 3 is not configured"):
        qsc.qp_rkeys(3)
