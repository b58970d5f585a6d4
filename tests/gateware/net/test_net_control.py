"""Tests of openqlink.gateware.net.control: ControlPlane with the register block.

(Named test_net_control.py: tests/host/test_control.py holds the host client's tests.)
"""

import random
import struct

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator
from netbench import (
    HOST_IP,
    HOST_MAC,
    HOST_PORT,
    QSC_IP,
    QSC_MAC,
    StreamSink,
    beat_tuple,
    frames_of,
)

from openqlink.gateware.bus import READ_TAG_BITS, BusOp
from openqlink.gateware.net.common import NetConfig
from openqlink.gateware.net.control import PPU_TIMEOUT_CYCLES, ControlPlane, ControlReplyBuilder
from openqlink.gateware.net.regs import COUNTER_LAG_CYCLES, NetRegisters
from openqlink.isa.layout import ISA_VERSION
from openqlink.memory_map import (
    QP_REGISTERS,
    QSCParams,
    counter_addr,
    global_reg,
    ppu_base,
    ppu_reg,
    qp_reg,
    version_word,
)
from openqlink.wire.control import BLOCK_MAX_PAIRS, Command, Flags, Status, unpack_response
from openqlink.wire.ipv4 import ipv4_checksum

PARAMS = QSCParams(num_ppus=2)
ACK = int(Flags.ACK_REQUEST)
SEQ = int(Flags.SEQUENCE_CHECK)


class ControlHarness(wiring.Component):
    def __init__(self, params: QSCParams):
        self.dut = ControlPlane(params)
        self.regs = NetRegisters(params, num_inc_sources=1)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        m.submodules.regs = regs = self.regs
        wiring.connect(m, dut.regs, regs.port)
        m.d.comb += regs.inc[0].eq(dut.count)
        return m


def req(cmd, addr, data=0, *, flags=ACK, seq=0, src_mac=HOST_MAC, src_ip=HOST_IP):
    return dict(src_mac=src_mac, src_ip=src_ip, src_port=HOST_PORT, cmd=int(cmd),
                flags=flags, seq=seq, addr=addr, data=data, pairs=1)


#: A second host on the LAN, and one that shares the owner's IP but not its MAC.
OTHER = dict(src_mac=HOST_MAC + 1, src_ip=HOST_IP + 1)
SPOOF_IP = dict(src_mac=HOST_MAC + 2, src_ip=HOST_IP)


def reply_of(p):
    return {f: int(getattr(p, f)) for f in
            ("dst_mac", "dst_ip", "dst_port", "cmd", "flags", "seq", "status", "addr", "value",
             "latched_seq", "last")}


def run(requests, *, read_answers=None, bus_ready=lambda c: True, reply_ready=lambda c: True,
        params=PARAMS):
    """Feed ``requests``; answer bus READs from ``read_answers`` (word_addr -> (data, error)).

    An int among ``requests`` is a pause: that many cycles with no request offered.

    Returns (replies, bus commands).
    """
    h = ControlHarness(params)
    dut = h.dut
    replies = StreamSink(dut.reply, reply_ready, convert=reply_of)
    bus = StreamSink(dut.bus_cmd, bus_ready)
    answers = dict(read_answers or {})

    async def feeder(ctx):
        for r in requests:
            if isinstance(r, int):
                ctx.set(dut.req.valid, 0)
                for _ in range(r):
                    await ctx.tick()
                continue
            ctx.set(dut.req.valid, 1)
            ctx.set(dut.req.payload, r)
            await ctx.tick().until(dut.req.ready)
        ctx.set(dut.req.valid, 0)
        for _ in range(40):
            await ctx.tick()

    async def reader(ctx):
        served = 0
        while True:
            await ctx.tick()
            reads = [c for c in bus.items if c[0] == BusOp.READ]
            if served < len(reads):
                _, word, _, tag = reads[served]
                data, error = answers[word]
                ctx.set(dut.bus_rdata.valid, 1)
                ctx.set(dut.bus_rdata.payload, {"data": data, "error": error, "tag": tag})
                await ctx.tick().until(dut.bus_rdata.ready)
                ctx.set(dut.bus_rdata.valid, 0)
                served += 1

    sim = Simulator(h)
    sim.add_clock(6.4e-9)
    sim.add_testbench(feeder)
    sim.add_testbench(replies.run, background=True)
    sim.add_testbench(bus.run, background=True)
    sim.add_testbench(reader, background=True)
    sim.run()
    return replies.items, bus.items


