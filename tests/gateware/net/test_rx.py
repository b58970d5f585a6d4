"""Tests of openqlink.gateware.net.rx: RoCEReceiver checks, drops, commit engine."""

import gc
import random
import struct
import warnings

import pytest
import simreuse
from amaranth.hdl import Module, UnusedElaboratable
from amaranth.lib import wiring
from amaranth.sim import Simulator
from netbench import (
    HOST_IP,
    HOST_MAC,
    HOST_PORT,
    PARAMS,
    QSC_IP,
    MacError,
    StreamSink,
    beats,
    control_frame,
    drive_frames,
    eth_header,
    expected_writes,
    ip_udp,
    mailbox_commit,
    pad60,
    roce_frame,
    send_frame,
    tail_write,
    write_frame,
)

from openqlink.gateware.net.regs import READ_LATENCY_CYCLES, NetRegisters
from openqlink.gateware.net.rx import COMMIT_LATENCY_CYCLES, RoCEReceiver
from openqlink.memory_map import (
    ENV_OFFSET,
    IMEM_OFFSET,
    MAILBOX_OFFSET,
    REGS_OFFSET,
    QSCParams,
    counter_addr,
    global_reg,
    ppu_base,
    ppu_reg,
    qp_reg,
)
from openqlink.wire.control import Command
from openqlink.wire.roce import Opcode

IMEM_RKEY, ENV_RKEY, REGS_RKEY = 0x1111_0001, 0x2222_0002, 0x3333_0003


class RxHarness(wiring.Component):
    """RoCEReceiver with its register block: counters are read back as the host would."""

    def __init__(self, params: QSCParams, **kw):
        self.dut = RoCEReceiver(params, **kw)
        self.regs = NetRegisters(params, num_inc_sources=1)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        m.submodules.regs = regs = self.regs
        m.d.comb += [
            dut.config.eq(regs.config),
            dut.qp.eq(regs.qp),
            regs.inc[0].eq(dut.count),
            regs.qp_inc.eq(dut.qp_count),
            regs.rx_epsn.eq(dut.epsn),
            dut.qp_reset.eq(regs.qp_reset),
        ]
        return m


async def reg_write(ctx, regs, addr: int, value: int) -> None:
    ctx.set(regs.port.addr, addr)             # decoded a cycle ahead of the write strobe
    ctx.set(regs.port.w_data, value)
    await ctx.tick()
    ctx.set(regs.port.w_en, 1)
    await ctx.tick()
    ctx.set(regs.port.w_en, 0)


async def reg_read(ctx, regs, addr: int) -> int:
    ctx.set(regs.port.addr, addr)
    for _ in range(READ_LATENCY_CYCLES):
        await ctx.tick()
    assert ctx.get(regs.port.hit)
    return ctx.get(regs.port.r_data)


COUNTER_NAMES = ["RX_FRAMES", "RX_ROCE_ACCEPTED", "DROP_ETH", "DROP_IP", "DROP_UDP",
                 "DROP_ICRC", "DROP_OPCODE", "DROP_PKEY", "DROP_QPN", "DROP_RKEY", "DROP_VA",
                 "DROP_LENGTH", "DROP_PSN", "PSN_GAP", "DROP_OVERFLOW", "RX_RPC_RESPONSES",
                 "DROP_MAC", "DROP_IMMDT", "DROP_PEER", "RX_ARP_REQUESTS", "RX_ECHO_REQUESTS",
                 "DROP_ARP", "DROP_ICMP"]


async def configure_rx(ctx, regs, params) -> None:
    """What a host's configure writes: each QP's peer addresses and region R_Keys, then
    RX_ENABLE."""
    for n in range(params.num_ppus):
        await reg_write(ctx, regs, qp_reg(n, "PEER_MAC_HI"), HOST_MAC >> 32)
        await reg_write(ctx, regs, qp_reg(n, "PEER_MAC_LO"), HOST_MAC & 0xFFFF_FFFF)
        await reg_write(ctx, regs, qp_reg(n, "PEER_IP"), HOST_IP)
        await reg_write(ctx, regs, qp_reg(n, "IMEM_RKEY"), IMEM_RKEY + n)
        await reg_write(ctx, regs, qp_reg(n, "ENV_RKEY"), ENV_RKEY + n)
        await reg_write(ctx, regs, qp_reg(n, "REGS_RKEY"), REGS_RKEY + n)
    await reg_write(ctx, regs, global_reg("RX_ENABLE"), 1)


def run_rx(frames, *, params=PARAMS, ready=lambda c: True, gap=0, rng=None, setup=None,
           settle=80, ctrl_ready=lambda c: True, after=None, then=None, configure=True, **kw):
    """Drive ``frames``; return (bus commands, control requests, counters, epsn list).
    ``configure`` (default) first writes what a host's configure would (:func:`configure_rx`);
    ``setup(ctx, regs)`` runs before the frames; ``then=(between, more)``: once they settled,
    ``between(ctx, regs)`` runs and the frames ``more`` are driven; ``after(ctx, regs)`` runs
    once the last frames settled."""
    rsim = simreuse.shared(("rx", params, tuple(sorted(kw.items()))),
                           lambda: RxHarness(params, **kw), clocks=6.4e-9, background=2)
    dut, regs = rsim.dut.dut, rsim.dut.regs
    sink = StreamSink(dut.bus_cmd, ready)
    ctrl = StreamSink(dut.ctrl_req, ctrl_ready, convert=lambda p: {
        f: int(getattr(p, f)) for f in
        ("src_mac", "src_ip", "src_port", "cmd", "flags", "seq", "addr", "data")})
    result = {}

    async def testbench(ctx):
        if configure:
            await configure_rx(ctx, regs, params)
        if setup is not None:
            await setup(ctx, regs)
        phases = [frames] if then is None else [frames, then[1]]
        for k, phase in enumerate(phases):
            if k:
                await then[0](ctx, regs)
            await drive_frames(ctx, dut.rx, phase, gap=gap, rng=rng)
            for _ in range(settle):
                await ctx.tick()
            while ctx.get(dut.busy):
                await ctx.tick()
        if after is not None:
            await after(ctx, regs)
        result["counters"] = {n: await reg_read(ctx, regs, counter_addr(n))
                              for n in COUNTER_NAMES}
        result["epsn"] = [await reg_read(ctx, regs, qp_reg(n, "RX_EPSN"))
                          for n in range(params.num_ppus)]

    rsim.run(testbench, sink.run, ctrl.run)
    return sink.items, ctrl.items, result["counters"], result["epsn"]


