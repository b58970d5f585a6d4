"""Round trip host -> GPU unified dispatch kernel -> host through the loopback ring.

A 32-byte payload (CUDA-Q's ``rpc_increment``: every byte + 1, a CUDA C++ DEVICE_CALL handler
that works 8 bytes at a time; ``gpu_handlers.py`` compares byte-loop handlers) goes through the
whole path: the Python poller writes the request into mapped pinned memory and then the slot's
sequence word, the persistent kernel (one warp) reads the request line, dispatches through the
function table, writes the response and its sequence word, the poller reads it. Next to it, in
the same run and the same kind of memory, the floor: a bare ping-pong of sequence words (no data
read, no dispatch) with the same fence before its store. Blocks of the two alternate
(``--rounds``) so that drift hits both. Also reported: the in-kernel turnaround (%globaltimer,
from the request in hand to the response published). 13 different requests go round in turn
(coprime with the slot count): a stale read of any request or response byte gives a wrong
response, counted (the exit status is 1 if any).

Every block runs on fresh rings (new pinned memory, floor and dispatch alike) and the poller is
pinned to one CPU; the per-block ratios are printed next to the pooled one. ``--call``
(repeatable: ``inline``, the data plane's default, LTO-inlined direct call; ``pointer``, through
the table's pointer as CUDA-Q) picks the handler call of the main comparison, ``--fence`` (0
fence.sc.sys, the default, 1 fence.acq_rel.sys) the fence of both the bridge and the floor.
``--sweep N`` first runs N requests through each variant (floors with each fence; the bridge with
the stage trace: pointer and inlined call, two-round-trip poll, other fences, CUDA-Q's single
thread, a byte-loop handler) and prints where the time goes.

Usage: python benchmarks/gpu_roundtrip.py [--requests 100000] [--rounds 10] [--call inline]
       [--call pointer] [--fence 0] [--sweep 20000] [--bridge-option -D...] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys

# The script's folder is on sys.path when it runs as a script: gpu_common is its neighbour.
from gpu_common import (
    FENCES,
    INCREMENT_SRC,
    FloorPingPong,
    environment,
    pin_cpu,
    print_table,
    run_loop,
    summary,
    write_json,
)

from openqlink.dispatch import DispatchMode, FunctionEntry, TypeDesc
from openqlink.gpu import (
    LOOPBACK_BRIDGE,
    CudaHandler,
    DispatchKernel,
    GPUDataPlane,
    TransportBridge,
)
from openqlink.gpu.program import builtin_launch
from openqlink.wire.rpc import PayloadType, Request, Response, fnv1a32

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

#: A handler that does nothing (no argument read, no result): with it the kernel's in-kernel
#: turnaround is the dispatch path's own cost (poll hand-over, lookup, response header, copy out,
#: publish), and the difference to ``rpc_increment``'s is that handler's cost.
EMPTY_SRC = r'''
#include "openqlink_dispatch.cuh"
extern "C" __device__ int rpc_empty(const void* in, void* out, uint32_t arg_len,
                                    uint32_t max_result_len, uint32_t* result_len) {
    *result_len = 0;
    return 0;
}
'''

STAGES = ("staged", "dispatch", "copy out", "fence", "seq store", "seen->published",
          "cycles", "disp cyc")


def make_plane(a, arr: TypeDesc, options: tuple[str, ...] = (), *, inline: bool = False,
               src: str = INCREMENT_SRC, single_thread: bool = False, timing: int = 0,
               trace: int = 0, empty: bool = False) -> GPUDataPlane:
    """A data plane serving ``rpc_increment`` (``src``), or with ``empty`` ``rpc_empty`` (same
    argument, no result)."""
    bridge = TransportBridge(LOOPBACK_BRIDGE.name, LOOPBACK_BRIDGE.source, options)
    kernel = None
    if single_thread:  # CUDA-Q's launch: the built-in kernel on one thread
        builtin = DispatchKernel.builtin()
        kernel = DispatchKernel(builtin.source, builtin.entry, builtin_launch, builtin.name)
    plane = GPUDataPlane(a.slots, a.slot_size, bridge=bridge, kernel=kernel,
                         inline_handlers=inline, timing_capacity=timing, trace_capacity=trace)
    name = "rpc_empty" if empty else "rpc_increment"
    plane.add(FunctionEntry(name, DispatchMode.DEVICE_CALL, (arr,), () if empty else (arr,),
                            CudaHandler(EMPTY_SRC if empty else src)))
    plane.get_device_handler(name)  # link + load before anything runs
    return plane


def sweep(a, request: list[bytes], expected: list[bytes], arr: TypeDesc,
          empty_request: list[bytes], empty_expected: list[bytes]) -> list[dict]:
    """N round trips per variant; the bridge variants with the stage trace (handler call through
    the table's pointer unless the label says inlined)."""
    floors = [(f"floor, {FENCES[f]}", f) for f in (0, 1, 2)]
    variants = [
        ("line poll, fence.sc.sys, pointer call", (), {}),
        ("line poll, fence.sc.sys, inlined call (default)", (), {"inline": True}),
        ("two-round-trip poll (LINE_POLL=0), fence.sc.sys", ("-DQLINK_LOOPBACK_LINE_POLL=0",),
         {}),
        ("line poll, fence.acq_rel.sys", ("-DQLINK_LOOPBACK_FENCE=1",), {}),
        ("line poll, no fence: one-line response (diagnostic)", ("-DQLINK_LOOPBACK_FENCE=2",),
         {}),
        ("single thread <<<1,1>>> (CUDA-Q launch), fence.sc.sys", (), {"single_thread": True}),
        ("line poll, fence.sc.sys, byte-loop handler", (), {"src": BYTE_LOOP_SRC}),
        ("line poll, fence.sc.sys, inlined call, empty handler", (),
         {"inline": True, "empty": True}),
        ("line poll, inlined call, response staged, copied out (DIRECT_TX=0)",
         ("-DQLINK_LOOPBACK_DIRECT_TX=0",), {"inline": True}),
        ("line poll, inlined call, empty handler, staged (DIRECT_TX=0)",
         ("-DQLINK_LOOPBACK_DIRECT_TX=0",), {"inline": True, "empty": True}),
    ]
    n = a.sweep + a.warmup
    rows = []
    for label, fence in floors:
        floor = FloorPingPong(a.device_ordinal, a.slots, a.slot_size, n, fence=fence)
        lat, _ = run_loop(floor.start(), request, None, a.sweep, a.warmup)
        kern = floor.stop()[a.warmup:]
        floor.close()
        rows.append({"variant": label, "round_trip": summary(lat), "in_kernel": summary(kern),
                     "wrong": 0, "stage_median_ns": {}})
    for label, opts, kw in variants:
        plane = make_plane(a, arr, opts, trace=n, timing=n, **kw)
        plane.start()
        assert plane.ring is not None
        empty = kw.get("empty", False)
        lat, bad = run_loop(plane.ring, empty_request if empty else request,
                            empty_expected if empty else expected, a.sweep, a.warmup)
        plane.stop()
        traces = plane.traces_ns()[a.warmup:]
        kern = plane.timings_ns()[a.warmup:]
        plane.close()
        med = [statistics.median(t[i] for t in traces) for i in range(len(STAGES))]
        rows.append({"variant": label, "round_trip": summary(lat), "in_kernel": summary(kern),
                     "wrong": bad, "stage_median_ns": dict(zip(STAGES, med, strict=True))})
    print(f"\nVariants, {a.sweep} round trips each (us; stage medians in ns, %globaltimer, "
          "32 ns ticks; cycles: seen->published and dispatch in SM clock cycles, clock64, and "
          "the SM clock they give; wrong = responses that differed from the expected one)")
    print(f"| {'variant':<54} | {'p50':>5} | {'p99':>5} | {'kern':>5} | {'wrong':>5} | "
          + " | ".join(f"{s:>8}" for s in STAGES) + f" | {'SM MHz':>6} |")
    print(f"|{'-' * 56}|{'-' * 7}|{'-' * 7}|{'-' * 7}|{'-' * 7}|"
          + "|".join("-" * 10 for _ in STAGES) + f"|{'-' * 8}|")
    for r in rows:
        rt, kn, st = r["round_trip"], r["in_kernel"], r["stage_median_ns"]
        mhz = (1000 * st["cycles"] / st["seen->published"]
               if st and st["seen->published"] else None)
        r["sm_clock_mhz"] = mhz
        print(f"| {r['variant']:<54} | {rt['p50_us']:>5.2f} | {rt['p99_us']:>5.2f} | "
              f"{kn['p50_us']:>5.2f} | {r['wrong']:>5} | "
              + " | ".join(f"{st[s]:>8.0f}" if st else f"{'':>8}" for s in STAGES)
              + (f" | {mhz:>6.0f} |" if mhz is not None else f" | {'':>6} |"))
    return rows


def compare(a, fence: int, inline: bool, request: list[bytes], expected: list[bytes],
            arr: TypeDesc, empty_request: list[bytes], empty_expected: list[bytes]) -> dict:
    """The main comparison: the floor, the dispatch kernel with ``rpc_increment`` and with the
    empty handler, in alternating blocks, each block on fresh rings (new pinned memory for
    each), so that where an allocation lands weighs on all alike. The dispatch path's overhead
    is the empty handler's in-kernel turnaround less the floor's; the handler's own cost is
    ``rpc_increment``'s less the empty one's."""
    per_block = a.requests // a.rounds
    options = (f"-DQLINK_LOOPBACK_FENCE={fence}", *a.bridge_option)
    plane = make_plane(a, arr, options, inline=inline, timing=per_block + a.warmup)
    empty = make_plane(a, arr, options, inline=inline, timing=per_block + a.warmup, empty=True)
    floor = FloorPingPong(plane.device_ordinal, a.slots, a.slot_size, per_block + a.warmup,
                          fence=fence)
    sides = ("floor", "dispatch", "empty")
    lat: dict[str, list[int]] = {k: [] for k in sides}
    kern: dict[str, list[int]] = {k: [] for k in sides}
    block_ratios = []
    bad = 0
    for _ in range(a.rounds):
        got_floor, _ = run_loop(floor.start(), request, None, per_block, a.warmup)
        lat["floor"] += got_floor
        kern["floor"] += floor.stop()[a.warmup:]
        for side, p, req, exp in (("dispatch", plane, request, expected),
                                  ("empty", empty, empty_request, empty_expected)):
            p.start()
            assert p.ring is not None
            got, b = run_loop(p.ring, req, exp, per_block, a.warmup)
            bad += b
            lat[side] += got
            p.stop()
            kern[side] += p.timings_ns()[a.warmup:]
            if side == "dispatch":
                block_ratios.append(round(statistics.median(got)
                                          / statistics.median(got_floor), 3))
    plane.close()
    empty.close()
    floor.close()
    mode = "inlined" if inline else "table pointer"
    print(f"\n{FENCES[fence]}, handler call {mode}: {a.payload}-byte payload, {a.slots} x "
          f"{a.slot_size}-byte slots, {a.rounds} alternating blocks of {per_block} "
          f"(+{a.warmup} warm-up) per variant; bridge options: {' '.join(options)}; wrong "
          f"responses: {bad}")
    rows = [("floor: seq ping-pong, no dispatch (round trip)", summary(lat["floor"])),
            (f"unified dispatch kernel, {mode} (round trip)", summary(lat["dispatch"])),
            (f"unified dispatch kernel, {mode}, empty handler (round trip)",
             summary(lat["empty"])),
            ("floor: in-kernel turnaround (%globaltimer)", summary(kern["floor"])),
            ("dispatch: in-kernel turnaround (%globaltimer)", summary(kern["dispatch"])),
            ("empty handler: in-kernel turnaround (%globaltimer)", summary(kern["empty"]))]
    print_table(f"Round trip host -> GPU -> host, Python poller, {FENCES[fence]}, {mode} "
                "(microseconds)", rows)
    ratio = rows[1][1]["p50_us"] / rows[0][1]["p50_us"]
    overhead_us = rows[5][1]["p50_us"] - rows[3][1]["p50_us"]
    handler_us = rows[4][1]["p50_us"] - rows[5][1]["p50_us"]
    # The turnarounds are whole %globaltimer ticks (32 ns on current GPUs): the medians'
    # difference moves in those steps, the means' does not.
    overhead_mean_us = rows[5][1]["mean_us"] - rows[3][1]["mean_us"]
    handler_mean_us = rows[4][1]["mean_us"] - rows[5][1]["mean_us"]
    print(f"\np50 dispatch / floor = {ratio:.3f} (target <= 1.2); per block: "
          f"{' '.join(f'{r:.3f}' for r in block_ratios)}")
    print(f"in-kernel p50: dispatch path overhead (empty handler - floor) = {overhead_us:.3f} us "
          f"(target < 0.3); rpc_increment's own cost (increment - empty) = {handler_us:.3f} us")
    print(f"in-kernel mean: dispatch path overhead = {overhead_mean_us:.3f} us; rpc_increment's "
          f"own cost = {handler_mean_us:.3f} us")
    return {"fence": FENCES[fence], "handler_call": mode, "wrong_responses": bad,
            "ratio_p50": ratio, "block_ratios": block_ratios,
            "dispatch_overhead_us": overhead_us, "handler_us": handler_us,
            "dispatch_overhead_mean_us": overhead_mean_us, "handler_mean_us": handler_mean_us,
            "rows": dict(rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000, help="per variant (>= 100000)")
    ap.add_argument("--warmup", type=int, default=1_000, help="per block")
    ap.add_argument("--rounds", type=int, default=10, help="alternating blocks per variant")
    ap.add_argument("--payload", type=int, default=32, help="payload bytes")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--slot-size", type=int, default=256)
    ap.add_argument("--call", action="append", choices=("pointer", "inline"),
                    help="handler call of the main comparison (repeatable; default inline, the "
                         "data plane's default)")
    ap.add_argument("--fence", type=int, default=0, choices=(0, 1),
                    help="fence of the bridge and the floor in the main comparison")
    ap.add_argument("--cpu", type=int, help="CPU to pin the poller to (default: the last)")
    ap.add_argument("--sweep", type=int, default=0, help="requests per variant (0: none)")
    ap.add_argument("--bridge-option", action="append", default=[],
                    help="NVRTC option for the loopback bridge (repeatable)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    cpu = pin_cpu(a.cpu)
    arr = TypeDesc.array(PayloadType.ARRAY_UINT8, a.payload)
    payloads = [bytes((i * 7 + k) & 0xFF for i in range(a.payload)) for k in range(13)]
    request = [Request(fnv1a32("rpc_increment"), k, k << 20, p).pack()
               for k, p in enumerate(payloads)]
    expected = [Response(0, k, k << 20, bytes((b + 1) & 0xFF for b in p)).pack()
                for k, p in enumerate(payloads)]
    empty_request = [Request(fnv1a32("rpc_empty"), k, k << 20, p).pack()
                     for k, p in enumerate(payloads)]
    empty_expected = [Response(0, k, k << 20, b"").pack() for k in range(len(payloads))]
    probe = make_plane(a, arr)
    a.device_ordinal = probe.device_ordinal
    env = environment(probe.device)
    probe.close()
    print(f"GPU {env['gpu']} ({env['arch']}), driver CUDA {env['driver_cuda_version']}, NVRTC "
          f"{env['nvrtc']}, nvJitLink {env['nvjitlink']}, Python {env['python']}, {env['date']}; "
          f"poller pinned to CPU {cpu}")
    swept = sweep(a, request, expected, arr, empty_request, empty_expected) if a.sweep else []
    results = [compare(a, a.fence, c == "inline", request, expected, arr, empty_request,
                       empty_expected) for c in (a.call or ["inline"])]
    bad = sum(r["wrong_responses"] for r in results) + sum(r["wrong"] for r in swept)
    args = vars(a)
    write_json(a.json, {"environment": env, "poller_cpu": cpu, "args": args,
                        "wrong_responses": bad, "main": results, "sweep": swept})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