def brief(replies):
    return [(r["cmd"], r["status"], r["addr"], r["value"], r["latched_seq"]) for r in replies]


def test_reply_addressing():
    replies, _ = run([req(Command.RD_DWORD, global_reg("VERSION"), seq=7)])
    assert replies == [dict(dst_mac=HOST_MAC, dst_ip=HOST_IP, dst_port=HOST_PORT, cmd=0x94,
                            flags=ACK, seq=7, status=Status.OK, addr=0,
                            value=version_word(ISA_VERSION), latched_seq=7, last=1)]


def test_global_registers_read_write():
    scratch = global_reg("SCRATCH")
    replies, bus = run([
        req(Command.WR_DWORD, scratch, 0xCAFEF00D, seq=1),
        req(Command.RD_DWORD, scratch, seq=2),
        req(Command.RD_DWORD, global_reg("NUM_PPUS"), seq=3),
        req(Command.RD_DWORD, global_reg("P_KEY"), seq=4),
        req(Command.WR_DWORD, global_reg("VERSION"), 5, seq=5),      # read-only: ignored
        req(Command.RD_DWORD, global_reg("VERSION"), seq=6),
        req(Command.RD_DWORD, qp_reg(1, "QSC_QPN"), seq=7),
        req(Command.WR_DWORD, qp_reg(1, "HOST_QPN"), 0xFF_123456, seq=8),
        req(Command.RD_DWORD, qp_reg(1, "HOST_QPN"), seq=9),
        # The counters show a strobe within COUNTER_LAG_CYCLES. Request 9 counts in its DECODE
        # cycle, 3 cycles after it is taken; request 10 reads in the cycle after it is taken.
        COUNTER_LAG_CYCLES + 2,
        req(Command.RD_DWORD, counter_addr("RX_CONTROL"), seq=10),
    ])
    assert bus == []
    assert brief(replies) == [
        (0x84, 0, scratch, 0, 1),                        # write replies carry value 0
        (0x94, 0, scratch, 0xCAFEF00D, 2),
        (0x94, 0, 4, 2, 3),
        (0x94, 0, global_reg("P_KEY"), 0xFFFF, 4),
        (0x84, 0, 0, 0, 5),
        (0x94, 0, 0, version_word(ISA_VERSION), 6),
        (0x94, 0, qp_reg(1, "QSC_QPN"), PARAMS.qpn_base + 1, 7),
        (0x84, 0, qp_reg(1, "HOST_QPN"), 0, 8),
        (0x94, 0, qp_reg(1, "HOST_QPN"), 0x123456, 9),   # 24-bit register
        (0x94, 0, counter_addr("RX_CONTROL"), 9, 10),    # the 9 requests before this one
    ]


def test_write_without_ack_is_silent_but_done():
    scratch = global_reg("SCRATCH")
    replies, _ = run([req(Command.WR_DWORD, scratch, 99, flags=0, seq=1),
                      req(Command.RD_DWORD, scratch, flags=0, seq=2)])
    assert brief(replies) == [(0x94, 0, scratch, 99, 2)]


def test_ppu_register_write_and_read_through_bus():
    tail = ppu_reg(1, "TAIL")                      # addr[2] = 0
    status = ppu_reg(1, "STATUS")                  # addr[2] = 1
    pc = ppu_reg(0, "PC")
    answers = {status >> 3: (0xAAAA_BBBB_1234_5678, 0), pc >> 3: (0x0000_0001_0000_0042, 0)}
    replies, bus = run([
        req(Command.WR_DWORD, tail, 17, seq=1),
        req(Command.RD_DWORD, status, seq=2),
        req(Command.RD_DWORD, pc, seq=3),
    ], read_answers=answers)
    tag = bus[1][3]
    assert bus == [
        (BusOp.WRITE, tail >> 3, 0x0F, 17 | 17 << 32),
        (BusOp.READ, status >> 3, 0xF0, tag),                       # data: the READ's tag
        (BusOp.READ, pc >> 3, 0x0F, (tag + 1) % (1 << READ_TAG_BITS)),
    ]
    assert brief(replies) == [
        (0x84, 0, tail, 0, 1),
        (0x94, 0, status, 0xAAAA_BBBB, 2),
        (0x94, 0, pc, 0x42, 3),
    ]