def nonzero(counters):
    return {k: v for k, v in counters.items() if v}


IMEM0 = ppu_base(0) + IMEM_OFFSET
ENV0 = ppu_base(0) + ENV_OFFSET


def payload_bytes(n: int, seed: int = 1) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(n))


# ---- accepted packets --------------------------------------------------------------------------

@pytest.mark.parametrize("offset,length", [(0, 32), (4, 32), (0, 13), (4, 1), (8, 7), (12, 64),
                                           (0, 0), (4, 0), (0, 8), (4, 4)])
def test_write_only_realigns(offset, length):
    data = payload_bytes(length, offset * 100 + length)
    va = IMEM0 + 0x40 + offset
    cmds, _, counters, epsn = run_rx([write_frame(va, data, IMEM_RKEY, psn=0)])
    assert cmds == expected_writes(va, data)
    assert nonzero(counters) == {"RX_FRAMES": 1, "RX_ROCE_ACCEPTED": 1}
    assert epsn == [1]


def test_write_with_immediate_commits_tail():
    data = payload_bytes(48)
    va = IMEM0 + 16 * 5
    cmds, _, counters, _ = run_rx([write_frame(va, data, IMEM_RKEY, imm=8)])
    assert cmds == expected_writes(va, data) + [tail_write(ppu_reg(0, "TAIL"), 8)]
    assert nonzero(counters) == {"RX_FRAMES": 1, "RX_ROCE_ACCEPTED": 1}


@pytest.mark.parametrize("va,r_key", [(IMEM0 + 0x100, IMEM_RKEY), (IMEM0 + 0x100, 0xBAD),
                                       (0xDEAD_BEEF_0000_0003, 0)])
@pytest.mark.parametrize("imm", [None, 0x10])
def test_a_zero_length_write_is_taken_unchecked_and_writes_nothing(va, r_key, imm):
    """IBTA Vol 1 C9-88: a zero-length RDMA WRITE's VA and R_Key are not checked. It moves the
    PSN and lands nothing; its ImmDt reaches no TAIL (without the check no region is known)."""
    cmds, _, counters, epsn = run_rx([write_frame(va, b"", r_key, imm=imm, psn=7)])
    assert cmds == []
    assert nonzero(counters) == {"RX_FRAMES": 1, "RX_ROCE_ACCEPTED": 1, "PSN_GAP": 1}
    assert epsn == [8]


def test_write_with_immediate_elsewhere_ignores_immediate():
    data = payload_bytes(20)
    cmds, _, _, _ = run_rx([write_frame(ENV0 + 4, data, ENV_RKEY, imm=0xDEAD)])
    assert cmds == expected_writes(ENV0 + 4, data)


def test_write_to_ppu_registers_region():
    va = ppu_reg(0, "START_TIME_LO")
    data = (1234).to_bytes(4, "little") + (0).to_bytes(4, "little")
    cmds, _, _, _ = run_rx([write_frame(va, data, REGS_RKEY)])
    assert cmds == expected_writes(va, data)


def test_send_only_to_mailbox():
    data = payload_bytes(37)
    mailbox = ppu_base(0) + MAILBOX_OFFSET
    cmds, _, counters, _ = run_rx([send_frame(data, psn=0)])
    assert cmds == expected_writes(mailbox, data) + [mailbox_commit(mailbox, 37)]
    assert nonzero(counters) == {"RX_FRAMES": 1, "RX_ROCE_ACCEPTED": 1, "RX_RPC_RESPONSES": 1}


def test_send_only_empty_commits_length_zero():
    mailbox = ppu_base(0) + MAILBOX_OFFSET
    cmds, _, _, _ = run_rx([send_frame(b"")])
    assert cmds == [mailbox_commit(mailbox, 0)]


def test_first_bus_command_latency():
    # measured from the cycle of the last beat, commit engine idle, bus ready
    h = RxHarness(PARAMS)
    dut = h.dut
    seen = {}

    async def tb(ctx):
        await configure_rx(ctx, h.regs, PARAMS)
        ctx.set(dut.bus_cmd.ready, 1)
        for b in beats(write_frame(IMEM0, bytes(32), IMEM_RKEY)):
            ctx.set(dut.rx.valid, 1)
            ctx.set(dut.rx.payload, b)
            await ctx.tick()
        ctx.set(dut.rx.valid, 0)
        for cycles in range(1, 100):
            if ctx.get(dut.bus_cmd.valid):
                seen["latency"] = cycles
                break
            await ctx.tick()

    sim = Simulator(h)
    sim.add_clock(6.4e-9)
    sim.add_testbench(tb)
    sim.run()
    assert seen["latency"] == COMMIT_LATENCY_CYCLES == 8


def test_send_only_full_mailbox_and_second_ppu():
    params = QSCParams(num_ppus=3)
    data = payload_bytes(64)
    mailbox = ppu_base(2) + MAILBOX_OFFSET
    cmds, _, _, epsn = run_rx([send_frame(data, dest_qp=params.qpn_base + 2, psn=77)],
                              params=params)
    assert cmds == expected_writes(mailbox, data) + [mailbox_commit(mailbox, 64)]
    assert epsn == [0, 0, 78]


