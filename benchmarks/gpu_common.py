"""Shared parts of the GPU benchmarks: the Python host poller, the floor kernel, statistics.

The poller is the same for every variant: write the request message into the next slot of the
loopback ring, store the request's sequence number in the slot's sequence word, spin until the
response slot's word holds it, copy the response out; one ``time.perf_counter_ns()`` pair around
each round trip.

# Ref: cuda-quantum realtime/include/cudaq/realtime/cudaq_realtime.h (host ring helpers)
"""

from __future__ import annotations

import ctypes
import json
import platform
import statistics
import time
from typing import Any

from openqlink.gpu import Device, LoopbackRing, nvjitlink_link, nvrtc_compile, toolchain_versions
from openqlink.gpu.driver import launch
from openqlink.gpu.sources import headers
from openqlink.gpu.toolchain import LinkInput

__all__ = ["INCREMENT_SRC", "FloorPingPong", "FENCES", "run_loop", "summary", "print_table",
           "environment", "write_json", "pin_cpu"]

#: CUDA-Q's ``rpc_increment`` (every argument byte + 1) as a DEVICE_CALL handler in CUDA C++:
#: the handler every GPU round-trip benchmark dispatches.
INCREMENT_SRC = r'''
#include "openqlink_dispatch.cuh"
extern "C" __device__ int rpc_increment(const void* in, void* out, uint32_t arg_len,
                                        uint32_t max_result_len, uint32_t* result_len) {
    const uint8_t* p = static_cast<const uint8_t*>(in);
    uint8_t* o = static_cast<uint8_t*>(out);
    if (arg_len > max_result_len) { *result_len = 0; return 2; }
    uint32_t i = 0;
    if (((reinterpret_cast<unsigned long>(p) | reinterpret_cast<unsigned long>(o)) & 7u) == 0) {
        for (; i + 8 <= arg_len; i += 8) {  // 8 bytes at a time, bytewise add (SIMD in a word)
            uint2 v = *reinterpret_cast<const uint2*>(p + i);
            v.x = __vadd4(v.x, 0x01010101u);
            v.y = __vadd4(v.y, 0x01010101u);
            *reinterpret_cast<uint2*>(o + i) = v;
        }
    }
    for (; i < arg_len; ++i) o[i] = static_cast<uint8_t>(p[i] + 1);
    *result_len = arg_len;
    return 0;
}
'''


#: The fences the floor and the loopback bridge can be built with (QLINK_*_FENCE).
FENCES = {0: "fence.sc.sys", 1: "fence.acq_rel.sys", 2: "none"}

#: The floor: a bare ping-pong of sequence words over the same loopback memory, no data read, no
#: dispatch: wait for the request slot's word to hold k (8-byte ld.acquire.sys polls), fence as
#: the bridge does before it publishes (QLINK_FLOOR_FENCE, default __threadfence_system), store k
#: in the response slot's word.
FLOOR_SRC = r'''
#include "openqlink_dispatch.cuh"
#ifndef QLINK_FLOOR_FENCE
#define QLINK_FLOOR_FENCE 0
#endif
extern "C" __global__ void qlink_pingpong(const uint8_t* rx_data, uint8_t* tx_data,
                                          uint32_t num_slots, uint32_t stride,
                                          volatile int* shutdown_flag,
                                          volatile uint64_t* processed, uint64_t* timing_ns,
                                          uint32_t timing_capacity) {
    uint32_t slot = 0;
    uint64_t done = 0;
    uint32_t timing_slot = 0;
    for (;;) {
        const uint64_t want = done + 1;
        const uint64_t offset = static_cast<uint64_t>(slot) * stride;
        const volatile uint64_t* word =
            reinterpret_cast<const volatile uint64_t*>(rx_data + offset);
        uint32_t spins = 0;
        while (qlink_load_acquire_sys(word) != want) {
            if ((++spins & 255u) == 0 && *shutdown_flag != 0) {
                *processed = done;
                return;
            }
        }
        const uint64_t t0 = qlink_globaltimer_ns();
#if QLINK_FLOOR_FENCE == 0
        __threadfence_system();
#elif QLINK_FLOOR_FENCE == 1
        asm volatile("fence.acq_rel.sys;" ::: "memory");
#endif
        *reinterpret_cast<volatile uint64_t*>(tx_data + offset) = want;
        *processed = ++done;
        if (timing_ns != nullptr) {
            timing_ns[timing_slot] = qlink_globaltimer_ns() - t0;
            if (++timing_slot == timing_capacity) timing_slot = 0;
        }
        slot = slot + 1 == num_slots ? 0 : slot + 1;
    }
}
'''


