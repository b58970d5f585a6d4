"""Tests of openqlink.gateware.net.tx.TxBuilder: frames checked byte for byte with the host codecs
and with scapy's RoCE layer (an independent ICRC)."""

import random
import zlib
from dataclasses import dataclass, field

import pytest
from amaranth.lib import data
from amaranth.sim import Simulator

from openqlink.gateware.bus import MAX_CALL_ARG_BYTES, CallRequest
from openqlink.gateware.net.common import NetConfig, QPContext
from openqlink.gateware.net.tx import (
    START_LATENCY_CYCLES,
    TxBuilder,
    rpc_frame_bytes,
    udp_call_frame_bytes,
)
from openqlink.memory_map import QSCParams
from openqlink.wire.ethernet import ETHERNET, EtherType
from openqlink.wire.ipv4 import IPV4, IpProtocol, ipv4_checksum
from openqlink.wire.roce import BTH, IMMDT, RETH, Opcode, icrc, slot_immediate
from openqlink.wire.rpc import Request
from openqlink.wire.udp import ROCEV2_PORT, UDP, UDP_CALL_PORT_BASE

QSC_MAC = 0x024E56510002
HOST_MAC = 0x0A0B0C0D0E0F
QSC_IP = 0xC0A80002
HOST_IP = 0xC0A80065
UDP_SRC = 0xC123
P_KEY = 0x8001


def _config() -> dict:
    return {"qsc_mac": QSC_MAC, "qsc_ip": QSC_IP, "udp_src_port": UDP_SRC, "p_key": P_KEY,
            "timestamp_format": 0, "rx_enable": 1}


def _qp(n: int) -> dict:
    return {"host_qpn": 0x11 + 0x1000 * n, "host_rkey": 0xA0B0C0D0 + n,
            "ring_va": 0x1_0000_0000 * n + 0x4000, "num_slots": 3 + 2 * n,
            "slot_size": 256 + 64 * n, "imem_rkey": 0, "env_rkey": 0, "regs_rkey": 0,
            # each QP's own peer: its requests go there
            "peer_mac": HOST_MAC + (n << 8), "peer_ip": HOST_IP + n,
            "transport": 0, "peer_udp_port": 0}


def _udp_qp(n: int) -> dict:
    """QP ``n`` in UDP mode (CUDA-Q realtime's udp bridge), its host listening on a port of its
    own."""
    return {**_qp(n), "transport": 1, "peer_udp_port": 40000 + 17 * n}