def test_bus_read_error_is_bad_address():
    addr = ppu_base(0) + 0x80_0010
    replies, bus = run([req(Command.RD_DWORD, addr, seq=1)],
                       read_answers={addr >> 3: (0x1234, 1)})
    assert [c[:3] for c in bus] == [(BusOp.READ, addr >> 3, 0x0F)]
    assert brief(replies) == [(0x94, Status.BAD_ADDRESS, addr, 0, 0)]   # latch restored


def test_bus_back_pressure_and_reply_back_pressure():
    tail = ppu_reg(0, "TAIL")
    replies, bus = run([req(Command.WR_DWORD, tail, i, seq=i) for i in range(1, 5)],
                       bus_ready=lambda c: c % 3 == 2, reply_ready=lambda c: c % 4 == 1)
    assert bus == [(BusOp.WRITE, tail >> 3, 0x0F, i | i << 32) for i in range(1, 5)]
    assert [r["seq"] for r in replies] == [1, 2, 3, 4]


def test_bad_addresses():
    bad = [
        0x0000_0020,                   # hole between QSC_IP and UDP_SRC_PORT
        0x0000_0009,                   # unaligned
        0x0000_0F00,                   # past the counters
        0x0000_1000 + 0x100 * 4,       # QP context of a fifth QP (4 QPs built)
        qp_reg(0, QP_REGISTERS[-1].name) + 4,     # past QP 0's registers
        ppu_base(2),                   # window of a third PPU
        0x0F00_0000,
        0xFFFF_FFFC,
        ppu_reg(0, "TAIL") + 2,        # unaligned PPU address: not sent to the bus
    ]
    replies, bus = run([req(Command.RD_DWORD, a, seq=i) for i, a in enumerate(bad)])
    assert bus == []
    # an address error latches no sequence number: latched_seq stays at its reset value
    assert brief(replies) == [(0x94, Status.BAD_ADDRESS, a, 0, 0) for a in bad]


def test_bad_command_and_flags():
    scratch = global_reg("SCRATCH")
    replies, bus = run([
        req(Command.WR_BLOCK, scratch, 1, flags=0, seq=1),      # not a read, no ACK: silent
        req(Command.RD_BLOCK, scratch, flags=0, seq=2),         # a read: answered (one pair)
        req(0x33, scratch, flags=ACK, seq=3),
        req(Command.WR_DWORD, scratch, 5, flags=ACK | 0x10, seq=4),
        req(Command.RD_DWORD, scratch, flags=0x80, seq=5),
    ])
    assert bus == []
    assert brief(replies) == [
        (0x99, Status.OK, scratch, 1, 2),            # the block write was done
        (0x33, Status.BAD_COMMAND, scratch, 0, 2),   # invalid: echoed raw, not latched
        (0x84, Status.BAD_FLAGS, scratch, 0, 2),     # refused: seq not latched, nothing written
        (0x94, Status.BAD_FLAGS, scratch, 0, 2),
    ]


