"""Clock frequencies, utilisation and build time of the QSC on ECP5 boards (open toolchain).

Board mode (the default): builds each board profile's bitstream exactly as
``qlink build --board NAME`` does (:func:`openqlink.build.build_board`: amaranth-boards platform,
PLL, RGMII MAC, qubit emulators, Yosys, nextpnr-ecp5, ecppack) and prints, per board, the
maximum frequency of every clock after routing against its target, the resources used and the
time of each stage. A board that misses timing is reported, not hidden (no bitstream is kept).

One block at a time, without a board (the network core, the PPU cluster, the QSC top, the
MAC), is ``benchmarks/synth_block.py``'s job.

Needs the YoWASP tools (``pip install 'openqlink[build]'``), found on ``PATH`` or beside the
running interpreter:

    python benchmarks/synth_ecp5.py [--board colorlight-5a-75b ...] [--seed 1] [--seeds 4]

``--seeds N`` places each netlist with seeds ``SEED .. SEED+N-1`` (``--jobs`` at a time) as
``qlink build --seeds`` does, and prints every seed's clocks: one netlist's spread.

The first run of each tool compiles its WebAssembly (about 30 s); one board takes several
minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from openqlink import build
from openqlink.gateware.boards import PROFILES


def _progress(console: Console):
    state = {"stage": None, "t0": time.monotonic()}

    def progress(stage: str, line: str) -> None:
        if stage != state["stage"]:
            if state["stage"] is not None:
                console.print(f"  {state['stage']}: {time.monotonic() - state['t0']:.0f} s")
            state.update(stage=stage, t0=time.monotonic())
    return progress


def run_boards(names: list[str], work: Path, seed: int, console: Console, *, seeds: int = 1,
               jobs: int | None = None) -> None:
    summary = Table(title="QSC board builds (nextpnr-ecp5, after routing)")
    for col in ("board", "part", "clock", "target", "achieved", "LUT4", "FF", "DP16KD",
                "MULT18", "build"):
        summary.add_column(col, justify="left" if col in ("board", "part", "clock")
                           else "right")
    for name in names:
        prof = PROFILES[name]
        console.print(f"[bold]{prof.title}[/] ({prof.part}): {prof.keeps}")
        try:
            report = build.build_board(prof, work / name, seed=seed, seeds=seeds, jobs=jobs,
                                       progress=_progress(console))
        except build.TimingError as exc:
            report = exc.report
        except build.BuildError as exc:
            console.print(f"  [red]failed[/]: {exc}")
            continue
        for row in report.seeds if len(report.seeds) > 1 else ():
            if "clocks" in row:
                text = ", ".join(f"{d} {mhz:.2f}" for d, mhz in row["clocks"].items()) + " MHz"
            else:
                text = "stopped" if row.get("stopped") else f"failed: {row.get('error')}"
            kept = " (kept)" if row["seed"] == report.seed else ""
            console.print(f"  seed {row['seed']}{kept}: {text}")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--board", action="append", choices=list(PROFILES),
                        help="board to build (repeatable; default: every board)")
    parser.add_argument("--seed", type=int, default=1, help="nextpnr placer seed (the first)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="placer seeds per netlist (SEED .. SEED+N-1)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="nextpnr runs at once (default: one per CPU)")
    parser.add_argument("--work", type=Path, default=Path("build/bench"))
    args = parser.parse_args()
    console = Console()
    work = args.work.resolve()
    run_boards(args.board or list(PROFILES), work, args.seed, console, seeds=args.seeds,
               jobs=args.jobs)


if __name__ == "__main__":
    main()