@dataclass
class Bench:
    """Drives requests and replies, collects frames with a random (or steady) ready."""

    num_ppus: int = 2
    ready_prob: float = 0.6
    seed: int = 0
    qps: list[dict] | None = None       # QP contexts; _qp(n) by default
    frames: list[bytes] = field(default_factory=list)
    frame_cycles: list[list[int]] = field(default_factory=list)   # cycle of each beat
    taken: list[tuple[str, object, int, int]] = field(default_factory=list)  # kind, item, ts, cyc
    sent_frame: int = 0
    sent_rpc: int = 0
    dropped: int = 0
    psn_out: list[int] = field(default_factory=list)
    #: QP contexts written after the item of that index was taken (a host reconfiguring).
    qps_after: dict[int, list[dict]] = field(default_factory=dict)
    #: ``qp_reset`` pulsed for a cycle after the item of that index was taken (a host
    #: configuring the QPs of the mask again).
    reset_after: dict[int, int] = field(default_factory=dict)

    def run(self, items: list[tuple[str, dict]], *, gap_prob: float = 0.3) -> None:
        dut = TxBuilder(self.num_ppus, QSCParams(num_ppus=self.num_ppus))
        if self.qps is None:
            self.qps = [_qp(n) for n in range(self.num_ppus)]
        rng = random.Random(self.seed)
        cycle = [0]
        producer_done = [False]
        expected_frames = sum(1 for _, item in items if _request_ok(item, self.num_ppus))

        async def clock_counter(ctx):
            async for _ in ctx.tick():
                cycle[0] += 1

        async def producer(ctx):
            ctx.set(dut.config, NetConfig.const(_config()))
            ctx.set(dut.qp, data.ArrayLayout(QPContext, self.num_ppus).const(self.qps))
            for kind, item in items:
                while rng.random() < gap_prob:
                    await ctx.tick()
                port = dut.call_req
                layout = CallRequest
                ctx.set(port.payload, layout.const(item))
                ctx.set(port.valid, 1)
                while True:
                    ts = rng.getrandbits(64)   # changes every cycle: sampled when taken
                    ctx.set(dut.timestamp, ts)
                    *_, ready = await ctx.tick().sample(port.ready)
                    if ready:
                        break
                self.taken.append((kind, item, ts, cycle[0]))
                if len(self.taken) - 1 in self.qps_after:
                    ctx.set(dut.qp, data.ArrayLayout(QPContext, self.num_ppus).const(
                        self.qps_after[len(self.taken) - 1]))
                ctx.set(port.valid, 0)
                ctx.set(port.payload, layout.const({}))   # stale payload must not be reused
                if len(self.taken) - 1 in self.reset_after:
                    ctx.set(dut.qp_reset, self.reset_after[len(self.taken) - 1])
                    await ctx.tick()
                    ctx.set(dut.qp_reset, 0)
            producer_done[0] = True

        async def consumer(ctx):
            beats: list[tuple[int, int]] = []
            cycles: list[int] = []
            stalled = None
            while len(self.frames) < expected_frames or not producer_done[0]:
                ready = rng.random() < self.ready_prob
                ctx.set(dut.tx.ready, ready)
                *_, valid, payload, sent_frame, sent_rpc, dropped = await ctx.tick().sample(
                    dut.tx.valid, dut.tx.payload, dut.sent_frame, dut.sent_rpc,
                    dut.call_dropped)
                self.sent_frame += sent_frame
                self.sent_rpc += sent_rpc
                self.dropped += dropped
                beat = (payload.data, payload.keep, payload.first, payload.last)
                if stalled is not None:   # stream rule: held until taken
                    assert valid and beat == stalled
                stalled = beat if valid and not ready else None
                if not (valid and ready):
                    continue
                assert payload.first == (not beats)
                if not payload.last:
                    assert payload.keep == 0xFF
                beats.append((payload.data, payload.keep))
                cycles.append(cycle[0])
                if payload.last:
                    self.frames.append(b"".join(
                        d.to_bytes(8, "little")[:bin(k).count("1")] for d, k in beats))
                    self.frame_cycles.append(cycles)
                    beats, cycles = [], []
            for _ in range(40):   # nothing more comes out
                ctx.set(dut.tx.ready, 1)
                *_, valid, dropped = await ctx.tick().sample(dut.tx.valid, dut.call_dropped)
                self.dropped += dropped
                assert not valid
            self.psn_out = [ctx.get(dut.tx_psn[n]) for n in range(self.num_ppus)]

        sim = Simulator(dut)
        sim.add_clock(6.4e-9)
        sim.add_testbench(clock_counter, background=True)
        sim.add_testbench(producer)
        sim.add_testbench(consumer)
        sim.run()


def _request_ok(item: dict, num_ppus: int) -> bool:
    return item["ppu"] < num_ppus and item["arg_len"] <= MAX_CALL_ARG_BYTES


def _call(ppu: int, i: int, arg_len: int) -> dict:
    # all 16 argument bytes nonzero and distinct: those from arg_len up must leave as zero pad
    args = bytes((0x11 * (j + 1) + i) % 255 + 1 for j in range(MAX_CALL_ARG_BYTES))
    return {"ppu": ppu, "function_id": 0x9E3779B9 ^ i, "request_id": 1000 + i,
            "arg_len": arg_len, "args": int.from_bytes(args, "little")}


def _check_ip_udp(frame: bytes, *, src_ip, dst_ip, src_port, dst_port, payload_bytes) -> None:
    ip = IPV4.unpack(frame, 14)
    assert ip == {"version": 4, "ihl": 5, "tos": 0, "total_length": 20 + 8 + payload_bytes,
                  "identification": 0, "flags": 0b010, "fragment_offset": 0, "ttl": 64,
                  "protocol": IpProtocol.UDP, "checksum": ip["checksum"],
                  "src": src_ip, "dst": dst_ip}
    assert ipv4_checksum(frame[14:34]) == 0
    assert ipv4_checksum(frame[14:24] + b"\0\0" + frame[26:34]) == ip["checksum"]
    assert UDP.unpack(frame, 34) == {"src_port": src_port, "dst_port": dst_port,
                                     "length": 8 + payload_bytes, "checksum": 0}


