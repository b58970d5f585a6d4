"""openqlink: the host side of an NVQLink-style real-time link between a QPU control system
(QSC) and CPUs/GPUs.

Subpackages and modules:

* :mod:`openqlink.wire`: codecs of every header on the wire (Ethernet, IPv4, UDP, RoCEv2 BTH/RETH/
  ImmDt with the ICRC, the control plane, CUDA-Q realtime's RPC messages).
* :mod:`openqlink.isa`: the PPU instruction layout shared with the gateware, the assembler.
* :mod:`openqlink.qsc`: :class:`~openqlink.qsc.QSC`, the device client (connect, configure,
  upload, trigger, read status and counters) over a :mod:`openqlink.bridges` transport.
* :mod:`openqlink.dispatch`: CUDA-Q style function table and the non-blocking dispatcher
  (HOST_CALL in Python, DEVICE_CALL through :mod:`openqlink.gpu`).
* :mod:`openqlink.gateware`: the Amaranth QSC gateware; :mod:`openqlink.sim`: the cocotb bench.
* :mod:`openqlink.memory_map`: the memory map and QP contract shared by all of the above.
* :mod:`openqlink.kernels`: ``@openqlink.kernel`` quantum kernels (``openqlink.qubit``,
  ``openqlink.h``, ``openqlink.mz``, ``openqlink.device_call``, ...), lowered through a
  calibration table to PPU programs; :mod:`openqlink.nvqlink`: the NVQLink-style library API
  (initialize, malloc, memcpy_to_qpu, load_kernel, launch_kernel, ...).
* :mod:`openqlink.plot`: pictures of a run's timeline and latency histograms (matplotlib, the
  ``[plot]`` extra, imported only to draw).
"""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__", "kernel", "qubit", "qvector", "x", "y", "z", "h", "s", "t", "rx",
           "ry", "rz", "cz", "mz", "device_call"]

#: The kernel language's names, imported from openqlink.kernels on first use (so that
#: ``import openqlink`` stays light).
_KERNEL_NAMES = frozenset(__all__[1:])

try:
    __version__ = version("openqlink")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"


def __getattr__(name: str):
    if name in _KERNEL_NAMES:
        from . import kernels

        return getattr(kernels, name)
    raise AttributeError(f"module 'openqlink' has no attribute {name!r}")
