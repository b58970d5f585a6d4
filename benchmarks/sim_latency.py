"""Latency of the QSC gateware's RPC path, measured in the cocotb simulation (deterministic).

For each modelled host turnaround it runs firmware/active_reset.s and prints, in DTD cycles
(250 MHz) and ns:

* wire RTT: request's last beat leaves the QSC's MAC -> response's last beat enters it;
* PPU RTT: the CALL's request handshake in the PPU -> result in the register (LAST_RTT_CYCLES);
* gateware overhead = PPU RTT - wire RTT: both directions through the network core, the
  clock-domain crossings and the CALL unit (compare: Holoscan Sensor Bridge's ~50 cycles at
  156.25 MHz, 320 ns, one direction);
* feedback: end of the readout window -> start of the conditional pulse (compare: in-controller
  active reset < 250 ns; here the decision goes through the host).

Usage: python benchmarks/sim_latency.py [--turnaround-ns 0 500 1000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from openqlink.sim.runner import run_sim

PROGRAM = Path(__file__).resolve().parents[1] / "firmware" / "active_reset.s"


def measure(turnaround_ns: int, build_dir: Path) -> dict:
    t0 = time.perf_counter()
    r = run_sim(PROGRAM, build_dir=build_dir, seed=1, host_turnaround_ns=turnaround_ns)
    wall_s = time.perf_counter() - t0
    period_ns = 1e9 / r["params"]["dtd_clk_hz"]
    (rpc,) = r["rpc"]
    ppu_rtt = r["registers"]["LAST_RTT_CYCLES"]
    acq_end = next(e for e in r["events"] if e["kind"] == "acquire_end")["dtd_cycle"]
    plays = [e for e in r["events"] if e["kind"] == "play_start"]
    feedback = plays[1]["dtd_cycle"] - acq_end if len(plays) > 1 else None
    return {
        "turnaround_ns": turnaround_ns,
        "wire_rtt_cycles": rpc["round_trip_cycles"], "wire_rtt_ns": rpc["round_trip_ns"],
        "ppu_rtt_cycles": ppu_rtt, "ppu_rtt_ns": ppu_rtt * period_ns,
        "overhead_cycles": ppu_rtt - rpc["round_trip_cycles"],
        "overhead_ns": ppu_rtt * period_ns - rpc["round_trip_ns"],
        "feedback_cycles": feedback,
        "feedback_ns": feedback * period_ns if feedback is not None else None,
        "wall_s": wall_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turnaround-ns", type=int, nargs="+", default=[0, 500, 1000])
    args = parser.parse_args()
    table = Table(title="QSC RPC latency in simulation (DTD 250 MHz; deterministic)")
    for col in ("host turnaround (modelled)", "wire RTT", "PPU RTT", "gateware overhead",
                "readout end -> reset pulse", "sim wall time"):
        table.add_column(col, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        for t in args.turnaround_ns:
            m = measure(t, Path(tmp))
            table.add_row(
                f"{t} ns",
                f"{m['wire_rtt_cycles']} cyc / {m['wire_rtt_ns']:.1f} ns",
                f"{m['ppu_rtt_cycles']} cyc / {m['ppu_rtt_ns']:.1f} ns",
                f"{m['overhead_cycles']} cyc / {m['overhead_ns']:.1f} ns",
                f"{m['feedback_cycles']} cyc / {m['feedback_ns']:.1f} ns"
                if m["feedback_cycles"] is not None else "-",
                f"{m['wall_s']:.1f} s")
    Console().print(table)


if __name__ == "__main__":
    main()
