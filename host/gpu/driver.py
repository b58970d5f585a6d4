"""The few CUDA driver calls the GPU data plane needs, through cuda-python (``cuda.bindings``).

* :func:`gpu_available` -- ``(True, "")`` or ``(False, why)``; never raises (for test skips).
* :class:`Device` -- ``cuInit``, the device's primary context, its architecture ``sm_XY``;
  allocations: :class:`PinnedMemory` (``cuMemHostAlloc(DEVICEMAP | PORTABLE)``: host memory
  the kernel reads and writes through its device address), :class:`DeviceMemory`; modules
  (:class:`Module`) and non-blocking streams (:class:`Stream`).
* :func:`launch` -- ``cuLaunchKernel`` with ``(value, ctypes type)`` parameters (and dynamic
  shared memory, :func:`function_attribute` / :func:`set_function_attribute` for its limit).

Nothing leaks on an error path: a constructor whose second driver call fails gives back what its
first one took (the pinned allocation, the device allocation, the retained primary context)
before raising. :meth:`Device.release` gives back the primary context that :class:`Device`
retained (``cuDevicePrimaryCtxRelease``); once every holder has released it, the driver destroys
it with everything still allocated in it.

Every failing driver call raises :class:`openqlink.errors.GPUError` naming the call and the
driver's error; a missing driver or GPU raises :class:`openqlink.errors.GPUUnavailableError`.
Before ``cuInit`` the environment gets ``CUDA_MODULE_LOADING=EAGER`` unless it is set: a module
loaded lazily while a persistent kernel runs can deadlock (CUDA-Q PR 4112).

# Ref: CUDA Driver API (cuMemHostAlloc CU_MEMHOSTALLOC_DEVICEMAP, cuMemHostGetDevicePointer,
# cuModuleLoadData, cuModuleGetGlobal, cuLaunchKernel, cuStreamQuery)
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Sequence
from typing import Any

from ..errors import GPUError, GPUUnavailableError

log = logging.getLogger(__name__)

__all__ = [
    "gpu_available",
    "Device",
    "PinnedMemory",
    "DeviceMemory",
    "Module",
    "Stream",
    "launch",
    "function_attribute",
    "set_function_attribute",
]


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise GPUUnavailableError(f"cuda-python is not installed (pip install "
                                  f"'openqlink[gpu]'): {exc}", code="ImportError") from None
    return driver


def _name(err: Any) -> str:
    return getattr(err, "name", str(err))


def _check(call: str, result: Any) -> Any:
    """Raise for a failed driver call; return its values (one value bare, several as tuple)."""
    drv = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise GPUError(f"{call} failed: {_name(err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@functools.cache
def _init() -> None:
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
    drv = _driver()
    try:
        (err,) = drv.cuInit(0)
    except Exception as exc:  # the bindings could not load libcuda
        raise GPUUnavailableError(f"cuInit: no CUDA driver ({exc})", code=type(exc).__name__) \
            from None
    if err != drv.CUresult.CUDA_SUCCESS:
        raise GPUUnavailableError(f"cuInit failed: {_name(err)}", code=_name(err))
    err, count = drv.cuDeviceGetCount()
    if err != drv.CUresult.CUDA_SUCCESS or count == 0:
        raise GPUUnavailableError("no CUDA device", code=_name(err))


def gpu_available() -> tuple[bool, str]:
    """``(True, "")`` when the driver initialises and sees a GPU, else ``(False, reason)``."""
    try:
        _init()
    except GPUUnavailableError as exc:
        return False, str(exc)
    return True, ""


class PinnedMemory:
    """``size_bytes`` of page-locked host memory mapped into the GPU's address space, zeroed.

    :attr:`host_ptr` is its host address, :attr:`device_ptr` the address kernels use (the same
    under unified addressing). :meth:`view` gives a ctypes array over it.

    Raises :class:`GPUError` when the allocation or the device mapping fails; when the mapping
    fails, the allocation is freed (``cuMemFreeHost``) before the error is raised.
    """

    def __init__(self, device: Device, size_bytes: int):
        drv = _driver()
        device.make_current()
        flags = drv.CU_MEMHOSTALLOC_DEVICEMAP | drv.CU_MEMHOSTALLOC_PORTABLE
        self.size_bytes = size_bytes
        self._device = device
        self.host_ptr = int(_check("cuMemHostAlloc", drv.cuMemHostAlloc(size_bytes, flags)))
        try:
            self.device_ptr = int(_check("cuMemHostGetDevicePointer",
                                         drv.cuMemHostGetDevicePointer(self.host_ptr, 0)))
        except BaseException:
            _release_quietly("cuMemFreeHost", drv.cuMemFreeHost, self.host_ptr)
            self.host_ptr = self.device_ptr = 0
            raise
        ctypes.memset(self.host_ptr, 0, size_bytes)

    def view(self, ctype: Any = ctypes.c_uint8, offset_bytes: int = 0,
             count: int | None = None) -> Any:
        """A ctypes array of ``count`` ``ctype`` items at ``offset_bytes`` (default: to the end)."""
        size = ctypes.sizeof(ctype)
        if count is None:
            count = (self.size_bytes - offset_bytes) // size
        if offset_bytes < 0 or offset_bytes + count * size > self.size_bytes:
            raise GPUError(f"view of {count} x {size} bytes at {offset_bytes} leaves the "
                           f"{self.size_bytes}-byte pinned buffer")
        return (ctype * count).from_address(self.host_ptr + offset_bytes)

    def free(self) -> None:
        """Free the memory (``cuMemFreeHost``); again: nothing. Raises :class:`GPUError`."""
        if self.host_ptr:
            self._device.make_current()
            _check("cuMemFreeHost", _driver().cuMemFreeHost(self.host_ptr))
            self.host_ptr = self.device_ptr = 0


class DeviceMemory:
    """``size_bytes`` of GPU memory at :attr:`ptr`, zeroed.

    Raises :class:`GPUError` when the allocation or the zeroing fails; when the zeroing fails,
    the allocation is freed (``cuMemFree``) before the error is raised.
    """

    def __init__(self, device: Device, size_bytes: int):
        drv = _driver()
        device.make_current()
        self.size_bytes = size_bytes
        self._device = device
        self.ptr = int(_check("cuMemAlloc", drv.cuMemAlloc(max(size_bytes, 1))))
        try:
            _check("cuMemsetD8", drv.cuMemsetD8(self.ptr, 0, max(size_bytes, 1)))
        except BaseException:
            _release_quietly("cuMemFree", drv.cuMemFree, self.ptr)
            self.ptr = 0
            raise

    def upload(self, data: bytes, offset_bytes: int = 0) -> None:
        """Copy ``data`` to ``ptr + offset_bytes`` (synchronous)."""
        if offset_bytes + len(data) > self.size_bytes:
            raise GPUError(f"{len(data)} bytes at {offset_bytes} do not fit {self.size_bytes}")
        if not data:
            return
        self._device.make_current()
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        _check("cuMemcpyHtoD", _driver().cuMemcpyHtoD(self.ptr + offset_bytes,
                                                       ctypes.addressof(buf), len(data)))

    def download(self, size_bytes: int | None = None, offset_bytes: int = 0) -> bytes:
        """Copy ``size_bytes`` (default: all) from ``ptr + offset_bytes`` (synchronous)."""
        n = self.size_bytes - offset_bytes if size_bytes is None else size_bytes
        if offset_bytes + n > self.size_bytes:
            raise GPUError(f"{n} bytes at {offset_bytes} leave the {self.size_bytes}-byte buffer")
        self._device.make_current()
        buf = ctypes.create_string_buffer(max(n, 1))
        if n:
            _check("cuMemcpyDtoH", _driver().cuMemcpyDtoH(ctypes.addressof(buf),
                                                           self.ptr + offset_bytes, n))
        return buf.raw[:n]

    def free(self) -> None:
        """Free the memory (``cuMemFree``); again: nothing. Raises :class:`GPUError`."""
        if self.ptr:
            self._device.make_current()
            _check("cuMemFree", _driver().cuMemFree(self.ptr))
            self.ptr = 0


class Module:
    """A loaded cubin: its kernels (:meth:`function`) and globals (:meth:`global_address`)."""

    def __init__(self, device: Device, cubin: bytes):
        device.make_current()
        self._device = device
        self.handle = _check("cuModuleLoadData", _driver().cuModuleLoadData(cubin))

    def function(self, name: str) -> Any:
        """The ``CUfunction`` of kernel ``name``."""
        self._device.make_current()
        return _check(f"cuModuleGetFunction({name})",
                      _driver().cuModuleGetFunction(self.handle, name.encode()))

    def global_address(self, name: str) -> tuple[int, int]:
        """``(device address, size in bytes)`` of the ``__device__`` variable ``name``."""
        self._device.make_current()
        ptr, size = _check(f"cuModuleGetGlobal({name})",
                           _driver().cuModuleGetGlobal(self.handle, name.encode()))
        return int(ptr), int(size)

    def read_u64(self, name: str) -> int:
        """The value of the 8-byte ``__device__`` variable ``name``."""
        ptr, size = self.global_address(name)
        if size != 8:
            raise GPUError(f"{name} is {size} bytes, not 8")
        out = ctypes.c_uint64()
        _check("cuMemcpyDtoH", _driver().cuMemcpyDtoH(ctypes.addressof(out), ptr, 8))
        return int(out.value)

    def unload(self) -> None:
        """Unload the module (``cuModuleUnload``); again: nothing. Raises :class:`GPUError`."""
        if self.handle is not None:
            self._device.make_current()
            _check("cuModuleUnload", _driver().cuModuleUnload(self.handle))
            self.handle = None


class Stream:
    """A non-blocking stream (it does not wait for, nor block, the legacy default stream)."""

    def __init__(self, device: Device):
        drv = _driver()
        device.make_current()
        self._device = device
        self.handle = _check("cuStreamCreate",
                             drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING))

    def done(self) -> bool:
        """True when all work on the stream has finished; raises :class:`GPUError` when it
        failed (e.g. the kernel faulted)."""
        drv = _driver()
        self._device.make_current()
        (err,) = drv.cuStreamQuery(self.handle)
        if err == drv.CUresult.CUDA_ERROR_NOT_READY:
            return False
        _check("cuStreamQuery", (err,))
        return True

    def synchronize(self) -> None:
        self._device.make_current()
        _check("cuStreamSynchronize", _driver().cuStreamSynchronize(self.handle))

    def destroy(self) -> None:
        """Destroy the stream (``cuStreamDestroy``); again: nothing. Raises :class:`GPUError`."""
        if self.handle is not None:
            self._device.make_current()
            _check("cuStreamDestroy", _driver().cuStreamDestroy(self.handle))
            self.handle = None


class Device:
    """CUDA device ``ordinal`` with its primary context, retained until :meth:`release`.

    Raises :class:`GPUUnavailableError` when there is no driver or no such device,
    :class:`GPUError` when a driver call fails (the context, if retained, is released first).
    """

    def __init__(self, ordinal: int = 0):
        _init()
        drv = _driver()
        err, count = drv.cuDeviceGetCount()
        if not 0 <= ordinal < count:
            raise GPUUnavailableError(f"no CUDA device {ordinal} ({count} present)",
                                      code="CUDA_ERROR_INVALID_DEVICE")
        self.ordinal = ordinal
        self.handle = _check("cuDeviceGet", drv.cuDeviceGet(ordinal))
        attr = drv.CUdevice_attribute
        self.compute_capability = (
            int(_check("cuDeviceGetAttribute", drv.cuDeviceGetAttribute(
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.handle))),
            int(_check("cuDeviceGetAttribute", drv.cuDeviceGetAttribute(
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.handle))))
        raw = _check("cuDeviceGetName", drv.cuDeviceGetName(128, self.handle))
        self.name = bytes(raw).split(b"\0", 1)[0].decode(errors="replace")
        self.context: Any = _check("cuDevicePrimaryCtxRetain",
                                   drv.cuDevicePrimaryCtxRetain(self.handle))
        try:
            self.make_current()
        except BaseException:
            self.context = None
            _release_quietly("cuDevicePrimaryCtxRelease", drv.cuDevicePrimaryCtxRelease,
                             self.handle)
            raise

    @property
    def arch(self) -> str:
        """``sm_XY`` of this GPU (``sm_90`` for an H100/H200)."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    @property
    def released(self) -> bool:
        """True once :meth:`release` has given the primary context back."""
        return self.context is None

    def make_current(self) -> None:
        """Make the primary context current in the calling thread. Raises :class:`GPUError`
        (also after :meth:`release`)."""
        if self.context is None:
            raise GPUError(f"CUDA device {self.ordinal}: its primary context was released")
        _check("cuCtxSetCurrent", _driver().cuCtxSetCurrent(self.context))

    def release(self) -> None:
        """Give back the primary context this object retained (``cuDevicePrimaryCtxRelease``,
        once; again: nothing). Free this object's memory, modules and streams first: when no
        one else holds the context, the driver destroys it with everything still in it. Raises
        :class:`GPUError` when the driver call fails (the context counts as released)."""
        if self.context is None:
            return
        self.context = None
        _check("cuDevicePrimaryCtxRelease", _driver().cuDevicePrimaryCtxRelease(self.handle))

    def attribute(self, name: str) -> int:
        """``cuDeviceGetAttribute``: ``CU_DEVICE_ATTRIBUTE_<name>`` of this device
        (``"MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"``: bytes). Raises :class:`GPUError`."""
        drv = _driver()
        attr = getattr(drv.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(_check(f"cuDeviceGetAttribute({name})",
                          drv.cuDeviceGetAttribute(attr, self.handle)))

    def driver_version(self) -> int:
        """The driver's CUDA version as ``1000 * major + 10 * minor`` (13000 for 13.0)."""
        return int(_check("cuDriverGetVersion", _driver().cuDriverGetVersion()))

    def alloc_pinned(self, size_bytes: int) -> PinnedMemory:
        return PinnedMemory(self, size_bytes)

    def alloc(self, size_bytes: int) -> DeviceMemory:
        return DeviceMemory(self, size_bytes)

    def load(self, cubin: bytes) -> Module:
        return Module(self, cubin)

    def stream(self) -> Stream:
        return Stream(self)


def _release_quietly(call: str, fn: Any, handle: Any) -> None:
    """Give back ``handle`` on an error path: a failure is logged, never raised (the error being
    handled is the one to report)."""
    try:
        _check(call, fn(handle))
    except Exception as exc:  # pragma: no cover - the driver failed twice
        log.warning("%s on an error path failed: %s", call, exc)


def function_attribute(function: Any, name: str) -> int:
    """``cuFuncGetAttribute``: the attribute ``CU_FUNC_ATTRIBUTE_<name>`` of a kernel
    (``"SHARED_SIZE_BYTES"``: its static shared memory, bytes). Raises :class:`GPUError`."""
    drv = _driver()
    attr = getattr(drv.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
    return int(_check(f"cuFuncGetAttribute({name})", drv.cuFuncGetAttribute(attr, function)))


def set_function_attribute(function: Any, name: str, value: int) -> None:
    """``cuFuncSetAttribute``: set ``CU_FUNC_ATTRIBUTE_<name>`` of a kernel
    (``"MAX_DYNAMIC_SHARED_SIZE_BYTES"``: the dynamic shared memory a launch may ask for,
    bytes). Raises :class:`GPUError`."""
    drv = _driver()
    attr = getattr(drv.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
    _check(f"cuFuncSetAttribute({name})", drv.cuFuncSetAttribute(function, attr, int(value)))


def launch(function: Any, stream: Any, *, grid: Sequence[int] = (1, 1, 1),
           block: Sequence[int] = (1, 1, 1), params: Sequence[tuple[int, Any]] = (),
           shared_bytes: int = 0) -> None:
    """``cuLaunchKernel(function)`` on ``stream`` (a :class:`Stream` or ``CUstream``) with
    ``params`` as ``(value, ctypes type)`` pairs, in the kernel's parameter order, and
    ``shared_bytes`` of dynamic shared memory. Raises :class:`GPUError`."""
    handle = stream.handle if isinstance(stream, Stream) else stream
    values = tuple(v for v, _ in params)
    types = tuple(t for _, t in params)
    _check("cuLaunchKernel", _driver().cuLaunchKernel(
        function, *grid, *block, shared_bytes, handle, (values, types), 0))
