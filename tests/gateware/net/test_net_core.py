"""Tests of openqlink.gateware.net.core: NetworkCore end to end (frames in, bus and frames out).

(Named test_net_core.py so that it cannot clash with another folder's test_core.py.)
"""

import simreuse
from amaranth.back import rtlil
from amaranth.sim import Simulator
from netbench import (
    HOST_IP,
    HOST_MAC,
    HOST_PORT,
    QSC_IP,
    QSC_MAC,
    StreamSink,
    block_frame,
    control_frame,
    drive_frames,
    expected_writes,
    mailbox_commit,
    open_rx,
    send_frame,
    tail_write,
    write_frame,
)

from openqlink.gateware.bus import BusOp
from openqlink.gateware.net.core import BusArbiter, NetworkCore
from openqlink.gateware.net.regs import COUNTER_LAG_CYCLES
from openqlink.memory_map import (
    IMEM_OFFSET,
    MAILBOX_OFFSET,
    QSCParams,
    counter_addr,
    global_reg,
    ppu_base,
    ppu_reg,
    qp_reg,
)
from openqlink.wire.control import BLOCK_MAX_PAIRS, Command, Flags, Status
from openqlink.wire.packet import parse_frame
from openqlink.wire.roce import Opcode, split_slot_immediate
from openqlink.wire.rpc import Request

PARAMS = QSCParams(num_ppus=2)
ACK = int(Flags.ACK_REQUEST)
IMEM_RKEY = 0x0BAD_CAFE


class CoreBench:
    """A NetworkCore with a MAC-side driver and sink and a PPU-cluster model on the bus."""

    def __init__(self, params=PARAMS, bus_ready=lambda c: True):
        self.rsim = simreuse.shared(("core", params), lambda: NetworkCore(params),
                                    clocks=6.4e-9, background=3)
        self.dut = dut = self.rsim.dut
        self.bus = StreamSink(dut.bus_cmd, bus_ready)
        self.tx_frames: list[bytes] = []
        self.ppu_words: dict[int, int] = {}     # word_addr -> 64-bit value answered to READs
        self.seq = 0

    async def tx_sink(self, ctx):
        ctx.set(self.dut.tx.ready, 1)
        frame = b""
        while True:
            _, _, valid, beat = await ctx.tick().sample(self.dut.tx.valid, self.dut.tx.payload)
            if valid:
                nbytes = bin(int(beat.keep)).count("1")
                frame += int(beat.data).to_bytes(8, "little")[:nbytes]
                if beat.last:
                    self.tx_frames.append(frame)
                    frame = b""

    async def responder(self, ctx):
        served = 0
        while True:
            await ctx.tick()
            reads = [c for c in self.bus.items if c[0] == BusOp.READ]
            if served < len(reads):
                _, word, _, tag = reads[served]
                value = self.ppu_words.get(word)
                ctx.set(self.dut.bus_rdata.valid, 1)
                ctx.set(self.dut.bus_rdata.payload,
                        {"data": value or 0, "error": int(value is None), "tag": tag})
                await ctx.tick().until(self.dut.bus_rdata.ready)
                ctx.set(self.dut.bus_rdata.valid, 0)
                served += 1

    async def control(self, ctx, cmd, addr, data=0, *, flags=ACK):
        """Send one control request and return the parsed response (a dict)."""
        self.seq += 1
        before = len(self.tx_frames)
        await drive_frames(ctx, self.dut.rx, [control_frame(cmd, addr, data, flags=flags,
                                                            seq=self.seq)])
        for _ in range(300):
            if len(self.tx_frames) > before:
                break
            await ctx.tick()
        assert len(self.tx_frames) == before + 1, "no control reply"
        f = parse_frame(self.tx_frames[-1])
        assert (f.eth["dst"], f.eth["src"]) == (HOST_MAC, QSC_MAC)
        assert (f.ip["dst"], f.ip["src"], f.ip_checksum_ok) == (HOST_IP, QSC_IP, True)
        assert (f.udp["dst_port"], f.udp["src_port"]) == (HOST_PORT, 8192)
        assert f.control["seq"] == self.seq and f.control["addr"] == addr
        return f.control

    async def read(self, ctx, addr):
        r = await self.control(ctx, Command.RD_DWORD, addr)
        assert r["status"] == Status.OK
        return r["value"]

    async def read_counter(self, ctx, name):
        """Counter ``name`` once every strobe so far shows in it (within COUNTER_LAG_CYCLES)."""
        await self.settle(ctx, COUNTER_LAG_CYCLES)
        return await self.read(ctx, counter_addr(name))

    async def write(self, ctx, addr, value):
        r = await self.control(ctx, Command.WR_DWORD, addr, value)
        assert r["status"] == Status.OK

    async def settle(self, ctx, cycles=60):
        for _ in range(cycles):
            await ctx.tick()

    def run(self, testbench):
        """Run ``testbench(ctx, self)`` from the core's initial state (a bench runs once)."""
        async def main(ctx):
            await testbench(ctx, self)

        self.rsim.run(main, self.bus.run, self.tx_sink, self.responder)


