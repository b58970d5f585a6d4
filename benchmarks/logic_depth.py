"""The registers a design cannot clock at a target, estimated from Yosys's ECP5 netlist in seconds.

nextpnr reports one critical path per clock after minutes of place and route. This script reads
the JSON netlist that ``synth_ecp5`` writes (``benchmarks/synth_block.py --depth`` makes one, or
a board build's ``build/NAME/NAME.json``) and estimates the arrival time at every register input
with a fixed delay per cell and per net hop (ECP5 speed grade 6, as nextpnr times an uncongested
die). It lists every register whose worst input arrives later than the clock period, worst first,
with the path to it, so a pipelining pass sees all of its failing paths at once.

    python benchmarks/logic_depth.py build/synth_ppus/block.json --freq 125 [--top 30]

The estimate is a guide, not a sign-off: routing on a full die is slower than ``--route-ns``;
nextpnr decides. All clocks are treated as one (the blocks are single-domain in the harness).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

from openqlink.build import source_line

#: Clock-to-output of each start point, in ns.
_CLK_TO_Q_NS = {"TRELLIS_FF": 0.52, "DP16KD": 5.83, "TRELLIS_DPR16X4": 0.52}
#: Input to output delay of the combinational cells, in ns (carry: per CCU2C, from CIN).
_LUT_NS = 0.24
_MUX_NS = 0.22
_CARRY_IN_NS = 0.45
_CARRY_STEP_NS = 0.07
_CARRY_OUT_NS = 0.44
_MULT_NS = 4.2
_DPR_READ_NS = 0.45
_SETUP_NS = 0.1
_FF_SUFFIX = re.compile(r"(_TRELLIS_FF_Q)(_\d+)?$")


def _cell_arcs(cell: dict):
    """(input bit, output bit, delay_ns, routed) arcs of one combinational cell."""
    conn, kind = cell["connections"], cell["type"]
    if kind == "LUT4":
        for pin in "ABCD":
            yield conn[pin][0], conn["Z"][0], _LUT_NS, True
    elif kind in ("PFUMX", "L6MUX21"):
        for pin, bits in conn.items():
            if pin != "Z":
                yield bits[0], conn["Z"][0], _MUX_NS, True
    elif kind == "CCU2C":
        outs = [conn["S0"][0], conn["S1"][0], conn["COUT"][0]]
        for pin in ("A0", "B0", "C0", "D0", "A1", "B1", "C1", "D1"):
            for out in outs:
                yield conn[pin][0], out, _CARRY_IN_NS, True
        yield conn["CIN"][0], conn["COUT"][0], _CARRY_STEP_NS, False
        yield conn["CIN"][0], conn["S0"][0], _CARRY_OUT_NS, False
        yield conn["CIN"][0], conn["S1"][0], _CARRY_OUT_NS, False
    elif kind == "MULT18X18D":
        ins = [b for pin, bits in conn.items() if re.fullmatch(r"[AB]\d+", pin) for b in bits]
        outs = [b for pin, bits in conn.items() if re.fullmatch(r"P\d+", pin) for b in bits]
        for i in ins:
            for o in outs:
                yield i, o, _MULT_NS, True
    elif kind == "TRELLIS_DPR16X4":
        for pin in ("RAD",):
            for i in conn[pin]:
                for o in conn["DO"]:
                    yield i, o, _DPR_READ_NS, True


def analyse(netlist: dict, route_ns: float):
    """Arrival time (ns) and predecessor of every net bit; the endpoints per register."""
    modules = list(netlist["modules"].values())
    top = next((m for m in modules if int(m.get("attributes", {}).get("top", "0") or 0, 2)),
               modules[0])
    arrival: dict[int, float] = {}
    pred: dict[int, int | None] = {}
    fanin: dict[int, list] = defaultdict(list)
    endpoints: list[tuple[int | str, int]] = []
    regs_by_q: dict[int, str] = {}
    srcs: dict[int, str] = {}
    for name, cell in top["cells"].items():
        kind, conn = cell["type"], cell["connections"]
        dirs = cell.get("port_directions", {})
        src = source_line(cell)
        if src:
            for pin, bits in conn.items():
                if dirs.get(pin) == "output":
                    srcs.update((b, src) for b in bits if isinstance(b, int))
        arcs = list(_cell_arcs(cell))
        if arcs:
            for i, o, d, routed in arcs:
                fanin[o].append((i, d, routed))
            continue
        reg = f"{name} ({kind})"
        if kind == "TRELLIS_FF":
            q = conn["Q"][0]
            reg = _FF_SUFFIX.sub("", name)
            regs_by_q[q] = reg
        for pin, bits in conn.items():
            for b in bits:
                if not isinstance(b, int):
                    continue
                if dirs.get(pin) == "output":
                    arrival[b] = _CLK_TO_Q_NS.get(kind, 0.5)
                    pred[b] = None
                elif dirs.get(pin) == "input" and pin not in ("CLK", "WCK", "CLKA", "CLKB"):
                    key = conn["Q"][0] if kind == "TRELLIS_FF" else f"{reg}.{pin}"
                    endpoints.append((key, b))

    def settle(bit: int) -> float:
        stack = [(bit, False)]
        while stack:
            b, expanded = stack.pop()
            if b in arrival:
                continue
            if not expanded:
                stack.append((b, True))
                stack.extend((i, False) for i, _, _ in fanin.get(b, ())
                             if isinstance(i, int) and i not in arrival)
                continue
            best, best_from = 0.0, None
            for i, d, routed in fanin.get(b, ()):
                if isinstance(i, int):
                    t = arrival.get(i, 0.0) + d + (route_ns if routed else 0.0)
                    if t > best:
                        best, best_from = t, i
            arrival[b], pred[b] = best, best_from
        return arrival[bit]

    names: dict[int, str] = {}
    for net, info in top["netnames"].items():
        for b in info["bits"]:
            if isinstance(b, int) and (b not in names or len(net) < len(names[b])):
                names[b] = net
    # Name a register after the shortest public net its Q drives (cell names can be mangled).
    for q in list(regs_by_q):
        net = names.get(q)
        if net is not None and "_TRELLIS_" not in net and len(net) < 120:
            regs_by_q[q] = re.sub(r"\$\d+$", "", net)
    ends: dict[str, str] = {}
    for key, _ in endpoints:
        ends.setdefault(regs_by_q.get(key, key), srcs.get(key, "") if isinstance(key, int) else "")
    endpoints = [(regs_by_q.get(key, key), b) for key, b in endpoints]
    worst: dict[str, tuple[float, int]] = {}
    for reg, b in endpoints:
        t = settle(b) + route_ns + _SETUP_NS
        if reg not in worst or t > worst[reg][0]:
            worst[reg] = (t, b)
    return worst, pred, names, arrival, srcs, ends


def _trace(bit: int, pred, names) -> list[str]:
    path = []
    while bit is not None:
        path.append(names.get(bit, f"${bit}"))
        bit = pred.get(bit)
    return path[::-1]


def _trace_sources(bit: int, pred, srcs) -> list[str]:
    """The source lines along the path to ``bit`` (LUTs without one as ``.``), runs merged."""
    path: list[str] = []
    while bit is not None:
        path.append(srcs.get(bit, "."))
        bit = pred.get(bit)
    merged: list[str] = []
    for step in path[::-1]:
        if not merged or step != merged[-1] or step != ".":
            merged.append(step)
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("netlist", type=Path, help="synth_ecp5 JSON netlist")
    parser.add_argument("--freq", type=float, default=125.0, help="target clock, MHz")
    parser.add_argument("--route-ns", type=float, default=0.7, help="delay of one net hop, ns")
    parser.add_argument("--top", type=int, default=40, help="registers to list")
    parser.add_argument("--steps", type=int, default=6, help="path steps to print per register")
    args = parser.parse_args()
    worst, pred, names, arrival, srcs, ends = analyse(json.loads(args.netlist.read_text()),
                                                args.route_ns)
    period = 1000.0 / args.freq
    failing = sorted(((t, reg, b) for reg, (t, b) in worst.items() if t > period), reverse=True)
    print(f"{len(failing)} of {len(worst)} register inputs estimated over {period:.2f} ns "
          f"({args.freq:g} MHz)")
    for t, reg, b in failing[:args.top]:
        path = _trace(b, pred, names)
        short = [re.sub(r"^harness\.block\.", "", p)[:60] for p in path]
        if len(short) > args.steps:
            short = short[:2] + ["..."] + short[-(args.steps - 3):]
        print(f"{t:6.2f} ns {len(path) - 1:3d} hops  {re.sub(r'^harness.block.', '', reg)}")
        print("      " + " -> ".join(short))
        print("      source: " + " ".join(_trace_sources(b, pred, srcs))
              + f" => {ends.get(reg) or '?'}")


if __name__ == "__main__":
    main()
