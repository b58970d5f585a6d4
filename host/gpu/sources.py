"""The CUDA C++ sources shipped with openqlink.gpu (package data in ``openqlink/gpu/cuda``).

* ``openqlink_dispatch.cuh`` -- RPC headers, the 168-byte function-table entry, the handler
  type, the unified transport hook declarations (:data:`HEADER_NAME`).
* ``unified_dispatch.cu`` -- the persistent dispatch kernel ``qlink_unified_dispatch``.
* ``loopback_bridge.cu`` -- the transport hooks of the GPU loopback bridge (mapped pinned
  host memory).
* ``roce_frames.cuh`` -- RoCEv2 request checks and response frames in plain C++ (CRC-32/ICRC,
  IPv4 checksum), shared by the GPU and the host's tests (:data:`FRAMES_HEADER_NAME`).
* ``roce_frame_bridge.cu`` -- the transport hooks of the GPU RoCE endpoint (raw frames in
  mapped pinned memory).

# Ref: cuda-quantum realtime/include/cudaq/realtime/daemon/dispatcher/unified_device_transport.cuh
"""

from __future__ import annotations

import functools
from importlib import resources

__all__ = ["HEADER_NAME", "FRAMES_HEADER_NAME", "read_source", "headers"]

#: The include name of the shared declarations (``#include "openqlink_dispatch.cuh"``).
HEADER_NAME = "openqlink_dispatch.cuh"
#: The include name of the frame code (``#include "roce_frames.cuh"``).
FRAMES_HEADER_NAME = "roce_frames.cuh"


@functools.cache
def read_source(name: str) -> str:
    """The text of the packaged CUDA file ``name``; raises :class:`FileNotFoundError`."""
    return resources.files(__package__).joinpath("cuda", name).read_text(encoding="utf-8")


def headers() -> dict[str, str]:
    """Include name -> text of every packaged header, for NVRTC."""
    return {name: read_source(name) for name in (HEADER_NAME, FRAMES_HEADER_NAME)}