IMEM0 = ppu_base(0) + IMEM_OFFSET


def test_end_to_end():
    bench = CoreBench()
    data = bytes(range(40))
    mailbox1 = ppu_base(1) + MAILBOX_OFFSET

    async def tb(ctx, b):
        # configuration over the control plane, registers read back
        await b.write(ctx, qp_reg(0, "IMEM_RKEY"), IMEM_RKEY)
        await open_rx(b.write, ctx, qps=range(PARAMS.num_ppus))
        assert await b.read(ctx, qp_reg(0, "IMEM_RKEY")) == IMEM_RKEY
        assert await b.read(ctx, qp_reg(1, "QSC_QPN")) == PARAMS.qpn_base + 1
        # an RDMA WRITE_WITH_IMMEDIATE: data, then the TAIL commit
        await drive_frames(ctx, b.dut.rx, [write_frame(IMEM0 + 0x40, data, IMEM_RKEY, imm=9,
                                                       psn=0)])
        await b.settle(ctx)
        assert b.bus.items == expected_writes(IMEM0 + 0x40, data) + [
            tail_write(ppu_reg(0, "TAIL"), 9)]
        # a bad ICRC, a wrong R_Key and an out-of-range VA: dropped, counted, nothing on the bus
        n = len(b.bus.items)
        await drive_frames(ctx, b.dut.rx, [
            write_frame(IMEM0, data, IMEM_RKEY, psn=1, bad_icrc=True),
            write_frame(IMEM0, data, IMEM_RKEY ^ 1, psn=1),
            write_frame(IMEM0 + PARAMS.imem_depth * 16 - 32, data, IMEM_RKEY, psn=1),
        ])
        await b.settle(ctx)
        assert len(b.bus.items) == n
        assert await b.read_counter(ctx, "DROP_ICRC") == 1
        assert await b.read_counter(ctx, "DROP_RKEY") == 1
        assert await b.read_counter(ctx, "DROP_VA") == 1
        assert await b.read_counter(ctx, "RX_ROCE_ACCEPTED") == 1
        assert await b.read(ctx, qp_reg(0, "RX_EPSN")) == 1
        # a SEND_ONLY response to PPU 1's mailbox
        await drive_frames(ctx, b.dut.rx, [send_frame(data[:24], dest_qp=PARAMS.qpn_base + 1)])
        await b.settle(ctx)
        assert b.bus.items[n:] == expected_writes(mailbox1, data[:24]) + [
            mailbox_commit(mailbox1, 24)]
        assert await b.read_counter(ctx, "RX_RPC_RESPONSES") == 1
        # a PPU register through the bus: WRITE, then a READ answered by the cluster model
        n = len(b.bus.items)
        await b.write(ctx, ppu_reg(1, "START_TIME_HI"), 0x77)
        b.ppu_words[ppu_reg(1, "STATUS") >> 3] = 0x0000_0003_0000_0000
        assert await b.read(ctx, ppu_reg(1, "STATUS")) == 3
        r = await b.control(ctx, Command.RD_DWORD, ppu_reg(1, "PC") + 0x1000)
        assert r["status"] == Status.BAD_ADDRESS
        assert b.bus.items[n:] == [
            (BusOp.WRITE, ppu_reg(1, "START_TIME_HI") >> 3, 0xF0, 0x77 << 32 | 0x77),
            (BusOp.READ, ppu_reg(1, "STATUS") >> 3, 0xF0, 1),        # data: the READ's tag
            (BusOp.READ, (ppu_reg(1, "PC") + 0x1000) >> 3, 0x0F, 2),
        ]
        # replies leave as frames and are counted
        sent = len(b.tx_frames)
        assert await b.read_counter(ctx, "TX_FRAMES") == sent
        # the reading request is counted in the cycle it is read: it sees the ones before it
        assert await b.read_counter(ctx, "RX_CONTROL") == b.seq - 1

    bench.run(tb)


