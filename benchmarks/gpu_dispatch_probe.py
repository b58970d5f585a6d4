"""Where the unified dispatch kernel's per-request path spends its SM cycles (a GPU host).

The built-in kernel (``unified_dispatch.cu``) is compiled with ``clock64`` probes between the
steps of its per-request path: the header loads, the lookup (a ballot and shuffles when the
table fits the warp's lanes), the leader's entry into its part, its checks, the handler call,
its response header stores, the result length shuffled to the lanes, and the result's copy
into the response. Each probe waits for the values the step produced (an ``asm`` input), so a
segment is that step's latency on one warp. The eight segments of each request are packed
into the kernel's timing ring (8 bits each, 255 = 255 or more), medians printed per handler:
``rpc_empty`` (no argument read, no result) and ``rpc_increment`` (32 bytes in and out).
``--twice`` adds a kernel whose lookup runs twice per request, to tell a cold-cache cost (the
second pass fast) from the instructions' own (both passes alike).

The probes add a few cycles each: use the figures to compare the steps, not as the path's
total (``gpu_roundtrip.py`` measures that). Without a GPU the script prints one line and exits
with status 2.

Usage: python benchmarks/gpu_dispatch_probe.py [--requests 20000] [--twice] [--json OUT]
"""

from __future__ import annotations

import argparse
import statistics
import sys

# The script's folder is on sys.path when it runs as a script: its neighbours are importable.
from gpu_common import INCREMENT_SRC, environment, pin_cpu, run_loop, write_json
from gpu_roundtrip import EMPTY_SRC

from openqlink.dispatch import DispatchMode, FunctionEntry, TypeDesc
from openqlink.gpu import CudaHandler, Device, DispatchKernel, GPUDataPlane, gpu_available
from openqlink.gpu.program import warp_launch
from openqlink.wire.rpc import PayloadType, Request, Response, fnv1a32

SEGMENTS = ("header loads", "lookup", "leader: entry", "leader: checks",
            "leader: handler call", "leader: header stores", "result length shuffle",
            "result copy")

_PROBE = r'''
#define QLINK_LOOKUP_OUT (static_cast<uint64_t>(index) ^ callable ^ want)
// clock64 once the value `dep` is available (the add waits for it).
static __device__ __forceinline__ uint64_t qlink_probe_clock(uint64_t dep) {
    uint64_t c;
    asm volatile("add.u64 %0, %1, 0; mov.u64 %0, %%clock64;" : "=l"(c) : "l"(dep) : "memory");
    return c;
}
'''

# (text in the kernel, text that replaces it): the probes, and the packed segments written
# where the kernel writes a request's turnaround.
_EDITS = (
    ('#include "openqlink_dispatch.cuh"\n', '#include "openqlink_dispatch.cuh"\n' + _PROBE),
    ("        const uint64_t t0 = timing_ns != nullptr ? qlink_globaltimer_ns() : 0;",
     "        const uint64_t t0 = timing_ns != nullptr ? qlink_globaltimer_ns() : 0;\n"
     "        const uint64_t c0 = qlink_probe_clock(0);"),
    ("        const uint32_t arg_len = static_cast<uint32_t>(head1);",
     "        const uint32_t arg_len = static_cast<uint32_t>(head1);\n"
     "        const uint64_t c1 = qlink_probe_clock(head0 ^ head1 ^ ptp_timestamp);"),
    ("        if (rank == 0) {\n            if (!in_registers) {",
     "        const uint64_t c2 = qlink_probe_clock(QLINK_LOOKUP_OUT);\n"
     "        uint64_t c3 = 0, c2a = 0, c2b = 0;\n"
     "        if (rank == 0) {\n            if (!in_registers) {"),
    ("            int32_t status = QLINK_STATUS_UNKNOWN_FUNCTION;",
     "            c2a = qlink_probe_clock(QLINK_LOOKUP_OUT);\n"
     "            int32_t status = QLINK_STATUS_UNKNOWN_FUNCTION;\n"
     "            c2b = c2a;"),
    ("                    status = qlink_call_handler(&table[index], h + 1, qlink_handler_out,",
     "                    c2b = qlink_probe_clock(0);\n"
     "                    status = qlink_call_handler(&table[index], h + 1, qlink_handler_out,"),
    ("            // The response header in three 8-byte stores",
     "            c3 = qlink_probe_clock(static_cast<uint64_t>(status) ^ result_len);\n"
     "            // The response header in three 8-byte stores"),
    ("        const uint32_t n = __shfl_sync(mask, result_len, leader);",
     "        const uint64_t c4 = qlink_probe_clock(result_len);\n"
     "        const uint32_t n = __shfl_sync(mask, result_len, leader);\n"
     "        const uint64_t c5 = qlink_probe_clock(n);"),
    ("        cudaq_dev_tx_publish(session, response);",
     "        const uint64_t c6 = qlink_probe_clock(0);\n"
     "        cudaq_dev_tx_publish(session, response);"),
    ("                timing_ns[timing_slot] = qlink_globaltimer_ns() - t0;",
     "                (void)t0;\n"
     "                const uint64_t d[8] = {c1 - c0, c2 - c1, c2a - c2, c2b - c2a, c3 - c2b,\n"
     "                                       c4 - c3, c5 - c4, c6 - c5};\n"
     "                uint64_t packed = 0;\n"
     "                for (int k = 0; k < 8; ++k) packed |= (d[k] < 255 ? d[k] : 255) << (8 * k);\n"
     "                timing_ns[timing_slot] = packed;"),
)