def _check_rpc_frame(frame: bytes, item: dict, ts: int, psn: int, slot: int, qp: dict) -> None:
    from scapy.contrib.roce import BTH as ScapyBTH
    from scapy.layers.l2 import Ether

    arg_len = item["arg_len"]
    pad = -arg_len % 4
    assert len(frame) == rpc_frame_bytes(arg_len) == 98 + arg_len + pad + 4
    assert ETHERNET.unpack(frame) == {"dst": qp["peer_mac"], "src": QSC_MAC,
                                      "ethertype": EtherType.IPV4}
    _check_ip_udp(frame, src_ip=QSC_IP, dst_ip=qp["peer_ip"], src_port=UDP_SRC,
                  dst_port=ROCEV2_PORT,
                  payload_bytes=len(frame) - 42)
    assert BTH.unpack(frame, 42) == {
        "opcode": Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE, "se": 0, "m": 0, "pad_cnt": pad,
        "tver": 0, "p_key": P_KEY, "fecn": 0, "becn": 0, "resv6": 0,
        "dest_qp": qp["host_qpn"], "a": 0, "resv7": 0, "psn": psn}
    assert RETH.unpack(frame, 54) == {"va": qp["ring_va"] + slot * qp["slot_size"],
                                      "r_key": qp["host_rkey"], "dma_len": 24 + arg_len}
    assert IMMDT.unpack(frame, 70) == {"imm": slot_immediate(psn, slot)}
    req = Request.unpack(frame[74:98 + arg_len])
    args = item["args"].to_bytes(MAX_CALL_ARG_BYTES, "little")[:arg_len]
    assert req == Request(item["function_id"], item["request_id"], ts, args)
    assert frame[98 + arg_len:98 + arg_len + pad] == bytes(pad)
    assert frame[-4:] == icrc(frame[14:-4])
    assert frame[-4:] == zlib.crc32(_icrc_v(frame[14:-4])).to_bytes(4, "little")
    # scapy recomputes the ICRC itself (independent of openqlink.wire.roce)
    pkt = Ether(frame)
    assert pkt.haslayer(ScapyBTH)
    assert pkt[ScapyBTH].dqpn == qp["host_qpn"] and pkt[ScapyBTH].psn == psn
    pkt[ScapyBTH].icrc = None
    assert bytes(pkt) == frame


def _icrc_v(packet: bytes) -> bytes:
    """The ICRC's input V from the IPv4 header to the pad (IBTA Annex A17.4.4): 8 bytes of ones,
    then the packet with IPv4 TOS, TTL and checksum, the UDP checksum and BTH byte 4 (FECN,
    BECN, resv6) set to ones. Written out here, apart from openqlink.wire.roce."""
    v = bytearray(packet)
    for i in (1, 8, 10, 11, 26, 27, 32):
        v[i] = 0xFF
    return b"\xff" * 8 + bytes(v)


def _check_udp_frame(frame: bytes, item: dict, ts: int, ppu: int, qp: dict) -> None:
    """A UDP-mode request (CUDA-Q realtime's udp bridge: one datagram, RPCHeader and
    arguments), checked against the host codecs and against scapy's IP/UDP layers."""
    from scapy.layers.inet import IP
    from scapy.layers.inet import UDP as ScapyUDP
    from scapy.layers.l2 import Ether

    arg_len = item["arg_len"]
    assert len(frame) == udp_call_frame_bytes(arg_len) == 14 + 20 + 8 + 24 + arg_len
    assert ETHERNET.unpack(frame) == {"dst": qp["peer_mac"], "src": QSC_MAC,
                                      "ethertype": EtherType.IPV4}
    _check_ip_udp(frame, src_ip=QSC_IP, dst_ip=qp["peer_ip"],
                  src_port=UDP_CALL_PORT_BASE + ppu, dst_port=qp["peer_udp_port"],
                  payload_bytes=24 + arg_len)
    args = item["args"].to_bytes(MAX_CALL_ARG_BYTES, "little")[:arg_len]
    assert frame[42:] == Request(item["function_id"], item["request_id"], ts, args).pack()
    # scapy builds the same frame from the fields (its own IPv4 checksum; UDP checksum 0)
    pkt = (Ether(dst=qp["peer_mac"].to_bytes(6, "big").hex(":"),
                 src=QSC_MAC.to_bytes(6, "big").hex(":"))
           / IP(src=".".join(str(b) for b in QSC_IP.to_bytes(4, "big")),
                dst=".".join(str(b) for b in qp["peer_ip"].to_bytes(4, "big")),
                flags="DF", ttl=64, id=0)
           / ScapyUDP(sport=UDP_CALL_PORT_BASE + ppu, dport=qp["peer_udp_port"], chksum=0)
           / frame[42:])
    assert bytes(pkt) == frame


