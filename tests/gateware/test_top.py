"""QSCTop in amaranth.sim: reset and clock robustness of the ``rti`` <-> ``dtd`` crossings.

The ``rti`` clock runs throughout; the ``dtd`` clock is driven by a process that the tests stop
and restart, and each domain's reset is asserted independently. Control-plane requests go in as
frames on ``rx`` and their replies are parsed from ``tx``: every request must be answered within
the documented bound, with PPU_TIMEOUT when the PPU side cannot answer, and the answers after the
PPU side is back must be the right ones.
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest
import simreuse
from amaranth.hdl import ClockDomain, Elaboratable, Module

from openqlink.gateware.net.control import PPU_TIMEOUT_CYCLES
from openqlink.gateware.net.core import NetworkCore
from openqlink.gateware.top import BUS_DROP_CYCLES, QSCTop
from openqlink.memory_map import (
    IMEM_OFFSET,
    PPU_REGISTERS,
    QSCParams,
    counter_addr,
    global_reg,
    ppu_base,
    ppu_reg,
    qp_reg,
)
from openqlink.wire.control import Command, Flags, Status
from openqlink.wire.packet import parse_frame

# The frame builders of the network-core tests (tests/gateware/net/netbench.py).
_spec = importlib.util.spec_from_file_location(
    "netbench", Path(__file__).resolve().parent / "net" / "netbench.py")
netbench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(netbench)
beats, control_frame, write_frame = netbench.beats, netbench.control_frame, netbench.write_frame

PARAMS = QSCParams(imem_depth=64, env_depth=64)
RTI_PERIOD = PARAMS.rti_period_ns * 1e-9
DTD_PERIOD = PARAMS.dtd_period_ns * 1e-9
ACK = int(Flags.ACK_REQUEST)
IMEM_RKEY = 0x1234_5678

#: rti cycles from a request's last beat on ``rx`` to its reply's last beat on ``tx`` beyond the
#: control plane's own bound: receive pipeline and queue, reply frame build and 8 beats out.
FRAME_SLACK = 48
BOUND = PPU_TIMEOUT_CYCLES + 2 + FRAME_SLACK

CALL_TIMEOUT = ppu_reg(0, "CALL_TIMEOUT_CYCLES")
CALL_TIMEOUT_RESET = next(r.reset for r in PPU_REGISTERS if r.name == "CALL_TIMEOUT_CYCLES")
START_LO = ppu_reg(0, "START_TIME_LO")
START_HI = ppu_reg(0, "START_TIME_HI")


class TopBench(Elaboratable):
    """A QSCTop with both domains defined here, a stoppable ``dtd`` clock and a frame port."""

    def __init__(self, params: QSCParams = PARAMS):
        self.top = QSCTop(params)
        self.cd_rti = ClockDomain("rti")
        self.cd_dtd = ClockDomain("dtd")
        self.m = Module()
        self.m.domains += [self.cd_rti, self.cd_dtd]
        self.m.submodules.top = self.top
        self.dtd_running = True
        self.tx_frames: list[bytes] = []
        self.seq = 0

    def elaborate(self, platform):
        return self.m

    # --- clocks and resets --------------------------------------------------------------------

    async def dtd_clock(self, ctx):
        clk = self.cd_dtd.clk
        while True:
            await ctx.delay(DTD_PERIOD / 2)
            if self.dtd_running:
                ctx.set(clk, ~ctx.get(clk))

    async def ticks(self, ctx, n: int):
        for _ in range(n):
            await ctx.tick("rti")

    async def pulse_rst(self, ctx, cd: ClockDomain, rti_cycles: int = 4):
        ctx.set(cd.rst, 1)
        await self.ticks(ctx, rti_cycles)
        ctx.set(cd.rst, 0)

    # --- frames -------------------------------------------------------------------------------

    async def tx_sink(self, ctx):
        tx = self.top.tx
        ctx.set(tx.ready, 1)
        frame = b""
        while True:
            _, _, valid, beat = await ctx.tick("rti").sample(tx.valid, tx.payload)
            if valid:
                if beat.first:
                    frame = b""
                nbytes = bin(int(beat.keep)).count("1")
                frame += int(beat.data).to_bytes(8, "little")[:nbytes]
                if beat.last:
                    self.tx_frames.append(frame)

    async def send(self, ctx, frame: bytes):
        rx = self.top.rx
        for b in beats(frame):
            ctx.set(rx.valid, 1)
            ctx.set(rx.payload, b)
            await ctx.tick("rti")
        ctx.set(rx.valid, 0)

    async def control(self, ctx, cmd: Command, addr: int, data: int = 0, *,
                      bound: int = BOUND) -> tuple[dict, int]:
        """One request; its reply (checked to be this request's) and the rti cycles it took."""
        self.seq = (self.seq + 1) & 0xFFFF
        before = len(self.tx_frames)
        await self.send(ctx, control_frame(cmd, addr, data, flags=ACK, seq=self.seq))
        cycles = 0
        while len(self.tx_frames) == before and cycles < bound:
            await ctx.tick("rti")
            cycles += 1
        assert len(self.tx_frames) > before, \
            f"{cmd.name} {addr:#010x}: no reply within {bound} rti cycles"
        assert len(self.tx_frames) == before + 1
        reply = parse_frame(self.tx_frames[-1]).control
        assert (reply["seq"], reply["addr"], reply["cmd"]) == (self.seq, addr, cmd | 0x80)
        return reply, cycles

    async def read(self, ctx, addr: int) -> int:
        reply, _ = await self.control(ctx, Command.RD_DWORD, addr)
        assert reply["status"] == Status.OK, f"{addr:#010x}: status {reply['status']:#x}"
        return reply["value"]

    async def write(self, ctx, addr: int, value: int):
        reply, _ = await self.control(ctx, Command.WR_DWORD, addr, value)
        assert reply["status"] == Status.OK, f"{addr:#010x}: status {reply['status']:#x}"

    async def expect_timeout(self, ctx, cmd: Command, addr: int, data: int = 0) -> int:
        reply, cycles = await self.control(ctx, cmd, addr, data)
        assert reply["status"] == Status.PPU_TIMEOUT, f"status {reply['status']:#x}"
        assert reply["value"] == 0
        return cycles

    async def check_ppu_answers(self, ctx, start_lo: int):
        """Reads of three PPU registers with distinct values come back right, in order."""
        assert await self.read(ctx, CALL_TIMEOUT) == CALL_TIMEOUT_RESET
        assert await self.read(ctx, START_LO) == start_lo
        assert await self.read(ctx, START_HI) == 0x5A5A
        assert await self.read(ctx, CALL_TIMEOUT) == CALL_TIMEOUT_RESET

    def run(self, testbench):
        """Run ``testbench(ctx, bench)`` from reset, in this process's one simulator of the top
        (``simreuse``: compiling the top for simulation takes seconds)."""
        self.dtd_running = True
        self.tx_frames = []
        self.seq = 0

        async def main(ctx):
            await self.ticks(ctx, 20)       # crossings out of reset
            await testbench(ctx, self)

        self._rsim.run(main, self.dtd_clock, self.tx_sink)

    @classmethod
    def shared(cls) -> TopBench:
        """The bench of :data:`PARAMS` that this process's tests share."""
        rsim = simreuse.shared("top", lambda: cls(), clocks={"rti": RTI_PERIOD}, background=2)
        bench = rsim.dut
        bench._rsim = rsim
        return bench


def test_read_while_dtd_has_no_clock():
    async def tb(ctx, b: TopBench):
        await b.write(ctx, START_HI, 0x5A5A)
        await b.write(ctx, START_LO, 111)
        await b.check_ppu_answers(ctx, 111)
        b.dtd_running = False
        cycles = await b.expect_timeout(ctx, Command.RD_DWORD, CALL_TIMEOUT)
        assert cycles > PPU_TIMEOUT_CYCLES          # it did wait for the PPU side
        # the control plane is not wedged: local registers, then the PPU side again
        await b.write(ctx, global_reg("SCRATCH"), 0xC0FFEE)
        assert await b.read(ctx, global_reg("SCRATCH")) == 0xC0FFEE
        await b.expect_timeout(ctx, Command.RD_DWORD, START_LO)
        b.dtd_running = True
        await b.ticks(ctx, 20)
        # the two READs given up on are answered late by now: their answers are discarded
        await b.check_ppu_answers(ctx, 111)
        await b.write(ctx, START_LO, 222)
        await b.check_ppu_answers(ctx, 222)

    TopBench.shared().run(tb)


def test_dtd_reset_during_read():
    outcomes = set()

    async def tb(ctx, b: TopBench):
        # offsets 0..8: the READ is done after the reset; about 10..16: lost in it (timed
        # out); 18 and up: done before it (every third covers the three)
        for offset in range(0, 24, 3):
            await b.write(ctx, START_LO, offset + 1)
            b.seq = (b.seq + 1) & 0xFFFF
            await b.send(ctx, control_frame(Command.RD_DWORD, START_LO, flags=ACK, seq=b.seq))
            before = len(b.tx_frames)
            await b.ticks(ctx, offset)
            await b.pulse_rst(ctx, b.cd_dtd)
            for _ in range(BOUND):
                if len(b.tx_frames) > before:
                    break
                await ctx.tick("rti")
            assert len(b.tx_frames) == before + 1, f"offset {offset}: no reply"
            reply = parse_frame(b.tx_frames[-1]).control
            assert reply["seq"] == b.seq
            # read before the reset, read after it (reset value 0), or given up on
            assert (reply["status"], reply["value"]) in (
                (Status.OK, offset + 1), (Status.OK, 0), (Status.PPU_TIMEOUT, 0)), \
                f"offset {offset}: {reply}"
            outcomes.add((reply["status"], reply["value"] != 0))
            await b.ticks(ctx, 20)
            # the PPU was reset: its registers are back to their reset values, and a late
            # answer to the READ cut by the reset does not answer these (the second register's
            # value differs from both the first's and the cut READ's)
            assert await b.read(ctx, START_LO) == 0
            assert await b.read(ctx, CALL_TIMEOUT) == CALL_TIMEOUT_RESET
        # writes and reads of the PPU side work after the last reset
        await b.write(ctx, START_HI, 0x5A5A)
        await b.write(ctx, START_LO, 7)
        await b.check_ppu_answers(ctx, 7)

    TopBench.shared().run(tb)
    # the offsets cover a READ done before the reset, one lost in it and one done after it
    assert outcomes == {(Status.OK, True), (Status.PPU_TIMEOUT, False), (Status.OK, False)}


def test_rti_reset_during_read():
    async def tb(ctx, b: TopBench):
        await b.write(ctx, START_HI, 0x5A5A)
        await b.write(ctx, START_LO, 0x0BAD)
        for offset in range(0, 24, 3):
            b.seq = (b.seq + 1) & 0xFFFF
            await b.send(ctx, control_frame(Command.RD_DWORD, START_LO, flags=ACK, seq=b.seq))
            await b.ticks(ctx, offset)
            await b.pulse_rst(ctx, b.cd_rti)
            await b.ticks(ctx, 20)
            b.tx_frames.clear()
            # the network core is back at reset; the PPU kept its registers. A late answer to
            # the READ cut by the reset must not answer the reads that follow.
            await b.check_ppu_answers(ctx, 0x0BAD)
            assert await b.read(ctx, START_HI) == 0x5A5A

    TopBench.shared().run(tb)


def test_dtd_held_in_reset_then_released():
    async def tb(ctx, b: TopBench):
        ctx.set(b.cd_dtd.rst, 1)
        await b.ticks(ctx, 50)
        # the crossing refuses commands, so after BUS_DROP_CYCLES the guard drops the control
        # plane's command, which is answered at once; the guard then keeps dropping
        cycles = await b.expect_timeout(ctx, Command.RD_DWORD, CALL_TIMEOUT)
        assert BUS_DROP_CYCLES < cycles < PPU_TIMEOUT_CYCLES
        assert await b.expect_timeout(ctx, Command.WR_DWORD, START_LO, 99) < BUS_DROP_CYCLES
        assert await b.expect_timeout(ctx, Command.WR_DWORD, START_HI, 98) < BUS_DROP_CYCLES
        assert await b.read(ctx, counter_addr("DROP_BUS")) >= 1
        assert await b.read(ctx, global_reg("NUM_PPUS")) == 1
        ctx.set(b.cd_dtd.rst, 0)
        await b.ticks(ctx, 20)
        # the writes answered PPU_TIMEOUT were not executed
        assert await b.read(ctx, START_LO) == 0
        assert await b.read(ctx, START_HI) == 0
        await b.write(ctx, START_HI, 0x5A5A)
        await b.write(ctx, START_LO, 5)
        await b.check_ppu_answers(ctx, 5)

    TopBench.shared().run(tb)


def test_writes_and_commands_while_dtd_stopped():
    imem = ppu_base(0) + IMEM_OFFSET
    payload = bytes(range(256)) * 4                 # 1 KiB: 128 bus commands a frame
    buffer_bytes = inspect.signature(NetworkCore).parameters["rx_buffer_bytes"].default
    frames = buffer_bytes // len(payload) + 4       # more than the receive buffer holds

    async def tb(ctx, b: TopBench):
        await b.write(ctx, qp_reg(0, "IMEM_RKEY"), IMEM_RKEY)
        await netbench.open_rx(b.write, ctx)
        await b.write(ctx, START_HI, 0x5A5A)
        b.dtd_running = False
        # RDMA WRITEs into a PPU whose clock is stopped: more than the receive buffer holds
        for _ in range(frames):
            await b.send(ctx, write_frame(imem, payload, IMEM_RKEY))
            await b.ticks(ctx, 8)
        await b.ticks(ctx, BUS_DROP_CYCLES + 200)
        assert await b.read(ctx, counter_addr("RX_ROCE_ACCEPTED")) == frames
        assert await b.read(ctx, counter_addr("DROP_OVERFLOW")) == 0
        dropped = await b.read(ctx, counter_addr("DROP_BUS"))
        assert frames * 128 - 16 <= dropped <= frames * 128   # all but what the crossing holds
        # control-plane writes are refused (nothing written), within the bound
        for value in (31, 32):
            await b.expect_timeout(ctx, Command.WR_DWORD, START_LO, value)
        assert await b.read(ctx, global_reg("SCRATCH")) == 0
        b.dtd_running = True
        await b.ticks(ctx, 60)
        assert await b.read(ctx, START_LO) == 0
        await b.write(ctx, START_LO, 33)
        await b.check_ppu_answers(ctx, 33)
        # the receive path delivers again
        before = await b.read(ctx, counter_addr("DROP_BUS"))
        await b.send(ctx, write_frame(imem + 8, b"\x11" * 8, IMEM_RKEY))
        await b.ticks(ctx, 40)
        assert await b.read(ctx, counter_addr("DROP_BUS")) == before
        assert await b.read(ctx, counter_addr("RX_ROCE_ACCEPTED")) == frames + 1

    TopBench.shared().run(tb)


def test_channel_counts_come_from_the_params():
    """``drives_per_ppu``, ``readouts_per_ppu`` and ``markers_per_ppu`` size each PPU's physical
    interface (default 1, 1, 4); a cluster given counts of its own keeps them."""
    from openqlink.gateware.ppu.cluster import PPUCluster

    default = QSCTop(QSCParams())
    assert [len(getattr(default.ptd[0], port)) for port in ("dac_active", "ro_window", "marker")] \
        == [1, 1, 4]
    params = QSCParams(num_ppus=2, drives_per_ppu=3, readouts_per_ppu=2, markers_per_ppu=5)
    for ptd in (QSCTop(params).ptd[1], PPUCluster(params).ptd[1]):
        assert [len(ptd.dac_active), len(ptd.ro_window), len(ptd.marker)] == [3, 2, 5]
    own = PPUCluster(params, n_drive=1, n_readout=4, n_marker=2).ptd[0]
    assert [len(own.dac_active), len(own.ro_window), len(own.marker)] == [1, 4, 2]
    for name in ("drives_per_ppu", "readouts_per_ppu"):
        for bad in (0, 17):
            with pytest.raises(ValueError, match=f"{name} must be 1..16"):
                QSCParams(**{name: bad})


# The instruction builders of the PPU tests (tests/gateware/ppu/ppu_bench.py).
_spec = importlib.util.spec_from_file_location(
    "ppu_bench", Path(__file__).resolve().parent / "ppu" / "ppu_bench.py")
ppu_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ppu_bench)