def test_sequence_check():
    scratch = global_reg("SCRATCH")
    replies, _ = run([
        req(Command.WR_DWORD, scratch, 1, flags=ACK | SEQ, seq=0xFFFE),  # first: always accepted
        req(Command.WR_DWORD, scratch, 2, flags=ACK | SEQ, seq=0xFFFF),
        req(Command.WR_DWORD, scratch, 3, flags=ACK | SEQ, seq=0x0000),  # wraps
        req(Command.WR_DWORD, scratch, 4, flags=ACK | SEQ, seq=0x0000),  # retransmitted
        req(Command.WR_DWORD, scratch, 5, flags=ACK | SEQ, seq=0x0005),  # jump: refused
        req(Command.RD_DWORD, scratch, flags=SEQ, seq=0x0001),
        req(Command.RD_DWORD, 0x20, flags=SEQ, seq=0x0002),              # bad address
        req(Command.RD_DWORD, scratch, flags=SEQ, seq=0x0003),
        req(Command.RD_DWORD, scratch, flags=0, seq=0x0100),             # unchecked: resyncs
        req(Command.RD_DWORD, scratch, flags=SEQ, seq=0x0101),
    ])
    assert brief(replies) == [
        (0x84, 0, scratch, 0, 0xFFFE),
        (0x84, 0, scratch, 0, 0xFFFF),
        (0x84, 0, scratch, 0, 0x0000),
        (0x84, 0, scratch, 0, 0x0000),                   # answered OK, not done again
        (0x84, Status.SEQUENCE_ERROR, scratch, 0, 0x0000),
        (0x94, 0, scratch, 3, 0x0001),                   # 3: the retransmission wrote nothing
        (0x94, Status.BAD_ADDRESS, 0x20, 0, 0x0001),     # an address error: not latched
        (0x94, Status.SEQUENCE_ERROR, scratch, 0, 0x0001),
        (0x94, 0, scratch, 3, 0x0100),
        (0x94, 0, scratch, 3, 0x0101),
    ]


def test_a_retransmitted_request_is_answered_without_running_its_writes_again():
    """A host whose acknowledgement was lost sends the request again with the same sequence
    number: a TRIGGER (a PPU write) must run once. Reads of a retransmission are done again;
    a block's every pair is answered; the latch does not move; a claim is not taken by it."""
    trigger = ppu_reg(0, "TRIGGER")
    pc = ppu_reg(0, "PC")
    scratch = global_reg("SCRATCH")
    answers = {pc >> 3: (0x42, 0)}
    block = dict(req(Command.WR_BLOCK, scratch, 9, flags=ACK | SEQ, seq=12), pairs=1)
    # (a retransmission carries the same bytes; 7 here shows that nothing is written)
    block_again = dict(block, data=7)
    replies, bus = run([
        req(Command.WR_DWORD, trigger, 1, flags=ACK | SEQ, seq=10),
        req(Command.WR_DWORD, trigger, 1, flags=ACK | SEQ, seq=10),      # its ack was lost
        req(Command.RD_DWORD, pc, flags=SEQ, seq=11),
        req(Command.RD_DWORD, pc, flags=SEQ, seq=11),                    # read again
        block, block_again,
        req(Command.RD_DWORD, scratch, flags=SEQ, seq=13),
        req(Command.WR_DWORD, scratch, 5, flags=ACK | SEQ, seq=13, **OTHER),  # not the owner
    ], read_answers=answers)
    assert [c[0] for c in bus] == [BusOp.WRITE, BusOp.READ, BusOp.READ]
    assert brief(replies) == [
        (0x84, 0, trigger, 0, 10),
        (0x84, 0, trigger, 0, 10),
        (0x94, 0, pc, 0x42, 11),
        (0x94, 0, pc, 0x42, 11),
        (Command.WR_BLOCK | 0x80, 0, scratch, 0, 12),
        (Command.WR_BLOCK | 0x80, 0, scratch, 0, 12),
        (0x94, 0, scratch, 9, 13),
        (0x84, Status.CLAIMED, scratch, 0, 13),            # the owner keeps its claim
    ]


async def _request(ctx, dut, r):
    ctx.set(dut.req.valid, 1)
    ctx.set(dut.req.payload, r)
    await ctx.tick().until(dut.req.ready)
    ctx.set(dut.req.valid, 0)


async def _reply(ctx, dut, bound):
    """The next reply and the cycles waited for it (at most ``bound``)."""
    ctx.set(dut.reply.ready, 1)
    for cycle in range(1, bound + 1):
        _, _, valid, payload = await ctx.tick().sample(dut.reply.valid, dut.reply.payload)
        if valid:
            return reply_of(payload), cycle
    raise AssertionError(f"no reply within {bound} cycles")


def _sim(tb):
    h = ControlHarness(PARAMS)
    sim = Simulator(h)
    sim.add_clock(6.4e-9)

    async def main(ctx):
        await tb(ctx, h.dut, h.regs)

    sim.add_testbench(main)
    sim.run()


