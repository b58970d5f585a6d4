"""Receive path: latency from a WRITE's last beat to the bus, and the commit engine's beat
efficiency for back-to-back RDMA WRITEs at line rate (Amaranth simulation, deterministic).

The receiver (``gateware/net/rx.py``) with its register block, configured as a host's
``QSC.configure`` would (peer addresses, R_Keys, RX_ENABLE), takes frames as a 10 Gb/s MAC
gives them: 8 bytes a cycle, ``LINE_RATE_GAP_CYCLES`` (3) idle cycles between frames; the bus
is always ready. It prints, per WRITE size:

A WRITE longer than the path MTU (``--pmtu``, 1024 bytes by default, written to the QP's PMTU
register) is a UC message of FIRST, MIDDLE... and LAST packets, as the host package's
``UCQueuePair.write_frames`` sends it. Per WRITE size:

* latency: cycles (rti) from the cycle of a frame's last beat to its first bus command;
* beat efficiency: of the bus cycles from a packet's first command to its last, the fraction
  that carry one of its payload words, over all packets (1.00: no bubble inside a packet);
* bus occupancy: of the bus cycles from the first packet's first command to the last packet's
  last, the fraction that carry a payload word, beside the line-rate bound (payload words /
  (frame beats + gap), the most the wire delivers): at or above it, the commit engine keeps up
  with the MAC.

Usage: python benchmarks/rx_commit.py [--sizes 64 256 1024 4096] [--pmtu 1024] [--count 12]
[--json OUT]
"""

from __future__ import annotations

import argparse
import json

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator
from rich.console import Console
from rich.table import Table

from openqlink.gateware.bus import BusOp
from openqlink.gateware.net.regs import READ_LATENCY_CYCLES, NetRegisters
from openqlink.gateware.net.rx import RoCEReceiver
from openqlink.memory_map import IMEM_OFFSET, QSCParams, global_reg, ppu_base, qp_reg
from openqlink.roce import UCQueuePair
from openqlink.sim.runner import LINE_RATE_GAP_CYCLES
from openqlink.wire.ipv4 import ip_to_int
from openqlink.wire.roce import path_mtu_code

HOST_MAC = 0x02_00_00_00_00_65
HOST_IP = ip_to_int("192.168.0.101")
IMEM_RKEY = 0x1111_0001


class _Bench(wiring.Component):
    def __init__(self, params: QSCParams):
        self.rx = RoCEReceiver(params)
        self.regs = NetRegisters(params, num_inc_sources=1)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.rx = rx = self.rx
        m.submodules.regs = regs = self.regs
        m.d.comb += [rx.config.eq(regs.config), rx.qp.eq(regs.qp), regs.inc[0].eq(rx.count),
                     regs.qp_inc.eq(rx.qp_count),
                     regs.rx_epsn.eq(rx.epsn), rx.qp_reset.eq(regs.qp_reset)]
        return m


def _beats(frame: bytes) -> list[dict]:
    out = []
    for i in range(0, len(frame), 8):
        chunk = frame[i:i + 8]
        out.append(dict(data=int.from_bytes(chunk.ljust(8, b"\0"), "little"),
                        keep=(1 << len(chunk)) - 1, first=int(i == 0),
                        last=int(i + 8 >= len(frame)), error=0))
    return out