def test_call_request_becomes_rpc_frame():
    bench = CoreBench()

    async def tb(ctx, b):
        await b.write(ctx, qp_reg(1, "PEER_MAC_HI"), HOST_MAC >> 32)
        await b.write(ctx, qp_reg(1, "PEER_MAC_LO"), HOST_MAC & 0xFFFF_FFFF)
        await b.write(ctx, qp_reg(1, "PEER_IP"), HOST_IP)
        await b.write(ctx, qp_reg(1, "HOST_QPN"), 0x4321)
        await b.write(ctx, qp_reg(1, "HOST_RKEY"), 0x5555)
        await b.write(ctx, qp_reg(1, "RING_VA_LO"), 0x10000)
        before = len(b.tx_frames)
        ctx.set(b.dut.call_req.valid, 1)
        ctx.set(b.dut.call_req.payload, {"ppu": 1, "function_id": 0xF00D, "request_id": 77,
                                         "arg_len": 4, "args": 0x04030201})
        await ctx.tick().until(b.dut.call_req.ready)
        ctx.set(b.dut.call_req.valid, 0)
        await b.settle(ctx, 60)
        assert len(b.tx_frames) == before + 1
        f = parse_frame(b.tx_frames[-1])
        assert f.icrc_ok and f.bth["opcode"] == Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE
        assert f.bth["dest_qp"] == 0x4321 and f.reth["r_key"] == 0x5555
        assert f.reth["va"] == 0x10000 and split_slot_immediate(f.immdt["imm"]) == (0, 0)
        req = Request.unpack(f.payload)
        assert (req.function_id, req.request_id, req.payload) == (0xF00D, 77, bytes([1, 2, 3, 4]))
        assert await b.read_counter(ctx, "TX_RPC_REQUESTS") == 1
        assert await b.read(ctx, qp_reg(1, "TX_PSN")) == 1
        # counted on PPU 1's own QP alone
        assert [await b.read(ctx, qp_reg(q, "TX_PACKETS")) for q in range(4)] == [0, 1, 0, 0]

    bench.run(tb)


def _runs(items, op_filter):
    """Indices of the commands matching ``op_filter``, to check contiguity."""
    return [i for i, c in enumerate(items) if op_filter(c)]


def test_packet_and_control_commands_never_interleave():
    pattern = [1, 0, 0, 1, 0, 1, 1, 0, 0, 0]
    bench = CoreBench(bus_ready=lambda c: pattern[c % len(pattern)])
    big = bytes(i & 0xFF for i in range(256))
    reg = ppu_reg(0, "START_TIME_LO")

    async def tb(ctx, b):
        await b.write(ctx, qp_reg(0, "IMEM_RKEY"), IMEM_RKEY)
        await open_rx(b.write, ctx, qps=range(PARAMS.num_ppus))
        n = len(b.bus.items)
        # the control write arrives right behind the packet, and again right before another one
        b.seq += 1
        await drive_frames(ctx, b.dut.rx, [
            write_frame(IMEM0, big, IMEM_RKEY),
            control_frame(Command.WR_DWORD, reg, 1, seq=b.seq),
            write_frame(IMEM0 + 0x400, big, IMEM_RKEY),
        ])
        b.seq += 1
        await drive_frames(ctx, b.dut.rx, [
            control_frame(Command.WR_DWORD, reg, 2, seq=b.seq),
            write_frame(IMEM0 + 0x800, big, IMEM_RKEY),
        ])
        await b.settle(ctx, 400)
        items = b.bus.items[n:]
        ctrl = [(BusOp.WRITE, reg >> 3, 0x0F, v | v << 32) for v in (1, 2)]
        packets = [expected_writes(IMEM0 + off, big) for off in (0, 0x400, 0x800)]
        assert sorted(items, key=repr) == sorted(sum(packets, []) + ctrl, key=repr)
        for p in packets:
            start = items.index(p[0])
            assert items[start:start + len(p)] == p, "a packet's commands were interleaved"
        assert items.index(ctrl[0]) < items.index(ctrl[1])

    bench.run(tb)


