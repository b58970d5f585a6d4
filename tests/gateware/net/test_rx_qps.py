"""Several QPs per QSC, independent of the PPU count (openqlink.gateware.net.rx, regs).

Each QP has its own peer, PSN and message state, counters and map of regions (the R_Keys of
its PPU's regions that its host wrote); an extra QP (``q >= num_ppus``) reaches the PPU its
PPU register names.
"""

import pytest
from amaranth.sim import Simulator
from netbench import (
    HOST_IP,
    HOST_MAC,
    QSC_IP,
    QSC_MAC,
    StreamSink,
    drive_frames,
    expected_writes,
    mailbox_commit,
    send_frame,
    write_frame,
)
from test_rx import RxHarness, nonzero, reg_read, reg_write, run_rx

from openqlink.memory_map import (
    ENV_OFFSET,
    IMEM_OFFSET,
    MAILBOX_OFFSET,
    QP_COUNTERS,
    QSCParams,
    global_reg,
    ppu_base,
    qp_reg,
)
from openqlink.roce import UCQueuePair
from openqlink.wire.ipv4 import ip_to_int

PARAMS = QSCParams()                      # one PPU, four QPs
OTHER_MAC = 0x02_00_00_00_00_66           # a second host
OTHER_IP = ip_to_int("192.168.0.102")
KEYS = {q: {"IMEM": 0x4949_0000 | q, "ENV": 0x4545_0000 | q, "REGS": 0x5252_0000 | q}
        for q in range(4)}


def from_other(frame_kw: dict) -> dict:
    """Frame keywords that send from the second host."""
    return {**frame_kw, "eth": {"src": OTHER_MAC}, "ip": {"src": OTHER_IP}}


def open_qp(q: int, *, ppu: int | None = None, mac: int = HOST_MAC, ip: int = HOST_IP,
            regions=("IMEM", "ENV", "REGS")):
    """The writes that configure QP ``q``: peer, PPU (for an extra QP), the R_Keys of
    ``regions`` (its map)."""
    writes = [(qp_reg(q, "PEER_MAC_HI"), mac >> 32), (qp_reg(q, "PEER_MAC_LO"), mac & 0xFFFF_FFFF),
              (qp_reg(q, "PEER_IP"), ip)]
    if ppu is not None:
        writes.append((qp_reg(q, "PPU"), ppu))
    writes += [(qp_reg(q, f"{name}_RKEY"), KEYS[q][name]) for name in regions]
    return writes


def setup_with(*qps):
    async def setup(ctx, regs):
        for writes in qps:
            for addr, value in writes:
                await reg_write(ctx, regs, addr, value)
        await reg_write(ctx, regs, global_reg("RX_ENABLE"), 1)
    return setup


def read_qp_counters(store: dict, num_qps: int):
    async def after(ctx, regs):
        for q in range(num_qps):
            store[q] = {name: await reg_read(ctx, regs, qp_reg(q, name))
                        for name, _ in QP_COUNTERS}
    return after


def test_a_build_has_at_least_four_qps_whatever_its_ppus():
    assert QSCParams().num_qps == 4
    assert QSCParams(num_ppus=2).num_qps == 4
    assert QSCParams(num_ppus=6).num_qps == 6
    assert QSCParams(num_ppus=2, num_qps=16).num_qps == 16
    for bad in (1, 17):
        with pytest.raises(ValueError, match="num_qps must be num_ppus"):
            QSCParams(num_ppus=2, num_qps=bad)


