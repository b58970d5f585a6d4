"""Loading the HOST_CALL handlers of a PPU program.

A program ``foo.s`` keeps its handlers in ``foo.py`` beside it (or in a file named with
``--handlers``): a Python module with a module-level ``table``, an
:class:`openqlink.dispatch.FunctionTable`. For ``qlink sim --gpu`` the module also has a
function ``device_table()`` returning the table whose DEVICE_CALL entries the GPU unified
dispatch kernel serves (a function, so that CPU-only runs never import CUDA).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..dispatch import FunctionTable
from ..errors import DispatchError

__all__ = ["default_handlers_path", "load_function_table"]


def default_handlers_path(program: str | Path) -> Path | None:
    """``foo.py`` beside ``foo.s``, if it exists."""
    candidate = Path(program).with_suffix(".py")
    return candidate if candidate.is_file() else None


def load_function_table(path: str | Path | None, *, gpu: bool = False) -> FunctionTable:
    """Import ``path`` and return its ``table`` (``gpu``: what its ``device_table()`` returns);
    an empty table when ``path`` is None.

    Raises :class:`DispatchError` (one line, naming the file) when the file cannot be read or
    imported (a syntax error names its line), has no ``table`` (``device_table``) or it does
    not give a FunctionTable.
    """
    if path is None:
        if gpu:
            raise DispatchError("--gpu needs a handlers file with a device_table() function")
        return FunctionTable()
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"openqlink_handlers_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise DispatchError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise DispatchError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from None
    except OSError as exc:
        raise DispatchError(f"{path}: {exc.strerror or exc}") from None
    except Exception as exc:   # the user's module failed while importing
        raise DispatchError(f"{path}: importing it raised {type(exc).__name__}: {exc}") from None
    if gpu:
        make = getattr(module, "device_table", None)
        if not callable(make):
            raise DispatchError(f"{path}: --gpu needs a function device_table() returning the "
                                "FunctionTable of DEVICE_CALL handlers")
        table = make()
    else:
        table = getattr(module, "table", None)
    if not isinstance(table, FunctionTable):
        raise DispatchError(f"{path}: needs a module-level `table` (openqlink.dispatch."
                            f"FunctionTable), found {type(table).__name__}")
    return table