def test_ppu_read_unanswered_times_out_within_the_bound():
    status = ppu_reg(0, "STATUS")

    async def tb(ctx, dut, regs):
        ctx.set(dut.bus_cmd.ready, 1)
        await _request(ctx, dut, req(Command.RD_DWORD, status, seq=1))
        reply, cycles = await _reply(ctx, dut, PPU_TIMEOUT_CYCLES + 10)
        # taken in the request's cycle: the reply is valid PPU_TIMEOUT_CYCLES + 2 cycles later
        assert cycles == PPU_TIMEOUT_CYCLES + 2
        assert (reply["status"], reply["value"]) == (Status.PPU_TIMEOUT, 0)
        # the late answer to that READ, then the answer to the next READ: only the latter counts
        await _request(ctx, dut, req(Command.RD_DWORD, status, seq=2))
        await ctx.tick().until(dut.bus_cmd.valid)
        tag = ctx.get(dut.bus_cmd.payload.data)
        ctx.set(dut.bus_rdata.valid, 1)
        for data, t in ((0xDEAD << 32, tag - 1), (0x0042 << 32, tag)):
            ctx.set(dut.bus_rdata.payload, {"data": data, "error": 0, "tag": t})
            await ctx.tick()
            assert ctx.get(dut.bus_rdata.ready)       # answers are always taken
        ctx.set(dut.bus_rdata.valid, 0)
        reply, _ = await _reply(ctx, dut, 10)
        assert (reply["status"], reply["value"], reply["seq"]) == (Status.OK, 0x42, 2)

    _sim(tb)


def test_ppu_write_not_taken_is_withdrawn():
    start = ppu_reg(0, "START_TIME_LO")

    async def tb(ctx, dut, regs):
        ctx.set(dut.bus_cmd.ready, 0)             # the bus never takes it
        await _request(ctx, dut, req(Command.WR_DWORD, start, 5, seq=1))
        reply, cycles = await _reply(ctx, dut, PPU_TIMEOUT_CYCLES + 10)
        assert cycles == PPU_TIMEOUT_CYCLES + 2
        assert (reply["status"], reply["value"]) == (Status.PPU_TIMEOUT, 0)
        assert not ctx.get(dut.bus_cmd.valid) and not ctx.get(dut.busy)

    _sim(tb)


def test_ppu_command_dropped_is_answered_at_once_and_counted():
    start = ppu_reg(0, "START_TIME_LO")

    async def tb(ctx, dut, regs):
        ctx.set(dut.bus_cmd.ready, 1)
        ctx.set(dut.bus_drop, 1)                  # the crossing drops whatever it takes
        await _request(ctx, dut, req(Command.WR_DWORD, start, 5, seq=1))
        reply, cycles = await _reply(ctx, dut, 10)
        assert reply["status"] == Status.PPU_TIMEOUT and cycles < 10
        ctx.set(dut.bus_drop, 0)
        for _ in range(COUNTER_LAG_CYCLES):      # the counter shows a strobe this late
            await ctx.tick()
        await _request(ctx, dut, req(Command.RD_DWORD, counter_addr("DROP_BUS"), seq=2))
        reply, _ = await _reply(ctx, dut, 10)
        assert reply["value"] == 1 + cycles       # one per cycle with bus_drop high

    _sim(tb)


