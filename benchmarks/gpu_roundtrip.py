"""Round trip host -> GPU unified dispatch kernel -> host through the loopback ring.

A 32-byte payload (CUDA-Q's ``rpc_increment``: every byte + 1, a CUDA C++ DEVICE_CALL handler)
goes through the whole path: the Python poller writes the request into mapped pinned memory and
sets the slot's flag, the persistent kernel copies it, dispatches through the function table,
writes the response and its flag, the poller reads it. Next to it, in the same run and the same
kind of memory, the floor: a bare flag ping-pong kernel (no data read, no dispatch). Blocks of
the two alternate (``--rounds``) so that drift hits both. Also reported: the in-kernel
turnaround (%globaltimer, from the request in hand to the response published).

Usage: python benchmarks/gpu_roundtrip.py [--requests 100000] [--inline] [--json out.json]
"""

from __future__ import annotations

import argparse
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
from openqlink.gpu import CudaHandler, GPUDataPlane
from openqlink.wire.rpc import PayloadType, Request, Response, fnv1a32

INCREMENT_SRC = r'''
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000, help="per variant (>= 100000)")
    ap.add_argument("--warmup", type=int, default=2_000)
    ap.add_argument("--rounds", type=int, default=2, help="alternating blocks per variant")
    ap.add_argument("--payload", type=int, default=32, help="payload bytes")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--slot-size", type=int, default=256)
    ap.add_argument("--inline", action="store_true", help="LTO-inlined handler call")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    per_block = a.requests // a.rounds
    arr = TypeDesc.array(PayloadType.ARRAY_UINT8, a.payload)
    plane = GPUDataPlane(a.slots, a.slot_size, inline_handlers=a.inline,
                         timing_capacity=per_block + a.warmup)
    plane.add(FunctionEntry("rpc_increment", DispatchMode.DEVICE_CALL, (arr,), (arr,),
                            CudaHandler(INCREMENT_SRC)))
    plane.get_device_handler("rpc_increment")  # link + load before timing anything
    floor = FloorPingPong(plane.device, a.slots, a.slot_size, per_block + a.warmup)
    payload = bytes(i & 0xFF for i in range(a.payload))
    request = Request(fnv1a32("rpc_increment"), 1, 0, payload).pack()
    expected = Response(0, 1, 0, bytes((b + 1) & 0xFF for b in payload)).pack()
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
          f"{mode}; wrong responses: {bad}")
    rows = [("floor: flag ping-pong, no dispatch (round trip)", summary(lat["floor"])),
            ("unified dispatch kernel (round trip)", summary(lat["dispatch"])),
            ("floor: in-kernel turnaround (%globaltimer)", summary(kern["floor"])),
            ("dispatch: in-kernel turnaround (%globaltimer)", summary(kern["dispatch"]))]
    print_table("Round trip host -> GPU -> host, Python poller (microseconds)", rows)
    ratio = rows[1][1]["p50_us"] / rows[0][1]["p50_us"]
    print(f"\np50 dispatch / floor = {ratio:.3f} (target <= 1.2)")
    write_json(a.json, {"environment": env, "args": vars(a), "wrong_responses": bad,
                        "ratio_p50": ratio, "rows": dict(rows)})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
