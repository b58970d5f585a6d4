"""Clock frequencies, utilisation and build time of the QSC on ECP5 boards (open toolchain).

Board mode (the default): builds each board profile's bitstream exactly as
``qlink build --board NAME`` does (:func:`openqlink.build.build_board`: amaranth-boards platform,
PLL, RGMII MAC, qubit emulators, Yosys, nextpnr-ecp5, ecppack) and prints, per board, the
maximum frequency of every clock after routing against its target, the resources used and the
time of each stage. A board that misses timing is reported, not hidden (no bitstream is kept).

Bare mode (``--bare``): the QSC top alone (``openqlink.gateware.top.generate_verilog``, the
Verilog ``qlink sim`` simulates) on the device and package given, pins unconstrained, every
clock asked for at ``--freq``. Its stream ports need about 260 pins: use a large package.

Needs the YoWASP tools (``pip install 'openqlink[build]'``), found on ``PATH`` or beside the
running interpreter:

    python benchmarks/synth_ecp5.py [--board colorlight-5a-75b ...] [--seed 1]
    python benchmarks/synth_ecp5.py --bare --device 85k --package CABGA756 --freq 125

The first run of each tool compiles its WebAssembly (about 30 s); one board takes several
minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from openqlink import build
from openqlink.gateware.boards import PROFILES
from openqlink.memory_map import QSCParams


def _progress(console: Console):
    state = {"stage": None, "t0": time.monotonic()}

    def progress(stage: str, line: str) -> None:
        if stage != state["stage"]:
            if state["stage"] is not None:
                console.print(f"  {state['stage']}: {time.monotonic() - state['t0']:.0f} s")
            state.update(stage=stage, t0=time.monotonic())
    return progress


def run_boards(names: list[str], work: Path, seed: int, console: Console) -> None:
    summary = Table(title="QSC board builds (nextpnr-ecp5, after routing)")
    for col in ("board", "part", "clock", "target", "achieved", "LUT4", "FF", "DP16KD",
                "MULT18", "build"):
        summary.add_column(col, justify="left" if col in ("board", "part", "clock")
                           else "right")
    for name in names:
        prof = PROFILES[name]
        console.print(f"[bold]{prof.title}[/] ({prof.part}): {prof.keeps}")
        try:
            report = build.build_board(prof, work / name, seed=seed,
                                       progress=_progress(console))
        except build.TimingError as exc:
            report = exc.report
        except build.BuildError as exc:
            console.print(f"  [red]failed[/]: {exc}")
            continue
        first = True
        for domain, clock in report.clocks.items():
            verdict = "" if clock["met"] else " [red](missed)[/]"
            row = [name, prof.part] if first else ["", ""]
            row += [domain, f"{clock['target_mhz']:g} MHz",
                    f"{clock['achieved_mhz']:.2f} MHz{verdict}"]
            if first:
                row += [f"{report.resources[k]}/{report.available.get(k, '?')}"
                        for k in ("LUT4", "FF", "DP16KD", "MULT18")]
                row.append(f"{report.seconds:.0f} s")
            else:
                row += [""] * 5
            summary.add_row(*row)
            first = False
    console.print(summary)


def run_bare(args, work: Path, console: Console) -> None:
    from openqlink.gateware.top import generate_verilog

    tools = {t: build.find_tool(t) for t in ("yosys", "nextpnr-ecp5")}
    missing = [t for t, path in tools.items() if path is None]
    if missing:
        raise SystemExit(f"{', '.join(missing)} not found: pip install 'openqlink[build]'")
    work.mkdir(parents=True, exist_ok=True)
    params = QSCParams(num_ppus=args.num_ppus, imem_depth=args.imem_depth,
                       env_depth=args.env_depth)
    (work / "qsc_top.v").write_text(generate_verilog(params))
    t0 = time.perf_counter()
    # YoWASP tools see the current directory: run them inside `work` with relative paths.
    subprocess.run([tools["yosys"], "-q", "-p", "read_verilog qsc_top.v; "
                    "synth_ecp5 -top qsc_top -json qsc_top.json"], cwd=work, check=True)
    t_synth = time.perf_counter() - t0
    t0 = time.perf_counter()
    pnr = subprocess.run([tools["nextpnr-ecp5"], f"--{args.device}", "--package", args.package,
                          "--speed", args.speed, "--json", "qsc_top.json",
                          "--lpf-allow-unconstrained", "--freq", str(args.freq),
                          "--seed", str(args.seed), "--timing-allow-fail"],
                         cwd=work, capture_output=True, text=True)
    t_pnr = time.perf_counter() - t0
    log = pnr.stdout + pnr.stderr
    (work / "pnr.log").write_text(log)
    if pnr.returncode:
        raise SystemExit(f"nextpnr failed ({pnr.returncode}); log: {work / 'pnr.log'}")
    report = build.parse_nextpnr_log(log)
    table = Table(title=f"bare QSC top, --{args.device} {args.package} speed {args.speed}, "
                        f"unconstrained pins")
    table.add_column("clock")
    table.add_column("target", justify="right")
    table.add_column("achieved", justify="right")
    for net, clock in report.clocks.items():
        table.add_row(build.clock_domain(net, ["rti", "dtd"]) or net, f"{args.freq:g} MHz",
                      f"{clock.achieved_mhz:.2f} MHz")
    console.print(table)
    console.print("  ".join(f"{k} {v}/{report.available.get(k, '?')}"
                            for k, v in report.resources.items()))
    console.print(f"synthesis {t_synth:.0f} s, place and route {t_pnr:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--board", action="append", choices=list(PROFILES),
                        help="board to build (repeatable; default: every board)")
    parser.add_argument("--seed", type=int, default=1, help="nextpnr placer seed")
    parser.add_argument("--work", type=Path, default=Path("build/bench"))
    bare = parser.add_argument_group("bare top (--bare)")
    bare.add_argument("--bare", action="store_true", help="the QSC top alone, no board")
    bare.add_argument("--device", default="85k", help="nextpnr-ecp5 device flag (25k, 45k, 85k)")
    bare.add_argument("--package", default="CABGA756")
    bare.add_argument("--speed", default="6")
    bare.add_argument("--freq", type=float, default=125.0, help="target of every clock, MHz")
    bare.add_argument("--num-ppus", type=int, default=1)
    bare.add_argument("--imem-depth", type=int, default=1024)
    bare.add_argument("--env-depth", type=int, default=4096)
    args = parser.parse_args()
    console = Console()
    work = args.work.resolve()
    if args.bare:
        run_bare(args, work / "bare", console)
    else:
        run_boards(args.board or list(PROFILES), work, args.seed, console)


if __name__ == "__main__":
    main()
