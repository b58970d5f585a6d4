"""Human-readable report of a simulation run (the timeline ``qlink sim`` prints)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

__all__ = ["print_report"]


def print_report(results: dict, console: Console | None = None) -> None:
    """Print the timeline, RPC round trips, counters and final status of ``results``."""
    console = console or Console()
    model = results["model"]
    console.print(f"[bold]{results['program']}[/bold]  start at DTD cycle "
                  f"{results['start_time_cycles']}")

    timeline = Table(title="Timeline (DTD cycles of the timeline counter)")
    for col in ("dtd_cycle", "time_ns", "channel", "event", "detail"):
        timeline.add_column(col, justify="right" if col in ("dtd_cycle", "time_ns") else "left")
    for ev in results["events"]:
        detail = ", ".join(f"{k}={v}" for k, v in ev.items()
                           if k not in ("channel", "kind", "dtd_cycle", "time_ns"))
        timeline.add_row(str(ev["dtd_cycle"]), f"{ev['time_ns']:.1f}", ev["channel"],
                         ev["kind"], detail)
    console.print(timeline)

    rpc = Table(title="RPC (round trip at the QSC's MAC: request out -> response in)")
    for col in ("function", "request_id", "status", "round_trip_cycles", "round_trip_ns"):
        rpc.add_column(col)
    for r in results["rpc"]:
        rpc.add_row(r["function"], f"{r['request_id']:#010x}", str(r["status"]),
                    str(r["round_trip_cycles"]), f"{r['round_trip_ns']:.1f}")
    console.print(rpc)
    console.print(f"host turnaround: {model['host_turnaround_ns']} ns "
                  f"[italic](modelled, not measured)[/italic]")
    regs = results.get("registers", {})
    if regs.get("CALL_COUNT"):
        period_ns = 1e9 / results["params"]["dtd_clk_hz"]
        rtt = regs["LAST_RTT_CYCLES"]
        console.print(f"last CALL at the PPU, request out -> result in register: {rtt} cycles "
                      f"= {rtt * period_ns:.1f} ns (LAST_RTT_CYCLES)")

    counters = Table(title="Counters (drop counters always, the others when non-zero)")
    counters.add_column("counter")
    counters.add_column("value", justify="right")
    for name, value in results["counters"].items():
        if value or name.startswith("DROP_") or name == "PSN_GAP":
            counters.add_row(name, str(value))
    for name in ("STALE_RESPONSES", "LATE_EVENTS"):
        if name in regs:
            counters.add_row(f"PPU {name}", str(regs[name]))
    console.print(counters)

    for m in results["measurements"]:
        console.print(f"measurement at cycle {m['dtd_cycle']}: outcome {m['outcome']} "
                      f"(P(1) = {m['p1']:.3f})")
    console.print(f"qubit P(1) at the end: {results['qubit_final_p1']:.3f}")
    status = results["status"]
    errors = [name for name, value in status.items() if name != "state" and value]
    console.print(f"[bold]final PPU status:[/bold] {status['state']}"
                  + (f" (errors: {', '.join(errors)})" if errors else " (no error bits)"))
