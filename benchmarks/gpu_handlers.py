"""Handler cost: CUDA C++ vs numba-cuda, LTO-inlined (direct call resolved at link time) vs called
through a pointer (the device function table).

The handler is CUDA-Q's ``rpc_increment`` on 32 bytes (every byte + 1), written once in CUDA C++
and once in Python (numba-cuda, with openqlink's generated adapter). Two measurements:

1. In-kernel cost per call: one kernel, linked with both handlers by nvJitLink, calls a handler
   ``--calls`` times on device memory, directly (LTO may inline it) or through the table's
   function pointer; %globaltimer around the loop, divided by the count. Each call depends on the
   previous one's output, so this is the latency of one call.
2. End to end: round trips through the unified dispatch kernel over the loopback ring (as
   ``gpu_roundtrip.py``), one data plane per variant.

Usage: python benchmarks/gpu_handlers.py [--calls 65536] [--requests 20000] [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import struct
import sys

from gpu_common import environment, print_table, run_loop, summary, write_json

from openqlink.dispatch import DispatchMode, FunctionEntry, TypeDesc
from openqlink.gpu import (
    CudaHandler,
    DispatchKernel,
    DispatchProgram,
    GPUDataPlane,
    NumbaHandler,
    pack_device_entry,
)
from openqlink.gpu.driver import Device, launch
from openqlink.wire.rpc import PayloadType, Request, Response, fnv1a32

INC_CPP = r'''
#include "openqlink_dispatch.cuh"
extern "C" __device__ int inc_cpp(const void* in, void* out, uint32_t arg_len,
                                  uint32_t max_result_len, uint32_t* result_len) {
    const uint8_t* p = static_cast<const uint8_t*>(in);
    uint8_t* o = static_cast<uint8_t*>(out);
    if (arg_len > max_result_len) { *result_len = 0; return 2; }
    for (uint32_t i = 0; i < arg_len; ++i) o[i] = static_cast<uint8_t>(p[i] + 1);
    *result_len = arg_len;
    return 0;
}
'''


def inc_numba(values, out):
    for i in range(32):
        out[i] = values[i] + 1
    return 0


BENCH_KERNEL = r'''
#include "openqlink_dispatch.cuh"
extern "C" __device__ int inc_cpp(const void*, void*, uint32_t, uint32_t, uint32_t*);
extern "C" __device__ int inc_numba(const void*, void*, uint32_t, uint32_t, uint32_t*);
// Calls handler `which` (0 C++, 1 numba) `iters` times, directly or through the table pointer.
extern "C" __global__ void qlink_bench_calls(const qlink_function_entry* table, uint32_t which,
                                             uint32_t direct, uint32_t iters, uint8_t* in,
                                             uint8_t* out, uint64_t* result) {
    const qlink_device_rpc_fn fn =
        reinterpret_cast<qlink_device_rpc_fn>(table[which].handler.device_fn_ptr);
    uint32_t len = 0;
    uint64_t acc = 0;
    const uint64_t t0 = qlink_globaltimer_ns();
    for (uint32_t i = 0; i < iters; ++i) {
        in[i & 31u] = static_cast<uint8_t>(acc);
        int st;
        if (direct != 0) {
            st = which == 0 ? inc_cpp(in, out, 32, 224, &len) : inc_numba(in, out, 32, 224, &len);
        } else {
            st = fn(in, out, 32, 224, &len);
        }
        acc += static_cast<uint64_t>(st) + len + out[i & 31u];
    }
    const uint64_t t1 = qlink_globaltimer_ns();
    result[0] = t1 - t0;
    result[1] = acc;
}
'''

ARR = TypeDesc.array(PayloadType.ARRAY_UINT8, 32)


def entries() -> dict[str, FunctionEntry]:
    return {
        "cpp": FunctionEntry("rpc_increment", DispatchMode.DEVICE_CALL, (ARR,), (ARR,),
                             CudaHandler(INC_CPP, "inc_cpp")),
        "numba": FunctionEntry("rpc_increment", DispatchMode.DEVICE_CALL, (ARR,), (ARR,),
                               NumbaHandler(inc_numba, "inc_numba")),
    }


def in_kernel(device: Device, calls: int, repeats: int) -> list[tuple[str, float]]:
    prog = DispatchProgram(device.arch, kernel=DispatchKernel(BENCH_KERNEL, "qlink_bench_calls"))
    e = entries()
    prog.add(FunctionEntry("inc_cpp", DispatchMode.DEVICE_CALL, (ARR,), (ARR,), e["cpp"].handler))
    prog.add(FunctionEntry("inc_numba", DispatchMode.DEVICE_CALL, (ARR,), (ARR,),
                           e["numba"].handler))
    linked = prog.link()
    module = device.load(linked.cubin)
    fn = module.function("qlink_bench_calls")
    table = b"".join(pack_device_entry(prog.entries[i], module.read_u64(linked.fnptr_symbols[n]))
                     for i, n in enumerate(("inc_cpp", "inc_numba")))
    dtable, buf_in, buf_out, res = (device.alloc(len(table)), device.alloc(64),
                                    device.alloc(256), device.alloc(16))
    dtable.upload(table)
    stream = device.stream()
    p, u32 = ctypes.c_void_p, ctypes.c_uint32
    out = []
    for label, which, direct in (("CUDA C++, through the table pointer", 0, 0),
                                 ("CUDA C++, LTO-inlined direct call", 0, 1),
                                 ("numba-cuda, through the table pointer", 1, 0),
                                 ("numba-cuda, LTO-inlined direct call", 1, 1)):
        best = None
        for _ in range(repeats + 1):  # the first run warms up
            launch(fn, stream, params=[(dtable.ptr, p), (which, u32), (direct, u32),
                                       (calls, u32), (buf_in.ptr, p), (buf_out.ptr, p),
                                       (res.ptr, p)])
            stream.synchronize()
            ns, _acc = struct.unpack("<QQ", res.download(16))
            best = ns if best is None else min(best, ns)
        out.append((label, best / calls))
    stream.destroy()
    for b in (dtable, buf_in, buf_out, res):
        b.free()
    module.unload()
    return out


def end_to_end(requests: int, warmup: int) -> list[tuple[str, dict, dict]]:
    payloads = [bytes((i * 5 + k) & 0xFF for i in range(32)) for k in range(13)]
    request = [Request(fnv1a32("rpc_increment"), k, 0, p).pack() for k, p in enumerate(payloads)]
    expected = [Response(0, k, 0, bytes((b + 1) & 0xFF for b in p)).pack()
                for k, p in enumerate(payloads)]
    rows = []
    for lang in ("cpp", "numba"):
        for inline in (False, True):
            plane = GPUDataPlane(8, 256, inline_handlers=inline, timing_capacity=requests + warmup)
            plane.add(entries()[lang])
            plane.start()
            assert plane.ring is not None
            lat, bad = run_loop(plane.ring, request, expected, requests, warmup)
            plane.stop()
            kern = plane.timings_ns()[warmup:]
            plane.close()
            if bad:
                raise SystemExit(f"{lang} inline={inline}: {bad} wrong responses")
            name = ("CUDA C++" if lang == "cpp" else "numba-cuda") + \
                (", inlined" if inline else ", table pointer")
            rows.append((name, summary(lat), summary(kern)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1 << 16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--warmup", type=int, default=1_000)
    ap.add_argument("--json")
    a = ap.parse_args()
    device = Device()
    env = environment(device)
    print(f"GPU {env['gpu']} ({env['arch']}), driver CUDA {env['driver_cuda_version']}, NVRTC "
          f"{env['nvrtc']}, nvJitLink {env['nvjitlink']}, numba-cuda {env['numba_cuda']}, "
          f"{env['date']}")
    calls = in_kernel(device, a.calls, a.repeats)
    print(f"\nIn-kernel cost of one call (32-byte rpc_increment, best of {a.repeats} x "
          f"{a.calls} dependent calls, %globaltimer)")
    print(f"| {'variant':<40} | {'ns/call':>8} |")
    print(f"|{'-' * 42}|{'-' * 10}|")
    for label, ns in calls:
        print(f"| {label:<40} | {ns:>8.1f} |")
    rows = end_to_end(a.requests, a.warmup)
    print_table(f"Round trip through the unified dispatch kernel, {a.requests} requests "
                "(microseconds)", [(n, s) for n, s, _ in rows])
    print_table("In-kernel turnaround of those requests (%globaltimer, microseconds)",
                [(n, k) for n, _, k in rows])
    write_json(a.json, {"environment": env, "args": vars(a), "in_kernel_ns_per_call":
                        dict(calls), "end_to_end": {n: {"round_trip": s, "in_kernel": k}
                                                    for n, s, k in rows}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
