"""openqlink.kernels: quantum kernels in Python, lowered to PPU programs.

``@openqlink.kernel`` (:func:`~openqlink.kernels.lang.kernel`) marks a function whose body is
a small subset of Python: qubit allocation, gates, measurement, classical control on the
results, loops and NVQLink's ``device_call(handler, *args)``. :mod:`.compiler` lowers it
through a :class:`~openqlink.calibration.CalibrationTable` to PPU assembly and a program;
:mod:`openqlink.nvqlink` loads and launches it on a QSC. ``docs/kernels.md`` describes the
language and the lowering.
"""

from .compiler import CompiledKernel, KernelResult, compile_kernel, handler_schema
from .lang import (
    GATES,
    Kernel,
    KernelCompileError,
    cz,
    device_call,
    h,
    kernel,
    mz,
    qubit,
    qvector,
    rx,
    ry,
    rz,
    s,
    t,
    x,
    y,
    z,
)

__all__ = [
    "Kernel", "KernelCompileError", "CompiledKernel", "KernelResult", "compile_kernel",
    "handler_schema", "kernel", "qubit", "qvector", "x", "y", "z", "h", "s", "t", "rx", "ry",
    "rz", "cz", "mz", "device_call", "GATES",
]
