"""The kernel language: the ``@kernel`` decorator and the names a kernel's body uses.

A quantum kernel is a Python function decorated with :func:`kernel`. Its body is never run by
Python: :class:`Kernel` reads its source (:func:`inspect.getsource`) and the compiler
(:mod:`openqlink.kernels.compiler`) lowers it, through a calibration table, to a PPU program.
The functions here (:func:`qubit`, :func:`h`, :func:`mz`, :func:`device_call`, ...) are the
names the body uses; called outside a kernel they raise :class:`KernelCompileError`.

The names and the argument order are CUDA-Q's (``cudaq.qubit``, ``cudaq.qvector``, ``h(q)``,
``rx(angle, q)``, ``mz(q)``, ``cz(a, b)``) and NVQLink's ``device_call(handler, *args)``
(arXiv 2510.25213, "the NVQLink programming model").
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import QlinkError

if TYPE_CHECKING:
    from ..calibration import CalibrationTable
    from ..memory_map import QSCParams
    from .compiler import CompiledKernel

__all__ = [
    "KernelCompileError", "Kernel", "kernel", "qubit", "qvector", "x", "y", "z", "h", "s", "t",
    "rx", "ry", "rz", "cz", "mz", "device_call", "GATES",
]


class KernelCompileError(QlinkError, ValueError):
    """A kernel the compiler cannot lower; the message starts with ``file:line:`` of the
    kernel's source and says what is not supported. ``filename`` and ``lineno`` hold them."""

    def __init__(self, message: str, filename: str = "<kernel>", lineno: int = 0):
        super().__init__(f"{filename}:{lineno}: {message}")
        self.filename = filename
        self.lineno = lineno


class Kernel:
    """A quantum kernel: the decorated function, its parsed source and its parameters.

    ``kernel.compile(table, *args)`` lowers it for the argument values ``args`` (every
    parameter is bound when the kernel is compiled, i.e. at launch) and returns a
    :class:`~openqlink.kernels.compiler.CompiledKernel` whose ``assembly`` is the PPU program
    as text. Calling a kernel directly raises: kernels run on a QSC
    (:func:`openqlink.nvqlink.launch_kernel`).

    Raises :class:`KernelCompileError` when the source cannot be read (a kernel defined in an
    interactive session) or is not a plain ``def``.
    """

    def __init__(self, func: Callable[..., Any]):
        if not inspect.isfunction(func):
            raise KernelCompileError(f"@kernel decorates a function, not {func!r}")
        self.func = func
        self.name = func.__name__
        self.filename = inspect.getsourcefile(func) or "<kernel>"
        try:
            lines, first = inspect.getsourcelines(func)
        except (OSError, TypeError) as exc:
            raise KernelCompileError(f"cannot read the source of kernel {self.name!r}: {exc}",
                                     self.filename, func.__code__.co_firstlineno) from None
        tree = ast.parse(textwrap.dedent("".join(lines)))
        ast.increment_lineno(tree, first - 1)
        node = tree.body[0]
        if not isinstance(node, ast.FunctionDef):
            raise KernelCompileError("a kernel is a plain `def` function", self.filename, first)
        self.tree: ast.FunctionDef = node
        self.params = [a.arg for a in node.args.args]
        args = node.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs or args.defaults:
            raise KernelCompileError("a kernel takes plain positional parameters only (no "
                                     "defaults, *args, **kwargs or keyword-only ones)",
                                     self.filename, node.lineno)
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def compile(self, table: CalibrationTable, *args: Any,
                params: QSCParams | None = None) -> CompiledKernel:
        """Lower the kernel for ``args`` through ``table`` to a program of the build
        ``params`` (default ``QSCParams()``); see :mod:`openqlink.kernels.compiler`."""
        from .compiler import compile_kernel

        return compile_kernel(self, table, args, params=params)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise KernelCompileError(f"kernel {self.name!r} runs on a QSC: launch it with "
                                 "openqlink.nvqlink.launch_kernel (or compile it with "
                                 ".compile(table))", self.filename, self.tree.lineno)

    def __repr__(self) -> str:
        return f"<openqlink kernel {self.name}({', '.join(self.params)})>"


def kernel(func: Callable[..., Any]) -> Kernel:
    """Decorator: make ``func`` a quantum :class:`Kernel` (its body is compiled, never run)."""
    return Kernel(func)


def _only_in_kernels(name: str) -> Callable[..., Any]:
    def stub(*args: Any, **kwargs: Any) -> Any:
        raise KernelCompileError(f"{name}() is used inside an @openqlink.kernel function only")

    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = f"``{name}`` in a kernel body (see docs/kernels.md); not callable elsewhere."
    return stub


qubit = _only_in_kernels("qubit")
qvector = _only_in_kernels("qvector")
x = _only_in_kernels("x")
y = _only_in_kernels("y")
z = _only_in_kernels("z")
h = _only_in_kernels("h")
s = _only_in_kernels("s")
t = _only_in_kernels("t")
rx = _only_in_kernels("rx")
ry = _only_in_kernels("ry")
rz = _only_in_kernels("rz")
cz = _only_in_kernels("cz")
mz = _only_in_kernels("mz")
device_call = _only_in_kernels("device_call")

#: The gates a kernel may apply: name -> number of angle arguments before the qubit(s).
GATES = {"x": 0, "y": 0, "z": 0, "h": 0, "s": 0, "t": 0, "rx": 1, "ry": 1, "rz": 1, "cz": 0}
