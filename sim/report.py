"""Human-readable report of a simulation run (the timeline ``qlink sim`` prints)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

__all__ = ["print_report", "status_line"]


def print_report(results: dict, console: Console | None = None) -> None:
    """Print the timeline, RPC round trips, counters and final status of ``results``."""
    console = console or Console()
    model = results["model"]
    console.print(f"[bold]{results['program']}[/bold]  start at DTD cycle "
                  f"{results['start_time_cycles']}")

    start = results["start_time_cycles"]
    timeline = Table(title="Timeline (DTD cycles of the timeline counter; t-start = cycles after "
                           "the trigger's start time)")
    for col in ("dtd_cycle", "t-start", "time_ns", "channel", "event", "detail"):
        timeline.add_column(col, justify="left" if col in ("channel", "event", "detail")
                            else "right")
    for ev in results["events"]:
        detail = ", ".join(f"{k}={v}" for k, v in ev.items()
                           if k not in ("channel", "kind", "dtd_cycle", "time_ns"))
        timeline.add_row(str(ev["dtd_cycle"]), str(ev["dtd_cycle"] - start),
                         f"{ev['time_ns']:.1f}", ev["channel"], ev["kind"], detail)
    console.print(timeline)

    if results["rpc"]:
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
    if results["measurements"] or any(e["kind"] == "play_start" for e in results["events"]):
        console.print(f"qubit P(1) at the end: {results['qubit_final_p1']:.3f}")
    for line in results.get("host_log", []):
        console.print(f"[yellow]host: {line}[/yellow]", markup=True, highlight=False)
    if results.get("run_limit_reached"):
        console.print(f"[bold red]run limit reached:[/bold red] the PPU was still "
                      f"{results['status']['state']} after {results['max_run_ns'] / 1000:g} us "
                      "of simulated time (raise it with --max-run-us)")
    gpu = results.get("gpu")
    if gpu:
        p50 = gpu["service_p50_ns"]
        calls = gpu["kernel_processed"] - gpu.get("warmup_requests", 0)
        in_kernel = gpu.get("call_in_kernel_ns") or []
        console.print(
            f"GPU: {gpu['device']} ({gpu['arch']}): the unified dispatch kernel served {calls} "
            f"CALL(s) after {gpu.get('warmup_requests', 0)} warm-up requests; link + launch "
            f"{gpu['link_and_launch_s']} s"
            + (f"; in the kernel, request seen -> response published: "
               f"{', '.join(f'{t / 1000:.2f}' for t in in_kernel)} us" if in_kernel else "")
            + (f"; host poll -> response frame sent (Python): p50 {p50 / 1000:.1f} us"
               if p50 is not None else "")
            + " (measured, wall clock)")
    if results.get("fault_location"):
        console.print(f"[bold]stopped at:[/bold] {results['fault_location']}")
    console.print(status_line(results))


def status_line(results: dict) -> str:
    """One line: the final PPU state and its error bits."""
    status = results["status"]
    errors = [name for name, value in status.items() if name != "state" and value]
    return (f"final PPU status: {status['state']}"
            + (f" (errors: {', '.join(errors)})" if errors else " (no error bits)"))