class FloorPingPong:
    """The floor kernel (<<<1, 1>>>) on its own loopback ring (mapped pinned memory, the same
    layout as the data plane's); ``fence`` as :data:`FENCES`. It retains the primary context of
    CUDA device ``ordinal`` for itself (a data plane's :meth:`close` releases its own) and gives
    it back in :meth:`close`."""

    def __init__(self, ordinal: int, num_slots: int, slot_size: int, timing_capacity: int,
                 fence: int = 0):
        device = Device(ordinal)
        try:
            arch = device.arch
            ltoir = nvrtc_compile(FLOOR_SRC, "pingpong.cu", arch, headers=headers(),
                                  options=(f"-DQLINK_FLOOR_FENCE={fence}",))
            self.module = device.load(nvjitlink_link([LinkInput("pingpong.cu", ltoir)], arch))
            self.function = self.module.function("qlink_pingpong")
            self.timing = device.alloc(8 * timing_capacity)
        except BaseException:
            device.release()
            raise
        self.device = device
        self.fence = fence
        self.num_slots, self.slot_size = num_slots, slot_size
        self.pinned = None
        self.timing_capacity = timing_capacity
        self.ring: LoopbackRing | None = None
        self.stream = None

    def start(self) -> LoopbackRing:
        """Fresh rings (new pinned memory, as the data plane takes at each start) and launch."""
        if self.pinned is not None:
            self.pinned.free()
        self.pinned = self.device.alloc_pinned(LoopbackRing.size_for(self.num_slots,
                                                                     self.slot_size))
        ctypes.memset(self.pinned.host_ptr, 0, self.pinned.size_bytes)
        self.ring = LoopbackRing(self.pinned, self.num_slots, self.slot_size)
        d = self.pinned.device_ptr
        p, u32 = ctypes.c_void_p, ctypes.c_uint32
        self.stream = self.device.stream()
        launch(self.function, self.stream, params=[
            (d + self.ring.rx_data_offset, p), (d + self.ring.tx_data_offset, p),
            (self.num_slots, u32), (self.ring.stride, u32),
            (self.ring.shutdown_device_ptr, p), (self.ring.processed_device_ptr, p),
            (self.timing.ptr, p), (self.timing_capacity, u32)])
        return self.ring

    def stop(self) -> list[int]:
        """Stop the kernel; the in-kernel turnarounds (ns) of its requests, oldest first (at
        most ``timing_capacity``)."""
        assert self.ring is not None and self.stream is not None
        self.ring.shutdown = True
        deadline = time.monotonic() + 10
        while not self.stream.done():
            if time.monotonic() > deadline:
                raise RuntimeError("floor kernel did not stop")
            time.sleep(1e-4)
        self.stream.destroy()
        count = self.ring.processed
        raw = list(memoryview(self.timing.download(8 * self.timing_capacity)).cast("Q"))
        if count <= self.timing_capacity:
            return raw[:count]
        start = count % self.timing_capacity
        return raw[start:] + raw[:start]

    def close(self) -> None:
        self.timing.free()
        if self.pinned is not None:
            self.pinned.free()
            self.pinned = None
        self.module.unload()
        self.device.release()


