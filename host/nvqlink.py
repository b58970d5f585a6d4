"""The NVQLink-style library API: initialize, malloc, memcpy, load_kernel, launch_kernel.

NVQLink's programming model (arXiv 2510.25213, "NVQLink: A Platform Architecture for ...
Quantum-Classical Integration") gives a host program a device handle on the QSC and a small
set of calls: ``initialize`` a connection, ``malloc``/``free`` QPU-side memory and
``memcpy_to_qpu``/``memcpy_from_qpu`` data into and out of it, ``load_kernel`` a compiled
kernel and ``launch_kernel`` it, serving its ``device_call`` requests on the real-time host
while it runs, and ``shutdown``. This module gives those calls over any
:class:`~openqlink.qsc.QSC`: the simulated QSC (``initialize("sim")``, a
:class:`~openqlink.sim.SimulatedQSC`) and a board through any bridge
(``initialize(bridge="udp")``), with the same code::

    import openqlink
    from openqlink import nvqlink

    dev = nvqlink.initialize("sim", qubits=1)
    handle = nvqlink.load_kernel(my_kernel)
    value = nvqlink.launch_kernel(handle, 5)
    nvqlink.shutdown()

The module-level functions act on the device of the last :func:`initialize`; the same calls
are methods of :class:`Device`.

QPU-side memory is the PPU's envelope memory (``docs/memory_map.md``: ``env_depth`` signed
16-bit samples, written by UC RDMA WRITE, read back over the control plane). Kernel envelopes
are placed from sample 0 up; :func:`malloc` allocates from the top down, in whole 64-bit
words (4 samples), so a buffer can hold envelopes that hand-written programs play
(``play CH, addr=N, len=L``).
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .calibration import CalibrationTable
from .dispatch import Dispatcher, FunctionTable, SlotRing
from .errors import QlinkError, WireFormatError
from .isa import PPUState, Program, assemble
from .kernels import CompiledKernel, Kernel
from .memory_map import ENV_OFFSET, MAILBOX_BYTES, ppu_base
from .qsc import QSC
from .wire.rpc import HEADER_BYTES, Request, Response

__all__ = [
    "Device", "QPUBuffer", "KernelHandle", "Launch", "LaunchError", "NVQLinkError",
    "initialize", "shutdown", "malloc", "free", "memcpy_to_qpu", "memcpy_from_qpu",
    "load_kernel", "launch_kernel", "current_device", "START_MARGIN_CYCLES",
]

#: How far ahead of the QSC's timeline a launch starts its program (DTD cycles): the trigger's
#: RDMA WRITE must reach the PPU before then (8 us at 250 MHz; the simulation runs slowly).
START_MARGIN_CYCLES = 2000
#: Bytes of one unit of envelope memory allocation (a 64-bit word, 4 samples).
_ALLOC_BYTES = 8

#: The PPU's error bits (``PPUStatus``) a launch reports.
_ERROR_BITS = ("underflow", "late", "call_timeout", "call_failed", "illegal_instruction",
               "sequence", "trigger_busy", "trigger_late", "trigger_incomplete")


class NVQLinkError(QlinkError):
    """A library call that cannot be done (no device initialized, a freed or foreign buffer,
    memory full); the message names the argument."""


class LaunchError(QlinkError):
    """A launch that did not end DONE: ``status`` is the PPU's STATUS (``PPUStatus``) and
    ``errors`` the names of its error bits; the message names them (and LAST_CALL_STATUS for
    a failed CALL)."""

    def __init__(self, message: str, status: Any = None, errors: tuple[str, ...] = ()):
        super().__init__(message)
        self.status = status
        self.errors = errors


@dataclass(frozen=True)
class QPUBuffer:
    """QPU-side memory from :func:`malloc`: ``nbytes`` at byte ``offset`` of PPU ``ppu``'s
    ``region`` (``"envelope"``: its envelope memory; sample ``offset // 2``)."""

    region: str
    ppu: int
    offset: int
    nbytes: int

    @property
    def sample(self) -> int:
        """The first envelope sample of the buffer (``play CH, addr=sample, len=...``)."""
        return self.offset // 2


@dataclass
class KernelHandle:
    """What :func:`load_kernel` returns: a kernel (compiled for each argument tuple at
    launch), or a fixed program with its function table."""

    source: Kernel | Program
    table: FunctionTable | None = None
    name: str = ""
    compiled: dict[tuple, CompiledKernel] = field(default_factory=dict)


@dataclass
class Launch:
    """One launch: ``value`` (the kernel's return value), ``status`` (PPUStatus), ``registers``
    (the PPU's, read after it ended), ``measurements`` (kernel variable -> bit), ``calls``
    (one dict per CALL: ``name``, ``args`` and ``result`` bytes, ``status``), ``mode``
    (``"HOST_CALL"`` or ``"DEVICE_CALL"``), ``compiled`` (the CompiledKernel, or None)."""

    value: Any
    status: Any
    registers: dict[str, int]
    measurements: dict[str, int]
    calls: list[dict]
    mode: str
    compiled: CompiledKernel | None


class Device:
    """A QSC opened for the library API (PPU ``ppu``, its CALLs served by this host).

    Parameters
    ----------
    qsc : QSC
        The device client (a board's ``QSC(bridge=...)`` or a ``SimulatedQSC``); connected
        and configured here; closed by :meth:`shutdown` when ``owns``.
    calibration : CalibrationTable, optional
        The table kernels are lowered through (default: the simulation's nominal table,
        :meth:`CalibrationTable.for_simulation`, of one qubit per readout channel of the
        build, as the simulation maps them).
    ppu : int
    gpu : bool
        Serve the kernels' ``device_call`` handlers on the GPU (DEVICE_CALL entries compiled
        by numba-cuda, :class:`openqlink.gpu.GPUDataPlane`) instead of in Python (HOST_CALL).
        Raises :class:`~openqlink.errors.GPUUnavailableError` where there is no CUDA GPU.
    num_slots, slot_size : int
        The host's request ring.
    """

    def __init__(self, qsc: QSC, *, calibration: CalibrationTable | None = None, ppu: int = 0,
                 gpu: bool = False, num_slots: int = 8, slot_size: int = 256,
                 owns: bool = True):
        if gpu:
            from .errors import GPUUnavailableError
            from .gpu import gpu_available

            ok, why = gpu_available()
            if not ok:
                raise GPUUnavailableError(f"initialize(gpu=True): no CUDA GPU: {why}")
        self.qsc = qsc
        self.ppu = ppu
        self.gpu = gpu
        self.owns = owns
        self.version = qsc.connect()
        self.ring = SlotRing(num_slots=num_slots, slot_size=slot_size)
        qsc.configure(ppu, self.ring)
        params = qsc.params
        self.params = params
        if calibration is None:      # one qubit per readout channel, as the simulation maps
            calibration = CalibrationTable.for_simulation(params.readouts_per_ppu, params)
        self.calibration = calibration
        self.env_bytes = 2 * params.env_depth
        self._buffers: dict[int, QPUBuffer] = {}      # offset -> buffer
        self._kernel_env_bytes = 0                      # kernel envelopes: [0, this)
        self._loaded: bytes | None = None               # the program now in the ring
        self._loaded_env: bytes | None = None
        self.last_launch: Launch | None = None
        self.closed = False
        self.simulation_results: dict | None = None

    # --- memory ---------------------------------------------------------------------------
    def malloc(self, nbytes: int, region: str = "envelope") -> QPUBuffer:
        """Allocate ``nbytes`` (> 0, rounded up to 8) of QPU memory in ``region``
        (``"envelope"``), from the top of the envelope memory down. Raises
        :class:`NVQLinkError` naming the region when it has no room left (the kernels'
        envelopes use its bottom)."""
        self._check_open()
        if region != "envelope":
            raise NVQLinkError(f"malloc: region {region!r}: the QSC's host-writable QPU memory "
                               "is 'envelope'")
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise NVQLinkError(f"malloc: nbytes must be a positive int, not {nbytes!r}")
        size = -(-nbytes // _ALLOC_BYTES) * _ALLOC_BYTES
        top = self.env_bytes
        for off in sorted(self._buffers, reverse=True):
            buf = self._buffers[off]
            end = off + -(-buf.nbytes // _ALLOC_BYTES) * _ALLOC_BYTES
            if top - end >= size:
                break
            top = off
        start = top - size
        if start < self._kernel_env_bytes:
            raise NVQLinkError(f"malloc: {nbytes} bytes do not fit the envelope memory "
                               f"({self.env_bytes} bytes, {self._kernel_env_bytes} used by "
                               "kernel envelopes)")
        buf = QPUBuffer("envelope", self.ppu, start, nbytes)
        self._buffers[start] = buf
        return buf

    def free(self, buf: QPUBuffer) -> None:
        """Release ``buf``; :class:`NVQLinkError` for a buffer not allocated here (or freed)."""
        if self._buffers.get(getattr(buf, "offset", None)) != buf:
            raise NVQLinkError(f"free: {buf!r} is not a live buffer of this device")
        del self._buffers[buf.offset]

    def _check_buffer(self, buf: QPUBuffer, offset: int, nbytes: int, what: str) -> None:
        self._check_open()
        if self._buffers.get(getattr(buf, "offset", None)) != buf:
            raise NVQLinkError(f"{what}: {buf!r} is not a live buffer of this device")
        if offset < 0 or offset % 4 or nbytes < 0 or offset + nbytes > buf.nbytes:
            raise NVQLinkError(f"{what}: bytes {offset}..{offset + nbytes - 1} are not inside "
                               f"the {buf.nbytes}-byte buffer (offset a multiple of 4)")

    def memcpy_to_qpu(self, buf: QPUBuffer, data: bytes | bytearray | memoryview,
                      offset: int = 0) -> None:
        """Write ``data`` (an even number of bytes: little-endian signed 16-bit samples) into
        ``buf`` from byte ``offset`` (a multiple of 4), by UC RDMA WRITEs, verified
        (:meth:`QSC.write_envelope`). Raises :class:`NVQLinkError` for bytes outside the
        buffer, :class:`~openqlink.errors.UploadError` when the write did not land."""
        data = bytes(data)
        self._check_buffer(buf, offset, len(data), "memcpy_to_qpu")
        if len(data) % 2 or not data:
            raise NVQLinkError("memcpy_to_qpu: data is whole 16-bit samples (an even, non-zero "
                               "number of bytes)")
        samples = struct.unpack(f"<{len(data) // 2}h", data)
        self.qsc.write_envelope(self.ppu, (buf.offset + offset) // 2, samples)

    def memcpy_from_qpu(self, buf: QPUBuffer, nbytes: int | None = None,
                        offset: int = 0) -> bytes:
        """Read ``nbytes`` (default: the rest of the buffer) of ``buf`` from byte ``offset``
        (a multiple of 4) over the control plane (RD_BLOCK of the envelope memory's words)."""
        nbytes = buf.nbytes - offset if nbytes is None else nbytes
        self._check_buffer(buf, offset, nbytes, "memcpy_from_qpu")
        start = buf.offset + offset
        base = ppu_base(self.ppu) + ENV_OFFSET
        words = range(start // 4, -(-(start + nbytes) // 4))
        values = self.qsc.control.read_block([base + 4 * w for w in words])
        raw = b"".join(struct.pack("<I", v) for v in values)
        skip = start - 4 * (start // 4)
        return raw[skip:skip + nbytes]

    # --- kernels --------------------------------------------------------------------------
    def load_kernel(self, kernel: Kernel | Program | str | os.PathLike[str], *args: Any,
                    table: FunctionTable | None = None) -> KernelHandle:
        """A handle for ``kernel``: an ``@openqlink.kernel`` function (compiled for the
        launch's arguments through :attr:`calibration`; with ``args``, compiled and uploaded
        now), an assembled :class:`~openqlink.isa.Program` with its function ``table``, or the
        path of an assembly file (its handlers the ``.py`` beside it, as ``qlink sim``).
        Raises :class:`~openqlink.kernels.KernelCompileError`,
        :class:`~openqlink.errors.AssemblerError` as they come."""
        self._check_open()
        if isinstance(kernel, Kernel):
            handle = KernelHandle(kernel, name=kernel.name)
            if args or not kernel.params:
                self._upload(self._compiled(handle, args).program)
            return handle
        if isinstance(kernel, Program):
            handle = KernelHandle(kernel, table or FunctionTable(), name="program")
        else:
            from .sim.handlers import default_handlers_path, load_function_table

            path = Path(kernel)
            try:
                text = path.read_text()
            except OSError as exc:
                raise NVQLinkError(f"load_kernel: {path}: {exc.strerror or exc}") from None
            program = assemble(text, filename=str(path), params=self.params)
            if table is None:
                table = load_function_table(default_handlers_path(path))
            handle = KernelHandle(program, table, name=path.stem)
        self._upload(handle.source)  # type: ignore[arg-type]
        return handle

    def _compiled(self, handle: KernelHandle, args: tuple) -> CompiledKernel:
        assert isinstance(handle.source, Kernel)
        if args not in handle.compiled:
            handle.compiled[args] = handle.source.compile(self.calibration, *args,
                                                          params=self.params)
        return handle.compiled[args]

    def _upload(self, program: Program) -> None:
        env = program.envelope_bytes()
        end = len(env)
        if self._buffers and end > min(self._buffers):
            raise NVQLinkError(f"load_kernel: the program's envelopes need samples 0.."
                               f"{end // 2 - 1}, which overlap a malloc'd buffer")
        if env and env != self._loaded_env:
            self.qsc.write_envelope(self.ppu, 0, struct.unpack(f"<{len(env) // 2}h", env))
            self._loaded_env = env
        self._kernel_env_bytes = max(self._kernel_env_bytes,
                                     -(-end // _ALLOC_BYTES) * _ALLOC_BYTES)
        code = program.to_bytes()
        if code != self._loaded:
            self.qsc.upload_program(self.ppu, code)
            self._loaded = code

    def launch_kernel(self, handle: KernelHandle, *args: Any, timeout_s: float = 900.0,
                      start_margin_cycles: int = START_MARGIN_CYCLES) -> Any:
        """Run ``handle`` with ``args`` and return its value (see :attr:`last_launch` for the
        registers, measurements and CALLs).

        Compiles the kernel for ``args`` (once per argument tuple), uploads its envelopes and
        program when they are not the ones loaded, triggers it ``start_margin_cycles`` ahead
        of the QSC's timeline, serves its CALLs (a :class:`~openqlink.dispatch.Dispatcher` on
        the function table, on the GPU with ``gpu``) until the PPU is DONE or ERROR, and reads
        its registers. Raises :class:`LaunchError` naming the PPU's error bits when it ends in
        ERROR (or the trigger was refused), :class:`TimeoutError` after ``timeout_s``
        wall-clock seconds.
        """
        self._check_open()
        compiled = None
        if isinstance(handle.source, Kernel):
            compiled = self._compiled(handle, tuple(args))
            program, table = compiled.program, compiled.function_table
        else:
            if args:
                raise NVQLinkError(f"launch_kernel: {handle.name} is a fixed program; it takes "
                                   "no arguments")
            program, table = handle.source, handle.table or FunctionTable()
        self._upload(program)
        calls: list[dict] = []
        by_id: dict[int, dict] = {}
        names = {e.function_id: e.name for e in table}

        def send(slot: int, data: bytes) -> None:
            response = Response.unpack(data)
            entry = by_id.get(response.request_id)
            if entry is not None:
                entry.update(status=response.status, result=response.result)
            self.qsc.send_response(self.ppu, slot, data)

        gpu_plane = None
        if self.gpu and compiled is not None and len(table):
            from .gpu import GPUDataPlane

            table = compiled.device_table()
            gpu_plane = GPUDataPlane(num_slots=self.ring.num_slots,
                                     slot_size=self.ring.slot_size)
        dispatcher = Dispatcher(table, self.ring, send_response=send,
                                max_result_bytes=MAILBOX_BYTES - HEADER_BYTES, gpu=gpu_plane)
        dispatcher.start()
        try:
            self.qsc.trigger(self.ppu, self.qsc.timeline(self.ppu) + start_margin_cycles,
                             len(program.instructions))
            deadline = time.monotonic() + timeout_s
            while True:
                self.qsc.poll_rx()
                for slot in filter(self.ring.ready, range(self.ring.num_slots)):
                    try:
                        request = Request.unpack(self.ring.slot(slot))
                    except WireFormatError:
                        continue                      # the dispatcher answers it
                    if request.request_id not in by_id:
                            entry = {"name": names.get(request.function_id,
                                                       f"{request.function_id:#010x}"),
                                     "args": request.payload}
                            by_id[request.request_id] = entry
                            calls.append(entry)
                dispatcher.poll()
                status = self.qsc.status(self.ppu)
                errors = tuple(b for b in _ERROR_BITS if getattr(status, b))
                state = status.state
                if state in (PPUState.DONE, PPUState.ERROR) or \
                        any(b.startswith("trigger_") for b in errors):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"launch_kernel {handle.name}: PPU {self.ppu} did not "
                                       f"end within {timeout_s:g} s (state {state.name})")
        finally:
            dispatcher.stop()
        registers = self.qsc.read_registers(self.ppu)
        if state != PPUState.DONE or errors:
            extra = ""
            if "call_failed" in errors:
                extra = f", LAST_CALL_STATUS {registers.get('LAST_CALL_STATUS')}"
            raise LaunchError(f"launch_kernel {handle.name}: PPU {self.ppu} ended {state.name} "
                              f"({', '.join(errors) or 'no error bit'}{extra})", status, errors)
        value = compiled.result_value(registers) if compiled is not None else None
        measurements = ({name: registers[f"R{reg}"] for name, reg in
                         compiled.measurements.items()} if compiled is not None else {})
        self.last_launch = Launch(value, status, registers, measurements, calls,
                                  "DEVICE_CALL" if gpu_plane is not None else "HOST_CALL",
                                  compiled)
        return value

    # --- lifetime -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise NVQLinkError("the device was shut down")

    def shutdown(self) -> None:
        """Close the QSC (when owned; a SimulatedQSC's simulation ends and its results are in
        :attr:`simulation_results`). Calling it again does nothing."""
        if self.closed:
            return
        self.closed = True
        if self.owns:
            self.qsc.close()
            self.simulation_results = getattr(self.qsc, "results", None)

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


_current: Device | None = None


def initialize(target: str | QSC | None = None, *, bridge: str | None = None,
               interface: str | None = None, calibration: CalibrationTable | None = None,
               gpu: bool = False, ppu: int = 0, **options: Any) -> Device:
    """Open a QSC for the library API and make it the current device.

    ``target``: ``"sim"`` (a :class:`~openqlink.sim.SimulatedQSC` started with ``options``:
    ``qubits``, ``build_dir``, ``simulator``, ``model``, ``seed``, ...), a :class:`QSC`
    already made (not closed by :func:`shutdown`), or None with ``bridge`` (``"raw"`` with
    ``interface``, ``"udp"``, ``"verbs"``; ``options`` go to :class:`QSC`, e.g. ``qsc_ip``,
    ``params``). ``calibration``, ``gpu``, ``ppu``: as :class:`Device`'s.

    Raises :class:`NVQLinkError` for a target it does not know, and what opening the QSC
    raises (a bridge this host cannot run, a simulation that does not start, a version
    mismatch).
    """
    global _current
    if target == "sim":
        from .sim import SimulatedQSC

        qsc: QSC = SimulatedQSC(**options)
        owns = True
    elif isinstance(target, QSC):
        if bridge is not None or options:
            raise NVQLinkError("initialize: a QSC object takes no bridge or QSC options")
        qsc, owns = target, False
    elif target is None and bridge is not None:
        qsc, owns = QSC(bridge=bridge, interface=interface, **options), True
    else:
        raise NVQLinkError(f"initialize: target {target!r}: give 'sim', a QSC, or bridge=")
    try:
        device = Device(qsc, calibration=calibration, ppu=ppu, gpu=gpu, owns=owns)
    except BaseException:
        if owns:
            qsc.close()
        raise
    _current = device
    return device


def current_device() -> Device:
    """The device of the last :func:`initialize`; :class:`NVQLinkError` when there is none."""
    if _current is None or _current.closed:
        raise NVQLinkError("no device: call openqlink.nvqlink.initialize() first")
    return _current


def shutdown() -> None:
    """Shut the current device down (see :meth:`Device.shutdown`)."""
    global _current
    if _current is not None:
        _current.shutdown()
        _current = None


def malloc(nbytes: int, region: str = "envelope") -> QPUBuffer:
    """:meth:`Device.malloc` on the current device."""
    return current_device().malloc(nbytes, region)


def free(buf: QPUBuffer) -> None:
    """:meth:`Device.free` on the current device."""
    current_device().free(buf)


def memcpy_to_qpu(buf: QPUBuffer, data: bytes | bytearray | memoryview, offset: int = 0) -> None:
    """:meth:`Device.memcpy_to_qpu` on the current device."""
    current_device().memcpy_to_qpu(buf, data, offset)


def memcpy_from_qpu(buf: QPUBuffer, nbytes: int | None = None, offset: int = 0) -> bytes:
    """:meth:`Device.memcpy_from_qpu` on the current device."""
    return current_device().memcpy_from_qpu(buf, nbytes, offset)


def load_kernel(kernel: Kernel | Program | str | os.PathLike[str], *args: Any,
                table: FunctionTable | None = None) -> KernelHandle:
    """:meth:`Device.load_kernel` on the current device."""
    return current_device().load_kernel(kernel, *args, table=table)


def launch_kernel(handle: KernelHandle, *args: Any, **kwargs: Any) -> Any:
    """:meth:`Device.launch_kernel` on the current device."""
    return current_device().launch_kernel(handle, *args, **kwargs)