def test_claim_a_write_claims_and_other_hosts_writes_are_refused():
    """The first accepted write claims the QSC for its source; another host's writes (a
    different IP, or the owner's IP from a different MAC) are answered CLAIMED and not done,
    while its reads are answered; the owner releases with a write of 0 to CLAIM, and then the
    other host may claim it."""
    scratch, claim = global_reg("SCRATCH"), global_reg("CLAIM")
    replies, bus = run([
        req(Command.RD_DWORD, claim, seq=1, **OTHER),                  # unclaimed: 0
        req(Command.WR_DWORD, scratch, 11, seq=2),                     # claims
        req(Command.RD_DWORD, claim, seq=3, **OTHER),                  # the owner's IP
        req(Command.WR_DWORD, scratch, 22, seq=4, **OTHER),            # refused
        req(Command.WR_DWORD, ppu_reg(0, "TRIGGER"), 1, seq=5, **SPOOF_IP),  # refused
        req(Command.WR_DWORD, claim, 0, seq=6, **OTHER),               # no release by others
        req(Command.RD_DWORD, scratch, seq=7, **OTHER),                # reads stay open
        req(Command.WR_DWORD, claim, 0, seq=8),                        # the owner releases
        req(Command.WR_DWORD, scratch, 33, seq=9, **OTHER),            # claims it
        req(Command.WR_DWORD, scratch, 44, seq=10),                    # now refused
        req(Command.RD_DWORD, claim, seq=11),
    ])
    assert bus == []
    assert brief(replies) == [
        (0x94, 0, claim, 0, 1),
        (0x84, 0, scratch, 0, 2),
        (0x94, 0, claim, HOST_IP, 2),             # another host's request latches nothing
        (0x84, Status.CLAIMED, scratch, 0, 2),
        (0x84, Status.CLAIMED, ppu_reg(0, "TRIGGER"), 0, 2),
        (0x84, Status.CLAIMED, claim, 0, 2),
        (0x94, 0, scratch, 11, 2),
        (0x84, 0, claim, 0, 8),
        (0x84, 0, scratch, 0, 9),
        (0x84, Status.CLAIMED, scratch, 0, 9),
        (0x94, 0, claim, HOST_IP + 1, 9),
    ]


def test_claim_other_hosts_do_not_disturb_the_owners_sequence():
    """Another host's requests neither check nor latch the sequence number: the owner's
    sequence-checked session goes on as if they had not come."""
    scratch = global_reg("SCRATCH")
    replies, _ = run([
        req(Command.WR_DWORD, scratch, 1, flags=ACK | SEQ, seq=10),
        req(Command.RD_DWORD, scratch, flags=ACK | SEQ, seq=500, **OTHER),   # not checked
        req(Command.WR_DWORD, scratch, 2, flags=ACK | SEQ, seq=11),
    ])
    assert brief(replies) == [
        (0x84, 0, scratch, 0, 10),
        (0x94, 0, scratch, 1, 10),
        (0x84, 0, scratch, 0, 11),
    ]


def test_claim_refused_and_failed_writes():
    """A write that fails its flags or sequence check claims nothing; a write the QSC accepts
    claims it even when it then fails (BAD_ADDRESS); a write of 0 to CLAIM on an unclaimed QSC
    leaves it unclaimed."""
    scratch, claim = global_reg("SCRATCH"), global_reg("CLAIM")
    replies, _ = run([
        req(Command.WR_DWORD, claim, 0, seq=1, **OTHER),
        req(Command.WR_DWORD, scratch, 5, flags=ACK | 0x10, seq=2, **OTHER),   # BAD_FLAGS
        req(Command.WR_DWORD, 0x20, 5, seq=3),                                # claims
        req(Command.WR_DWORD, scratch, 6, seq=4, **OTHER),
    ])
    assert brief(replies) == [
        (0x84, 0, claim, 0, 1),
        (0x84, Status.BAD_FLAGS, scratch, 0, 1),
        (0x84, Status.BAD_ADDRESS, 0x20, 0, 1),          # not latched, but claimed
        (0x84, Status.CLAIMED, scratch, 0, 1),
    ]


def test_error_priority_is_the_bridges():
    """Holoscan Sensor Bridge's RTL ranks a bad command over bad flags over a sequence error
    over an address error; none of them latches the sequence number."""
    scratch = global_reg("SCRATCH")
    replies, _ = run([
        req(Command.RD_DWORD, scratch, flags=ACK | SEQ, seq=5),                # latched: 5
        req(0x07, 0x20, flags=ACK | SEQ | 0x40, seq=9),                        # all four wrong
        req(Command.WR_DWORD, 0x20, 1, flags=ACK | SEQ | 0x40, seq=9),         # flags first
        req(Command.WR_DWORD, 0x20, 1, flags=ACK | SEQ, seq=9),                # sequence next
        req(Command.WR_DWORD, 0x20, 1, flags=ACK | SEQ, seq=6),                # address last
        req(Command.RD_DWORD, scratch, flags=ACK | SEQ, seq=6),                # 6 still next
    ])
    assert brief(replies) == [
        (0x94, 0, scratch, 0, 5),
        (0x07, Status.BAD_COMMAND, 0x20, 0, 5),
        (0x84, Status.BAD_FLAGS, 0x20, 0, 5),
        (0x84, Status.SEQUENCE_ERROR, 0x20, 0, 5),
        (0x84, Status.BAD_ADDRESS, 0x20, 0, 5),
        (0x94, 0, scratch, 0, 6),
    ]