def _udp_response_frame(payload: bytes, dst_port: int, src_port: int) -> bytes:
    """A UDP datagram from the host's socket to the QSC as Linux sends it (scapy computes its
    UDP checksum)."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    def ip(v: int) -> str:
        return ".".join(str(b) for b in v.to_bytes(4, "big"))

    frame = bytes(Ether(dst=netbench.QSC_MAC.to_bytes(6, "big").hex(":"),
                        src=netbench.HOST_MAC.to_bytes(6, "big").hex(":")) /
                  IP(src=ip(netbench.HOST_IP), dst=ip(netbench.QSC_IP)) /
                  UDP(sport=src_port, dport=dst_port) / payload)
    assert frame[40:42] != bytes(2)                  # a checksum, not 0
    return frame


def test_a_call_in_udp_mode_completes_with_the_result():
    """QP 0 in UDP mode (CUDA-Q realtime's udp bridge): the program is uploaded and triggered
    as before (RDMA WRITE_WITH_IMMEDIATE, control plane), its CALL leaves as one UDP datagram
    (RPCHeader and argument, UDP checksum 0, from UDP_CALL_PORT_BASE to PEER_UDP_PORT), and the
    bridge's full 256-byte slot answer, with a Linux UDP checksum, completes the CALL: the
    result lands in r5 and r6 and the PPU is DONE."""
    from openqlink.isa.layout import PPUState, PPUStatus
    from openqlink.wire.ipv4 import ipv4_checksum
    from openqlink.wire.rpc import Request, Response, fnv1a32
    from openqlink.wire.udp import UDP_CALL_PORT_BASE

    peer_port = 47001
    fid = fnv1a32("decode")
    prog = [ppu_bench.set_(1, 0x5A), ppu_bench.call(5, 1, 8, fid, rd_hi=6), ppu_bench.end()]
    code = b"".join(word.to_bytes(16, "little") for word in prog)
    result = 0x1234_5678_9ABC_DEF0

    async def tb(ctx, b):
        for addr, value in [
                (qp_reg(0, "PEER_MAC_HI"), netbench.HOST_MAC >> 32),
                (qp_reg(0, "PEER_MAC_LO"), netbench.HOST_MAC & 0xFFFF_FFFF),
                (qp_reg(0, "PEER_IP"), netbench.HOST_IP),
                (qp_reg(0, "IMEM_RKEY"), IMEM_RKEY), (global_reg("RX_ENABLE"), 1),
                (qp_reg(0, "TRANSPORT"), 1), (qp_reg(0, "PEER_UDP_PORT"), peer_port),
                (qp_reg(0, "RESPONSE_BYTES"), 256)]:
            await b.write(ctx, addr, value)
        await b.send(ctx, write_frame(ppu_base(0) + IMEM_OFFSET, code, IMEM_RKEY,
                                      imm=len(prog)))
        await b.ticks(ctx, 40)
        now = await b.read(ctx, ppu_reg(0, "TIMELINE_LO"))
        await b.write(ctx, START_LO, now + 2000)
        await b.write(ctx, START_HI, 0)
        before = len(b.tx_frames)
        await b.write(ctx, ppu_reg(0, "TRIGGER"), len(prog))
        for _ in range(3000):
            if any(f[36:38] == peer_port.to_bytes(2, "big") for f in b.tx_frames[before:]):
                break
            await ctx.tick("rti")
        request, = [f for f in b.tx_frames[before:] if f[36:38] == peer_port.to_bytes(2, "big")]
        # the UDP-mode request, byte for byte
        req = Request.unpack(request[42:])
        assert (req.function_id, req.payload) == (fid, b"\x5a")
        assert len(request) == 14 + 20 + 8 + 24 + 1
        assert request[12:14] == b"\x08\x00" and ipv4_checksum(request[14:34]) == 0
        assert request[34:42] == (UDP_CALL_PORT_BASE.to_bytes(2, "big") +
                                  peer_port.to_bytes(2, "big") + (8 + 25).to_bytes(2, "big") +
                                  bytes(2))
        # the bridge's answer: one full slot, to the request's source port
        slot = Response(0, req.request_id, req.ptp_timestamp,
                        result.to_bytes(8, "little")).pack().ljust(256, b"\0")
        await b.send(ctx, _udp_response_frame(slot, UDP_CALL_PORT_BASE, peer_port))
        # (the core runs ahead of the timeline: the CALL leaves while the PPU waits for
        # START_TIME; it is DONE once the timeline passed it)
        for _ in range(200):
            state = PPUStatus.from_bits(await b.read(ctx, ppu_reg(0, "STATUS"))).state
            if state != PPUState.ARMED:
                break
        assert state == PPUState.DONE
        assert await b.read(ctx, ppu_reg(0, "R5")) == result & 0xFFFF_FFFF
        assert await b.read(ctx, ppu_reg(0, "R6")) == result >> 32
        assert await b.read(ctx, ppu_reg(0, "CALL_COUNT")) == 1
        assert await b.read(ctx, qp_reg(0, "TX_PSN")) == 0
        assert await b.read(ctx, qp_reg(0, "TX_PACKETS")) == 1
        assert await b.read(ctx, counter_addr("RX_RPC_RESPONSES")) == 1

    TopBench.shared().run(tb)