def test_four_qps_of_one_ppu_each_its_own_peer_keys_and_map():
    """QP 0 (the PPU's own, this host), QP 1 (a second host, IMEM only), QP 2 (this host, ENV
    only), QP 3 left closed. Each packet is judged by the QP its DestQP names."""
    imem = ppu_base(0) + IMEM_OFFSET
    env = ppu_base(0) + ENV_OFFSET
    qpn = [PARAMS.qpn_base + q for q in range(4)]
    frames = [
        # 0: QP 1's host into the instruction ring with QP 1's key: taken
        write_frame(imem + 16, b"QP1-imem", KEYS[1]["IMEM"], **from_other({"dest_qp": qpn[1]})),
        # 1: the same with QP 0's key: keys are per QP
        write_frame(imem + 16, b"QP1-imem", KEYS[0]["IMEM"], **from_other({"dest_qp": qpn[1]})),
        # 2: QP 1 into the envelope memory, a region outside its map, with QP 0's ENV key
        write_frame(env, b"QP1-env!", KEYS[0]["ENV"], **from_other({"dest_qp": qpn[1]})),
        # 3: this host on QP 1: not QP 1's peer
        write_frame(imem + 16, b"QP1-imem", KEYS[1]["IMEM"], dest_qp=qpn[1]),
        # 4: the second host on QP 0: not QP 0's peer
        write_frame(imem, b"QP0-imem", KEYS[0]["IMEM"], **from_other({"dest_qp": qpn[0]})),
        # 5: QP 2 into the envelope memory: taken
        write_frame(env + 8, b"QP2-env!", KEYS[2]["ENV"], dest_qp=qpn[2]),
        # 6: QP 2 into the instruction ring: outside its map
        write_frame(imem, b"QP2-imem", KEYS[2]["IMEM"], dest_qp=qpn[2]),
        # 7: QP 3, never configured: no peer (this host is not it)
        write_frame(imem, b"QP3-imem", KEYS[3]["IMEM"], dest_qp=qpn[3]),
        # 8: a SEND on QP 2 lands in the PPU's mailbox
        send_frame(b"R" * 24, dest_qp=qpn[2], psn=1),
        # 9: QP 0 with its own key: taken, PSN 0 in sequence on QP 0 (QP 2 took 0 and 1)
        write_frame(imem, b"QP0-imem", KEYS[0]["IMEM"], dest_qp=qpn[0], psn=0),
    ]
    counts: dict = {}
    cmds, _, counters, _ = run_rx(
        frames, configure=False,
        setup=setup_with(open_qp(0), open_qp(1, ppu=0, mac=OTHER_MAC, ip=OTHER_IP,
                                             regions=("IMEM",)),
                         open_qp(2, ppu=0, regions=("ENV",))),
        after=read_qp_counters(counts, 4))
    mailbox = ppu_base(0) + MAILBOX_OFFSET
    assert cmds == (expected_writes(imem + 16, b"QP1-imem") +
                    expected_writes(env + 8, b"QP2-env!") + expected_writes(mailbox, b"R" * 24) +
                    [mailbox_commit(mailbox, 24)] + expected_writes(imem, b"QP0-imem"))
    assert nonzero(counters) == {"RX_FRAMES": 10, "RX_ROCE_ACCEPTED": 4, "DROP_RKEY": 3,
                                 "DROP_PEER": 3, "RX_RPC_RESPONSES": 1}
    assert counts == {
        0: {"RX_PACKETS": 1, "RX_DROPS": 1, "RX_DROPS_PSN": 0, "TX_PACKETS": 0},
        1: {"RX_PACKETS": 1, "RX_DROPS": 3, "RX_DROPS_PSN": 0, "TX_PACKETS": 0},
        2: {"RX_PACKETS": 2, "RX_DROPS": 1, "RX_DROPS_PSN": 0, "TX_PACKETS": 0},
        3: {"RX_PACKETS": 0, "RX_DROPS": 1, "RX_DROPS_PSN": 0, "TX_PACKETS": 0},
    }


def test_each_qp_keeps_its_own_psn_and_message():
    """Two hosts' multi-packet WRITEs to one PPU, on QP 0 and QP 3, packet by packet
    interleaved: both land whole; a lost MIDDLE breaks QP 3's message alone."""
    imem = ppu_base(0) + IMEM_OFFSET
    qp_a = UCQueuePair(HOST_MAC, HOST_IP, 0x11, QSC_MAC, QSC_IP, PARAMS.qpn_base,
                       pmtu_bytes=256, tx_psn=100)
    qp_b = UCQueuePair(OTHER_MAC, OTHER_IP, 0x12, QSC_MAC, QSC_IP, PARAMS.qpn_base + 3,
                       pmtu_bytes=256, tx_psn=0xFFFFFF)            # across the PSN wrap
    a = qp_a.write_frames(imem, KEYS[0]["IMEM"], bytes(range(256)) * 3)
    b = qp_b.write_frames(imem + 1024, KEYS[3]["IMEM"], bytes(range(255, -1, -1)) * 3)
    pmtu = [(qp_reg(q, "PMTU"), 1) for q in (0, 3)]
    setup = setup_with(open_qp(0), open_qp(3, ppu=0, mac=OTHER_MAC, ip=OTHER_IP), pmtu)
    counts: dict = {}
    cmds, _, counters, _ = run_rx([a[0], b[0], a[1], b[1], a[2], b[2]], configure=False,
                                  setup=setup, after=read_qp_counters(counts, 4))
    got = sorted(cmds, key=lambda c: c[1])
    want = sorted(expected_writes(imem, bytes(range(256)) * 3) +
                  expected_writes(imem + 1024, bytes(range(255, -1, -1)) * 3),
                  key=lambda c: c[1])
    assert got == want
    assert counters["RX_ROCE_ACCEPTED"] == 6 and counters["DROP_PSN"] == 0
    # QP 3 loses its MIDDLE: its LAST is dropped (DROP_PSN), QP 0's message is whole
    cmds, _, counters, _ = run_rx([a[0], b[0], a[1], a[2], b[2]], configure=False,
                                  setup=setup, after=read_qp_counters(counts, 4))
    assert sorted(cmds, key=lambda c: c[1]) == sorted(
        expected_writes(imem, bytes(range(256)) * 3) +
        expected_writes(imem + 1024, bytes(range(255, -1, -1))), key=lambda c: c[1])
    assert counters["DROP_PSN"] == 1
    assert counts[0]["RX_PACKETS"] == 3 and counts[0]["RX_DROPS"] == 0
    assert counts[3] == {"RX_PACKETS": 1, "RX_DROPS": 1, "RX_DROPS_PSN": 1, "TX_PACKETS": 0}