def test_arbiter_alternates_and_holds():
    dut = BusArbiter()
    sink = StreamSink(dut.bus_cmd)
    seen = []

    async def tb(ctx):
        # rx holds the grant for a 3-command packet although ctrl waits
        ctx.set(dut.rx_busy, 1)
        ctx.set(dut.ctrl_busy, 1)
        ctx.set(dut.ctrl_cmd.valid, 1)
        ctx.set(dut.ctrl_cmd.payload, {"op": BusOp.WRITE, "word_addr": 99})
        for i in range(3):
            ctx.set(dut.rx_cmd.valid, 1)
            ctx.set(dut.rx_cmd.payload, {"op": BusOp.WRITE, "word_addr": i})
            await ctx.tick()
            assert not ctx.get(dut.ctrl_cmd.ready)
        ctx.set(dut.rx_cmd.valid, 0)
        ctx.set(dut.rx_busy, 0)
        await ctx.tick().until(dut.ctrl_cmd.ready)
        ctx.set(dut.ctrl_cmd.valid, 0)
        ctx.set(dut.ctrl_busy, 0)
        await ctx.tick()
        seen.extend(sink.items)

    sim = Simulator(dut)
    sim.add_clock(6.4e-9)
    sim.add_testbench(tb)
    sim.add_testbench(sink.run, background=True)
    sim.run()
    assert [c[1] for c in seen] == [0, 1, 2, 99]


def test_conversion_names_the_ports():
    """The core converts to RTLIL with its ports named (Amaranth's own back end: Yosys's Verilog
    of the whole top is what the system tests and ``qlink build --verilog`` make)."""
    core = NetworkCore(QSCParams(num_ppus=2))
    text = rtlil.convert(core, name="network_core")
    assert "module \\network_core" in text
    for port in ("rx__valid", "rx__payload", "tx__ready", "bus_cmd__payload", "bus_rdata__valid",
                 "call_req__ready", "clk", "rst"):
        assert port in text, port


# -- WR_BLOCK and RD_BLOCK, serialized as the Holoscan Sensor Bridge host does ------------------


async def _block(b, ctx, cmd, pairs, *, flags=ACK, wait=4000):
    """Send a block request (flags: the HSB host's ACK_REQUEST) and return the parsed response."""
    b.seq += 1
    before = len(b.tx_frames)
    await drive_frames(ctx, b.dut.rx, [block_frame(cmd, pairs, flags=flags, seq=b.seq)])
    for _ in range(wait):
        if len(b.tx_frames) > before:
            break
        await ctx.tick()
    assert len(b.tx_frames) == before + 1, "no control reply"
    frame = b.tx_frames[-1]
    f = parse_frame(frame)
    assert (f.ip["dst"], f.ip_checksum_ok, f.udp["dst_port"]) == (HOST_IP, True, HOST_PORT)
    assert f.control["seq"] == b.seq and f.control["cmd"] == cmd | 0x80
    # the length as HSB's RTL makes it: 6 + 8 n + 2 payload bytes, at least 18
    n = len(f.control["pairs"])
    assert f.udp["length"] == 8 + max(18, 6 + 8 * n + 2)
    assert len(frame) == max(60, 42 + 6 + 8 * n + 2)
    return f.control


def test_write_block_and_read_block():
    bench = CoreBench()
    scratch = global_reg("SCRATCH")
    regs = [qp_reg(0, "IMEM_RKEY"), qp_reg(0, "ENV_RKEY"), qp_reg(1, "IMEM_RKEY")]

    async def tb(ctx, b):
        # one WR_BLOCK: a global register, QP registers, a PPU register through the bus
        writes = [(scratch, 0x1234_5678), *((a, 0xA000 + i) for i, a in enumerate(regs)),
                  (ppu_reg(1, "START_TIME_HI"), 0x77)]
        n = len(b.bus.items)
        r = await _block(b, ctx, Command.WR_BLOCK, writes)
        assert (r["status"], r["latched_seq"]) == (Status.OK, b.seq)
        assert r["pairs"] == [(a, 0) for a, _ in writes]        # write replies carry value 0
        assert b.bus.items[n:] == [
            (BusOp.WRITE, ppu_reg(1, "START_TIME_HI") >> 3, 0xF0, 0x77 << 32 | 0x77)]
        for a, v in writes[:-1]:
            assert await b.read(ctx, a) == v
        # one RD_BLOCK of the same registers and a PPU register answered by the cluster model
        b.ppu_words[ppu_reg(1, "STATUS") >> 3] = 0x0000_0003_0000_0000
        reads = [a for a, _ in writes[:-1]] + [ppu_reg(1, "STATUS")]
        r = await _block(b, ctx, Command.RD_BLOCK, [(a, 0) for a in reads])
        assert r["status"] == Status.OK
        assert r["pairs"] == [*((a, v) for a, v in writes[:-1]), (ppu_reg(1, "STATUS"), 3)]
        # a one-pair block is padded to 18 bytes like a DWORD response
        r = await _block(b, ctx, Command.RD_BLOCK, [(scratch, 0)])
        assert r["pairs"] == [(scratch, 0x1234_5678)]
        assert await b.read_counter(ctx, "RX_CONTROL") == b.seq - 1

    bench.run(tb)


