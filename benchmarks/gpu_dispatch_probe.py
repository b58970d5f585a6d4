"""Where the unified dispatch kernel's per-request path spends its SM cycles (a GPU host).

The built-in kernel (``unified_dispatch.cu``) is compiled with ``clock64`` probes between the
steps of its per-request path: the header loads, the lookup (one ballot when the table fits the
warp's lanes), then the caller's part (the caller: the lane holding the matching entry): its
entry into it, its checks, the handler call (the handler's own cost) and the response header's
stores; then the ballot on whether there is a result and its copy into the response. Each probe
waits for the values the step produced (an ``asm`` input), so a segment is that step's latency
on one warp. The seven segments of each request are packed into the kernel's timing ring
(fields of ``WIDTHS`` bits: the handler call's 12, up to 4095 cycles), medians printed per
handler: ``rpc_empty`` (32 argument bytes not read, no result) and ``rpc_increment`` (32 bytes
in and out). Rank 0 records its probes: the caller of the one-entry tables used here.
``--twice`` adds a kernel whose lookup runs twice per request (``lookup``: the first pass,
``lookup again``: the second), to tell a cold-cache cost (the second pass fast) from the
instructions' own (both passes alike).

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

SEGMENTS = ("header loads", "lookup", "caller: entry", "caller: checks", "caller: handler call",
            "caller: header stores", "result: ballot, copy")
#: Bits of each segment in the request's 64-bit timing word (a value at its field's largest is
#: that or more): the handler call gets 12 (4095 cycles), the others what they need with room.
WIDTHS = (8, 9, 7, 7, 12, 9, 10)
#: With --twice: an eighth segment ("lookup again"), the handler call down to 8 bits.
TWICE_WIDTHS = (8, 8, 7, 7, 8, 8, 10, 8)


def _pack(widths: tuple[int, ...]) -> str:
    """C statements packing d[0..] into `packed`, each capped at its field's largest value."""
    lines, shift = [], 0
    for k, w in enumerate(widths):
        cap = (1 << w) - 1
        lines.append(f"                packed |= (d[{k}] < {cap}u ? d[{k}] : {cap}u) << {shift};\n")
        shift += w
    assert shift <= 64
    return "".join(lines)


_PROBE = r"""
#define QLINK_LOOKUP_OUT (static_cast<uint64_t>(caller) ^ caller_lane ^ callable ^ want)
// clock64 once the value `dep` is available (the add waits for it).
static __device__ __forceinline__ uint64_t qlink_probe_clock(uint64_t dep) {
    uint64_t c;
    asm volatile("add.u64 %0, %1, 0; mov.u64 %0, %%clock64;" : "=l"(c) : "l"(dep) : "memory");
    return c;
}
"""

# (text in the kernel, text that replaces it): the probes, and the packed segments written
# where the kernel writes a request's turnaround. Rank 0 records its probes: the caller of the
# one-entry tables used here (their entry is in rank 0's registers).
_EDITS = (
    ('#include "openqlink_dispatch.cuh"\n', '#include "openqlink_dispatch.cuh"\n' + _PROBE),
    ("        const uint64_t t0 = timing_ns != nullptr ? qlink_globaltimer_ns() : 0;",
     "        const uint64_t t0 = timing_ns != nullptr ? qlink_globaltimer_ns() : 0;\n"
     "        const uint64_t c0 = qlink_probe_clock(0);"),
    ("        const uint32_t arg_len = static_cast<uint32_t>(head1);",
     "        const uint32_t arg_len = static_cast<uint32_t>(head1);\n"
     "        const uint64_t c1 = qlink_probe_clock(head0 ^ head1 ^ ptp_timestamp);"),
    ("        uint32_t result_len = 0;  // the caller's\n        if (caller) {",
     "        const uint64_t c2 = qlink_probe_clock(QLINK_LOOKUP_OUT);\n"
     "        uint64_t c2a = 0, c2b = 0, c3 = 0;\n"
     "        uint32_t result_len = 0;  // the caller's\n        if (caller) {\n"
     "            c2a = qlink_probe_clock(0);"),
    ("            if (status == QLINK_STATUS_OK) {\n",
     "            c2b = qlink_probe_clock(static_cast<uint32_t>(status));\n"
     "            if (status == QLINK_STATUS_OK) {\n"),
    ("            // The response header in three 8-byte stores",
     "            c3 = qlink_probe_clock(static_cast<uint64_t>(status) ^ result_len);\n"
     "            // The response header in three 8-byte stores"),
    ("        if (__ballot_sync(mask, result_len != 0) != 0) {",
     "        const uint64_t c4 = qlink_probe_clock(result_len);\n"
     "        if (__ballot_sync(mask, result_len != 0) != 0) {"),
    ("        cudaq_dev_tx_publish(session, response);",
     "        const uint64_t c5 = qlink_probe_clock(0);\n"
     "        cudaq_dev_tx_publish(session, response);"),
    ("                timing_ns[timing_slot] = qlink_globaltimer_ns() - t0;",
     "                (void)t0;\n"
     "                const uint64_t d[7] = {c1 - c0, c2 - c1, c2a - c2, c2b - c2a, c3 - c2b,\n"
     "                                       c4 - c3, c5 - c4};\n"
     "                uint64_t packed = 0;\n" + _pack(WIDTHS)
     + "                timing_ns[timing_slot] = packed;"),
)

