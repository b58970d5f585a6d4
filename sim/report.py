"""Human-readable report of a simulation run (the timeline ``qlink sim`` prints).

A run of one PPU prints the PTD channel map with the model's parameters, its timeline, RPC
round trips, counters, measurements and final status. A run of several PPUs prints the same
for all of them, each row naming its PPU, and a table of each PPU's program, final status,
registers and measurements.
"""

from __future__ import annotations

import re

from rich.console import Console
from rich.table import Table

__all__ = ["print_report", "status_line", "all_done", "ppu_results", "channel_ppu",
           "channel_map_table"]

#: A PTD channel's name in the events: ``drive<ppu>.<ch>``, ``readout<ppu>.<ch>``,
#: ``marker<ppu>.<ch>``.
_CHANNEL_NAME = re.compile(r"[a-z]+(\d+)\.\d+")

#: The registers the table of PPUs shows when they are not zero (r1..r15 always when set).
_PPU_TABLE_REGISTERS = ("CALL_COUNT", "LAST_CALL_STATUS", "LATE_EVENTS", "STALE_RESPONSES")


def channel_ppu(channel: str) -> int | None:
    """The PPU index in an event's channel name (``drive1.0`` -> 1); None for another name."""
    m = _CHANNEL_NAME.fullmatch(channel)
    return int(m.group(1)) if m else None


def ppu_results(results: dict) -> list[dict]:
    """Each PPU's results (``results["ppus"]``); for results without that key, PPU 0's from
    the top-level keys."""
    if results.get("ppus"):
        return results["ppus"]
    return [{"ppu": 0, "program": results.get("program"), "status": results["status"],
             "registers": results.get("registers", {}),
             "measurements": results.get("measurements", []),
             "qubit_final_p1": results.get("qubit_final_p1"),
             "fault_location": results.get("fault_location")}]


def all_done(results: dict) -> bool:
    """True when every PPU of the run ended DONE (what makes ``qlink sim`` exit with 0)."""
    return all(p["status"].get("state") == "DONE" for p in ppu_results(results))


def _errors(status: dict) -> list[str]:
    return [name for name, value in status.items() if name != "state" and value]


