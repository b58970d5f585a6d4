"""openqlink.gateware.bram: a read port that behaves as Amaranth's synchronous read port and
that synthesis maps with nothing between the block RAM and its consumers."""

from __future__ import annotations

import random
import subprocess

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib.memory import Memory
from amaranth.sim import Simulator

from openqlink import build
from openqlink.gateware import bram


def _pair(width: int = 16, depth: int = 32):
    """Two equal memories: one read through ``bram.read_port``, one through Amaranth's own."""
    m = Module()
    ours = Memory(shape=unsigned(width), depth=depth, init=[], attrs={"no_rw_check": True})
    ref = Memory(shape=unsigned(width), depth=depth, init=[])
    m.submodules.ours, m.submodules.ref = ours, ref
    io = {"waddr": Signal(range(depth)), "wdata": Signal(width), "we": Signal(),
          "raddr": Signal(range(depth)), "ren": Signal()}
    r_ours = bram.read_port(m, ours, name="r")
    r_ref = ref.read_port()
    for mem in (ours, ref):
        w = mem.write_port()
        m.d.comb += [w.addr.eq(io["waddr"]), w.data.eq(io["wdata"]), w.en.eq(io["we"])]
    for r in (r_ours, r_ref):
        m.d.comb += [r.addr.eq(io["raddr"]), r.en.eq(io["ren"])]
    return m, io, r_ours, r_ref


def test_reads_as_amaranths_synchronous_port():
    """Random writes and reads, reads of the word being written included (read-first in
    simulation, as Amaranth's port), and reads disabled (the data holds): the two ports agree
    in every cycle."""
    m, io, ours, ref = _pair()
    rng = random.Random(11)

    async def bench(ctx):
        for cycle in range(2000):
            addr = rng.randrange(32)
            ctx.set(io["waddr"], addr if rng.random() < 0.3 else rng.randrange(32))
            ctx.set(io["raddr"], addr)
            ctx.set(io["wdata"], rng.getrandbits(16))
            ctx.set(io["we"], rng.random() < 0.5)
            ctx.set(io["ren"], rng.random() < 0.7)
            await ctx.tick()
            assert ctx.get(ours.data) == ctx.get(ref.data), f"cycle {cycle}"

    sim = Simulator(m)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()


def _luts_after_synthesis(tmp_path, make_port) -> dict[str, int]:
    yosys = build.find_tool("yosys")
    if yosys is None:
        pytest.skip("no Yosys (pip install 'openqlink[build]')")
    m = Module()
    mem = Memory(shape=unsigned(128), depth=512, init=[], attrs={"no_rw_check": True})
    m.submodules.mem = mem
    w = mem.write_port(granularity=8)
    waddr, wdata, we = Signal(9), Signal(128), Signal(16)
    m.d.comb += [w.addr.eq(waddr), w.data.eq(wdata), w.en.eq(we)]
    ports = [waddr, wdata, we]
    for k in range(2):
        r = make_port(m, mem, k)
        addr, en, load, q = Signal(9), Signal(), Signal(), Signal(128)
        m.d.comb += [r.addr.eq(addr), r.en.eq(en)]
        with m.If(load):
            m.d.sync += q.eq(r.data)            # a consumer register with an enable
        ports += [addr, en, load, q]
    (tmp_path / "t.il").write_text(rtlil.convert(m, ports=ports))
    subprocess.run([yosys, "-q", "-p", "read_rtlil t.il; synth_ecp5 -top top; "
                    "tee -q -o stat.txt stat"], cwd=tmp_path, check=True,
                   env=build.toolchain_env())
    cells = {}
    for line in (tmp_path / "stat.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            cells[parts[1]] = int(parts[0])
    return cells


def test_synthesis_puts_no_logic_after_the_block_ram(tmp_path):
    """A 512 x 128 memory with a byte-enable write port and two read ports into enabled
    consumer registers: the ports of ``bram.read_port`` map to DP16KDs and the consumers'
    flip-flops alone (no LUT); Amaranth's synchronous ports get Yosys's read-first emulation
    (bypass registers and multiplexers) although the memory has ``no_rw_check``."""
    ours = _luts_after_synthesis(tmp_path, lambda m, mem, k: bram.read_port(m, mem, name=f"r{k}"))
    assert ours.get("DP16KD") == 8
    assert ours.get("LUT4", 0) == 0
    assert ours.get("TRELLIS_FF") == 2 * 128
    theirs = _luts_after_synthesis(tmp_path, lambda m, mem, k: mem.read_port())
    assert theirs.get("LUT4", 0) > 100
