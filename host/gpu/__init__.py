"""openqlink.gpu: the GPU data plane, CUDA-Q's unified dispatch kernel linked at run time.

One persistent kernel (one warp, CUDA C++ shipped as package data) receives each RPC request
through the transport bridge's hooks, looks its function_id up in the device function table,
calls the DEVICE_CALL handler and always answers with an ``RPCResponse``. The kernel, the
bridge's hooks and the handlers (CUDA C++ through NVRTC, or Python through numba-cuda) are
LTO-IR, linked by nvJitLink into one module for the GPU's own architecture, cached by source,
toolchain versions and architecture. The loopback bridge runs the whole path over mapped pinned
host memory, on any GPU without a NIC; the frame bridge (:mod:`.frames`) makes the kernel a RoCE
endpoint that takes raw request frames and writes complete response frames. ``docs/gpu.md``
describes the design and its use.

Importing this package needs no GPU; compiling and linking need the ``[gpu]`` extra; running
needs a CUDA driver and a GPU (else :class:`openqlink.errors.GPUUnavailableError`).

# Ref: CUDA-Q PR 5722/5778; cuda-quantum realtime/docs/cudaq_realtime_host_api.md (unified
# dispatch); realtime/include/cudaq/realtime/daemon/dispatcher/unified_device_transport.cuh
"""

from .dataplane import ENTRY_BYTES, GPUDataPlane, pack_device_entry
from .driver import Device, gpu_available
from .frames import FrameEndpointConfig, FrameRings, GPUFramePlane
from .handlers import HANDLER_SIGNATURE, CudaHandler, DeviceHandler, NumbaHandler, numba_handler
from .loopback import HostMemory, LoopbackRing
from .program import (
    BUILTIN_KERNEL_ENTRY,
    FRAME_BRIDGE,
    LOOPBACK_BRIDGE,
    DispatchKernel,
    DispatchProgram,
    LaunchArgs,
    LinkedProgram,
    TransportBridge,
)
from .toolchain import (
    LinkCache,
    LinkInput,
    cubin_symbols,
    default_cache,
    nvjitlink_link,
    nvrtc_compile,
    toolchain_versions,
)


def get_device_handler(plane: GPUDataPlane, name: str) -> int:
    """``plane.get_device_handler(name)``: the handler's device address in the linked module
    (links and loads the module on the first lookup)."""
    return plane.get_device_handler(name)


__all__ = [
    "GPUDataPlane",
    "GPUFramePlane",
    "FrameEndpointConfig",
    "FrameRings",
    "FRAME_BRIDGE",
    "get_device_handler",
    "ENTRY_BYTES",
    "pack_device_entry",
    "Device",
    "gpu_available",
    "DeviceHandler",
    "CudaHandler",
    "NumbaHandler",
    "numba_handler",
    "HANDLER_SIGNATURE",
    "HostMemory",
    "LoopbackRing",
    "DispatchKernel",
    "DispatchProgram",
    "TransportBridge",
    "LOOPBACK_BRIDGE",
    "BUILTIN_KERNEL_ENTRY",
    "LaunchArgs",
    "LinkedProgram",
    "LinkCache",
    "LinkInput",
    "cubin_symbols",
    "default_cache",
    "nvjitlink_link",
    "nvrtc_compile",
    "toolchain_versions",
]