def test_block_stops_at_an_address_error_and_restores_the_latch():
    bench = CoreBench()
    scratch = global_reg("SCRATCH")
    rkey = qp_reg(0, "IMEM_RKEY")
    bad = ppu_reg(1, "PC") + 0x1000            # in PPU 1's window, no register: a bus error

    async def tb(ctx, b):
        await b.write(ctx, scratch, 1)
        latched = b.seq
        r = await _block(b, ctx, Command.WR_BLOCK, [(scratch, 5), (0x7000_0000, 6), (rkey, 7)])
        # HSB's RTL: the pairs up to the failing one, status BAD_ADDRESS, the latch reverted
        assert r["status"] == Status.BAD_ADDRESS and r["latched_seq"] == latched
        assert r["pairs"] == [(scratch, 0), (0x7000_0000, 0)]
        assert await b.read(ctx, scratch) == 5 and await b.read(ctx, rkey) == 0
        # a READ's bus error stops a RD_BLOCK the same way
        latched = b.seq
        r = await _block(b, ctx, Command.RD_BLOCK, [(scratch, 0), (bad, 0), (rkey, 0)])
        assert r["status"] == Status.BAD_ADDRESS and r["latched_seq"] == latched
        assert r["pairs"] == [(scratch, 5), (bad, 0)]
        # header errors answer before any pair: one pair, value 0, nothing done
        r = await _block(b, ctx, Command.WR_BLOCK, [(scratch, 9), (rkey, 9)], flags=ACK | 0x40)
        assert (r["status"], r["pairs"]) == (Status.BAD_FLAGS, [(scratch, 0)])
        assert await b.read(ctx, scratch) == 5

    bench.run(tb)


def test_largest_block_and_pair_ring_overflow():
    bench = CoreBench()
    scratch = global_reg("SCRATCH")
    big = [(scratch, 0)] * BLOCK_MAX_PAIRS

    async def tb(ctx, b):
        await b.write(ctx, scratch, 0x5A)
        r = await _block(b, ctx, Command.RD_BLOCK, big)
        assert r["status"] == Status.OK and r["pairs"] == [(scratch, 0x5A)] * BLOCK_MAX_PAIRS
        # one pair more than the HSB host's largest packet: dropped (UDP length), no reply
        sent = len(b.tx_frames)
        await drive_frames(ctx, b.dut.rx, [block_frame(Command.RD_BLOCK, big + [(scratch, 0)],
                                                       flags=ACK, seq=b.seq + 1)])
        await b.settle(ctx, 400)
        assert len(b.tx_frames) == sent
        assert await b.read_counter(ctx, "DROP_UDP") == 1
        # three largest blocks back to back: the pair ring holds two (the control plane is
        # still on the first), the third is dropped whole and counted
        frames = [block_frame(Command.RD_BLOCK, big, flags=ACK, seq=b.seq + 1 + k)
                  for k in range(3)]
        sent = len(b.tx_frames)
        await drive_frames(ctx, b.dut.rx, frames)
        for _ in range(6000):           # two replies, about 900 cycles each
            if len(b.tx_frames) == sent + 2:
                break
            await ctx.tick()
        await b.settle(ctx, 1500)       # and no third (it would take about 900 cycles more)
        assert len(b.tx_frames) == sent + 2
        assert await b.read_counter(ctx, "DROP_OVERFLOW") == 1
        b.seq += 2
        # the ring drained: a block is taken again
        r = await _block(b, ctx, Command.RD_BLOCK, big[:3])
        assert r["status"] == Status.OK and r["pairs"] == [(scratch, 0x5A)] * 3

    bench.run(tb)
