"""The GPU RoCE endpoint on a real GPU: request frames built as the QSC builds them go into the
rx ring, and the response frames the kernel writes are byte for byte what the host's
UCQueuePair would send; bad frames are counted by the kernel with the host's reasons; PSNs are
handed over and back; every frame posted before stop() is answered. Skipped without a GPU."""

from __future__ import annotations

import struct
import time

import pytest
from gpumodel import HANG_GUARD_S, device_entries, request

from openqlink.errors import DispatchError
from openqlink.gpu import gpu_available
from openqlink.gpu.frames import COUNTER_NAMES, FrameEndpointConfig, GPUFramePlane
from openqlink.roce import UCQueuePair
from openqlink.wire.packet import build_roce_frame, parse_frame
from openqlink.wire.roce import slot_immediate
from openqlink.wire.rpc import Response

_OK, _WHY = gpu_available()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _OK, reason=f"no CUDA driver or GPU: {_WHY}")]

HOST_MAC, QSC_MAC = 0x02_00_00_00_00_01, 0x02_00_00_00_00_10
HOST_IP, QSC_IP = "192.168.0.1", "192.168.0.10"
HOST_QPN, QSC_QPN, RKEY = 0x100, 0x2, 0x1234_5678
NUM_SLOTS, SLOT_SIZE = 8, 128


def host_qp(**kw) -> UCQueuePair:
    return UCQueuePair(HOST_MAC, HOST_IP, HOST_QPN, QSC_MAC, QSC_IP, QSC_QPN, **kw)


class Qsc:
    """The QSC's side: request frames as the gateware sends them."""

    def __init__(self):
        self.qp = UCQueuePair(QSC_MAC, QSC_IP, QSC_QPN, HOST_MAC, HOST_IP, HOST_QPN)
        self.slot = 0

    def frame(self, rpc: bytes) -> bytes:
        slot = self.slot
        self.slot = (slot + 1) % NUM_SLOTS
        return self.qp.write_frame(slot * SLOT_SIZE, RKEY, rpc,
                                   imm=slot_immediate(self.qp.tx_psn, slot))


@pytest.fixture
def plane():
    qp = host_qp()
    cfg = FrameEndpointConfig.from_qp(qp, num_slots=NUM_SLOTS, slot_size=SLOT_SIZE,
                                      ring_rkey=RKEY)
    p = GPUFramePlane(cfg, timing_capacity=256)
    for e in device_entries():
        p.add(e)
    p.qp = qp
    yield p
    p.close()


def pop(plane) -> bytes:
    deadline = time.monotonic() + HANG_GUARD_S
    while (f := plane.pop_frame()) is None:
        if plane._stream is not None and plane._stream.done():
            raise AssertionError(f"the kernel exited (processed {plane.processed})")
        if time.monotonic() > deadline:
            raise AssertionError(f"no response frame (counters {plane.counters()})")
    return f


def push(plane, frame: bytes) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not plane.push_frame(frame):
        if time.monotonic() > deadline:
            raise AssertionError("the rx frame ring stays full")


def add_request(a: int, b: int, rid: int) -> bytes:
    return request("add_i32", struct.pack("<ii", a, b), rid, ts=rid * 7)


def test_requests_get_the_frames_the_host_would_send(plane):
    qsc = Qsc()
    ref = host_qp(tx_psn=40)             # what the host's own path would have sent
    plane.qp.tx_psn = 40
    plane.start(qp=plane.qp)
    with pytest.raises(DispatchError, match="held by the GPU RoCE endpoint"):
        plane.qp.send_frame(b"x")        # it would reuse a PSN of the kernel's
    for k in range(3 * NUM_SLOTS + 3):   # the rings wrap
        a, b = k * 1000 - 7, 3 - k
        push(plane, qsc.frame(add_request(a, b, k)))
        got = pop(plane)
        want = Response(0, k, k * 7, struct.pack("<i", a + b)).pack()
        assert got == ref.send_frame(want), k
    assert plane.frames.last_frame_ns > 0
    plane.stop()
    n = 3 * NUM_SLOTS + 3
    c = plane.counters()
    assert (c["RX_FRAMES"], c["RX_ROCE_ACCEPTED"], c["RX_PUBLISHED"], c["TX_FRAMES"]) == (n,) * 4
    assert (plane.qp.tx_psn, plane.qp.rx_epsn) == (40 + n, n)   # handed back
    assert plane.qp.psns_held_by is None
    assert parse_frame(plane.qp.send_frame(b"x")).bth["psn"] == 40 + n


