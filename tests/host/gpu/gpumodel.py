"""Shared helpers of the GPU tests: handler sources, a Python reference model of the unified
dispatch kernel over the loopback ring, and a data plane built on that model (no GPU)."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

from openqlink.dispatch import FunctionEntry, TypeDesc
from openqlink.gpu import CudaHandler, HostMemory, LoopbackRing, NumbaHandler
from openqlink.wire.rpc import (
    HEADER_BYTES,
    REQUEST_MAGIC,
    PayloadType,
    Request,
    Response,
    fnv1a32,
)

P = PayloadType

ADD_SRC = r'''
#include "openqlink_dispatch.cuh"
extern "C" __device__ int add_i32(const void* in, void* out, uint32_t arg_len,
                                  uint32_t max_result_len, uint32_t* result_len) {
    int32_t a, b;
    memcpy(&a, in, 4);
    memcpy(&b, static_cast<const uint8_t*>(in) + 4, 4);
    const int32_t s = a + b;
    memcpy(out, &s, 4);
    *result_len = 4;
    return 0;
}
'''

INCR_SRC = r'''
#include "openqlink_dispatch.cuh"
// CUDA-Q's rpc_increment: every byte + 1.
extern "C" __device__ int rpc_increment(const void* in, void* out, uint32_t arg_len,
                                        uint32_t max_result_len, uint32_t* result_len) {
    const uint8_t* p = static_cast<const uint8_t*>(in);
    uint8_t* o = static_cast<uint8_t*>(out);
    if (arg_len > max_result_len) { *result_len = 0; return 2; }
    for (uint32_t i = 0; i < arg_len; ++i) o[i] = static_cast<uint8_t>(p[i] + 1);
    *result_len = arg_len;
    return 0;
}
'''

FAIL_SRC = r'''
#include "openqlink_dispatch.cuh"
extern "C" __device__ int fail7(const void*, void*, uint32_t, uint32_t, uint32_t* result_len) {
    *result_len = 0;
    return 7;
}
'''

TOO_BIG_SRC = r'''
#include "openqlink_dispatch.cuh"
extern "C" __device__ int too_big(const void*, void*, uint32_t, uint32_t max_result_len,
                                  uint32_t* result_len) {
    *result_len = max_result_len + 1;
    return 0;
}
'''


def mul(a, b):
    return a * b


def popcount8(bits):
    n = 0
    for i in range(8):
        n += (bits[0] >> i) & 1
    return n


def sum4(values, total, nonzero):
    s = 0
    k = 0
    for i in range(4):
        s += values[i]
        if values[i] != 0:
            k += 1
    total[0] = s
    nonzero[0] = k
    return 0


def device_entries() -> list[FunctionEntry]:
    """The DEVICE_CALL entries the GPU tests run (C++ and numba handlers)."""
    from openqlink.dispatch import DispatchMode as M
    return [
        FunctionEntry("add_i32", M.DEVICE_CALL, (P.INT32, P.INT32), (P.INT32,),
                      CudaHandler(ADD_SRC)),
        FunctionEntry("rpc_increment", M.DEVICE_CALL, (TypeDesc.array(P.ARRAY_UINT8, 8),),
                      (TypeDesc.array(P.ARRAY_UINT8, 8),), CudaHandler(INCR_SRC)),
        FunctionEntry("fail7", M.DEVICE_CALL, (), (), CudaHandler(FAIL_SRC)),
        FunctionEntry("too_big", M.DEVICE_CALL, (), (), CudaHandler(TOO_BIG_SRC)),
        FunctionEntry("mul", M.DEVICE_CALL, (P.INT32, P.INT64), (P.INT64,), NumbaHandler(mul)),
        FunctionEntry("popcount8", M.DEVICE_CALL, (TypeDesc.bits(8),), (P.UINT8,),
                      NumbaHandler(popcount8)),
        FunctionEntry("sum4", M.DEVICE_CALL, (TypeDesc.array(P.ARRAY_INT32, 4),),
                      (P.INT32, P.UINT8), NumbaHandler(sum4)),
    ]


def request(name: str, payload: bytes, rid: int, ts: int = 0) -> bytes:
    return Request(fnv1a32(name), rid, ts, payload).pack()


def raw_request(magic: int, function_id: int, arg_len: int, rid: int, payload: bytes = b"",
                ts: int = 0) -> bytes:
    return struct.pack("<IIIIQ", magic, function_id, arg_len, rid, ts) + payload


# ---- Python model of qlink_unified_dispatch over the loopback ring ----
Impl = Callable[[bytes, int], tuple[int, bytes]]


class KernelModel:
    """Reference model of the unified kernel + loopback bridge: the same response rules
    (status -1 bad magic / unknown / not DEVICE_CALL, -3 arg_len beyond the slot, -2 arg_len
    against the schema, 1 result too long), the same sequence words, strict ring order."""

    def __init__(self, ring: LoopbackRing, impls: dict[str, tuple[FunctionEntry, Impl]],
                 max_result_len: int):
        self.ring = ring
        self.table = {fnv1a32(n): v for n, v in impls.items()}
        self.max_result_len = max_result_len
        self.next_slot = 0
        self.seq = 0  # the last request taken

    def step(self) -> int:
        done = 0
        r = self.ring
        while r.rx_seq[self.next_slot].value == self.seq + 1:
            slot = self.next_slot
            self.seq += 1
            buf = bytes(r.memory_view(slot))
            magic, fid, arg_len, rid, ts = struct.unpack_from("<IIIIQ", buf)
            status, result = -1, b""
            if magic == REQUEST_MAGIC and fid in self.table:
                entry, impl = self.table[fid]
                if arg_len > r.slot_size - HEADER_BYTES:
                    status = -3
                elif arg_len != entry.arg_len_bytes:
                    status = -2
                else:
                    status, result = impl(buf[HEADER_BYTES:HEADER_BYTES + arg_len],
                                          self.max_result_len)
                    if len(result) > self.max_result_len:
                        status, result = 1, b""
            r.write_response_for_model(slot, Response(status, rid, ts, result).pack(), self.seq)
            self.next_slot = (slot + 1) % r.num_slots
            done += 1
        r.model_processed += done
        return done


class ModelRing(LoopbackRing):
    """A LoopbackRing over plain host memory with the kernel's side done in Python."""

    def __init__(self, num_slots: int, slot_size: int):
        super().__init__(HostMemory(LoopbackRing.size_for(num_slots, slot_size)), num_slots,
                         slot_size)
        self.model_processed = 0

    def memory_view(self, slot: int) -> bytes:
        import ctypes
        return ctypes.string_at(self.request_host_address(slot), self.slot_size)

    def write_response_for_model(self, slot: int, data: bytes, seq: int) -> None:
        import ctypes
        ctypes.memmove(self.response_host_address(slot), data, len(data))
        self.tx_seq[slot].value = seq


