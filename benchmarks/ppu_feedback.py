"""Feedback latency and sustained event rate of a PPU, measured on the gateware in simulation.

Feedback latency, as Quantum Machines defines it: from the last ADC sample of a readout window
into the PPU to the first sample of the conditional output, here the first DAC sample of a PLAY
(a drive channel) or the first cycle of a MARKER, that a BRANCH on the window's result selects.
It is measured, not computed: the program ``acquire`` / ``beq`` / ``play`` (or ``marker``) is
run with the output's offset ``L`` cycles after the window's last sample, for ``L`` = 1, 2, ...;
the latency is the smallest ``L`` that the PPU plays on time (no LATE), for the branch taken and
not taken. Each board's build is measured with its profile's parameters (``qlink build
--board NAME`` builds the same PPU: no NCOs), and the simulation build's (NCOs and
demodulation, one cycle more).

Sustained rate: ``N`` events for one channel ``d`` cycles apart, from a start 60 cycles ahead;
the smallest ``d`` at which every one plays on time gives the events per DTD cycle that the core
keeps up (``N`` is well past the channel queue's depth, so the queue hides nothing).

    python benchmarks/ppu_feedback.py [--events 200]

The PPU bench of the tests (``tests/gateware/ppu/ppu_bench.py``: bus writes into the cluster,
uploads, triggers) drives Amaranth's simulator; no Verilog and no network are involved.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gateware" / "ppu"))

from ppu_bench import (  # noqa: E402  (the bench lives beside the tests that use it)
    NCO_PARAMS,
    Monitor,
    acquire,
    branch,
    end,
    make_sim,
    marker,
    play,
    status,
    trigger,
    upload,
    upload_env,
)

from openqlink.gateware.boards.profiles import PROFILES  # noqa: E402
from openqlink.isa.layout import Cond, PPUState  # noqa: E402
from openqlink.memory_map import QSCParams  # noqa: E402

WINDOW, OFFSET = 8, 10                 #: the readout window: cycles, and its offset from t


def _run(params: QSCParams, prog: list[int], adc) -> tuple[int, bool, Monitor]:
    """Run ``prog`` on PPU 0 from a start time 60 cycles ahead; returns (start time, LATE,
    the monitor of PPU 0's outputs)."""
    dut, sim = make_sim(params)
    mon = Monitor(dut, 0, adc)
    mon.add_to(sim)
    out = {}

    async def bench(ctx):
        await upload_env(ctx, dut, 0, [1000] * 4)
        await upload(ctx, dut, 0, prog)
        out["s"] = ctx.get(dut.now) + 60
        await trigger(ctx, dut, 0, out["s"], len(prog))
        for _ in range(400):
            st = await status(ctx, dut, 0)
            if st.state in (PPUState.DONE, PPUState.ERROR):
                break
        out["late"] = bool(st.late)

    sim.add_testbench(bench)
    sim.run()
    return out["s"], out["late"], mon


def _conditional(params: QSCParams, output: str, taken: bool, lead: int) -> tuple[bool, int]:
    """(LATE, cycles from the window's last sample to the output's first) for one ``lead``."""
    last = OFFSET + WINDOW - 1
    if output == "drive":
        pulse, key = play(0, last + lead, 0, 4, 0x4000), "active"
    else:
        pulse, key = marker(0, last + lead, 4), "marker"
    if taken:
        prog = [acquire(0, 1, OFFSET, WINDOW, 0), branch(Cond.EQ, 1, 1, 3), end(), pulse, end()]
    else:
        prog = [acquire(0, 1, OFFSET, WINDOW, 0), branch(Cond.NE, 1, 1, 3), pulse, end()]
    s, late, mon = _run(params, prog, adc=lambda now: 100)
    cycles = mon.cycles(key, 0 if key == "marker" else None)
    return late, (cycles[0] - (s + last)) if cycles and not late else -1


def feedback_cycles(params: QSCParams, output: str, taken: bool) -> int:
    """The smallest lead that plays on time."""
    for lead in range(1, 40):
        late, measured = _conditional(params, output, taken, lead)
        if not late:
            assert measured == lead, (measured, lead)
            return lead
    raise RuntimeError(f"{output}: late up to 40 cycles")


def sustained_spacing(params: QSCParams, output: str, events: int) -> int:
    """The smallest spacing ``d`` (cycles) at which ``events`` events for one channel, at
    ``d, 2d, ...`` cycles after a start 60 cycles ahead, all play on time: the core queues
    ``1 / d`` events per cycle for as long as a program runs."""
    params = replace(params, imem_depth=max(params.imem_depth, 1 << (events + 1).bit_length()))
    for d in range(1, 8):
        if output == "drive":
            prog = [play(0, d * (k + 1), 0, 1, 0x4000) for k in range(events)]
        else:
            prog = [marker(0, d * (k + 1), 1) for k in range(events)]
        _, late, mon = _run(params, [*prog, end()], adc=None)
        fired = mon.cycles("active" if output == "drive" else "marker")
        if not late and len(fired) == events:
            return d
    raise RuntimeError(f"{output}: late at every spacing up to 7 cycles")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200)
    args = ap.parse_args()
    builds = [*((f"{name} (board build, no NCO)", prof.params) for name, prof in PROFILES.items()),
              ("simulation (NCO)", NCO_PARAMS)]
    print("| build | output | branch | latency (DTD cycles) | at 125 MHz (ns) | at 250 MHz (ns) |")
    print("|---|---|---|---|---|---|")
    for name, params in builds:
        for output in ("drive", "marker"):
            for taken in (True, False):
                n = feedback_cycles(params, output, taken)
                print(f"| {name} | {output} | {'taken' if taken else 'not taken'} | {n} | "
                      f"{n * 8} | {n * 4} |")
    print()
    print("| build | output | events | smallest spacing on time (cycles) | events per DTD cycle |")
    print("|---|---|---|---|---|")
    for name, params in builds:
        for output in ("drive", "marker"):
            d = sustained_spacing(params, output, args.events)
            print(f"| {name} | {output} | {args.events} | {d} | {1 / d:.2f} |")


if __name__ == "__main__":
    main()