def test_bad_frames_are_dropped_and_counted_as_the_host_does(plane):
    qsc = Qsc()
    plane.start(qp=plane.qp)
    model = host_qp()                    # the host's verdicts for the same frames

    class _Ring:                         # a ring for the model, always free
        num_slots, slot_size = NUM_SLOTS, SLOT_SIZE
        memory = bytearray(NUM_SLOTS * SLOT_SIZE)

        def publish(self, slot, length):
            pass

        def ready(self, slot):
            return False

    model.register_ring(_Ring(), RKEY)
    good = qsc.frame(add_request(1, 2, 1))
    f = parse_frame(good)

    def refit(**changes) -> bytes:
        fields = dict(dst_mac=f.eth["dst"], src_mac=f.eth["src"], src_ip=f.ip["src"],
                      dst_ip=f.ip["dst"], opcode=f.bth["opcode"], dest_qp=f.bth["dest_qp"],
                      psn=f.bth["psn"], p_key=f.bth["p_key"], va=f.reth["va"],
                      r_key=f.reth["r_key"], imm=f.immdt["imm"], payload=f.payload)
        fields.update(changes)
        return build_roce_frame(**fields)

    icrc_bad = bytearray(good)
    icrc_bad[-1] ^= 0x40                 # 110 bytes, no Ethernet padding: the ICRC ends it
    ip_bad = bytearray(good)
    ip_bad[24] ^= 1
    bad = {"DROP_QPN": refit(dest_qp=HOST_QPN + 1), "DROP_RKEY": refit(r_key=RKEY + 1),
           "DROP_VA": refit(va=8), "DROP_LENGTH": refit(dma_len=3),
           "DROP_OPCODE": qsc.qp.send_frame(b"x" * 24), "DROP_ICRC": bytes(icrc_bad),
           "DROP_IP": bytes(ip_bad), "DROP_PEER": refit(src_ip="192.168.0.99"),
           "DROP_PKEY": refit(p_key=0x0002), "DROP_ETH": refit(dst_mac=0x020000000099)}
    assert len(good) == 110
    for name, frame in bad.items():
        assert model.handle_frame(frame).reason == name, name
        push(plane, frame)
    push(plane, good)
    assert model.handle_frame(good).accepted
    got = Response.unpack(parse_frame(pop(plane)).payload)
    assert (got.status, got.request_id, got.result) == (0, 1, struct.pack("<i", 3))
    plane.stop()
    assert plane.pop_frame() is None     # no dropped frame was answered
    c = plane.counters()
    for name in COUNTER_NAMES:
        if name not in ("TX_FRAMES", "DROP_OVERFLOW"):
            assert c[name] == model.counters[name], name
    assert c["TX_FRAMES"] == 1 and plane.processed == 1


def test_protocol_errors_and_short_requests(plane):
    qsc = Qsc()
    plane.start(qp=plane.qp)
    cases = [
        (request("no_such", b"", 1), -1),
        (request("add_i32", b"\0" * 4, 2), -2),                  # arg_len against the schema
        (add_request(1, 2, 3)[:24 + 4], -3),                     # fewer bytes than arg_len
        (add_request(1, 2, 4)[:20], -3),                         # shorter than the header
        (request("fail7", b"", 5), 7),
        (request("too_big", b"", 6), 1),
    ]
    for rpc, status in cases:
        push(plane, qsc.frame(rpc))
        r = Response.unpack(parse_frame(pop(plane)).payload)
        assert r.status == status, (rpc, r)
    plane.stop()


def test_every_frame_posted_before_stop_is_answered(plane):
    qsc = Qsc()
    plane.start(qp=plane.qp)
    n = NUM_SLOTS
    for k in range(n):
        push(plane, qsc.frame(add_request(k, k, k)))
    plane.stop()
    got = []
    while (f := plane.pop_frame()) is not None:
        got.append(Response.unpack(parse_frame(f).payload))
    assert [(r.request_id, r.result) for r in got] == [
        (k, struct.pack("<i", 2 * k)) for k in range(n)]


def test_restart_continues_the_psns_and_counters(plane):
    qsc = Qsc()
    plane.start(qp=plane.qp)
    push(plane, qsc.frame(add_request(1, 1, 1)))
    first = parse_frame(pop(plane)).bth["psn"]
    plane.stop()
    plane.qp.send_frame(b"host's own packet")   # the host uses the QP between runs
    plane.start(qp=plane.qp)
    push(plane, qsc.frame(add_request(2, 2, 2)))
    second = parse_frame(pop(plane)).bth["psn"]
    plane.stop()
    assert (first, second) == (0, 2)
    assert plane.counters()["RX_PUBLISHED"] == 2 and plane.qp.rx_epsn == 2