def print_report(results: dict, console: Console | None = None) -> None:
    """Print the timeline, RPC round trips, counters and final status of ``results``."""
    console = console or Console()
    model = results["model"]
    ppus = ppu_results(results)
    multi = len(ppus) > 1
    start = results["start_time_cycles"]
    if multi:
        console.print(f"[bold]{len(ppus)} PPUs[/bold], all started at DTD cycle {start}")
        for p in ppus:
            console.print(f"  PPU {p['ppu']}: {p['program']}")
    else:
        console.print(f"[bold]{results['program']}[/bold]  start at DTD cycle {start}")
    table = channel_map_table(model)
    if table is not None:
        console.print(table)

    timeline = Table(title="Timeline (DTD cycles of the timeline counter; t-start = cycles after "
                           "the trigger's start time)")
    cols = ("dtd_cycle", "t-start", "time_ns") + (("ppu",) if multi else ()) + (
        "channel", "event", "detail")
    for col in cols:
        timeline.add_column(col, justify="left" if col in ("channel", "event", "detail")
                            else "right")
    for ev in results["events"]:
        detail = ", ".join(f"{k}={v}" for k, v in ev.items()
                           if k not in ("channel", "kind", "dtd_cycle", "time_ns"))
        row = [str(ev["dtd_cycle"]), str(ev["dtd_cycle"] - start), f"{ev['time_ns']:.1f}"]
        if multi:
            row.append(str(channel_ppu(ev["channel"])))
        timeline.add_row(*row, ev["channel"], ev["kind"], detail)
    console.print(timeline)

    if results["rpc"]:
        rpc = Table(title="RPC (round trip at the QSC's MAC: request out -> response in)")
        for col in (("ppu",) if multi else ()) + ("function", "request_id", "status",
                                                  "round_trip_cycles", "round_trip_ns"):
            rpc.add_column(col)
        for r in results["rpc"]:
            rpc.add_row(*([str(r.get("ppu", 0))] if multi else []), r["function"],
                        f"{r['request_id']:#010x}", str(r["status"]),
                        str(r["round_trip_cycles"]), f"{r['round_trip_ns']:.1f}")
        console.print(rpc)
        if "tap" not in results:
            console.print(f"host turnaround: {model['host_turnaround_ns']} ns "
                          f"[italic](modelled, not measured)[/italic]")
    tap = results.get("tap")
    if tap is not None:
        console.print(f"TAP {tap['interface']}: {tap['frames_from_kernel']} frames from the "
                      f"kernel, {tap['frames_to_kernel']} to it; the host (raw bridge, "
                      f"{tap['host_mac']} {tap['host_ip']}) answered in wall-clock time "
                      "[italic](its turnaround not modelled)[/italic]")
    period_ns = 1e9 / results["params"]["dtd_clk_hz"]
    for p in ppus:
        regs = p.get("registers", {})
        if regs.get("CALL_COUNT"):
            rtt = regs["LAST_RTT_CYCLES"]
            prefix = f"PPU {p['ppu']}: " if multi else ""
            console.print(f"{prefix}last CALL at the PPU, request out -> result in register: "
                          f"{rtt} cycles = {rtt * period_ns:.1f} ns (LAST_RTT_CYCLES)")

    counters = Table(title="Counters (drop counters always, the others when non-zero)")
    counters.add_column("counter")
    counters.add_column("value", justify="right")
    for name, value in results["counters"].items():
        if value or name.startswith("DROP_") or name == "PSN_GAP":
            counters.add_row(name, str(value))
    for p in ppus:
        regs = p.get("registers", {})
        for name in ("STALE_RESPONSES", "LATE_EVENTS"):
            if name in regs:
                counters.add_row(f"PPU {p['ppu']} {name}" if multi else f"PPU {name}",
                                 str(regs[name]))
    console.print(counters)

    if multi:
        _print_ppu_table(console, ppus)
    played = {channel_ppu(e["channel"]) for e in results["events"] if e["kind"] == "play_start"}
    for p in ppus:
        prefix = f"PPU {p['ppu']} " if multi else ""
        final = p.get("qubits_final_p1") or [p["qubit_final_p1"]]
        for m in p["measurements"]:
            which = (f" of qubit {m['qubit']} (readout {m['channel']})"
                     if len(final) > 1 and "qubit" in m else "")
            console.print(f"{prefix}measurement{which} at cycle {m['dtd_cycle']}: outcome "
                          f"{m['outcome']} (P(1) = {m['p1']:.3f})")
        if p["measurements"] or p["ppu"] in played:
            if len(final) == 1:
                console.print(f"{prefix}qubit P(1) after its last pulse or readout: "
                              f"{final[0]:.3f}")
            else:
                console.print(f"{prefix}P(1) after each qubit's last pulse or readout: "
                              + ", ".join(f"qubit {q} {v:.3f}" for q, v in enumerate(final)))
    for line in results.get("host_log", []):
        console.print(f"[yellow]host: {line}[/yellow]", markup=True, highlight=False)
    if results.get("run_limit_reached"):
        still = [p for p in ppus if p["status"]["state"] not in ("DONE", "ERROR")]
        who = ("the PPU was still " + results["status"]["state"] if not multi else
               ", ".join(f"PPU {p['ppu']} was still {p['status']['state']}" for p in still))
        console.print(f"[bold red]run limit reached:[/bold red] {who} after "
                      f"{results['max_run_ns'] / 1000:g} us of simulated time (raise it with "
                      "--max-run-us)")
    gpu = results.get("gpu")
    if gpu:
        console.print(gpu_line(gpu))
    for p in ppus:
        if p.get("fault_location"):
            prefix = f"PPU {p['ppu']} " if multi else ""
            console.print(f"[bold]{prefix}stopped at:[/bold] {p['fault_location']}")
    console.print(status_line(results))


def gpu_line(gpu: dict) -> str:
    """One line on what the GPU did in a ``--gpu`` run (``results["gpu"]``): the CALLs it
    served (the warm-up not counted), link + launch, the in-kernel times and the service time,
    as measured in wall-clock time; with ``--gpu-frames`` (``mode == "frames"``) the GPU RoCE
    endpoint's frame times instead of the host's Python path."""
    frames = gpu.get("mode") == "frames"
    warmup = gpu.get("warmup_requests", 0)
    calls = gpu.get("calls_served", gpu["kernel_processed"] - (0 if frames else warmup))
    who = "the GPU RoCE endpoint" if frames else "the unified dispatch kernel"
    in_kernel = gpu.get("frame_in_kernel_ns" if frames else "call_in_kernel_ns") or []
    seen = "frame seen -> response frame published" if frames \
        else "request seen -> response published"
    p50 = gpu.get("service_p50_ns")
    service = ("request frame in -> response frame out, no Python per frame" if frames
               else "host poll -> response frame sent (Python)")
    return (f"GPU: {gpu['device']} ({gpu['arch']}): {who} served {calls} CALL(s) after "
            f"{warmup} warm-up requests; link + launch {gpu['link_and_launch_s']} s"
            + (f"; in the kernel, {seen}: {', '.join(f'{t / 1000:.2f}' for t in in_kernel)} us"
               if in_kernel else "")
            + (f"; {service}: p50 {p50 / 1000:.1f} us" if p50 is not None else "")
            + " (measured, wall clock)")