def _check_all(bench: Bench, items: list[tuple[str, dict]]) -> None:
    """Frames leave in the order the items were taken; slots and PSNs per PPU (RoCE mode);
    UDP-mode requests move neither."""
    sent = [t for t in bench.taken if _request_ok(t[1], bench.num_ppus)]
    assert len(bench.frames) == len(sent)
    count = [0] * bench.num_ppus
    for frame, (_, item, ts, _) in zip(bench.frames, sent, strict=True):
        n = item["ppu"]
        qp = bench.qps[n]
        if qp["transport"]:
            _check_udp_frame(frame, item, ts, n, qp)
            continue
        _check_rpc_frame(frame, item, ts, psn=count[n], slot=count[n] % qp["num_slots"], qp=qp)
        count[n] += 1
    assert bench.psn_out == count
    assert bench.sent_frame == len(sent)
    assert bench.sent_rpc == len(sent)


def test_rpc_requests_slots_psn_random_backpressure():
    rng = random.Random(5)
    lengths = list(range(MAX_CALL_ARG_BYTES + 1))
    rng.shuffle(lengths)
    items = [("call", _call(rng.randrange(2), i, a)) for i, a in enumerate(lengths)]
    bench = Bench(num_ppus=2, ready_prob=0.5, seed=11)
    bench.run(items)
    _check_all(bench, items)
    # slots wrapped on both PPUs (3 and 5 slots)
    assert sum(1 for k, it in items if it["ppu"] == 0) > 3
    assert {it["arg_len"] for _, it in items} == set(range(MAX_CALL_ARG_BYTES + 1))


def _run_steady(items, seed: int) -> "Bench":
    """``items`` offered without gaps, ``ready`` steady: every frame right, its first beat
    START_LATENCY_CYCLES after it was taken, no gap inside any frame."""
    bench = Bench(num_ppus=1, ready_prob=1.0, seed=seed)
    bench.run(items, gap_prob=0.0)
    _check_all(bench, items)
    for (_, _, _, taken_cycle), cycles in zip(bench.taken, bench.frame_cycles, strict=True):
        assert cycles[0] - taken_cycle == START_LATENCY_CYCLES
        assert cycles == list(range(cycles[0], cycles[0] + len(cycles)))
    return bench


def test_latency_and_no_gaps_with_steady_ready():
    # one request of each frame length (102, 106, 110, 114, 118 bytes)
    _run_steady([("call", _call(0, i, 4 * i)) for i in range(5)], seed=1)


def test_back_to_back_every_arg_len():
    # offered without gaps, ready steady: each item is taken in the cycle after the previous
    # frame's last beat, its first beat START_LATENCY_CYCLES after that, no gaps in any frame
    items = []
    for a in range(MAX_CALL_ARG_BYTES + 1):
        items += [("call", _call(0, a, a)), ("call", _call(0, 10 + a, a))]
    bench = _run_steady(items, seed=4)
    for (_, _, _, taken_cycle), before in zip(bench.taken[1:], bench.frame_cycles[:-1],
                                              strict=True):
        assert taken_cycle == before[-1] + 1


def test_back_to_back_heavy_backpressure():
    items = []
    for i in range(12):
        items.append(("call", _call(i % 2, i, 7 * i % 17)))
    bench = Bench(num_ppus=2, ready_prob=0.25, seed=9)
    bench.run(items, gap_prob=0.0)
    _check_all(bench, items)