def test_an_extra_qp_reaches_the_ppu_its_register_names():
    """Two PPUs, four QPs: QP 2 and QP 3 reach PPU 1; QP 2's VA in PPU 0's window is outside its
    regions (DROP_VA), its SEND lands in PPU 1's mailbox. Moved to PPU 0, QP 3 writes there."""
    params = QSCParams(num_ppus=2)
    qpn = [params.qpn_base + q for q in range(4)]
    imem0, imem1 = ppu_base(0) + IMEM_OFFSET, ppu_base(1) + IMEM_OFFSET
    frames = [
        write_frame(imem1 + 32, b"QP2-ppu1", KEYS[2]["IMEM"], dest_qp=qpn[2]),
        write_frame(imem0 + 32, b"QP2-ppu0", KEYS[2]["IMEM"], dest_qp=qpn[2], psn=1),
        send_frame(b"S" * 24, dest_qp=qpn[2], psn=1),
        write_frame(imem1 + 64, b"QP3-ppu1", KEYS[3]["IMEM"], dest_qp=qpn[3]),
    ]
    later = [write_frame(imem0 + 64, b"QP3-ppu0", KEYS[3]["IMEM"], dest_qp=qpn[3], psn=1),
             write_frame(imem1 + 64, b"QP3-ppu1", KEYS[3]["IMEM"], dest_qp=qpn[3], psn=2)]

    async def move_qp3(ctx, regs):
        await reg_write(ctx, regs, qp_reg(3, "PPU"), 0)

    cmds, _, counters, _ = run_rx(
        frames, params=params, configure=False,
        setup=setup_with(open_qp(2, ppu=1), open_qp(3, ppu=1)), then=(move_qp3, later))
    mailbox1 = ppu_base(1) + MAILBOX_OFFSET
    assert cmds == (expected_writes(imem1 + 32, b"QP2-ppu1") +
                    expected_writes(mailbox1, b"S" * 24) + [mailbox_commit(mailbox1, 24)] +
                    expected_writes(imem1 + 64, b"QP3-ppu1") +
                    expected_writes(imem0 + 64, b"QP3-ppu0"))
    assert nonzero(counters) == {"RX_FRAMES": 6, "RX_ROCE_ACCEPTED": 4, "DROP_VA": 2,
                                 "RX_RPC_RESPONSES": 1}


class _OwnQpContextNamingPpu1(RxHarness):
    """The receiver with its register block, PPU 0's own QP's context carrying ``ppu`` 1 (the
    register block drives ``q`` there; the receiver's ``qp`` port itself takes any value)."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        m.d.comb += self.dut.qp[0].ppu.eq(1)
        return m


def test_an_own_qp_reaches_its_own_ppu_whatever_its_context_says():
    """Rule 8 of the receiver: QP ``q < num_ppus`` is PPU ``q``'s own and reaches PPU ``q``. A
    SEND on QP 0 lands in PPU 0's mailbox, and a WRITE into PPU 0's instruction ring is taken,
    even where QP 0's context names PPU 1."""
    params = QSCParams(num_ppus=2)
    h = _OwnQpContextNamingPpu1(params)
    sink = StreamSink(h.dut.bus_cmd)
    imem0 = ppu_base(0) + IMEM_OFFSET
    frames = [send_frame(b"S" * 8, psn=0),
              write_frame(imem0, b"QP0-imem", KEYS[0]["IMEM"], psn=1)]

    async def testbench(ctx):
        for addr, value in open_qp(0) + [(global_reg("RX_ENABLE"), 1)]:
            await reg_write(ctx, h.regs, addr, value)
        await drive_frames(ctx, h.dut.rx, frames)
        for _ in range(80):
            await ctx.tick()

    sim = Simulator(h)
    sim.add_clock(6.4e-9)
    sim.add_testbench(testbench)
    sim.add_testbench(sink.run, background=True)
    sim.run()
    mailbox0 = ppu_base(0) + MAILBOX_OFFSET
    assert sink.items == (expected_writes(mailbox0, b"S" * 8) + [mailbox_commit(mailbox0, 8)] +
                          expected_writes(imem0, b"QP0-imem"))