def _g(value: float | None, unit: str = "") -> str:
    """A parameter for the table: ``inf`` for None (no decay), else ``%g`` and its unit."""
    return "inf" if value is None else f"{value:g}{unit}"


def channel_map_table(model: dict) -> Table | None:
    """The PTD channel map of ``results["model"]`` with PPU 0's model parameters (one row per
    channel); None for results without a channel map (the board bench's emulator)."""
    cmap = model.get("channel_map")
    system = model.get("qubit") or {}
    if not cmap or "qubits" not in system:
        return None
    seed = system.get("seed")
    rate = system.get("sample_rate_hz", 0.0)
    table = Table(title=f"PTD channels -> qubit model ({cmap['qubits']} qubit(s) per PPU, "
                        f"{rate / 1e6:g} MS/s; PPU n's model seeded {seed} + n)")
    for col in ("channel", "drives / reads", "parameters"):
        table.add_column(col)
    qubits = system["qubits"]
    couplers = system.get("couplers", [])
    readouts = system.get("readouts", [])
    for d in cmap["drive"]:
        if d["role"] == "drive":
            qp = qubits[d["qubit"]]
            table.add_row(f"drive {d['channel']}", f"qubit {d['qubit']}",
                          f"if {_g(qp['if_hz'], ' Hz')}, T1 {_g(qp['t1_ns'], ' ns')}, "
                          f"T2 {_g(qp['t2_ns'], ' ns')}, pi_area {qp['pi_area']:.4g}")
        else:
            cz = couplers[d["coupler"]]["cz_area"] if d["coupler"] < len(couplers) else None
            a, b = d["qubits"]
            table.add_row(f"drive {d['channel']}", f"coupler of qubits {a}, {b}",
                          f"cz_area {_g(cz)}")
    for r in cmap["readout"]:
        ro = readouts[r["channel"]]
        table.add_row(f"readout {r['channel']}", f"qubit {r['qubit']}",
                      f"ro_if {_g(ro['ro_if_hz'], ' Hz')}, amplitude "
                      f"{_g(ro['readout_amplitude'])}, phase 0/1 {ro['phase0_rad']:.4g}/"
                      f"{ro['phase1_rad']:.4g} rad, noise {_g(ro['noise_sigma'])}")
    return table


def _print_ppu_table(console: Console, ppus: list[dict]) -> None:
    """One row per PPU: its program, final state, error bits, registers and measurements."""
    table = Table(title="PPUs (registers: r1..r15 and the CALL and event counts when non-zero)")
    for col in ("ppu", "program", "state", "errors", "registers", "measurements"):
        table.add_column(col, justify="right" if col == "ppu" else "left")
    for p in ppus:
        regs = p.get("registers", {})
        shown = [f"r{i}={regs[f'R{i}']}" for i in range(1, 16) if regs.get(f"R{i}")]
        shown += [f"{name}={regs[name]}" for name in _PPU_TABLE_REGISTERS if regs.get(name)]
        outcomes = ", ".join(str(m["outcome"]) for m in p["measurements"])
        table.add_row(str(p["ppu"]), str(p.get("program", "")).rsplit("/", 1)[-1],
                      p["status"]["state"], ", ".join(_errors(p["status"])) or "-",
                      " ".join(shown) or "-", outcomes or "-")
    console.print(table)


def status_line(results: dict) -> str:
    """One line: the final PPU state and its error bits (each PPU's, with several)."""
    ppus = ppu_results(results)
    if len(ppus) == 1:
        status = ppus[0]["status"]
        errors = _errors(status)
        return (f"final PPU status: {status['state']}"
                + (f" (errors: {', '.join(errors)})" if errors else " (no error bits)"))
    parts = []
    for p in ppus:
        errors = _errors(p["status"])
        parts.append(f"PPU {p['ppu']} {p['status']['state']}"
                     + (f" (errors: {', '.join(errors)})" if errors else " (no error bits)"))
    return "final PPU status: " + "; ".join(parts)
