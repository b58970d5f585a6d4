"""HOST_CALL handlers of ``firmware/active_reset_fidelity.s``: those of the active-reset example.

The program calls ``reset_decision(r1:1) -> r2`` once per shot, the handler of
``firmware/active_reset.py``; this file serves that module's :data:`table` (``qlink sim`` takes
the ``.py`` beside a program as its handlers).
"""

from __future__ import annotations

from pathlib import Path

from openqlink.sim.handlers import load_function_table

__all__ = ["table"]

#: The function table of ``firmware/active_reset.py``.
table = load_function_table(Path(__file__).with_name("active_reset.py"))
