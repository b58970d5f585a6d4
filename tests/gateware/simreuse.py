"""One ``amaranth.sim.Simulator`` per design for the many short runs of a test module.

Building a ``Simulator`` compiles the whole design into Python (the network core: about 1.5 s;
the receiver 0.6 s; the PPU cluster 1.2 s), which is most of a short test. A
:class:`ReusableSimulator` is built once per design and key, and ``Simulator.reset()`` (every
signal and memory back to its initial value, every clock and testbench restarted) starts each
later run from the same state as a new one. The testbenches of a run are given to :meth:`run`;
the simulator's own testbenches only call them.

A run that raises leaves the simulator unused again: the next :func:`shared` call with that key
builds a new one, so a failing test cannot leave state behind for the next.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable

from amaranth.sim import Simulator

__all__ = ["ReusableSimulator", "shared"]

Testbench = Callable  # async def testbench(ctx)


class ReusableSimulator:
    """``dut`` in a simulator with ``clocks`` (period in seconds, or ``{domain: period}``) and
    room for ``background`` background testbenches and ``processes`` processes per run."""

    def __init__(self, dut, *, clocks: float | dict[str, float], background: int = 0,
                 processes: int = 0):
        self.dut = dut
        self.broken = False
        self._sim = Simulator(dut)
        for domain, period in (clocks.items() if isinstance(clocks, dict)
                               else [("sync", clocks)]):
            self._sim.add_clock(period, domain=domain)
        self._main: Testbench | None = None
        self._background: list[Testbench | None] = [None] * background
        self._sim.add_testbench(self._run_main)
        for i in range(background):
            self._sim.add_testbench(functools.partial(self._run_background, i), background=True)
        self._processes: list[Testbench | None] = [None] * processes
        for i in range(processes):
            self._sim.add_process(functools.partial(self._run_process, i))
        self._used = False

    async def _run_main(self, ctx) -> None:
        await self._main(ctx)

    async def _run_background(self, i: int, ctx) -> None:
        if self._background[i] is not None:
            await self._background[i](ctx)

    async def _run_process(self, i: int, ctx) -> None:
        if self._processes[i] is not None:
            await self._processes[i](ctx)

    def run(self, main: Testbench, *background: Testbench,
            processes: tuple[Testbench, ...] = ()) -> None:
        """Run ``main`` (and ``background`` testbenches and ``processes``, which end with it)
        from the initial state."""
        if self.broken:
            raise RuntimeError("this simulator's last run raised: build a new one")
        for what, given, room in (("background testbenches", background, self._background),
                                  ("processes", processes, self._processes)):
            if len(given) > len(room):
                raise ValueError(f"{len(given)} {what}, room for {len(room)}")
        if self._used:
            self._sim.reset()
        self._used = True
        self._main = main
        self._background = list(background) + [None] * (len(self._background) - len(background))
        self._processes = list(processes) + [None] * (len(self._processes) - len(processes))
        try:
            self._sim.run()
        except BaseException:
            self.broken = True
            raise


_SHARED: dict[Hashable, ReusableSimulator] = {}


def shared(key: Hashable, make_dut: Callable[[], object], *, clocks: float | dict[str, float],
           background: int = 0, processes: int = 0) -> ReusableSimulator:
    """The :class:`ReusableSimulator` of ``key`` in this process, built (``make_dut()``) the
    first time and again after a run of it raised."""
    rsim = _SHARED.get(key)
    if rsim is None or rsim.broken:
        rsim = _SHARED[key] = ReusableSimulator(make_dut(), clocks=clocks,
                                                background=background, processes=processes)
    return rsim