def measure(size_bytes: int, count: int, pmtu_bytes: int = 1024) -> dict:
    """Drive ``count`` WRITEs of ``size_bytes`` (a multiple of 8; a message of several packets
    when longer than ``pmtu_bytes``) back to back into PPU 0's instruction ring and return the
    latency and efficiency figures."""
    params = QSCParams()
    if size_bytes % 8 or size_bytes * count > params.imem_depth * 16:
        raise ValueError(f"{count} WRITEs of {size_bytes} bytes do not fit the ring")
    bench = _Bench(params)
    rx, regs = bench.rx, bench.regs
    qp = UCQueuePair(HOST_MAC, HOST_IP, 0x200, params.mac, params.ip, params.qpn_base,
                     pmtu_bytes=pmtu_bytes)
    frames = [frame for k in range(count) for frame in qp.write_frames(
        ppu_base(0) + IMEM_OFFSET + k * size_bytes, IMEM_RKEY,
        bytes((k + i) & 0xFF for i in range(size_bytes)))]
    packet_bytes = min(size_bytes, pmtu_bytes)
    out: dict = {}

    async def write_reg(ctx, addr: int, value: int) -> None:
        ctx.set(regs.port.addr, addr)
        for _ in range(READ_LATENCY_CYCLES - 1):
            await ctx.tick()
        ctx.set(regs.port.w_data, value)
        ctx.set(regs.port.w_en, 1)
        await ctx.tick()
        ctx.set(regs.port.w_en, 0)

    async def testbench(ctx):
        for addr, value in ((qp_reg(0, "PEER_MAC_HI"), HOST_MAC >> 32),
                            (qp_reg(0, "PEER_MAC_LO"), HOST_MAC & 0xFFFF_FFFF),
                            (qp_reg(0, "PEER_IP"), HOST_IP),
                            (qp_reg(0, "IMEM_RKEY"), IMEM_RKEY),
                            (qp_reg(0, "PMTU"), path_mtu_code(pmtu_bytes)),
                            (global_reg("RX_ENABLE"), 1)):
            await write_reg(ctx, addr, value)
        ctx.set(rx.bus_cmd.ready, 1)
        cycle = 0
        last_beat: list[int] = []
        writes: list[tuple[int, int]] = []       # (cycle, word address)

        def sample() -> None:
            if ctx.get(rx.bus_cmd.valid) and ctx.get(rx.bus_cmd.payload.op) == BusOp.WRITE:
                writes.append((cycle, ctx.get(rx.bus_cmd.payload.word_addr)))

        for frame in frames:
            for b in _beats(frame):
                ctx.set(rx.rx.valid, 1)
                ctx.set(rx.rx.payload, b)
                sample()
                await ctx.tick()
                cycle += 1
            last_beat.append(cycle - 1)
            ctx.set(rx.rx.valid, 0)
            for _ in range(LINE_RATE_GAP_CYCLES):
                sample()
                await ctx.tick()
                cycle += 1
        for _ in range(400):
            sample()
            await ctx.tick()
            cycle += 1
        words = packet_bytes // 8                # per packet
        if len(writes) != size_bytes // 8 * count:
            raise RuntimeError(f"{len(writes)} bus WRITEs, expected {size_bytes // 8 * count}")
        first_word = writes[0][1]
        packets: dict[int, list[int]] = {}
        for c, word in writes:
            packets.setdefault((word - first_word) // words, []).append(c)
        inside = sum(p[-1] - p[0] + 1 for p in packets.values())
        span = writes[-1][0] - writes[0][0] + 1
        frame_beats = -(-len(frames[0]) // 8)
        out.update(
            size_bytes=size_bytes, count=count, pmtu_bytes=pmtu_bytes,
            packets=len(frames) // count,
            latency_cycles=writes[0][0] - last_beat[0],
            efficiency=len(writes) / inside,
            occupancy=len(writes) / span,
            line_rate_bound=words / (frame_beats + LINE_RATE_GAP_CYCLES))

    sim = Simulator(bench)
    sim.add_clock(1 / params.rti_clk_hz)
    sim.add_testbench(testbench)
    sim.run()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--pmtu", type=int, default=1024, help="path MTU in bytes")
    parser.add_argument("--count", type=int, default=12,
                        help="WRITEs per size (fewer where the ring holds fewer)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    ring_bytes = QSCParams().imem_depth * 16
    rows = [measure(size, min(args.count, ring_bytes // size), args.pmtu)
            for size in args.sizes]
    table = Table(title=f"RDMA WRITEs back to back at line rate (PMTU {args.pmtu} B; rti "
                        "cycles; bus always ready)")
    for col in ("WRITE size", "packets", "WRITEs", "last beat -> first bus command",
                "beat efficiency", "bus occupancy", "line-rate bound"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['size_bytes']} B", str(r["packets"]), str(r["count"]),
                      f"{r['latency_cycles']} cyc",
                      f"{r['efficiency']:.3f}", f"{r['occupancy']:.3f}",
                      f"{r['line_rate_bound']:.3f}")
    Console().print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