class ModelPlane:
    """The :class:`openqlink.dispatch.GPUPlane` protocol over :class:`KernelModel` (no GPU):
    the "kernel" runs whenever the host polls for a response."""

    def __init__(self, impls: dict[str, Impl], num_slots: int = 4, slot_size: int = 128):
        self.num_slots = num_slots
        self.slot_size = slot_size
        self.impls = impls
        self.ring: ModelRing | None = None
        self.model: KernelModel | None = None
        self.running = False
        self.started_with: list[FunctionEntry] = []

    @property
    def processed(self) -> int:
        return self.ring.model_processed if self.ring is not None else 0

    def start(self, entries, *, max_result_bytes=None) -> None:
        entries = list(entries)
        self.started_with = entries
        self.ring = ModelRing(self.num_slots, self.slot_size)
        cap = self.slot_size - HEADER_BYTES
        if max_result_bytes is not None:
            cap = min(cap, max_result_bytes)
        self.model = KernelModel(self.ring, {e.name: (e, self.impls[e.name]) for e in entries},
                                 cap)
        self.running = True

    def stop(self, timeout_s: float = 10.0) -> int:
        assert self.model is not None
        self.model.step()
        self.running = False
        return self.processed

    def can_submit(self) -> bool:
        assert self.ring is not None
        return self.ring.can_submit()

    def submit(self, request: bytes) -> int:
        assert self.ring is not None
        return self.ring.submit(request)

    def poll_response(self):
        if self.ring is None:
            return None
        if self.running:
            assert self.model is not None
            self.model.step()
        return self.ring.poll_response()


#: A kernel that never answers fails the test instead of hanging it.
HANG_GUARD_S = 20.0


def wait_response(plane) -> tuple[int, Response]:
    """The next response of a running :class:`openqlink.gpu.GPUDataPlane`; fails at once when
    the kernel has faulted or exited, or after :data:`HANG_GUARD_S`."""
    deadline = time.monotonic() + HANG_GUARD_S
    spins = 0
    while (got := plane.poll_response()) is None:
        spins += 1
        if spins % 1024 == 0 and plane._stream is not None and plane._stream.done():
            raise AssertionError(f"the kernel exited (processed {plane.processed})")
        if time.monotonic() > deadline:
            raise AssertionError(f"no response from the kernel (processed {plane.processed})")
    return got[0], Response.unpack(got[1])


def call(plane, data: bytes) -> Response:
    """Submit one request and wait for its response."""
    plane.submit(data)
    return wait_response(plane)[1]