def gpu_bridge_response(payload_size: int, request_id: int, result: bytes,
                        filler: int = 0xA5) -> bytes:
    """An RPC response as CUDA-Q realtime's GPU RoCE bridge SENDs it: the 24-byte RPCResponse
    header (magic "CUQS" 0x43555153, status i32, result_len, request_id, ptp_timestamp, all
    little-endian) and the result, in a SEND of a fixed 24 + ``payload_size`` bytes whatever
    result_len says (the rest is whatever the slot held: ``filler`` here)."""
    header = struct.pack("<IiIIQ", 0x43555153, 0, len(result), request_id, 0)
    body = header + result
    return body + bytes([filler]) * (24 + payload_size - len(body))


def _qp_setup(ppu: int, **values: int):
    async def setup(ctx, regs):
        for name, value in values.items():
            await reg_write(ctx, regs, qp_reg(ppu, name), value)
    return setup


def test_a_gpu_bridge_response_longer_than_the_mailbox():
    """CUDA-Q's GPU bridge SENDs 24 + its payload size (256 here) bytes: dropped whole as
    LENGTH while the QP takes 64 (from reset); with RESPONSE_BYTES 280 taken, and only its
    first 64 bytes (header, result, the slot's next bytes) reach the mailbox, committed as 64."""
    send = gpu_bridge_response(256, 0x0100_0007, (42).to_bytes(8, "little"))
    mailbox = ppu_base(0) + MAILBOX_OFFSET
    cmds, _, counters, _ = run_rx([send_frame(send)])
    assert cmds == [] and nonzero(counters) == {"RX_FRAMES": 1, "DROP_LENGTH": 1}
    cmds, _, counters, _ = run_rx([send_frame(send), send_frame(send + b"\0\0\0\0")],
                                  setup=_qp_setup(0, RESPONSE_BYTES=24 + 256))
    assert cmds == expected_writes(mailbox, send[:64]) + [mailbox_commit(mailbox, 64)]
    assert nonzero(counters) == {"RX_FRAMES": 2, "RX_ROCE_ACCEPTED": 1, "RX_RPC_RESPONSES": 1,
                                 "DROP_LENGTH": 1}


def test_the_qsc_qpn_is_the_hosts_to_set():
    """QSC_QPN 0x2 (the GPU bridge's default remote QP) for PPU 1: its SENDs and WRITEs now
    carry DestQP 0x2, and its QPN from reset is no QP's any more; two QPs given one QPN: the
    lower PPU takes the packet."""
    params = QSCParams(num_ppus=3)
    data = payload_bytes(40)
    mb1, mb0 = ppu_base(1) + MAILBOX_OFFSET, ppu_base(0) + MAILBOX_OFFSET
    frames = [send_frame(data, dest_qp=0x2), send_frame(data, dest_qp=params.qpn_base + 1),
              write_frame(ppu_base(1) + IMEM_OFFSET, data[:16], IMEM_RKEY + 1, dest_qp=0x2)]
    cmds, _, counters, _ = run_rx(frames, params=params, setup=_qp_setup(1, QSC_QPN=0x2))
    assert cmds == (expected_writes(mb1, data) + [mailbox_commit(mb1, 40)]
                    + expected_writes(ppu_base(1) + IMEM_OFFSET, data[:16]))
    assert counters["DROP_QPN"] == 1 and counters["RX_ROCE_ACCEPTED"] == 2

    async def both(ctx, regs):
        await _qp_setup(1, QSC_QPN=0x2)(ctx, regs)
        await _qp_setup(0, QSC_QPN=0x2)(ctx, regs)
    cmds, _, _, _ = run_rx([send_frame(data, dest_qp=0x2)], params=params, setup=both)
    assert cmds == expected_writes(mb0, data) + [mailbox_commit(mb0, 40)]


def test_a_qp_configured_again_expects_psn_0():
    """A write of a QP's HOST_QPN (a host configuring it again) returns that QP's RX_EPSN to
    0, and no other QP's: a restarted host's first packet (PSN 0) is no PSN_GAP."""
    params = QSCParams(num_ppus=3)
    frames = [send_frame(payload_bytes(16), dest_qp=params.qpn_base + n, psn=77 + n)
              for n in (1, 2)]

    async def reconfigure(ctx, regs):
        await reg_write(ctx, regs, qp_reg(2, "HOST_QPN"), 0x99)
        for _ in range(2):
            await ctx.tick()

    _, _, _, epsn = run_rx(frames, params=params)
    assert epsn == [0, 79, 80]
    _, _, _, epsn = run_rx(frames, params=params, after=reconfigure)
    assert epsn == [0, 79, 0]


def test_write_to_second_ppu_uses_its_rkey_and_tail():
    params = QSCParams(num_ppus=2)
    va = ppu_base(1) + IMEM_OFFSET + 32
    data = payload_bytes(16)
    ok = write_frame(va, data, IMEM_RKEY + 1, dest_qp=params.qpn_base + 1, imm=3)
    wrong = write_frame(va, data, IMEM_RKEY, dest_qp=params.qpn_base + 1, imm=3)
    cmds, _, counters, _ = run_rx([ok, wrong], params=params)
    assert cmds == expected_writes(va, data) + [tail_write(ppu_reg(1, "TAIL"), 3)]
    assert counters["DROP_RKEY"] == 1


