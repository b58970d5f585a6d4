"""cocotb benches and models of the QSC's peers (MAC, qubit, host), and the runner of
``qlink sim``. See ``docs/simulation.md``.

:class:`SimulatedQSC` (:mod:`openqlink.sim.serve`) is the simulated QSC as a device: an
:class:`openqlink.qsc.QSC` whose transport reaches ``qlink sim --serve`` in a child process.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SimulatedQSC", "SimulationError"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the benches and the CLI import this package without them.
    if name == "SimulatedQSC":
        from .serve import SimulatedQSC

        return SimulatedQSC
    if name == "SimulationError":
        from .runner import SimulationError

        return SimulationError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