# --twice: the lookup in a loop of two passes; segments 2 and 3 become the two passes.
_TWICE = (
    ("        if (in_registers) {\n            const uint32_t hit =",
     "        uint64_t cpass = 0;\n#pragma unroll 1\n"
     "        for (int pass = 0; pass < 2; ++pass) {\n"
     "        if (pass == 1) cpass = qlink_probe_clock(QLINK_LOOKUP_OUT);\n"
     "        index = -1; callable = 0; want = 0;\n"
     "        if (in_registers) {\n            const uint32_t hit ="),
    ("        const uint64_t c2 = qlink_probe_clock(",
     "        }\n        const uint64_t c2 = qlink_probe_clock("),
    ("{c1 - c0, c2 - c1, c2a - c2,", "{c1 - c0, cpass - c1, c2 - cpass,"),
)


def _edit(source: str, edits) -> str:
    for old, new in edits:
        if source.count(old) != 1:
            raise SystemExit(f"gpu_dispatch_probe: the kernel no longer has this text once "
                             f"(update the probe): {old!r}")
        source = source.replace(old, new)
    return source


def probe_source(twice: bool = False) -> str:
    """The built-in kernel's source with the probes (and with ``twice``, the lookup twice)."""
    source = _edit(DispatchKernel.builtin().source, _EDITS)
    return _edit(source, _TWICE) if twice else source


def run(kernel_source: str, empty: bool, n: int, warmup: int) -> tuple[list[list[int]], int]:
    """``n`` requests through the probed kernel; each segment's cycles per request."""
    name = "rpc_empty" if empty else "rpc_increment"
    arr = TypeDesc.array(PayloadType.ARRAY_UINT8, 32)
    payloads = [bytes((i * 7 + k) & 0xFF for i in range(32)) for k in range(13)]
    requests = [Request(fnv1a32(name), k, k << 20, p).pack() for k, p in enumerate(payloads)]
    expected = [Response(0, k, k << 20, b"" if empty else bytes((b + 1) & 0xFF for b in p))
                .pack() for k, p in enumerate(payloads)]
    kernel = DispatchKernel(kernel_source, "qlink_unified_dispatch", warp_launch,
                            "unified_dispatch_probe.cu")
    plane = GPUDataPlane(8, 256, kernel=kernel, inline_handlers=True,
                         timing_capacity=n + warmup)
    plane.add(FunctionEntry(name, DispatchMode.DEVICE_CALL, (arr,), () if empty else (arr,),
                            CudaHandler(EMPTY_SRC if empty else INCREMENT_SRC)))
    try:
        plane.start()
        assert plane.ring is not None
        _, wrong = run_loop(plane.ring, requests, expected, n, warmup)
        plane.stop()
        packed = plane.timings_ns()[warmup:]
    finally:
        plane.close()
    return [[(v >> (8 * k)) & 0xFF for v in packed] for k in range(len(SEGMENTS))], wrong


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--warmup", type=int, default=1_000)
    ap.add_argument("--twice", action="store_true", help="also the kernel with the lookup twice")
    ap.add_argument("--cpu", type=int, help="CPU to pin the poller to (default: the last)")
    ap.add_argument("--json", help="write the medians here")
    a = ap.parse_args()
    ok, why = gpu_available()
    if not ok:
        print(f"gpu_dispatch_probe: no GPU: {why}")
        return 2
    cpu = pin_cpu(a.cpu)
    kernels = [("built-in kernel", probe_source())]
    if a.twice:
        kernels.append(("lookup twice (lookup: first pass, leader: entry: second)",
                        probe_source(twice=True)))
    results = []
    for label, source in kernels:
        for empty in (True, False):
            segments, wrong = run(source, empty, a.requests, a.warmup)
            handler = "rpc_empty" if empty else "rpc_increment"
            medians = {s: statistics.median(v) for s, v in zip(SEGMENTS, segments, strict=True)}
            results.append({"kernel": label, "handler": handler, "wrong_responses": wrong,
                            "median_cycles": medians})
    device = Device(0)
    env = environment(device)
    device.release()
    print(f"GPU {env['gpu']} ({env['arch']}), driver CUDA {env['driver_cuda_version']}, "
          f"{env['date']}; poller pinned to CPU {cpu}; {a.requests} requests per row; SM "
          "cycles per step, median (255: 255 or more)")
    print(f"| {'kernel, handler':<70} | " + " | ".join(f"{s:>10}" for s in SEGMENTS) + " |")
    print(f"|{'-' * 72}|" + "|".join("-" * 12 for _ in SEGMENTS) + "|")
    for r in results:
        print(f"| {r['kernel'] + ', ' + r['handler']:<70} | "
              + " | ".join(f"{r['median_cycles'][s]:>10.0f}" for s in SEGMENTS) + " |")
    write_json(a.json, {"environment": env, "poller_cpu": cpu, "requests": a.requests,
                        "results": results})
    return 1 if any(r["wrong_responses"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
