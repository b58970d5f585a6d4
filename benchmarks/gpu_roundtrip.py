"""Round trip host -> GPU unified dispatch kernel -> host through the loopback ring.

A 32-byte payload (CUDA-Q's ``rpc_increment``: every byte + 1, a CUDA C++ DEVICE_CALL handler
that works 8 bytes at a time; ``gpu_handlers.py`` compares byte-loop handlers) goes through the
whole path: the Python poller writes the request into mapped pinned memory and
sets the slot's flag, the persistent kernel copies it, dispatches through the function table,
writes the response and its flag, the poller reads it. Next to it, in the same run and the same
kind of memory, the floor: a bare flag ping-pong kernel (no data read, no dispatch). Blocks of
the two alternate (``--rounds``) so that drift hits both. Also reported: the in-kernel
turnaround (%globaltimer, from the request in hand to the response published).

``--sweep N`` first runs N requests through each loopback-bridge variant (how the request is
read, how much is prefetched) with the bridge's stage trace, and prints where the time goes.

Usage: python benchmarks/gpu_roundtrip.py [--requests 100000] [--inline] [--sweep 20000]
       [--bridge-option -DQLINK_LOOPBACK_LOAD=2 ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys

# The script's folder is on sys.path when it runs as a script: gpu_common is its neighbour.
from gpu_common import (
    FloorPingPong,
    environment,
    print_table,
    run_loop,
    summary,
    write_json,
)

from openqlink.dispatch import DispatchMode, FunctionEntry, TypeDesc
from openqlink.gpu import LOOPBACK_BRIDGE, CudaHandler, GPUDataPlane, TransportBridge
from openqlink.wire.rpc import PayloadType, Request, Response, fnv1a32

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

BYTE_LOOP_SRC = r'''
#include "openqlink_dispatch.cuh"
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

STAGES = ("copy in", "dispatch", "copy out", "fence", "flag", "flag->published")


def sweep(a, request: list[bytes], expected: list[bytes], arr: TypeDesc) -> list[dict]:
    """N round trips per bridge variant with the stage trace; returns one row per variant."""
    variants = [("default: ld.global after the acquire, shared staging", (), INCREMENT_SRC),
                 ("device-memory staging", ("-DQLINK_LOOPBACK_SMEM_BYTES=0",), INCREMENT_SRC),
                 ("ld.global.cv loads", ("-DQLINK_LOOPBACK_LOAD=0",), INCREMENT_SRC),
                 ("default, byte-loop handler", (), BYTE_LOOP_SRC)]
    rows = []
    for label, opts, src in variants:
        bridge = TransportBridge(LOOPBACK_BRIDGE.name, LOOPBACK_BRIDGE.source, opts)
        plane = GPUDataPlane(a.slots, a.slot_size, bridge=bridge, inline_handlers=a.inline,
                             trace_capacity=a.sweep + a.warmup)
        plane.add(FunctionEntry("rpc_increment", DispatchMode.DEVICE_CALL, (arr,), (arr,),
                                CudaHandler(src)))
        plane.start()
        assert plane.ring is not None
        lat, bad = run_loop(plane.ring, request, expected, a.sweep, a.warmup)
        plane.stop()
        traces = plane.traces_ns()[a.warmup:]
        plane.close()
        med = [statistics.median(t[i] for t in traces) for i in range(len(STAGES))]
        rows.append({"variant": label, "round_trip": summary(lat), "wrong": bad,
                     "stage_median_ns": dict(zip(STAGES, med, strict=True))})
    print(f"\nLoopback bridge variants, {a.sweep} round trips each (stage medians in ns, "
          "%globaltimer, 32 ns ticks)")
    print(f"| {'variant':<46} | {'p50 us':>6} | {'p99 us':>6} | "
          + " | ".join(f"{s:>8}" for s in STAGES) + " |")
    print(f"|{'-' * 48}|{'-' * 8}|{'-' * 8}|" + "|".join("-" * 10 for _ in STAGES) + "|")
    for r in rows:
        rt = r["round_trip"]
        print(f"| {r['variant']:<46} | {rt['p50_us']:>6.2f} | {rt['p99_us']:>6.2f} | "
              + " | ".join(f"{r['stage_median_ns'][s]:>8.0f}" for s in STAGES) + " |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000, help="per variant (>= 100000)")
    ap.add_argument("--warmup", type=int, default=2_000)
    ap.add_argument("--rounds", type=int, default=2, help="alternating blocks per variant")
    ap.add_argument("--payload", type=int, default=32, help="payload bytes")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--slot-size", type=int, default=256)
    ap.add_argument("--inline", action="store_true", help="LTO-inlined handler call")
    ap.add_argument("--sweep", type=int, default=0, help="requests per bridge variant (0: none)")
    ap.add_argument("--bridge-option", action="append", default=[],
                    help="NVRTC option for the loopback bridge (repeatable)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    per_block = a.requests // a.rounds
    arr = TypeDesc.array(PayloadType.ARRAY_UINT8, a.payload)
    bridge = TransportBridge(LOOPBACK_BRIDGE.name, LOOPBACK_BRIDGE.source,
                             tuple(a.bridge_option))
    plane = GPUDataPlane(a.slots, a.slot_size, inline_handlers=a.inline, bridge=bridge,
                         timing_capacity=per_block + a.warmup)
    plane.add(FunctionEntry("rpc_increment", DispatchMode.DEVICE_CALL, (arr,), (arr,),
                            CudaHandler(INCREMENT_SRC)))
    plane.get_device_handler("rpc_increment")  # link + load before timing anything
    floor = FloorPingPong(plane.device, a.slots, a.slot_size, per_block + a.warmup)
    # 13 different requests (coprime with the slot count): a stale read gives a wrong answer.
    payloads = [bytes((i * 7 + k) & 0xFF for i in range(a.payload)) for k in range(13)]
    request = [Request(fnv1a32("rpc_increment"), k, k << 20, p).pack()
               for k, p in enumerate(payloads)]
    expected = [Response(0, k, k << 20, bytes((b + 1) & 0xFF for b in p)).pack()
                for k, p in enumerate(payloads)]
    swept = sweep(a, request, expected, arr) if a.sweep else []
    lat = {"floor": [], "dispatch": []}
    kern = {"floor": [], "dispatch": []}
    bad = 0
    for _ in range(a.rounds):
        ring = floor.start()
        got, _ = run_loop(ring, request, None, per_block, a.warmup)
        lat["floor"] += got
        kern["floor"] += floor.stop()[a.warmup:]
        plane.start()
        assert plane.ring is not None
        got, b = run_loop(plane.ring, request, expected, per_block, a.warmup)
        bad += b
        lat["dispatch"] += got
        plane.stop()
        kern["dispatch"] += plane.timings_ns()[a.warmup:]
    plane.close()
    env = environment(plane.device)
    mode = "inlined" if a.inline else "table pointer"
    print(f"GPU {env['gpu']} ({env['arch']}), driver CUDA {env['driver_cuda_version']}, NVRTC "
          f"{env['nvrtc']}, nvJitLink {env['nvjitlink']}, Python {env['python']}, {env['date']}")
    print(f"{a.payload}-byte payload, {a.slots} x {a.slot_size}-byte slots, {a.rounds} "
          f"alternating blocks of {per_block} (+{a.warmup} warm-up) per variant; handler call: "
          f"{mode}; bridge options: {' '.join(a.bridge_option) or '(default)'}; wrong "
          f"responses: {bad}")
    rows = [("floor: flag ping-pong, no dispatch (round trip)", summary(lat["floor"])),
            ("unified dispatch kernel (round trip)", summary(lat["dispatch"])),
            ("floor: in-kernel turnaround (%globaltimer)", summary(kern["floor"])),
            ("dispatch: in-kernel turnaround (%globaltimer)", summary(kern["dispatch"]))]
    print_table("Round trip host -> GPU -> host, Python poller (microseconds)", rows)
    ratio = rows[1][1]["p50_us"] / rows[0][1]["p50_us"]
    print(f"\np50 dispatch / floor = {ratio:.3f} (target <= 1.2)")
    write_json(a.json, {"environment": env, "args": vars(a), "wrong_responses": bad,
                        "ratio_p50": ratio, "rows": dict(rows), "sweep": swept})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