def test_slot_offsets_carry_into_the_upper_va_word():
    # slot * slot_size added to a ring VA whose lower word is near 2**32: from slot 2 on the sum
    # carries into the upper word; 7 slots wrap after 7 requests
    qp = {**_qp(0), "ring_va": 0x7_FFFE_8000, "slot_size": 0xFFFF, "num_slots": 7}
    assert (0xFFFE_8000 + 2 * 0xFFFF) >> 32 == 1
    items = [("call", _call(0, i, 3 * i % 17)) for i in range(9)]
    bench = Bench(num_ppus=1, ready_prob=0.7, seed=6, qps=[qp])
    bench.run(items)
    _check_all(bench, items)


def test_a_new_slot_size_restarts_the_slots():
    """The offsets are counted in the slot size: after SLOT_SIZE changes, the PPU's requests
    go from slot 0 again, at the new size (and PSNs go on)."""
    qp = {**_qp(0), "num_slots": 5, "slot_size": 256}
    new = {**qp, "slot_size": 320}
    items = [("call", _call(0, i, 2)) for i in range(6)]
    bench = Bench(num_ppus=1, ready_prob=0.8, seed=9, qps=[qp], qps_after={2: [new]})
    bench.run(items)
    assert len(bench.frames) == 6
    for k, (frame, (_, item, ts, _)) in enumerate(zip(bench.frames, bench.taken, strict=True)):
        slot, ctx = (k, qp) if k <= 2 else (k - 3, new)
        _check_rpc_frame(frame, item, ts, psn=k, slot=slot, qp=ctx)


def test_a_qp_configured_again_restarts_its_psn_and_slots():
    """A host that restarts and configures its QP again (``qp_reset``) gets the next request
    with PSN 0 in slot 0, as its new QP and dispatcher expect; the request taken just before
    (whose slot advance is still to come) keeps its PSN and slot, and the other QP goes on."""
    qps = [{**_qp(0), "num_slots": 5}, {**_qp(1), "num_slots": 5}]
    items = [("call", _call(n, i, 2)) for i in range(4) for n in (0, 1)]
    items += [("call", _call(0, 10 + i, 1)) for i in range(3)]
    # after item 6 (PPU 0's fourth request) PPU 0's QP restarts
    bench = Bench(num_ppus=2, ready_prob=0.8, seed=4, qps=qps, reset_after={6: 0b01})
    bench.run(items, gap_prob=0)
    assert len(bench.frames) == len(items)
    expect = [(0, 0), (0, 0), (1, 1), (1, 1), (2, 2), (2, 2), (3, 3), (3, 3),
              (0, 0), (1, 1), (2, 2)]
    for frame, (_, item, ts, _), (psn, slot) in zip(bench.frames, bench.taken, expect,
                                                     strict=True):
        _check_rpc_frame(frame, item, ts, psn=psn, slot=slot, qp=qps[item["ppu"]])


def test_malformed_requests_are_dropped():
    items = [("call", _call(0, 0, 3)), ("call", _call(1, 1, 2)),    # PPU 1 does not exist
             ("call", {**_call(0, 2, 0), "arg_len": MAX_CALL_ARG_BYTES + 1}),
             ("call", _call(0, 3, 1))]
    bench = Bench(num_ppus=1, ready_prob=0.8, seed=2)
    bench.run(items)
    _check_all(bench, items)
    assert bench.dropped == 2


def test_malformed_requests_back_to_back():
    # offered without gaps: a dropped request leaves nothing behind, the next item is taken 2
    # cycles after it and goes out whole
    bad_ppu = {**_call(0, 1, 2), "ppu": 1}
    bad_len = {**_call(0, 2, 0), "arg_len": MAX_CALL_ARG_BYTES + 1}
    items = [("call", bad_ppu), ("call", _call(0, 0, 3)), ("call", bad_len), ("call", bad_ppu),
             ("call", _call(0, 1, 1)), ("call", bad_len), ("call", _call(0, 3, 0))]
    bench = Bench(num_ppus=1, ready_prob=1.0, seed=8)
    bench.run(items, gap_prob=0.0)
    _check_all(bench, items)
    assert bench.dropped == 4
    for (_, item, _, taken_cycle), (_, _, _, next_cycle) in zip(bench.taken[:-1],
                                                                   bench.taken[1:], strict=True):
        if not _request_ok(item, 1):
            assert next_cycle == taken_cycle + 2


