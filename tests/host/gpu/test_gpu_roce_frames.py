"""The GPU RoCE endpoint's frame code (``roce_frames.cuh``) compiled by g++ and called through
ctypes: request frames built by the host's own UCQueuePair are accepted with the right RPC bytes
and slot, every kind of bad frame is dropped with the reason UCQueuePair gives, and the SEND_ONLY
response frame is byte for byte the one UCQueuePair.send_frame builds."""

from __future__ import annotations

import ctypes
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openqlink.dispatch import SlotRing
from openqlink.gpu.frames import COUNTER_NAMES, FrameEndpointConfig
from openqlink.roce import UCQueuePair
from openqlink.wire.packet import build_roce_frame
from openqlink.wire.roce import icrc, slot_immediate
from openqlink.wire.rpc import Request, Response

CUDA_DIR = Path(__file__).resolve().parents[3] / "host" / "gpu" / "cuda"

WRAPPER = r'''
#include <stddef.h>
#include "roce_frames.cuh"
extern "C" {
void t_tables(uint32_t* t) { qlink_crc32_tables_init(t); }
uint32_t t_crc32(const uint32_t* t, uint32_t prev, const uint8_t* p, uint32_t n) {
    return qlink_crc32(t, prev, p, n);
}
uint32_t t_icrc(const uint32_t* t, const uint8_t* ip, uint32_t n) { return qlink_icrc(t, ip, n); }
uint32_t t_check(const uint32_t* t, const qlink_roce_endpoint* ep, qlink_roce_psn* psn,
                 uint64_t* counters, const uint8_t* f, uint32_t n, qlink_roce_request* req) {
    return qlink_roce_check_request(t, ep, psn, counters, f, n, req);
}
uint32_t t_build(const uint32_t* t, const qlink_roce_endpoint* ep, qlink_roce_psn* psn,
                 uint64_t* counters, uint8_t* out, uint32_t payload_len) {
    return qlink_roce_build_send_only(t, ep, psn, counters, out, payload_len);
}
uint32_t t_sizes(uint32_t which) {
    return which == 0 ? sizeof(qlink_roce_endpoint)
         : which == 1 ? sizeof(qlink_roce_psn) : sizeof(qlink_frame_ctx);
}
#define F(T, f) offsetof(T, f),
static const unsigned long ep_offsets[] = {
    F(qlink_roce_endpoint, host_mac) F(qlink_roce_endpoint, qsc_mac)
    F(qlink_roce_endpoint, ring_va) F(qlink_roce_endpoint, host_ip)
    F(qlink_roce_endpoint, qsc_ip) F(qlink_roce_endpoint, host_qpn)
    F(qlink_roce_endpoint, qsc_qpn) F(qlink_roce_endpoint, ring_rkey)
    F(qlink_roce_endpoint, num_slots) F(qlink_roce_endpoint, slot_size)
    F(qlink_roce_endpoint, pmtu_bytes) F(qlink_roce_endpoint, p_key)
    F(qlink_roce_endpoint, udp_src_port)
    F(qlink_frame_ctx, rx_ring) F(qlink_frame_ctx, tx_ring) F(qlink_frame_ctx, control)
    F(qlink_frame_ctx, rx_stage) F(qlink_frame_ctx, tx_stage) F(qlink_frame_ctx, num_frames)
    F(qlink_frame_ctx, rx_stride) F(qlink_frame_ctx, tx_stride)
    F(qlink_frame_ctx, rx_frame_bytes) F(qlink_frame_ctx, tx_frame_bytes)
};
uint32_t t_offset(uint32_t i) { return static_cast<uint32_t>(ep_offsets[i]); }
}
'''