def run_loop(ring: LoopbackRing, requests: list[bytes], expected: list[bytes] | None, n: int,
             warmup: int) -> tuple[list[int], int]:
    """``warmup + n`` round trips through ``ring`` (a fresh one, or one only this function has
    used), request ``i`` being ``requests[i % k]``; returns the last ``n`` latencies (ns) and how
    many responses differed from ``expected[i % k]`` (``None``: not checked). Give ``k`` coprime
    with the slot count, so that a slot's next request differs from its last one (a stale read
    shows as a wrong response)."""
    rx, tx = ring.rx_seq, ring.tx_seq
    slots = ring.num_slots
    req_addr = [ring.request_host_address(s) for s in range(slots)]
    resp_addr = [ring.response_host_address(s) for s in range(slots)]
    k = len(requests)
    size = len(requests[0])
    resp_len = len(expected[0]) if expected is not None else size
    memmove, string_at, now = ctypes.memmove, ctypes.string_at, time.perf_counter_ns
    lat = [0] * (n + warmup)
    bad = 0
    slot = ring.next_post
    seq = ring.next_seq
    j = 0
    for i in range(n + warmup):
        request = requests[j]
        word = tx[slot]
        t0 = now()
        memmove(req_addr[slot], request, size)
        rx[slot].value = seq
        while word.value != seq:
            pass
        data = string_at(resp_addr[slot], resp_len)
        lat[i] = now() - t0
        if expected is not None and data != expected[j]:
            bad += 1
        seq += 1
        slot = slot + 1 if slot + 1 < slots else 0
        j = j + 1 if j + 1 < k else 0
    ring.next_seq, ring.next_post, ring.next_take = seq, slot, slot
    return lat[warmup:], bad


def pin_cpu(cpu: int | None = None) -> int | None:
    """Keep this process on one CPU (default: the last one it may use), so that the poller's
    cache lines and timer stay on one core for floor and dispatch alike; returns the CPU, or
    ``None`` where affinity cannot be set."""
    import os
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    cpu = allowed[-1] if cpu is None else cpu
    os.sched_setaffinity(0, {cpu})
    return cpu


def summary(values_ns: list[int]) -> dict[str, float]:
    """p50, p99, max, min, mean of ``values_ns`` in microseconds."""
    v = sorted(values_ns)
    if not v:
        return {}

    def pick(q: float) -> int:  # nearest rank
        return v[min(len(v) - 1, int(q * len(v)))]

    return {"n": len(v), "p50_us": pick(0.50) / 1e3, "p99_us": pick(0.99) / 1e3,
            "max_us": v[-1] / 1e3, "min_us": v[0] / 1e3,
            "mean_us": statistics.fmean(v) / 1e3}


def print_table(title: str, rows: list[tuple[str, dict[str, float]]]) -> None:
    print(f"\n{title}")
    print(f"| {'variant':<44} | {'n':>7} | {'p50 us':>7} | {'p99 us':>7} | {'max us':>8} | "
          f"{'min us':>7} | {'mean us':>7} |")
    print(f"|{'-' * 46}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 10}|{'-' * 9}|{'-' * 9}|")
    for name, s in rows:
        if not s:
            continue
        print(f"| {name:<44} | {s['n']:>7} | {s['p50_us']:>7.3f} | {s['p99_us']:>7.3f} | "
              f"{s['max_us']:>8.3f} | {s['min_us']:>7.3f} | {s['mean_us']:>7.3f} |")


def environment(device: Device) -> dict[str, Any]:
    v = toolchain_versions()
    return {"gpu": device.name, "arch": device.arch,
            "driver_cuda_version": device.driver_version(), "nvrtc": v.nvrtc,
            "nvjitlink": v.nvjitlink, "numba_cuda": v.numba_cuda,
            "python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def write_json(path: str | None, data: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