# --twice: the lookup in a loop of two passes; segment 1 becomes the first pass, and a segment
# "lookup again" (the second) is added.
_TWICE = (
    ("        if (in_registers) {\n            const bool match =",
     "        uint64_t cpass = 0;\n#pragma unroll 1\n"
     "        for (int pass = 0; pass < 2; ++pass) {\n"
     "        if (pass == 1) cpass = qlink_probe_clock(QLINK_LOOKUP_OUT);\n"
     "        if (in_registers) {\n            const bool match ="),
    ("        const uint64_t c2 = qlink_probe_clock(",
     "        }\n        const uint64_t c2 = qlink_probe_clock("),
    ("const uint64_t d[7] = {c1 - c0, c2 - c1,", "const uint64_t d[8] = {c1 - c0, cpass - c1,"),
    ("c4 - c3, c5 - c4};", "c4 - c3, c5 - c4, c2 - cpass};"),
    (_pack(WIDTHS), _pack(TWICE_WIDTHS)),
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


def run(kernel_source: str, empty: bool, n: int, warmup: int,
        segments: int) -> tuple[list[list[int]], int]:
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
    widths = WIDTHS if segments == len(WIDTHS) else TWICE_WIDTHS
    shifts = [sum(widths[:k]) for k in range(len(widths))]
    return [[(v >> shift) & ((1 << w) - 1) for v in packed]
            for shift, w in zip(shifts, widths, strict=True)], wrong


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
    kernels = [("built-in kernel", probe_source(), SEGMENTS)]
    if a.twice:
        kernels.append(("lookup twice", probe_source(twice=True), (*SEGMENTS, "lookup again")))
    columns = (*SEGMENTS, "lookup again") if a.twice else SEGMENTS
    results = []
    for label, source, names in kernels:
        for empty in (True, False):
            segments, wrong = run(source, empty, a.requests, a.warmup, len(names))
            handler = "rpc_empty" if empty else "rpc_increment"
            medians = {s: statistics.median(v) for s, v in zip(names, segments, strict=True)}
            results.append({"kernel": label, "handler": handler, "wrong_responses": wrong,
                            "median_cycles": medians})
    device = Device(0)
    env = environment(device)
    device.release()
    print(f"GPU {env['gpu']} ({env['arch']}), driver CUDA {env['driver_cuda_version']}, "
          f"{env['date']}; poller pinned to CPU {cpu}; {a.requests} requests per row; SM "
          "cycles per step, median (a field's largest value: that or more; the widths: "
          f"{WIDTHS}, with --twice {TWICE_WIDTHS})")
    print(f"| {'kernel, handler':<30} | " + " | ".join(f"{s:>12}" for s in columns) + " |")
    print(f"|{'-' * 32}|" + "|".join("-" * 14 for _ in columns) + "|")
    for r in results:
        cells = (f"{r['median_cycles'][s]:>12.0f}" if s in r["median_cycles"] else f"{'':>12}"
                 for s in columns)
        print(f"| {r['kernel'] + ', ' + r['handler']:<30} | " + " | ".join(cells) + " |")
    write_json(a.json, {"environment": env, "poller_cpu": cpu, "requests": a.requests,
                        "results": results})
    return 1 if any(r["wrong_responses"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