def _settings(examples: int):
    return settings(max_examples=examples, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


class _Req(ctypes.Structure):
    _fields_ = [("offset", ctypes.c_uint32), ("length", ctypes.c_uint32),
                ("slot", ctypes.c_uint32), ("psn", ctypes.c_uint32),
                ("psn_gap", ctypes.c_uint32)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed: the frame code's host build needs it")
    d = tmp_path_factory.mktemp("roce_frames")
    src = d / "wrap.cpp"
    src.write_text(WRAPPER)
    so = d / "libroce_frames.so"
    subprocess.run([gxx, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-shared",
                    "-fPIC", "-I", str(CUDA_DIR), "-o", str(so), str(src)], check=True,
                   capture_output=True, text=True)
    lib = ctypes.CDLL(str(so))
    u32, p = ctypes.c_uint32, ctypes.c_void_p
    for name, args in (("t_crc32", [p, u32, p, u32]), ("t_icrc", [p, p, u32]),
                       ("t_check", [p, p, p, p, p, u32, p]), ("t_build", [p, p, p, p, p, u32]),
                       ("t_sizes", [u32]), ("t_offset", [u32])):
        getattr(lib, name).restype = u32
        getattr(lib, name).argtypes = args
    lib.t_tables.argtypes = [p]
    return lib


class Endpoint:
    """The C endpoint beside a UCQueuePair with the same contract."""

    HOST_MAC, QSC_MAC = 0x02_00_00_00_00_01, 0x02_00_00_00_00_10
    HOST_IP, QSC_IP = "192.168.0.1", "192.168.0.10"

    def __init__(self, lib, *, num_slots=8, slot_size=256, host_qpn=0x100, qsc_qpn=0x2,
                 rkey=0x1234_5678, ring_va=0, tx_psn=0, rx_epsn=0, p_key=0xFFFF,
                 pmtu_bytes=1024):
        self.lib = lib
        # The host's QP (receiver of requests, sender of responses) and the QSC's side
        # (a UCQueuePair the other way round builds request frames as the gateware does).
        self.host = UCQueuePair(self.HOST_MAC, self.HOST_IP, host_qpn, self.QSC_MAC,
                                self.QSC_IP, qsc_qpn, tx_psn=tx_psn, rx_epsn=rx_epsn,
                                p_key=p_key, pmtu_bytes=pmtu_bytes)
        self.ring = SlotRing(num_slots, slot_size)
        self.host.register_ring(self.ring, rkey, va=ring_va)
        self.qsc = UCQueuePair(self.QSC_MAC, self.QSC_IP, qsc_qpn, self.HOST_MAC, self.HOST_IP,
                               host_qpn, p_key=p_key, udp_src_port=0xC000)
        self.cfg = FrameEndpointConfig.from_qp(self.host, num_slots=num_slots,
                                               slot_size=slot_size, ring_rkey=rkey,
                                               ring_va=ring_va)
        self.ep = ctypes.create_string_buffer(self.cfg.pack(), 64)
        self.psn = (ctypes.c_uint32 * 2)(tx_psn, rx_epsn)
        self.counters = (ctypes.c_uint64 * len(COUNTER_NAMES))()
        self.table = (ctypes.c_uint32 * 2048)()
        lib.t_tables(self.table)
        self.num_slots, self.slot_size, self.rkey, self.ring_va = (num_slots, slot_size, rkey,
                                                                   ring_va)

    def request(self, payload: bytes, slot: int, psn: int | None = None) -> bytes:
        """The request frame the QSC sends (its UCQueuePair's write_frame)."""
        if psn is not None:
            self.qsc.tx_psn = psn
        psn_now = self.qsc.tx_psn
        return self.qsc.write_frame(self.ring_va + slot * self.slot_size, self.rkey, payload,
                                    imm=slot_immediate(psn_now, slot))

    def check_c(self, frame: bytes):
        req = _Req()
        buf = ctypes.create_string_buffer(bytes(frame), max(len(frame), 1))
        why = self.lib.t_check(self.table, self.ep, self.psn, self.counters, buf, len(frame),
                               ctypes.byref(req))
        return COUNTER_NAMES[why], req, buf.raw

    def check_both(self, frame: bytes):
        """(C reason, C request, Python RxResult) for one frame; the host's ring is emptied so
        that a slot in use never makes the difference."""
        name, req, raw = self.check_c(frame)
        r = self.host.handle_frame(frame)
        if r.slot is not None:
            self.ring.take(r.slot)
            self.ring.clear(r.slot)
        return name, req, raw, r

    def counters_dict(self) -> dict[str, int]:
        return dict(zip(COUNTER_NAMES, self.counters, strict=True))

    def build_c(self, payload: bytes) -> bytes:
        out = ctypes.create_string_buffer(54 + len(payload) + 64)
        ctypes.memmove(ctypes.addressof(out) + 54, payload, len(payload))
        n = self.lib.t_build(self.table, self.ep, self.psn, self.counters, out, len(payload))
        return out.raw[:n]


def rpc(fid=7, rid=1, args=b"\x01\x02\x03\x04\x05\x06\x07\x08") -> bytes:
    return Request(function_id=fid, request_id=rid, ptp_timestamp=0x1122334455,
                   payload=args).pack()


def test_struct_layouts_match_python(lib):
    """qlink_roce_endpoint and qlink_frame_ctx as g++ lays them out against the struct formats
    openqlink.gpu.frames packs them with (FrameEndpointConfig.pack, FrameRings.ctx_bytes)."""
    from openqlink.gpu.frames import CTX_BYTES, FrameRings
    from openqlink.gpu.loopback import HostMemory
    cfg = FrameEndpointConfig.from_qp(Endpoint(lib).host, num_slots=8, slot_size=256,
                                      ring_rkey=1)
    assert lib.t_sizes(0) == 64 == len(cfg.pack())
    assert lib.t_sizes(1) == 8
    rings = FrameRings(HostMemory(FrameRings.size_for(2, 64)), 2, 64)
    assert lib.t_sizes(2) == CTX_BYTES == len(rings.ctx_bytes(cfg, 0, 0))
    fmt = "<QQQIIIIIIIIHHI" + "QQQQQIIIII"   # the endpoint's reserved u32 is not named
    want = [struct.calcsize(fmt[:i]) for i in range(1, len(fmt)) if i != 14]
    assert [lib.t_offset(i) for i in range(len(want))] == want


@given(st.binary(max_size=300), st.integers(0, 2**32 - 1))
@_settings(200)
def test_crc32_is_zlibs(lib, data, prev):
    t = (ctypes.c_uint32 * 2048)()
    lib.t_tables(t)
    assert lib.t_crc32(t, prev, data, len(data)) == zlib.crc32(data, prev)


@given(st.binary(min_size=40, max_size=200))
@_settings(200)
def test_icrc_is_the_hosts(lib, packet):
    t = (ctypes.c_uint32 * 2048)()
    lib.t_tables(t)
    assert lib.t_icrc(t, packet, len(packet)).to_bytes(4, "little") == icrc(packet)


@given(payload=st.binary(min_size=1, max_size=256), slot=st.integers(0, 7),
       psn=st.integers(0, 2**24 - 1))
@_settings(150)
def test_accepted_requests_give_the_rpc_bytes_and_slot(lib, payload, slot, psn):
    e = Endpoint(lib, rx_epsn=psn)
    frame = e.request(payload, slot, psn=psn)
    name, req, raw, r = e.check_both(frame)
    assert name == r.reason == "RX_ROCE_ACCEPTED"
    assert (req.slot, req.length, req.psn, req.psn_gap) == (slot, len(payload), psn, 0)
    assert raw[req.offset:req.offset + req.length] == payload
    assert (e.psn[1], e.host.rx_epsn) == ((psn + 1) % 2**24,) * 2
    assert e.counters_dict() == e.host.counters


def test_psn_jump_is_accepted_and_counted_as_the_host_does(lib):
    e = Endpoint(lib, rx_epsn=5)
    name, req, _raw, r = e.check_both(e.request(rpc(), 3, psn=9))
    assert name == r.reason == "RX_ROCE_ACCEPTED" and r.psn_gap and req.psn_gap == 1
    assert e.psn[1] == e.host.rx_epsn == 10
    assert e.counters_dict() == e.host.counters and e.host.counters["PSN_GAP"] == 1


@given(result=st.binary(max_size=40), status=st.integers(-3, 5), rid=st.integers(0, 2**32 - 1),
       psn=st.integers(0, 2**24 - 1), p_key=st.sampled_from([0xFFFF, 0x8001, 0x7FFF]))
@_settings(150)
def test_response_frame_is_byte_identical(lib, result, status, rid, psn, p_key):
    e = Endpoint(lib, tx_psn=psn, p_key=p_key)
    payload = Response(status=status, request_id=rid, ptp_timestamp=rid * 3,
                       result=result).pack()
    mine = e.build_c(payload)
    theirs = e.host.send_frame(payload)
    assert mine == theirs
    assert e.psn[0] == e.host.tx_psn == (psn + 1) % 2**24
    assert e.counters_dict()["TX_FRAMES"] == e.host.counters["TX_FRAMES"] == 1


def _refit(frame: bytes, **changes) -> bytes:
    """A request frame rebuilt with some fields changed (checksums and ICRC made right)."""
    from openqlink.wire.packet import parse_frame
    f = parse_frame(frame)
    fields = dict(dst_mac=f.eth["dst"], src_mac=f.eth["src"], src_ip=f.ip["src"],
                  dst_ip=f.ip["dst"], opcode=f.bth["opcode"], dest_qp=f.bth["dest_qp"],
                  psn=f.bth["psn"], p_key=f.bth["p_key"], src_port=f.udp["src_port"],
                  va=f.reth["va"], r_key=f.reth["r_key"], dma_len=f.reth["dma_len"],
                  imm=f.immdt["imm"], payload=f.payload, tver=f.bth["tver"])
    fields.update(changes)
    return build_roce_frame(**fields)


def _bad_frames(e: Endpoint) -> dict[str, bytes]:
    good = e.request(rpc(), 2, psn=0)
    ip_bad = bytearray(good)
    ip_bad[24] ^= 0x01                       # IPv4 header checksum
    # The ICRC is the 4 bytes before the Ethernet padding: flip one of them.
    ulen = int.from_bytes(good[38:40], "big")
    icrc_bad = bytearray(good)
    icrc_bad[14 + 20 + ulen - 1] ^= 0x5A
    udp_bad = bytearray(good)
    udp_bad[40:42] = b"\x12\x34"             # a non-zero UDP checksum that does not verify
    send = e.qsc.send_frame(rpc())           # a SEND_ONLY to the host QP
    return {
        "DROP_QPN": _refit(good, dest_qp=0x101),
        "DROP_RKEY": _refit(good, r_key=0xDEAD),
        "DROP_VA:offset": _refit(good, va=2 * e.slot_size + 8),
        "DROP_VA:slot": _refit(good, imm=slot_immediate(0, 3)),
        "DROP_VA:beyond": _refit(good, va=e.num_slots * e.slot_size),
        "DROP_LENGTH:dma": _refit(good, dma_len=len(rpc()) + 4),
        "DROP_OPCODE:tver": _refit(good, tver=1),
        "DROP_OPCODE:send": send,
        "DROP_ICRC": bytes(icrc_bad),
        "DROP_IP:checksum": bytes(ip_bad),
        "DROP_IP:dst": _refit(good, dst_ip="192.168.0.99"),
        "DROP_UDP:checksum": bytes(udp_bad),
        "DROP_UDP:port": _port(good),
        "DROP_PEER:mac": _refit(good, src_mac=0x02_00_00_00_00_77),
        "DROP_PEER:ip": _refit(good, src_ip="192.168.0.77"),
        "DROP_ETH:dst": _refit(good, dst_mac=0x02_00_00_00_00_55),
        "DROP_PKEY": _refit(good, p_key=0x0001),
        "DROP_IP:truncated": good[:60],
        "DROP_LENGTH:no_reth": _shrink(good, 8 + 12 + 8 + 4),
        "DROP_LENGTH:no_bth": _shrink(good, 8 + 8 + 4),
        "DROP_IP:cut": good[:45],
        "DROP_IP:short": good[:30],
        "DROP_ETH:short": good[:10],
    }


def _shrink(good: bytes, udp_len: int) -> bytes:
    """``good`` cut to a UDP length of ``udp_len`` bytes, its lengths, IPv4 checksum and ICRC
    made right: a well-formed packet too short for what its opcode carries."""
    from openqlink.wire.ipv4 import ipv4_checksum
    f = bytearray(good[:14 + 20 + udp_len])
    f[16:18] = (20 + udp_len).to_bytes(2, "big")
    f[38:40] = udp_len.to_bytes(2, "big")
    f[24:26] = b"\0\0"
    f[24:26] = ipv4_checksum(bytes(f[14:34])).to_bytes(2, "big")
    if udp_len >= 8 + 12 + 4:
        f[-4:] = icrc(bytes(f[14:-4]))
    return bytes(f).ljust(60, b"\0")


def _port(good: bytes) -> bytes:
    f = bytearray(good)
    f[36:38] = (4792).to_bytes(2, "big")
    return bytes(f)


def test_every_bad_frame_kind_is_dropped_with_the_hosts_reason(lib):
    e = Endpoint(lib)
    frames = _bad_frames(e)
    for kind, frame in frames.items():
        name, _req, _raw, r = e.check_both(frame)
        assert name == r.reason == kind.split(":")[0], (kind, name, r.reason)
    assert e.counters_dict() == e.host.counters
    # Nothing got through: no PSN moved.
    assert e.psn[1] == e.host.rx_epsn == 0


@given(data=st.binary(min_size=1, max_size=160), cut=st.integers(0, 160),
       flip=st.integers(0, 159), bit=st.integers(0, 7))
@_settings(300)
def test_damaged_frames_get_the_hosts_verdict(lib, data, cut, flip, bit):
    e = Endpoint(lib)
    frame = bytearray(e.request(data, 1, psn=0))
    if flip < len(frame):
        frame[flip] ^= 1 << bit
    frame = bytes(frame[:max(cut, 1)] if cut < len(frame) else frame)
    name, req, raw, r = e.check_both(frame)
    assert name == r.reason, (name, r.reason)
    if r.accepted:
        assert (req.slot, req.length) == (r.slot, r.length_bytes)
    assert e.counters_dict() == e.host.counters


def test_a_right_udp_checksum_is_accepted_and_a_wrong_one_dropped(lib):
    from openqlink.wire.ipv4 import ones_complement_sum
    e = Endpoint(lib)
    good = bytearray(e.request(rpc(), 4, psn=0))
    ulen = int.from_bytes(good[38:40], "big")
    pseudo = good[26:34] + bytes([0, 17]) + ulen.to_bytes(2, "big")
    csum = ~ones_complement_sum(bytes(pseudo) + bytes(good[34:34 + ulen])) & 0xFFFF
    good[40:42] = (csum or 0xFFFF).to_bytes(2, "big")
    name, req, raw, r = e.check_both(bytes(good))
    assert name == r.reason == "RX_ROCE_ACCEPTED" and req.slot == 4
    good[40:42] = ((csum + 1) & 0xFFFF or 1).to_bytes(2, "big")
    name, _req, _raw, r = e.check_both(bytes(good))
    assert name == r.reason == "DROP_UDP"


def test_other_ethertype_and_zero_length_request(lib):
    e = Endpoint(lib)
    arp = bytearray(e.request(rpc(), 0, psn=0))
    arp[12:14] = b"\x08\x06"
    empty = e.request(b"", 1, psn=1)
    for frame, reason in ((bytes(arp), "DROP_ETH"), (bytes(arp[:40]), "DROP_ETH"),
                          (empty, "DROP_LENGTH")):
        name, _req, _raw, r = e.check_both(frame)
        assert name == r.reason == reason
    assert e.counters_dict() == e.host.counters
