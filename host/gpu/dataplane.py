"""GPUDataPlane: the persistent unified dispatch kernel over the GPU loopback ring.

``GPUDataPlane(num_slots, slot_size)`` owns, once started: the dispatch module (kernel + loopback
bridge hooks + handlers, linked by nvJitLink for the GPU's own ``sm_XY`` and loaded as one module
on the first handler lookup), the device function table, the request/response rings in mapped
pinned memory (:class:`~openqlink.gpu.loopback.LoopbackRing`), the shutdown flag and the
processed counter, and the kernel's non-blocking stream.

Life cycle::

    plane = GPUDataPlane(num_slots=8, slot_size=256)
    plane.add_handler("add", CudaHandler(SRC), args=(INT32, INT32), results=(INT32,))
    addr = plane.get_device_handler("add")      # links and loads the module
    plane.start([entry, ...])                   # device table, rings, launch (one warp)
    slot = plane.submit(request_bytes)          # host -> ring (strict ring order)
    plane.poll_response()                       # -> (slot, response bytes) | None
    plane.stop()                                # shutdown flag, wait for the kernel

Requests are checked against the schema in the kernel too (arg_len vs the entry's schema:
status -2; arg_len beyond the slot: -3; bad magic or unknown function_id: -1), so a transport
that writes the ring directly is safe; the :class:`~openqlink.dispatch.Dispatcher` checks them on
the host before forwarding, and answers bad ones itself.

``start()`` refuses (:class:`~openqlink.errors.DispatchError`) a DEVICE_CALL entry whose handler
is an address that :meth:`GPUDataPlane.get_device_handler` did not return for that module.

# Ref: cuda-quantum realtime/lib/daemon/dispatcher/cudaq_realtime_api.cpp (start validates,
# launches the persistent kernel on its own stream; stop sets the shutdown flag and waits;
# get_processed); realtime/docs/cudaq_realtime_host_api.md (CUDAQ_KERNEL_UNIFIED)
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Iterable
from typing import Any

from ..dispatch import DispatchMode, FunctionEntry, TypeDesc
from ..errors import DispatchError, GPUError
from ..wire.rpc import HEADER_BYTES, PayloadType
from .driver import (
    Device,
    DeviceMemory,
    Module,
    PinnedMemory,
    Stream,
    function_attribute,
    set_function_attribute,
)
from .handlers import DeviceHandler
from .loopback import CTX_BYTES, LoopbackRing, check_host_order
from .program import (
    LOOPBACK_BRIDGE,
    DispatchKernel,
    DispatchProgram,
    LaunchArgs,
    LinkedProgram,
    TransportBridge,
)
from .toolchain import LinkCache

__all__ = ["GPUDataPlane", "ENTRY_BYTES", "HANDLER_GUARD_BYTES", "pack_device_entry"]

log = logging.getLogger(__name__)

#: Size of one device function-table entry (``cudaq_function_entry_t``).
ENTRY_BYTES = 168
#: Bytes of a handler's private output area past ``max_result_len`` (rounded up to 16): what a
#: handler writes there is dropped; past them the GPU faults the kernel (``start``).
HANDLER_GUARD_BYTES = 8192


def _align16(n: int) -> int:
    return (n + 15) // 16 * 16


def pack_device_entry(entry: FunctionEntry, address: int) -> bytes:
    """The 168-byte device table entry: handler address (u64), function_id (u32),
    dispatch_mode (u8), 3 reserved, the 148-byte schema, 4 bytes of padding."""
    out = (struct.pack("<QIB3x", address, entry.function_id, int(entry.mode))
           + entry.schema_bytes())
    return out + bytes(ENTRY_BYTES - len(out))


def _ring_order(items: list[Any], count: int) -> list[Any]:
    """The entries of a ring of ``len(items)`` written ``count`` times, oldest first."""
    cap = len(items)
    if count <= cap:
        return items[:count]
    start = count % cap
    return items[start:] + items[:start]


class GPUDataPlane:
    """The GPU loopback data plane with its persistent dispatch kernel.

    Parameters
    ----------
    num_slots, slot_size : int
        Ring geometry (1..4096 slots; slot_size a multiple of 16, at least 32 bytes).
    device : int
        CUDA device ordinal.
    arch : str, optional
        ``sm_XY`` to link for; default the device's own (linking then needs the driver).
    kernel : DispatchKernel, optional
        A custom dispatch kernel and launcher instead of the built-in one.
    inline_handlers : bool
        Default ``True``: the kernel calls the program's handlers directly (a ``switch`` on
        function_id that LTO inlines; the table's pointer stays the fallback for other
        function_ids); ``False``: every call through the table's pointer, as CUDA-Q. Both run
        the same handler for every table :meth:`start` accepts (with ``True`` it refuses an
        entry whose address is another of the program's handlers than its function_id's).
    cache : LinkCache | bool
        Link cache (default: the on-disk one); ``False`` for none.
    timing_capacity : int
        Keep the in-kernel turnaround (ns, %globaltimer) of the last ``timing_capacity``
        requests in device memory (:meth:`timings_ns`); 0 for none.
    bridge : TransportBridge, optional
        The loopback bridge's device source (default :data:`LOOPBACK_BRIDGE`), e.g. with other
        compile-time options (``-DQLINK_LOOPBACK_PREFETCH_BYTES=128``).
    trace_capacity : int
        Diagnostic: compile the bridge with ``QLINK_LOOPBACK_TRACE`` and keep the stage times of
        the last ``trace_capacity`` requests (:meth:`traces_ns`); 0 for none.

    Attributes
    ----------
    ring : LoopbackRing | None
        The rings, while started.
    """

    def __init__(self, num_slots: int = 8, slot_size: int = 256, *, device: int = 0,
                 arch: str | None = None, kernel: DispatchKernel | None = None,
                 inline_handlers: bool = True, cache: LinkCache | bool = True,
                 timing_capacity: int = 0, bridge: TransportBridge | None = None,
                 trace_capacity: int = 0):
        LoopbackRing.check_geometry(num_slots, slot_size)
        if timing_capacity < 0:
            raise DispatchError(f"timing_capacity must be >= 0, not {timing_capacity}")
        if trace_capacity < 0:
            raise DispatchError(f"trace_capacity must be >= 0, not {trace_capacity}")
        bridge = bridge if bridge is not None else LOOPBACK_BRIDGE
        if trace_capacity:
            bridge = TransportBridge(bridge.name, bridge.source,
                                     (*bridge.options, "-DQLINK_LOOPBACK_TRACE"))
        self._bridge = bridge
        self.trace_capacity = trace_capacity
        self._trace: DeviceMemory | None = None
        self.num_slots = num_slots
        self.slot_size = slot_size
        self.device_ordinal = device
        self.timing_capacity = timing_capacity
        self._arch = arch
        self._kernel = kernel
        self._inline = inline_handlers
        self._cache = cache
        self._device: Device | None = None
        self._program: DispatchProgram | None = None
        self._module: Module | None = None
        self._addresses: dict[str, int] = {}
        self._handed_out = False  # get_device_handler() gave addresses in the loaded module
        self._stream: Stream | None = None
        self._pinned: PinnedMemory | None = None
        self._dev_buffers: list[DeviceMemory] = []
        self._timing: DeviceMemory | None = None
        self.ring: LoopbackRing | None = None
        self.max_result_len = slot_size - HEADER_BYTES
        self._final_processed = 0

    # ---- device, program ----
    @property
    def device(self) -> Device:
        """The CUDA device (initialised on first use; :class:`GPUUnavailableError` without)."""
        if self._device is None:
            self._device = Device(self.device_ordinal)
        return self._device

    @property
    def arch(self) -> str:
        return self._arch if self._arch is not None else self.device.arch

    @property
    def program(self) -> DispatchProgram:
        if self._program is None:
            self._program = DispatchProgram(self.arch, kernel=self._kernel, bridge=self._bridge,
                                            inline_handlers=self._inline, cache=self._cache)
        return self._program

    def add(self, entry: FunctionEntry) -> FunctionEntry:
        """Add a DEVICE_CALL entry (handler: :class:`CudaHandler` / :class:`NumbaHandler`)."""
        return self.program.add(entry)

    def add_handler(self, name: str, handler: DeviceHandler, *,
                    args: Iterable[TypeDesc | PayloadType] = (),
                    results: Iterable[TypeDesc | PayloadType] = ()) -> FunctionEntry:
        """Add the DEVICE_CALL handler ``name`` with its schema; returns its entry."""
        return self.program.add_handler(name, handler, args=args, results=results)

    def link(self) -> LinkedProgram:
        """Compile and link the dispatch module (no GPU needed when ``arch`` was given)."""
        return self.program.link()

    @property
    def loaded(self) -> bool:
        return self._module is not None

    def _load(self) -> Module:
        if self._module is None:
            linked = self.link()
            module = self.device.load(linked.cubin)
            try:
                module.function(linked.kernel.entry)  # resolve now: nothing loads lazily later
                addresses = {name: module.read_u64(sym)
                             for name, sym in linked.fnptr_symbols.items()}
            except BaseException:
                try:
                    module.unload()
                except Exception as exc:  # pragma: no cover - the driver failed twice
                    log.warning("unloading a module that failed to resolve: %s", exc)
                raise
            self._addresses = addresses
            self._module = module
        return self._module

    def get_device_handler(self, name: str) -> int:
        """The device address of handler ``name`` in the linked module (links and loads the
        module on the first call). Raises :class:`DispatchError` for an unknown name."""
        if name not in self.program:
            raise DispatchError(f"no DEVICE_CALL handler {name!r} in the dispatch program")
        self._load()
        self._handed_out = True
        return self._addresses[name]

    def owns_address(self, address: int) -> bool:
        """True when ``address`` was returned by :meth:`get_device_handler` for this module."""
        return self._module is not None and address in self._addresses.values()

    # ---- start / stop ----
    @property
    def running(self) -> bool:
        return self._stream is not None

    def _resolve(self, entries: list[FunctionEntry]) -> list[tuple[FunctionEntry, int | None]]:
        """Check entries, add their source handlers; refuse foreign addresses (before any GPU
        work)."""
        out: list[tuple[FunctionEntry, int | None]] = []
        for e in entries:
            if e.mode != DispatchMode.DEVICE_CALL:
                raise DispatchError(f"{e.name!r} is {e.mode.name}; the GPU data plane runs "
                                    "DEVICE_CALL entries")
            h = e.handler
            if isinstance(h, bool) or (h is not None and not isinstance(h, int | DeviceHandler)):
                raise DispatchError(f"DEVICE_CALL {e.name!r}: handler {h!r} is neither a device "
                                    "handler nor an address from get_device_handler()")
            if isinstance(h, int):
                if not self.owns_address(h):
                    raise DispatchError(f"DEVICE_CALL {e.name!r}: address {h:#x} did not come "
                                        "from get_device_handler() of this dispatch module")
                if self._inline:
                    # The inlined switch calls the program's handler of this function_id: the
                    # table's address must be that one, or the two call paths would differ.
                    for other in self.program.entries:
                        if (other.function_id == e.function_id
                                and self._addresses.get(other.name) != h):
                            raise DispatchError(
                                f"DEVICE_CALL {e.name!r}: address {h:#x} is not the program's "
                                f"handler {other.name!r} of function_id {e.function_id:#010x}, "
                                "which inline_handlers=True calls directly; use that handler's "
                                "address or inline_handlers=False")
                out.append((e, h))
                continue
            if isinstance(h, DeviceHandler) and e.name not in self.program:
                self.program.add(e)
            elif e.name not in self.program:
                raise DispatchError(f"DEVICE_CALL {e.name!r} has no handler: give it a "
                                    "CudaHandler/NumbaHandler or add one to the GPU data plane")
            out.append((e, None))
        return out

    def start(self, entries: Iterable[FunctionEntry] | None = None, *,
              max_result_bytes: int | None = None) -> None:
        """Build the device function table from ``entries`` (default: every handler added),
        allocate the rings and launch the persistent kernel.

        ``max_result_bytes`` caps what a handler may write (default ``slot_size - 24``). Each
        handler writes into a private output area of ``max_result_len`` (rounded up to 16) plus
        :data:`HANDLER_GUARD_BYTES` bytes at the end of the kernel's shared memory (dynamic
        shared memory, after everything the kernel and the bridge keep there); the kernel copies
        at most ``max_result_len`` bytes of it into the response. A handler that writes past
        ``max_result_len`` thus never reaches the function table or the kernel's state: within
        the guard its extra bytes are dropped, beyond the shared memory the GPU faults the
        kernel (:meth:`stop` then raises :class:`GPUError`).

        Raises :class:`~openqlink.errors.HostOrderError` on a host that is not x86 (before any
        GPU work), :class:`DispatchError` (bad entry, foreign address, already running, a
        private output area larger than the GPU's shared memory per block),
        :class:`~openqlink.errors.CompileError` / :class:`~openqlink.errors.LinkError`,
        :class:`~openqlink.errors.GPUError`. A start that fails leaves nothing behind: the
        buffers and the stream it made are freed, and the module is unloaded and the CUDA
        primary context released (both are taken again by the next use), unless
        :meth:`get_device_handler` has handed out addresses in that module (then :meth:`close`
        gives them back) or the previous run's rings are still held (a restart that failed
        before freeing them).
        """
        check_host_order()
        if self.running:
            raise DispatchError("the GPU data plane is already running")
        allocating = False
        try:
            items = self._resolve(list(entries) if entries is not None
                                  else self.program.entries)
            if not items:
                raise DispatchError("the device function table is empty")
            for e, _ in items:
                if e.arg_len_bytes > self.slot_size - HEADER_BYTES:
                    raise DispatchError(f"{e.name!r} takes {e.arg_len_bytes} argument bytes; a "
                                        f"{self.slot_size}-byte slot holds "
                                        f"{self.slot_size - HEADER_BYTES}")
            cap = self.slot_size - HEADER_BYTES
            if max_result_bytes is not None:
                if max_result_bytes < 0:
                    raise DispatchError(f"max_result_bytes must be >= 0, not "
                                        f"{max_result_bytes}")
                cap = min(cap, max_result_bytes)
            module = self._load()
            allocating = True
            self._free_buffers()  # a restart: the previous run's rings and table
            self._launch(module, items, cap)
        except BaseException:
            self._undo_start(allocating)
            raise

    def _undo_start(self, allocating: bool) -> None:
        """Give back what a failed :meth:`start` took, in reverse order. The error being raised
        is the one to report, so a failure while giving back is logged only."""
        stream, self._stream = self._stream, None
        steps = [stream.destroy if stream is not None else None,
                 self._free_buffers if allocating else None]
        # Keep the module and context while handed-out addresses name the module, or while the
        # previous run's rings (not freed: the call failed before) live in the context.
        previous_rings = not allocating and (self._pinned is not None or bool(self._dev_buffers))
        if not (self._handed_out or previous_rings):
            steps += [self._unload, self._release_device]
        for step in steps:
            if step is None:
                continue
            try:
                step()
            except Exception as exc:  # pragma: no cover - the driver failed twice
                log.warning("cleaning up after a failed start: %s", exc)

    def _launch(self, module: Module, items: list[tuple[FunctionEntry, int | None]],
                cap: int) -> None:
        """Allocate the rings, staging buffers, context and table, and launch the kernel; every
        allocation is recorded on ``self`` as soon as it exists, so that :meth:`start` frees it
        if a later step fails."""
        table = b"".join(pack_device_entry(e, self._addresses[e.name] if a is None else a)
                         for e, a in items)
        dev = self.device
        dev.make_current()
        kernel = self.program.kernel
        function = module.function(kernel.entry)
        out_bytes = _align16(cap) + HANDLER_GUARD_BYTES
        self._reserve_handler_area(function, out_bytes)
        ctx_ptr, shutdown_ptr, processed_ptr = self._make_transport()
        dtable = self._dev_alloc(len(table))
        dtable.upload(table)
        if self.timing_capacity:
            self._timing = self._dev_alloc(8 * self.timing_capacity)
        self.max_result_len = cap
        stream = dev.stream()
        self._stream = stream
        args = LaunchArgs(
            function=function, stream=stream.handle,
            transport_ctx=ctx_ptr, table=dtable.ptr, count=len(items),
            max_arg_len=self.slot_size - HEADER_BYTES, max_result_len=cap,
            shutdown_flag=shutdown_ptr, processed=processed_ptr,
            timing_ns=self._timing.ptr if self._timing is not None else 0,
            timing_capacity=self.timing_capacity, handler_out_bytes=out_bytes)
        kernel.launcher()(args)
        log.info("dispatch kernel %s running on %s (%s): %d entries, %d x %d-byte slots",
                 kernel.entry, dev.name, self.arch, len(items), self.num_slots, self.slot_size)

    def _make_transport(self) -> tuple[int, int, int]:
        """Allocate the bridge's memory and device context; returns the device addresses of
        the context, the shutdown flag and the processed counter. Every allocation is recorded
        on ``self`` (``_pinned``, :meth:`_dev_alloc`) as soon as it exists."""
        dev = self.device
        self._pinned = dev.alloc_pinned(LoopbackRing.size_for(self.num_slots, self.slot_size))
        self.ring = LoopbackRing(self._pinned, self.num_slots, self.slot_size)
        # The request and response staging buffers, used when a slot is too large for shared
        # memory, then the transport context.
        rx_stage = self._dev_alloc(self.ring.stride)
        tx_stage = self._dev_alloc(self.ring.stride)
        if self.trace_capacity:
            self._trace = self._dev_alloc(64 * self.trace_capacity)
        ctx = self._dev_alloc(CTX_BYTES)
        ctx.upload(self.ring.ctx_bytes(rx_stage.ptr, tx_stage.ptr,
                                       self._trace.ptr if self._trace is not None else 0,
                                       self.trace_capacity))
        return ctx.ptr, self.ring.shutdown_device_ptr, self.ring.processed_device_ptr

    def _dev_alloc(self, size_bytes: int) -> DeviceMemory:
        """A device allocation owned by this run (freed by :meth:`_free_buffers`)."""
        buf = self.device.alloc(size_bytes)
        self._dev_buffers.append(buf)
        return buf

    def _reserve_handler_area(self, function: Any, out_bytes: int) -> None:
        """Let ``function`` launch with ``out_bytes`` of dynamic shared memory (the handlers'
        private output area). Raises :class:`DispatchError` when the GPU has less shared memory
        per block than the kernel's own plus ``out_bytes``."""
        static = function_attribute(function, "SHARED_SIZE_BYTES")
        most = self.device.attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
        if static + out_bytes > most:
            room = most - static - HANDLER_GUARD_BYTES
            raise DispatchError(
                f"handler output area of {out_bytes} bytes (max_result_len rounded up to 16, "
                f"plus a {HANDLER_GUARD_BYTES}-byte guard) does not fit beside the kernel's "
                f"{static} bytes of shared memory ({most} per block on {self.device.name}); "
                f"pass max_result_bytes of at most {max(room, 0) // 16 * 16}")
        if out_bytes > function_attribute(function, "MAX_DYNAMIC_SHARED_SIZE_BYTES"):
            set_function_attribute(function, "MAX_DYNAMIC_SHARED_SIZE_BYTES", out_bytes)

    def stop(self, timeout_s: float = 10.0) -> int:
        """Set the shutdown flag, wait for the kernel to exit; returns the processed count.

        Every request posted before the call is answered before the kernel exits (the bridge
        looks at the next slot again once it has seen the flag); :meth:`poll_response` returns
        those responses afterwards. The module stays loaded and the CUDA context retained, for
        another :meth:`start`; :meth:`close` gives them back. Raises :class:`GPUError` when the
        kernel has not exited after ``timeout_s`` (it keeps running; the buffers are kept) or
        faulted.
        """
        if self._stream is None or self.ring is None:
            return self._final_processed
        self.ring.shutdown = True
        deadline = time.monotonic() + timeout_s
        while not self._stream.done():
            if time.monotonic() > deadline:
                raise GPUError(f"the dispatch kernel did not stop within {timeout_s} s")
            time.sleep(1e-4)
        self._final_processed = self.ring.processed
        self._stream.destroy()
        self._stream = None
        return self._final_processed

    def timings_ns(self) -> list[int]:
        """In-kernel turnaround (ns) of the last requests, oldest first (after :meth:`stop`)."""
        if self._timing is None:
            return []
        raw = self._timing.download(8 * self.timing_capacity)
        return _ring_order(list(struct.unpack(f"<{self.timing_capacity}Q", raw)),
                           self.processed)

    def traces_ns(self) -> list[tuple[int, ...]]:
        """Diagnostic stage times of the last requests, oldest first (after :meth:`stop`; needs
        ``trace_capacity``), eight per request: in ns (%globaltimer, 32 ns ticks on H100 and
        H200) the request copied in, lookup + handler + response header, the response copied
        out, ``__threadfence_system``, the sequence word's store, and seen -> published; then
        in SM clock cycles (``clock64``) seen -> published and lookup + handler + response
        header (their ratio to the ns gives the SM clock while the request was served)."""
        if self._trace is None:
            return []
        cap = self.trace_capacity
        values = struct.unpack(f"<{8 * cap}Q", self._trace.download(64 * cap))
        return _ring_order([values[8 * i:8 * i + 8] for i in range(cap)], self.processed)

    def _free_buffers(self) -> None:
        """Free the run's device buffers and pinned rings (each one once, also when freeing
        another fails: the first error is raised at the end)."""
        buffers, self._dev_buffers = self._dev_buffers, []
        pinned, self._pinned = self._pinned, None
        self._timing = None
        self._trace = None
        self.ring = None
        first: BaseException | None = None
        for b in (*buffers, *([pinned] if pinned is not None else [])):
            try:
                b.free()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    def _unload(self) -> None:
        if self._module is not None:
            module, self._module = self._module, None
            self._addresses = {}
            self._handed_out = False
            module.unload()

    def _release_device(self) -> None:
        if self._device is not None:
            device, self._device = self._device, None
            device.release()

    def close(self) -> None:
        """Stop the kernel if it runs, free the buffers, unload the module and release the CUDA
        primary context (``cuDevicePrimaryCtxRelease``); the plane can be started again (it
        retains the context and loads the module anew). Raises :class:`GPUError` as
        :meth:`stop` does (nothing is freed then: the kernel may still use it)."""
        self.stop()
        self._free_buffers()
        self._unload()
        self._release_device()

    def __enter__(self) -> GPUDataPlane:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- the ring ----
    @property
    def processed(self) -> int:
        """Requests the kernel has answered (live while running)."""
        return self.ring.processed if self.ring is not None else self._final_processed

    @property
    def outstanding(self) -> int:
        return self.ring.outstanding if self.ring is not None else 0

    def _ring(self) -> LoopbackRing:
        if self.ring is None or self._stream is None:
            raise DispatchError("the GPU data plane is not running: start() it first")
        return self.ring

    def can_submit(self) -> bool:
        return self._ring().can_submit()

    def submit(self, request: bytes) -> int:
        """Post one request (RPCHeader + arguments) into the next ring slot; returns the slot.
        Raises :class:`DispatchError` when not running or the ring is full."""
        return self._ring().submit(request)

    def poll_response(self) -> tuple[int, bytes] | None:
        """The next response in ring order (``(slot, RPCResponse + result)``) or ``None``; also
        after :meth:`stop` (the kernel answers every request posted before it exits)."""
        if self.ring is None:
            return None
        return self.ring.poll_response()
