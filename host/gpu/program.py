"""The dispatch module: kernel + bridge hooks + handlers, all LTO-IR, linked into one cubin.

A :class:`DispatchProgram` collects, for one architecture:

* the dispatch kernel (:class:`DispatchKernel`: the built-in ``qlink_unified_dispatch`` of
  ``unified_dispatch.cu``, or the application's own source, entry and launcher);
* the transport bridge's hooks ``cudaq_dev_transport_attach`` / ``cudaq_dev_rx_poll`` /
  ``cudaq_dev_tx_publish`` (:class:`TransportBridge`; :data:`LOOPBACK_BRIDGE` is the GPU
  loopback over mapped pinned memory), resolved at link time, not through pointers;
* the DEVICE_CALL handlers (:mod:`openqlink.gpu.handlers`), one per function-table entry;
* a generated unit defining ``qlink_call_handler_id`` (the kernel's call of a handler: through
  the table's pointer, or, with ``inline_handlers=True``, a ``switch`` on the request's
  function_id with direct calls that LTO can inline, the pointer remaining the fallback),
  ``qlink_call_handler`` (the same, given the entry alone, for custom kernels) and one exported
  variable ``qlink_fnptr_<symbol>`` per handler holding its address, read back by
  :meth:`openqlink.gpu.GPUDataPlane.get_device_handler`.

:meth:`DispatchProgram.link` compiles what the :class:`~openqlink.gpu.toolchain.LinkCache`
does not already hold and links with nvJitLink (``-lto -arch=sm_XY``); it needs no GPU.

# Ref: cuda-quantum realtime/lib/daemon/dispatcher/unified_dispatch_kernel.cu and
# unified_device_transport.cuh (hooks resolved at device link time, one module with the
# kernel and the handlers); CUDA-Q PR 5722/5778 (run-time nvJitLink of the unified kernel)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..dispatch import DispatchMode, FunctionEntry, TypeDesc
from ..errors import DispatchError, LinkError
from ..wire.rpc import PayloadType
from .handlers import HANDLER_SIGNATURE, DeviceHandler
from .sources import headers, read_source
from .toolchain import (
    LinkCache,
    LinkInput,
    cache_key,
    cubin_symbols,
    default_cache,
    nvjitlink_link,
    nvrtc_compile,
    parse_arch,
    toolchain_versions,
)

__all__ = [
    "DispatchKernel",
    "TransportBridge",
    "LOOPBACK_BRIDGE",
    "FRAME_BRIDGE",
    "LaunchArgs",
    "LinkedProgram",
    "DispatchProgram",
    "BUILTIN_KERNEL_ENTRY",
    "FNPTR_PREFIX",
    "builtin_launch",
    "warp_launch",
]

log = logging.getLogger(__name__)

#: Entry point of the built-in unified dispatch kernel.
BUILTIN_KERNEL_ENTRY = "qlink_unified_dispatch"
#: Prefix of the exported variables holding each handler's address.
FNPTR_PREFIX = "qlink_fnptr_"


@dataclass(frozen=True)
class LaunchArgs:
    """What a dispatch-kernel launcher gets (device addresses are ``int``).

    ``function`` is the kernel (a ``CUfunction``), ``stream`` the ``CUstream`` it must run on
    (non-blocking, owned by the data plane); ``transport_ctx`` the bridge's device context;
    ``table``/``count`` the device function table; ``max_arg_len``/``max_result_len`` the slot
    payload and handler output capacities in bytes; ``shutdown_flag`` (``volatile int*``) and
    ``processed`` (``uint64_t*``) in mapped pinned memory; ``timing_ns``/``timing_capacity`` the
    optional turnaround ring (0/0 for none); ``handler_out_bytes`` the dynamic shared memory
    (bytes) the launch must give the kernel: the built-in kernel's handlers write into it (their
    private output area, ``max_result_len`` rounded up to 16 plus a guard), and a kernel launched
    with less gives its handlers only what it got. ``launch(kernel, args)`` of :mod:`.driver`
    launches.
    """

    function: Any
    stream: Any
    transport_ctx: int
    table: int
    count: int
    max_arg_len: int
    max_result_len: int
    shutdown_flag: int
    processed: int
    timing_ns: int
    timing_capacity: int
    handler_out_bytes: int = 0


def builtin_launch(args: LaunchArgs, threads: int = 1) -> None:
    """Launch a kernel with the built-in parameter list (nine parameters) <<<1, threads>>> and
    ``args.handler_out_bytes`` of dynamic shared memory: one thread by default, as CUDA-Q
    launches its unified kernel. Raises :class:`~openqlink.errors.GPUError`."""
    import ctypes

    from .driver import launch
    p, u32 = ctypes.c_void_p, ctypes.c_uint32
    launch(args.function, args.stream, grid=(1, 1, 1), block=(threads, 1, 1), params=[
        (args.transport_ctx, p), (args.table, p), (args.count, u32), (args.max_arg_len, u32),
        (args.max_result_len, u32), (args.shutdown_flag, p), (args.processed, p),
        (args.timing_ns, p), (args.timing_capacity, u32)], shared_bytes=args.handler_out_bytes)


def warp_launch(args: LaunchArgs) -> None:
    """Launch the built-in ``qlink_unified_dispatch`` <<<1, 32>>>: one warp, whose lanes call
    the transport hooks together (the loopback bridge reads a request line in one load)."""
    builtin_launch(args, threads=32)


@dataclass(frozen=True)
class DispatchKernel:
    """A persistent dispatch kernel: CUDA C++ ``source`` defining ``extern "C" __global__``
    ``entry``, and the ``launch`` callable that starts it from a :class:`LaunchArgs`.

    The source may ``#include "openqlink_dispatch.cuh"`` and call the transport hooks and
    ``qlink_call_handler``. ``launch=None`` means :func:`builtin_launch` (<<<1, 1>>>, the nine
    parameters of ``qlink_unified_dispatch`` in order), so a custom kernel with the built-in
    parameter list needs no launcher of its own. :meth:`builtin` launches one warp
    (:func:`warp_launch`).
    """

    source: str
    entry: str = BUILTIN_KERNEL_ENTRY
    launch: Callable[[LaunchArgs], None] | None = None
    name: str = "dispatch_kernel.cu"
    options: tuple[str, ...] = ()

    @classmethod
    def builtin(cls) -> DispatchKernel:
        """The packaged unified dispatch kernel (``unified_dispatch.cu``)."""
        return cls(read_source("unified_dispatch.cu"), BUILTIN_KERNEL_ENTRY, warp_launch,
                   "unified_dispatch.cu")

    def launcher(self) -> Callable[[LaunchArgs], None]:
        return self.launch if self.launch is not None else builtin_launch


@dataclass(frozen=True)
class TransportBridge:
    """A transport bridge's device side: CUDA C++ ``source`` defining the three
    ``extern "C" __device__`` hooks of ``openqlink_dispatch.cuh``."""

    name: str
    source: str
    options: tuple[str, ...] = ()


def _loopback() -> TransportBridge:
    return TransportBridge("loopback_bridge.cu", read_source("loopback_bridge.cu"))


#: The GPU loopback bridge (mapped pinned host memory, :mod:`openqlink.gpu.loopback`).
LOOPBACK_BRIDGE = _loopback()
#: The GPU RoCE endpoint's bridge: raw RoCEv2 frames in mapped pinned host memory
#: (:mod:`openqlink.gpu.frames`).
FRAME_BRIDGE = TransportBridge("roce_frame_bridge.cu", read_source("roce_frame_bridge.cu"))


@dataclass(frozen=True)
class LinkedProgram:
    """A linked dispatch module: the cubin, its cache key, whether the cache supplied it, the
    kernel entry, and handler name -> exported address variable."""

    cubin: bytes
    key: str
    from_cache: bool
    arch: str
    kernel: DispatchKernel
    fnptr_symbols: dict[str, str] = field(default_factory=dict)

    @property
    def symbols(self) -> set[str]:
        return cubin_symbols(self.cubin)


class DispatchProgram:
    """Collects the dispatch module's parts for ``arch`` (``"sm_90"``) and links them.

    Parameters
    ----------
    arch : str
        The GPU's architecture, ``sm_XY``: the actual GPU's (see
        :attr:`openqlink.gpu.driver.Device.arch`) or an explicit one for CI.
    kernel : DispatchKernel, optional
        Default: :meth:`DispatchKernel.builtin`.
    bridge : TransportBridge, optional
        Default: :data:`LOOPBACK_BRIDGE`.
    inline_handlers : bool
        Resolve handler calls at link time (direct calls, inlined by LTO) instead of through the
        function table's pointer.
    cache : LinkCache | bool
        ``True``: :func:`~openqlink.gpu.toolchain.default_cache`; ``False``: no cache.

    Raises :class:`openqlink.errors.DispatchError` for a bad entry, :class:`GPUError` for a bad
    arch.
    """

    def __init__(self, arch: str, *, kernel: DispatchKernel | None = None,
                 bridge: TransportBridge | None = None, inline_handlers: bool = False,
                 cache: LinkCache | bool = True):
        parse_arch(arch)
        self.arch = arch
        self.kernel = kernel if kernel is not None else DispatchKernel.builtin()
        self.bridge = bridge if bridge is not None else LOOPBACK_BRIDGE
        self.inline_handlers = inline_handlers
        self.cache: LinkCache | None = (default_cache() if cache is True
                                        else None if cache is False else cache)
        self._entries: dict[str, FunctionEntry] = {}
        self.linked: LinkedProgram | None = None

    # ---- handlers ----
    def add(self, entry: FunctionEntry) -> FunctionEntry:
        """Add a DEVICE_CALL ``entry`` whose ``handler`` is a :class:`DeviceHandler`.

        Raises :class:`DispatchError` for another mode, another kind of handler, a name added
        twice, two handlers with one symbol or one function_id (the names' FNV-1a hashes
        collide), or a program already linked.
        """
        if self.linked is not None:
            raise DispatchError(f"cannot add {entry.name!r}: the dispatch module is already "
                                "linked (add every handler before the first lookup)")
        if entry.mode != DispatchMode.DEVICE_CALL:
            raise DispatchError(f"{entry.name!r} is {entry.mode.name}, not DEVICE_CALL")
        if not isinstance(entry.handler, DeviceHandler):
            raise DispatchError(f"DEVICE_CALL {entry.name!r}: handler {entry.handler!r} is not "
                                "a CudaHandler or NumbaHandler")
        if entry.name in self._entries:
            raise DispatchError(f"handler {entry.name!r} is already in the dispatch program")
        symbol = entry.handler.resolve_symbol(entry.name)
        for other in self._entries.values():
            assert isinstance(other.handler, DeviceHandler)
            if other.function_id == entry.function_id:
                raise DispatchError(f"handlers {other.name!r} and {entry.name!r} share the "
                                    f"function_id {entry.function_id:#010x}")
            if other.handler.resolve_symbol(other.name) == symbol:
                raise DispatchError(f"handlers {other.name!r} and {entry.name!r} share the C "
                                    f"symbol {symbol!r}")
        self._entries[entry.name] = entry
        return entry

    def add_handler(self, name: str, handler: DeviceHandler, *,
                    args: Iterable[TypeDesc | PayloadType] = (),
                    results: Iterable[TypeDesc | PayloadType] = ()) -> FunctionEntry:
        """Make and :meth:`add` the DEVICE_CALL entry ``name`` with this schema."""
        return self.add(FunctionEntry(name, DispatchMode.DEVICE_CALL, tuple(args),
                                      tuple(results), handler))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    @property
    def entries(self) -> list[FunctionEntry]:
        return list(self._entries.values())

    def symbol(self, name: str) -> str:
        """The C symbol of handler ``name``; raises :class:`KeyError`."""
        handler = self._entries[name].handler
        assert isinstance(handler, DeviceHandler)
        return handler.resolve_symbol(name)

    # ---- the generated call unit ----
    def call_source(self) -> str:
        """CUDA C++ of ``qlink_call_handler``, ``qlink_call_handler_id`` and the
        ``qlink_fnptr_<symbol>`` variables."""
        lines = ["// Generated by openqlink.gpu: handler calls and exported handler addresses.",
                 '#include "openqlink_dispatch.cuh"']
        symbols = []
        for e in self._entries.values():
            sym = self.symbol(e.name)
            symbols.append((e, sym))
            lines.append(f'extern "C" __device__ {HANDLER_SIGNATURE % sym};')
            lines.append(f'extern "C" __device__ qlink_device_rpc_fn {FNPTR_PREFIX}{sym} = {sym};')
        lines.append('extern "C" __device__ int qlink_call_handler_id(uint32_t function_id, '
                     "const qlink_function_entry* e, const void* in, void* out, uint32_t arg_len, "
                     "uint32_t max_result_len, uint32_t* result_len) {")
        if self.inline_handlers and symbols:
            lines.append("    switch (function_id) {")
            for e, sym in symbols:
                lines.append(f"    case {e.function_id:#010x}u: return {sym}(in, out, arg_len, "
                             "max_result_len, result_len);")
            lines.append("    default: break;")
            lines.append("    }")
        # Through the table's pointer: the callee gets the address of a variable of its own,
        # so that the caller's result_len (in the kernel, once this is inlined) never has its
        # address taken and stays in a register on the direct calls' path.
        lines.append("    uint32_t n = 0;")
        lines.append("    const int status = reinterpret_cast<qlink_device_rpc_fn>("
                     "e->handler.device_fn_ptr)(in, out, arg_len, max_result_len, &n);")
        lines.append("    *result_len = n;")
        lines.append("    return status;")
        lines.append("}")
        lines.append('extern "C" __device__ int qlink_call_handler(const qlink_function_entry* e, '
                     "const void* in, void* out, uint32_t arg_len, uint32_t max_result_len, "
                     "uint32_t* result_len) {")
        lines.append("    return qlink_call_handler_id(e->function_id, e, in, out, arg_len, "
                     "max_result_len, result_len);")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def key(self) -> str:
        """The cache key of the linked module."""
        parts: list[str | bytes] = [
            "dispatch-module", self.arch, toolchain_versions().key(),
            self.kernel.name, self.kernel.source, self.kernel.entry, *self.kernel.options,
            self.bridge.name, self.bridge.source, *self.bridge.options,
            *headers().values(), self.call_source()]
        for e in self._entries.values():
            assert isinstance(e.handler, DeviceHandler)
            parts += [e.name, e.handler.key(e, self.arch)]
        return cache_key(*parts)

    def compile_inputs(self) -> list[LinkInput]:
        """Compile every part to LTO-IR (no cache): kernel, bridge, call unit, handlers."""
        heads = headers()
        inputs = [
            LinkInput(self.kernel.name, nvrtc_compile(self.kernel.source, self.kernel.name,
                                                      self.arch, headers=heads,
                                                      options=self.kernel.options)),
            LinkInput(self.bridge.name, nvrtc_compile(self.bridge.source, self.bridge.name,
                                                      self.arch, headers=heads,
                                                      options=self.bridge.options)),
            LinkInput("qlink_call.cu", nvrtc_compile(self.call_source(), "qlink_call.cu",
                                                     self.arch, headers=heads)),
        ]
        for e in self._entries.values():
            assert isinstance(e.handler, DeviceHandler)
            inputs += e.handler.compile(e, self.arch)
        return inputs

    def link(self, *, extra: Sequence[LinkInput] = ()) -> LinkedProgram:
        """Compile and link (or take the cubin from the cache); the result is kept in
        :attr:`linked` and later calls return it.

        ``extra`` LTO-IR modules are linked too (they make the key: no cache then). Raises
        :class:`~openqlink.errors.CompileError`, :class:`~openqlink.errors.LinkError` (with
        nvJitLink's log; also when the cubin lacks the kernel entry or a handler's address).
        """
        if self.linked is not None:
            return self.linked
        fnptrs = {e.name: FNPTR_PREFIX + self.symbol(e.name) for e in self._entries.values()}
        key = self.key()
        cubin = None
        if self.cache is not None and not extra:
            cubin = self.cache.get(key)
        from_cache = cubin is not None
        if cubin is None:
            inputs = self.compile_inputs() + list(extra)
            cubin = nvjitlink_link(inputs, self.arch)
            names = tuple(i.name for i in inputs)
            missing = {self.kernel.entry, *fnptrs.values()} - cubin_symbols(cubin)
            if missing:
                raise LinkError(names, f"the linked module lacks {', '.join(sorted(missing))}")
            if self.cache is not None and not extra:
                self.cache.put(key, cubin)
        log.info("dispatch module for %s: %d handlers, %d-byte cubin%s", self.arch,
                 len(fnptrs), len(cubin), " (cached)" if from_cache else "")
        self.linked = LinkedProgram(cubin, key, from_cache, self.arch, self.kernel, fnptrs)
        return self.linked