def test_psn_gap_counted_and_kept():
    d = payload_bytes(8)
    frames = [write_frame(IMEM0, d, IMEM_RKEY, psn=0xFFFFFF),
              write_frame(IMEM0 + 8, d, IMEM_RKEY, psn=0),
              write_frame(IMEM0 + 16, d, IMEM_RKEY, psn=5)]
    cmds, _, counters, epsn = run_rx(frames)
    assert len(cmds) == 3
    # epsn starts at 0: 0xFFFFFF jumps, 0 follows it (24-bit wrap), 5 jumps again.
    assert counters["PSN_GAP"] == 2
    assert counters["RX_ROCE_ACCEPTED"] == 3
    assert epsn == [6]


def test_broadcast_mac_and_padding_accepted():
    data = payload_bytes(4)
    frame = write_frame(IMEM0, data, IMEM_RKEY, eth={"dst": (1 << 48) - 1}, extra=bytes(11))
    cmds, _, _, _ = run_rx([frame])
    assert cmds == expected_writes(IMEM0, data)


def test_ip_checksum_zero_forms():
    # RFC 1624: a header whose other words sum to 0xFFFF may carry checksum 0x0000 or 0xFFFF.
    # Choose the identification so the sum of the other words is 0xFFFF, then send both forms.
    from openqlink.wire.ipv4 import IPV4, IpProtocol

    fields = dict(total_length=20 + 8 + 12 + 16 + 8 + 4, identification=0, ttl=64,
                  protocol=IpProtocol.UDP, src=HOST_IP, dst=QSC_IP)
    base = IPV4.pack(**fields)
    total = sum(int.from_bytes(base[i:i + 2], "big") for i in range(0, 20, 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    fields["identification"] = 0xFFFF - total
    data = payload_bytes(8)
    frames = [write_frame(IMEM0, data, IMEM_RKEY, ip=dict(fields, checksum=c))
              for c in (0x0000, 0xFFFF)]
    cmds, _, counters, _ = run_rx(frames)
    assert counters["RX_ROCE_ACCEPTED"] == 2
    assert cmds == expected_writes(IMEM0, data) * 2


def test_control_request_extracted():
    frame = control_frame(Command.RD_DWORD, 0x0000_0008, 0x55AA, flags=3, seq=0x1234)
    cmds, reqs, counters, _ = run_rx([frame])
    assert cmds == []
    assert reqs == [dict(src_mac=HOST_MAC, src_ip=HOST_IP, src_port=HOST_PORT,
                         cmd=Command.RD_DWORD, flags=3, seq=0x1234, addr=8, data=0x55AA)]
    assert nonzero(counters) == {"RX_FRAMES": 1}


def test_the_bridge_hosts_ten_byte_read_is_taken():
    """The Holoscan Sensor Bridge host library's RD_DWORD is 10 bytes, serialized as its
    ``read_uint32`` does (cmd, flags, be16 seq, two zero bytes, be32 addr: no data word); a
    write or a read shorter than that is still too short."""
    import struct

    from openqlink.wire.udp import CONTROL_PORT

    def datagram(payload: bytes) -> bytes:
        return pad60(eth_header() + ip_udp(payload, dst_port=CONTROL_PORT))

    short_read = struct.pack(">BBHBBI", Command.RD_DWORD, 0x03, 0x0102, 0, 0, 0x0000_0008)
    short_write = struct.pack(">BBHBBI", Command.WR_DWORD, 0x03, 0x0103, 0, 0, 0x0000_0008)
    frames = [datagram(short_read), datagram(short_write), datagram(short_read[:9])]
    cmds, reqs, counters, _ = run_rx(frames)
    assert cmds == []
    assert [(r["cmd"], r["flags"], r["seq"], r["addr"]) for r in reqs] == [
        (Command.RD_DWORD, 3, 0x0102, 8)]
    assert nonzero(counters) == {"RX_FRAMES": 3, "DROP_UDP": 2}


# ---- drops -------------------------------------------------------------------------------------

GOOD_VA = IMEM0 + 0x80
D16 = payload_bytes(16)


def _w(**kw):
    kw.setdefault("payload", D16)
    kw.setdefault("va", GOOD_VA)
    kw.setdefault("r_key", IMEM_RKEY)
    return roce_frame(kw.pop("opcode", Opcode.RDMA_WRITE_ONLY), **kw)


def _not_ipv4():
    return pad60(eth_header(ethertype=0x86DD) + bytes(40))          # IPv6: not handled


def _tcp():
    return pad60(eth_header() + ip_udp(bytes(20), dst_port=80, ip={"protocol": 6}))


DROPS = {
    "eth_dst": (_w(eth={"dst": 0x02_00_00_00_00_99}), "DROP_ETH"),
    "ethertype": (_not_ipv4(), "DROP_ETH"),
    "ip_checksum": (_w(ip={"checksum": 0x1234}), "DROP_IP"),
    "ip_version": (_w(ip={"version": 6}), "DROP_IP"),
    "ip_ihl": (_w(ip={"ihl": 6}), "DROP_IP"),
    "ip_dst": (_w(ip={"dst": QSC_IP + 1}), "DROP_IP"),
    "ip_fragment_mf": (_w(ip={"flags": 0b001}), "DROP_IP"),
    "ip_fragment_offset": (_w(ip={"fragment_offset": 8}), "DROP_IP"),
    "ip_total_length_long": (_w(ip={"total_length": 20 + 8 + 12 + 16 + 16 + 4 + 40}), "DROP_IP"),
    "ip_protocol": (_tcp(), "DROP_IP"),
    "udp_port": (_w(udp={"dst_port": 4792}), "DROP_UDP"),
    "udp_length": (_w(udp={"length": 8 + 12 + 16 + 16}), "DROP_UDP"),
    "icrc": (_w(bad_icrc=True), "DROP_ICRC"),
    "opcode_rc": (_w(opcode=0x0A), "DROP_OPCODE"),
    "opcode_ud_send": (_w(opcode=0x64), "DROP_OPCODE"),
    "opcode_below_uc": (_w(opcode=0x1F), "DROP_OPCODE"),
    "opcode_above_uc": (_w(opcode=0x2C), "DROP_OPCODE"),
    "opcode_send_imm": (roce_frame(Opcode.SEND_ONLY_WITH_IMMEDIATE, imm=1, payload=D16), None),
    # a FIRST carries exactly a PMTU (1024 from reset)
    "first_not_a_pmtu": (_w(opcode=Opcode.RDMA_WRITE_FIRST, dma_len=4096), "DROP_LENGTH"),
    "middle_alone": (roce_frame(Opcode.RDMA_WRITE_MIDDLE, payload=bytes(1024)), "DROP_PSN"),
    "last_alone": (roce_frame(Opcode.SEND_LAST, payload=D16), "DROP_PSN"),
    "only_over_the_pmtu": (write_frame(GOOD_VA, bytes(1028), IMEM_RKEY), "DROP_LENGTH"),
    "tver": (_w(bth={"tver": 1}), "DROP_OPCODE"),
    "pkey": (_w(bth={"p_key": 0x8001}), "DROP_PKEY"),
    "pkey_limited": (_w(bth={"p_key": 0x7FFF}), None),  # accepted: we are a full member
    "qpn_low": (_w(dest_qp=PARAMS.qpn_base - 1), "DROP_QPN"),
    "qpn_high": (_w(dest_qp=PARAMS.qpn_base + PARAMS.num_qps), "DROP_QPN"),
    # an extra QP that no host configured: no peer (closed)
    "qpn_of_a_closed_qp": (_w(dest_qp=PARAMS.qpn_base + 1), "DROP_PEER"),
    "header_too_short": (roce_frame(Opcode.RDMA_WRITE_ONLY, payload=bytes(8)), "DROP_LENGTH"),
    "rkey": (_w(r_key=IMEM_RKEY ^ 0x100), "DROP_RKEY"),
    "rkey_of_other_region": (_w(r_key=ENV_RKEY), "DROP_RKEY"),
    "va_out_of_range": (_w(va=IMEM0 + PARAMS.imem_depth * 16 - 8), "DROP_VA"),
    "va_past_region": (_w(va=IMEM0 + PARAMS.imem_depth * 16), "DROP_VA"),
    "va_unaligned": (_w(va=GOOD_VA + 2), "DROP_VA"),
    "va_high_bits": (_w(va=GOOD_VA | 1 << 32), "DROP_VA"),
    "va_mailbox": (_w(va=ppu_base(0) + MAILBOX_OFFSET), "DROP_VA"),
    "va_other_ppu": (_w(va=ppu_base(1) + IMEM_OFFSET), "DROP_VA"),
    "va_global_regs": (_w(va=0x100), "DROP_VA"),
    "va_regs_readonly": (_w(va=ppu_base(0) + REGS_OFFSET + 0x10, r_key=REGS_RKEY), "DROP_VA"),
    # ImmDt of a WRITE_WITH_IMMEDIATE into the ring is its new TAIL: 0 .. imem_depth - 1
    "immdt_not_a_tail": (write_frame(GOOD_VA, D16, IMEM_RKEY, imm=PARAMS.imem_depth),
                         "DROP_IMMDT"),
    "immdt_high_bit": (write_frame(GOOD_VA, D16, IMEM_RKEY, imm=1 << 31), "DROP_IMMDT"),
    # IBTA C9-88: nothing of a zero-length WRITE is checked or delivered, its ImmDt included
    "immdt_zero_length": (write_frame(GOOD_VA, b"", IMEM_RKEY, imm=PARAMS.imem_depth + 3),
                          None),
    "immdt_last_tail": (write_frame(GOOD_VA, D16, IMEM_RKEY, imm=PARAMS.imem_depth - 1), None),
    "immdt_elsewhere": (write_frame(ENV0 + 8, D16, ENV_RKEY, imm=0xFFFF_FFFF), None),
    "immdt_bad_rkey_first": (write_frame(GOOD_VA, D16, IMEM_RKEY ^ 1, imm=1 << 20), "DROP_RKEY"),
    "dma_len": (_w(dma_len=20), "DROP_LENGTH"),
    "pad_cnt": (_w(pad_cnt=2), "DROP_LENGTH"),
    "send_too_long": (send_frame(bytes(68)), "DROP_LENGTH"),
    "control_short": (pad60(eth_header() + ip_udp(bytes(10), dst_port=8192)), "DROP_UDP"),
}


@pytest.mark.parametrize("name", list(DROPS))
def test_drop_reasons(name):
    frame, reason = DROPS[name]
    good = write_frame(IMEM0 + 8, D16, IMEM_RKEY, psn=0)
    cmds, reqs, counters, _ = run_rx([frame, good])
    if reason is None:
        assert counters["RX_ROCE_ACCEPTED"] == 2
        return
    # the dropped frame emits nothing; the next frame still goes through
    assert cmds == expected_writes(IMEM0 + 8, D16)
    assert reqs == []
    expected = {"RX_FRAMES": 2, "RX_ROCE_ACCEPTED": 1, reason: 1}
    assert nonzero(counters) == expected


# ---- frames the MAC flags bad ------------------------------------------------------------------

def test_mac_error_drops_good_frame_whole():
    # a frame that would be accepted (PSN 5 would resynchronise the expected PSN): with the MAC's
    # error flag nothing of it is written, the PSN state is untouched, the next frame goes through
    good = write_frame(IMEM0 + 8, D16, IMEM_RKEY, psn=0)
    flagged = MacError(write_frame(IMEM0 + 0x40, D16, IMEM_RKEY, imm=7, psn=5))
    cmds, reqs, counters, epsn = run_rx([flagged, good])
    assert cmds == expected_writes(IMEM0 + 8, D16)
    assert reqs == []
    assert nonzero(counters) == {"RX_FRAMES": 2, "RX_ROCE_ACCEPTED": 1, "DROP_MAC": 1}
    assert epsn == [1]


@pytest.mark.parametrize("gap", [0, 3])
def test_mac_error_control_send_and_bad_frames(gap):
    mailbox = ppu_base(0) + MAILBOX_OFFSET
    frames = [MacError(control_frame(Command.WR_DWORD, 8, 1, seq=1)),
              MacError(send_frame(D16, psn=0)),
              MacError(_w(bad_icrc=True)),                 # the MAC's flag names the reason
              MacError(_w(eth={"dst": 0x02_00_00_00_00_99})),
              MacError(b"\x01" * 10),
              control_frame(Command.WR_DWORD, 8, 2, seq=2),
              send_frame(D16, psn=0)]
    cmds, reqs, counters, epsn = run_rx(frames, gap=gap)
    assert [r["seq"] for r in reqs] == [2]
    assert cmds == expected_writes(mailbox, D16) + [mailbox_commit(mailbox, 16)]
    assert nonzero(counters) == {"RX_FRAMES": 7, "RX_ROCE_ACCEPTED": 1, "RX_RPC_RESPONSES": 1,
                                 "DROP_MAC": 5}
    assert epsn == [1]


def test_rx_disable_drops_roce_but_not_control():
    async def setup(ctx, regs):
        from openqlink.memory_map import global_reg
        await reg_write(ctx, regs, global_reg("RX_ENABLE"), 0)

    frames = [_w(), control_frame(Command.RD_DWORD, 0)]
    cmds, reqs, counters, _ = run_rx(frames, setup=setup)
    assert cmds == [] and len(reqs) == 1
    assert counters["DROP_UDP"] == 1


def test_pkey_configured():
    async def setup(ctx, regs):
        from openqlink.memory_map import global_reg
        await reg_write(ctx, regs, global_reg("P_KEY"), 0x0005)   # limited member of 5

    frames = [_w(bth={"p_key": 0x8005}), _w(bth={"p_key": 0x0005}), _w(bth={"p_key": 0xFFFF})]
    cmds, _, counters, _ = run_rx(frames, setup=setup)
    assert counters["RX_ROCE_ACCEPTED"] == 1
    assert counters["DROP_PKEY"] == 2
    assert cmds == expected_writes(GOOD_VA, D16)


def test_closed_from_reset_nothing_lands_before_configure():
    """From reset RDMA receive is off and no R_Key is valid: an R_Key-0 write into the PPU's
    registers (TRIGGER) lands nowhere; control requests are still taken."""
    regs0 = ppu_base(0) + REGS_OFFSET
    zero_key = [write_frame(regs0, bytes(8), 0), write_frame(GOOD_VA, D16, 0),
                control_frame(Command.RD_DWORD, 0)]
    cmds, reqs, counters, _ = run_rx(zero_key, configure=False)
    assert cmds == [] and len(reqs) == 1
    assert nonzero(counters) == {"RX_FRAMES": 3, "DROP_UDP": 2}

    async def enable_only(ctx, regs):
        # the peer and RX_ENABLE, but no R_Key written: every key, 0 included, is invalid
        await reg_write(ctx, regs, qp_reg(0, "PEER_MAC_HI"), HOST_MAC >> 32)
        await reg_write(ctx, regs, qp_reg(0, "PEER_MAC_LO"), HOST_MAC & 0xFFFF_FFFF)
        await reg_write(ctx, regs, qp_reg(0, "PEER_IP"), HOST_IP)
        await reg_write(ctx, regs, global_reg("RX_ENABLE"), 1)

    cmds, _, counters, _ = run_rx(zero_key[:2] + [send_frame(b"ok")], configure=False,
                                  setup=enable_only)
    mailbox = ppu_base(0) + MAILBOX_OFFSET
    assert cmds == expected_writes(mailbox, b"ok") + [mailbox_commit(mailbox, 2)]
    assert counters["DROP_RKEY"] == 2 and counters["RX_ROCE_ACCEPTED"] == 1


def test_a_qp_restart_invalidates_its_rkeys_until_written_again():
    """A write of HOST_QPN (a host configuring the QP anew) closes the QP's regions until their
    R_Keys are written again; another QP's keys stay valid."""
    params = QSCParams(num_ppus=2)
    ok0 = _w()
    ok1 = write_frame(ppu_base(1) + IMEM_OFFSET, D16, IMEM_RKEY + 1, dest_qp=params.qpn_base + 1)

    async def restart(ctx, regs):
        await reg_write(ctx, regs, qp_reg(0, "HOST_QPN"), 0x321)

    cmds, _, counters, _ = run_rx([ok0, ok1], params=params, setup=restart)
    assert cmds == expected_writes(ppu_base(1) + IMEM_OFFSET, D16)
    assert counters["DROP_RKEY"] == 1

    async def restart_and_rekey(ctx, regs):
        await restart(ctx, regs)
        await reg_write(ctx, regs, qp_reg(0, "IMEM_RKEY"), IMEM_RKEY)

    cmds, _, counters, _ = run_rx([ok0], params=params, setup=restart_and_rekey)
    assert cmds == expected_writes(GOOD_VA, D16) and counters["DROP_RKEY"] == 0


@pytest.mark.parametrize("who", ["mac", "ip", "both"])
def test_packets_from_another_address_than_the_peer_are_dropped(who):
    """rxe's address check: a QP takes packets only from its peer's MAC and IP, whatever the
    keys say; the peer's next packet is taken."""
    eth = {"src": HOST_MAC ^ 0x10} if who in ("mac", "both") else None
    ip = {"src": HOST_IP + 7} if who in ("ip", "both") else None
    frames = [_w(eth=eth, ip=ip), send_frame(b"x" * 8, eth=eth, ip=ip), _w()]
    cmds, _, counters, _ = run_rx(frames)
    assert cmds == expected_writes(GOOD_VA, D16)
    assert nonzero(counters) == {"RX_FRAMES": 3, "DROP_PEER": 2, "RX_ROCE_ACCEPTED": 1}


def test_each_qp_takes_packets_from_its_own_peer_only():
    """QP 1 is given another host (PEER_MAC, PEER_IP): that host's packets reach QP 1 and not
    QP 0, the first host's reach QP 0 and not QP 1."""
    params = QSCParams(num_ppus=2)
    other_mac, other_ip = HOST_MAC + 0x100, HOST_IP + 1
    other = {"eth": {"src": other_mac}, "ip": {"src": other_ip}}
    imem1 = ppu_base(1) + IMEM_OFFSET

    async def second_host(ctx, regs):
        await reg_write(ctx, regs, qp_reg(1, "PEER_MAC_HI"), other_mac >> 32)
        await reg_write(ctx, regs, qp_reg(1, "PEER_MAC_LO"), other_mac & 0xFFFF_FFFF)
        await reg_write(ctx, regs, qp_reg(1, "PEER_IP"), other_ip)

    frames = [
        write_frame(imem1, D16, IMEM_RKEY + 1, dest_qp=params.qpn_base + 1, **other),  # taken
        write_frame(GOOD_VA, D16, IMEM_RKEY, **other),                                 # PEER
        write_frame(imem1 + 16, D16, IMEM_RKEY + 1, dest_qp=params.qpn_base + 1),      # PEER
        write_frame(GOOD_VA + 16, D16, IMEM_RKEY),                                      # taken
    ]
    cmds, _, counters, _ = run_rx(frames, params=params, setup=second_host)
    assert cmds == expected_writes(imem1, D16) + expected_writes(GOOD_VA + 16, D16)
    assert nonzero(counters) == {"RX_FRAMES": 4, "DROP_PEER": 2, "RX_ROCE_ACCEPTED": 2}


def _scapy_udp(dport: int, l4: bytes, *, chksum: int | None = None, pad: bytes = b"",
               ip_id: int = 1, ip_frag: int = 0x4000) -> bytes:
    """An Ethernet/IPv4/UDP frame from the peer, its UDP checksum computed by scapy (an
    independent RFC 768 implementation; GPL: tests only) unless ``chksum`` is given, then
    ``pad`` (Ethernet padding, outside the checksum)."""
    from scapy.layers import inet
    from scapy.layers.l2 import Ether

    p = (Ether(dst=PARAMS.mac, src="02:00:00:00:00:65") /
         inet.IP(src="192.168.0.101", dst=PARAMS.ip, id=ip_id, flags=ip_frag >> 13,
                 frag=ip_frag & 0x1FFF) /
         inet.UDP(sport=HOST_PORT, dport=dport, chksum=chksum) / l4)
    return bytes(p) + pad


def test_udp_checksum_verified_when_not_zero():
    """RFC 1122: a non-zero UDP checksum is verified, for control datagrams (padded or odd
    length, the padding left out of the sum) and RoCEv2 alike; zero means none."""
    from openqlink.wire.control import CONTROL_REQUEST
    from openqlink.wire.udp import CONTROL_PORT, ROCEV2_PORT

    req = CONTROL_REQUEST.pack(cmd=Command.RD_DWORD, flags=0, seq=3, addr=0, data=0)
    good_ctrl = _scapy_udp(CONTROL_PORT, req, pad=bytes(range(0xA0, 0xA4)))
    odd_ctrl = _scapy_udp(CONTROL_PORT, req + b"\x5a", pad=b"\xff\xee\xdd")
    roce = _w()                                   # netbench's frame: checksum 0
    udp_at = 14 + 20
    roce_l4 = roce[udp_at + 8:14 + int.from_bytes(roce[16:18], "big")]
    # the same IPv4 identification and flags: the ICRC covers them
    good_roce = _scapy_udp(ROCEV2_PORT, roce_l4, ip_id=int.from_bytes(roce[18:20], "big"),
                           ip_frag=int.from_bytes(roce[20:22], "big"))
    for f in (good_ctrl, odd_ctrl, good_roce):
        assert f[udp_at + 6:udp_at + 8] != bytes(2)

    def corrupt(frame: bytes) -> bytes:           # the checksum off by one
        c = int.from_bytes(frame[udp_at + 6:udp_at + 8], "big")
        return frame[:udp_at + 6] + ((c % 0xFFFF) + 1).to_bytes(2, "big") + frame[udp_at + 8:]

    frames = [good_ctrl, odd_ctrl, good_roce, corrupt(good_ctrl), corrupt(odd_ctrl),
              corrupt(good_roce), _scapy_udp(CONTROL_PORT, req, chksum=0)]
    cmds, reqs, counters, _ = run_rx(frames)
    assert len(reqs) == 3
    assert cmds == expected_writes(GOOD_VA, D16)
    assert nonzero(counters) == {"RX_FRAMES": 7, "DROP_UDP": 3, "RX_ROCE_ACCEPTED": 1}


def test_truncated_and_runt_frames():
    good = _w()
    frames = [good[:40], good[:70], b"\x01" * 10, good]
    cmds, _, counters, _ = run_rx(frames)
    assert cmds == expected_writes(GOOD_VA, D16)
    assert counters["DROP_ETH"] == 1 and counters["DROP_IP"] == 2


# ---- flow: back-to-back, back-pressure, overflow -----------------------------------------------

def _random_packets(rng: random.Random, count: int):
    frames, expected = [], []
    for i in range(count):
        kind = rng.choice(["write", "write_imm", "send", "bad"])
        length = rng.choice([0, 1, 4, 7, 8, 12, 13, 31, 32, 60, 64, 100, 257])
        data = payload_bytes(length, rng.randrange(1 << 30))
        va = IMEM0 + 4 * rng.randrange(0, 64)
        if kind == "write":
            frames.append(write_frame(va, data, IMEM_RKEY, psn=i))
            expected += expected_writes(va, data)
        elif kind == "write_imm":
            frames.append(write_frame(va, data, IMEM_RKEY, imm=i, psn=i))
            expected += expected_writes(va, data) + [tail_write(ppu_reg(0, "TAIL"), i)]
        elif kind == "send":
            data = data[:64]
            mailbox = ppu_base(0) + MAILBOX_OFFSET
            frames.append(send_frame(data, psn=i))
            expected += expected_writes(mailbox, data) + [mailbox_commit(mailbox, len(data))]
        else:
            frames.append(write_frame(va, data, IMEM_RKEY, psn=i, bad_icrc=True))
    return frames, expected


def test_back_to_back_frames():
    rng = random.Random(7)
    frames, expected = _random_packets(rng, 12)
    cmds, _, counters, _ = run_rx(frames, gap=0)
    assert cmds == expected
    assert counters["RX_FRAMES"] == 12


def test_bus_back_pressure_and_gaps():
    rng = random.Random(11)
    frames, expected = _random_packets(rng, 12)
    ready_rng = random.Random(3)
    pattern = [ready_rng.random() < 0.4 for _ in range(1 << 12)]
    cmds, _, counters, _ = run_rx(frames, ready=lambda c: pattern[c % len(pattern)],
                                  rng=random.Random(5), settle=200)
    assert cmds == expected
    assert counters["DROP_OVERFLOW"] == 0


def test_buffer_overflow_drops_and_recovers():
    big = payload_bytes(1000)
    frames = [write_frame(IMEM0 + 0x1000 * i, big, IMEM_RKEY) for i in range(4)]
    # 4 KiB buffer: three 1070-byte frames fit, the fourth does not while the bus is stalled.
    h_cmds, _, counters, _ = run_rx(frames, ready=lambda c: c > 700, settle=900,
                                    buffer_bytes=4096)
    assert counters["DROP_OVERFLOW"] == 1
    assert counters["RX_ROCE_ACCEPTED"] == 3
    exp = []
    for i in range(3):
        exp += expected_writes(IMEM0 + 0x1000 * i, big)
    assert h_cmds == exp


def test_descriptor_queue_overflow():
    d = payload_bytes(4)
    frames = [write_frame(IMEM0 + 8 * i, d, IMEM_RKEY) for i in range(12)]
    cmds, _, counters, _ = run_rx(frames, ready=lambda c: c > 400, desc_depth=4)
    # one waiting in the bus_cmd register, one in the engine's second register, one stalled
    # in the commit engine, four queued
    assert counters["RX_ROCE_ACCEPTED"] == 7
    assert counters["DROP_OVERFLOW"] == 5
    exp = []
    for i in range(7):
        exp += expected_writes(IMEM0 + 8 * i, d)
    assert cmds == exp


def test_control_queue_overflow():
    frames = [control_frame(Command.WR_DWORD, 8, i, seq=i) for i in range(8)]
    cmds, reqs, counters, _ = run_rx(frames, ctrl_ready=lambda c: c > 90, ctrl_depth=2)
    assert counters["DROP_OVERFLOW"] == 6
    assert [r["seq"] for r in reqs] == [0, 1]


def test_beats_helper():
    b = beats(bytes(range(13)))
    assert [x["keep"] for x in b] == [0xFF, 0x1F]
    assert b[0]["first"] and b[1]["last"]


def test_scapy_built_packets_accepted():
    """Frames built by scapy's RoCE layer (an independent ICRC, GPL: tests only), with TOS, TTL,
    FECN/BECN and pad bytes that the ICRC masks or covers."""
    from scapy.contrib.roce import BTH as ScapyBTH
    from scapy.layers import inet
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    from openqlink.wire.roce import IMMDT, RETH

    def frame(opcode, ext: bytes, data: bytes, psn: int) -> bytes:
        pad = (-len(data)) % 4
        p = (Ether(dst=PARAMS.mac, src="02:00:00:00:00:65") /
             inet.IP(src="192.168.0.101", dst=PARAMS.ip, tos=0x2E, ttl=17, flags="DF") /
             inet.UDP(sport=0xD000, dport=4791, chksum=0) /
             ScapyBTH(opcode=opcode, dqpn=PARAMS.qpn_base, psn=psn, padcount=pad, fecn=1,
                      becn=1) /
             Raw(ext + data + bytes(pad)))
        return pad60(bytes(p))

    d1, d2 = payload_bytes(13, 5), payload_bytes(21, 6)
    va = IMEM0 + 0x204
    frames = [
        frame(Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE,
              RETH.pack(va=va, r_key=IMEM_RKEY, dma_len=13) + IMMDT.pack(imm=42), d1, 9),
        frame(Opcode.SEND_ONLY, b"", d2, 10),
    ]
    mailbox = ppu_base(0) + MAILBOX_OFFSET
    cmds, _, counters, _ = run_rx(frames)
    assert cmds == (expected_writes(va, d1) + [tail_write(ppu_reg(0, "TAIL"), 42)] +
                    expected_writes(mailbox, d2) + [mailbox_commit(mailbox, 21)])
    assert counters["PSN_GAP"] == 1


def test_parameter_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="buffer_bytes must be a power of two of at least "
                                             "2048, not 3000"):
            RoCEReceiver(PARAMS, buffer_bytes=3000)
        with pytest.raises(ValueError, match="desc_depth and ctrl_depth must be at least 1"):
            RoCEReceiver(PARAMS, desc_depth=0)
        gc.collect()