def test_a_ppu_read_address_error_restores_the_latch():
    """A RD_DWORD that the PPU side answers with an error (no register there) is an address
    error: the sequence number latched with it is taken back."""
    addr = ppu_base(0) + 0x80_0010
    scratch = global_reg("SCRATCH")
    replies, _ = run([
        req(Command.RD_DWORD, scratch, flags=ACK | SEQ, seq=20),
        req(Command.RD_DWORD, addr, flags=ACK | SEQ, seq=21),
        req(Command.RD_DWORD, scratch, flags=ACK | SEQ, seq=21),
    ], read_answers={addr >> 3: (0x1234, 1)})
    assert brief(replies) == [
        (0x94, 0, scratch, 0, 20),
        (0x94, Status.BAD_ADDRESS, addr, 0, 20),
        (0x94, 0, scratch, 0, 21),
    ]


# -- ControlReplyBuilder: one frame per response, any number of pairs --------------------------


def _expected_reply_frame(head: dict, pairs: list[tuple[int, int]]) -> bytes:
    """The response frame written out with struct, apart from the builder and wire.control:
    HSB's layout (6-byte header, pairs, latched_seq, padded to 18 payload bytes)."""
    payload = struct.pack(">BBHBB", head["cmd"], head["flags"], head["seq"], head["status"], 0)
    payload += b"".join(struct.pack(">II", a, v) for a, v in pairs)
    payload += struct.pack(">H", head["latched_seq"])
    payload = payload.ljust(18, b"\0")
    udp = struct.pack(">HHHH", 8192, head["dst_port"], 8 + len(payload), 0)
    ip = bytearray(struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp) + len(payload), 0,
                               0x4000, 64, 17, 0, QSC_IP.to_bytes(4, "big"),
                               head["dst_ip"].to_bytes(4, "big")))
    ip[10:12] = ipv4_checksum(bytes(ip)).to_bytes(2, "big")
    eth = head["dst_mac"].to_bytes(6, "big") + QSC_MAC.to_bytes(6, "big") + b"\x08\x00"
    return (eth + bytes(ip) + udp + payload).ljust(60, b"\0")


def test_reply_builder_frames_under_back_pressure():
    rng = random.Random(7)
    dut = ControlReplyBuilder()
    responses = []
    for k, n in enumerate([1, 2, 5, 1, BLOCK_MAX_PAIRS, 3]):
        head = dict(dst_mac=HOST_MAC + k, dst_ip=HOST_IP + k, dst_port=HOST_PORT + k,
                    cmd=0x99 if n > 1 else 0x94, flags=ACK, seq=100 + k, status=3 * (k % 2),
                    latched_seq=0x4000 + k)
        pairs = [(rng.getrandbits(32), rng.getrandbits(32)) for _ in range(n)]
        responses.append((head, pairs))
    frames = StreamSink(dut.tx, lambda c: rng.random() < 0.6, convert=beat_tuple)

    async def feeder(ctx):
        ctx.set(dut.config, NetConfig.const(dict(qsc_mac=QSC_MAC, qsc_ip=QSC_IP)))
        for head, pairs in responses:
            for i, (a, v) in enumerate(pairs):
                while rng.random() < 0.3:
                    await ctx.tick()
                ctx.set(dut.reply.valid, 1)
                ctx.set(dut.reply.payload, {**head, "addr": a, "value": v,
                                            "last": int(i == len(pairs) - 1)})
                await ctx.tick().until(dut.reply.ready)
                ctx.set(dut.reply.valid, 0)
        for _ in range(4 * 200):
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(6.4e-9)
    sim.add_testbench(feeder)
    sim.add_testbench(frames.run, background=True)
    sim.run()
    got = frames_of(frames.items)
    assert got == [_expected_reply_frame(h, p) for h, p in responses]
    assert [unpack_response(f[42:])["pairs"] for f in got] == [p for _, p in responses]