def test_parameter_validation():
    import gc
    import warnings

    from amaranth.hdl import UnusedElaboratable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match=r"^num_ppus must be an int in 1\.\.16, not 0$"):
            TxBuilder(0, QSCParams())
        gc.collect()
    with pytest.raises(ValueError, match=r"^arg_len must be 0\.\.16, not 17$"):
        rpc_frame_bytes(17)
    with pytest.raises(ValueError, match=r"^arg_len must be 0\.\.16, not -1$"):
        rpc_frame_bytes(-1)


def test_rpc_frame_bytes():
    # Eth 14 + IPv4 20 + UDP 8 + BTH 12 + RETH 16 + ImmDt 4 + RPCHeader 24, args padded to 4,
    # ICRC 4
    assert MAX_CALL_ARG_BYTES == 16
    assert [rpc_frame_bytes(a) for a in range(17)] == \
        [102] + [106] * 4 + [110] * 4 + [114] * 4 + [118] * 4


def test_udp_call_frame_bytes():
    # Eth 14 + IPv4 20 + UDP 8 + RPCHeader 24 + args (no pad, no ICRC): always above 60 bytes
    assert [udp_call_frame_bytes(a) for a in range(17)] == list(range(66, 83))
    with pytest.raises(ValueError, match=r"^arg_len must be 0\.\.16, not 17$"):
        udp_call_frame_bytes(17)


def test_udp_mode_requests_every_arg_len_steady():
    """TRANSPORT = 1: each CALL leaves as one UDP datagram (UDP_CALL_PORT_BASE + q to
    PEER_UDP_PORT, checksum 0, the RPC message exactly), back to back, without gaps, with the
    RoCE request's latency; TX_PSN stays."""
    items = [("call", _call(0, a, a)) for a in range(MAX_CALL_ARG_BYTES + 1)]
    bench = Bench(num_ppus=1, ready_prob=1.0, seed=3, qps=[_udp_qp(0)])
    bench.run(items, gap_prob=0.0)
    _check_all(bench, items)
    assert bench.psn_out == [0]
    for (_, _, _, taken_cycle), cycles in zip(bench.taken, bench.frame_cycles, strict=True):
        assert cycles[0] - taken_cycle == START_LATENCY_CYCLES
        assert cycles == list(range(cycles[0], cycles[0] + len(cycles)))
    for (_, _, _, taken_cycle), before in zip(bench.taken[1:], bench.frame_cycles[:-1],
                                              strict=True):
        assert taken_cycle == before[-1] + 1


def test_udp_and_roce_qps_mixed_random_backpressure():
    """PPU 0 in RoCE mode, PPU 1 in UDP mode, interleaved under back-pressure: PPU 0's frames
    are the RoCE requests with its slots and PSNs (PPU 1's requests take none of them)."""
    rng = random.Random(21)
    items = [("call", _call(rng.randrange(2), i, rng.randrange(MAX_CALL_ARG_BYTES + 1)))
             for i in range(30)]
    bench = Bench(num_ppus=2, ready_prob=0.5, seed=13, qps=[_qp(0), _udp_qp(1)])
    bench.run(items)
    _check_all(bench, items)
    assert 0 < bench.psn_out[0] < len(items) and bench.psn_out[1] == 0


def test_transport_switch_between_requests():
    """A host switching its QP to UDP mode and back: each request goes in the mode it was
    taken in, and the RoCE requests after the switch go on from the PSN and slot where they
    stopped."""
    roce, udp = _qp(0), _udp_qp(0)
    items = [("call", _call(0, i, (5 * i) % 17)) for i in range(6)]
    bench = Bench(num_ppus=1, ready_prob=0.7, seed=2, qps=[roce],
                  qps_after={1: [udp], 3: [roce]})
    bench.run(items)
    assert len(bench.frames) == 6
    psn = 0
    for k, (frame, (_, item, ts, _)) in enumerate(zip(bench.frames, bench.taken, strict=True)):
        if k in (2, 3):
            _check_udp_frame(frame, item, ts, 0, udp)
        else:
            _check_rpc_frame(frame, item, ts, psn=psn, slot=psn % roce["num_slots"], qp=roce)
            psn += 1
    assert bench.psn_out == [psn]
