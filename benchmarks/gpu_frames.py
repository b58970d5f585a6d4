"""The GPU RoCE endpoint: request frame in the rx ring -> response frame published.

A Python poller plays the NIC: it writes a raw RoCEv2 request frame (UC
RDMA_WRITE_ONLY_WITH_IMMEDIATE carrying an RPC request for CUDA-Q's ``rpc_increment``, a 32-byte
payload by default, built by a UCQueuePair standing in for the QSC) into the next slot of the rx
frame ring, then its sequence word, and spins until the response frame's sequence word appears in
the tx ring; one ``time.perf_counter_ns()`` pair around each round trip. The kernel checks the
frame (Ethernet, IPv4 checksum, UDP, ICRC on the GPU, BTH, RETH, ImmDt), dispatches, and builds
the SEND_ONLY frame (IPv4 checksum, ICRC). Every response frame is compared with the one the
host's UCQueuePair builds for the same response and PSN; a differing one is counted (exit status
1 if any). 13 different requests go round in turn.

Reported, in the same run: the loopback floor of ``gpu_roundtrip.py`` (a bare ping-pong of
sequence words over mapped pinned memory, no data, no dispatch), the endpoint's round trip, the
frame's time in the kernel (``%globaltimer``: sequence word seen -> response frame published,
checks and ICRCs included) and the dispatch part of it (the kernel's own turnaround: request
handed out -> response published). Blocks of floor and endpoint alternate (``--rounds``), each
on fresh memory.

Needs a CUDA GPU: without one it prints one line and exits with status 2.

Usage: python benchmarks/gpu_frames.py [--requests 100000] [--rounds 10] [--payload 32]
       [--slots 8] [--slot-size 256] [--cpu N] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

# The script's folder is on sys.path when it runs as a script: gpu_common is its neighbour.
from gpu_common import (
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
from openqlink.gpu import CudaHandler, gpu_available
from openqlink.gpu.frames import FrameEndpointConfig, FrameRings, GPUFramePlane
from openqlink.roce import UCQueuePair
from openqlink.wire.roce import slot_immediate
from openqlink.wire.rpc import PayloadType, Request, Response, fnv1a32

HOST_MAC, QSC_MAC = 0x02_00_00_00_00_01, 0x02_00_00_00_00_10
HOST_IP, QSC_IP = "192.168.0.1", "192.168.0.10"
HOST_QPN, QSC_QPN, RKEY = 0x11, 0x2, 0x5EED_0001


def frames_for(count: int, payloads: list[bytes], slots: int, slot_size: int,
               tx_psn: int) -> tuple[list[bytes], list[bytes]]:
    """``count`` request frames (request ``i`` carries ``payloads[i % k]``, into slot
    ``i % slots``, PSNs from 0) and the response frames the host would send for them (PSNs from
    ``tx_psn``)."""
    qsc = UCQueuePair(QSC_MAC, QSC_IP, QSC_QPN, HOST_MAC, HOST_IP, HOST_QPN)
    ref = UCQueuePair(HOST_MAC, HOST_IP, HOST_QPN, QSC_MAC, QSC_IP, QSC_QPN, tx_psn=tx_psn)
    fid = fnv1a32("rpc_increment")
    requests, expected = [], []
    for i in range(count):
        k = i % len(payloads)
        p = payloads[k]
        slot = i % slots
        rpc = Request(fid, k, k << 20, p).pack()
        requests.append(qsc.write_frame(slot * slot_size, RKEY, rpc,
                                        imm=slot_immediate(qsc.tx_psn, slot)))
        expected.append(ref.send_frame(
            Response(0, k, k << 20, bytes((b + 1) & 0xFF for b in p)).pack()))
    return requests, expected


def run_frames(rings: FrameRings, requests: list[bytes], expected: list[bytes],
               warmup: int) -> tuple[list[int], list[int], int]:
    """One request frame at a time through the rings: the round trips (ns), the frames' times
    in the kernel (ns) and the number of response frames that differ, the first ``warmup``
    left out."""
    push, pop, now = rings.push, rings.pop, time.perf_counter_ns
    lat, kern = [], []
    bad = 0
    for i, frame in enumerate(requests):
        t0 = now()
        push(frame)
        while (got := pop()) is None:
            pass
        t1 = now()
        if i >= warmup:
            lat.append(t1 - t0)
            kern.append(rings.last_frame_ns)
            bad += got != expected[i]
    return lat, kern, bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000, help="per variant")
    ap.add_argument("--warmup", type=int, default=1_000, help="per block")
    ap.add_argument("--rounds", type=int, default=10, help="alternating blocks")
    ap.add_argument("--payload", type=int, default=32, help="payload bytes")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--slot-size", type=int, default=256)
    ap.add_argument("--cpu", type=int, help="CPU to pin the poller to (default: the last)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    ok, why = gpu_available()
    if not ok:
        print(f"gpu_frames: needs a CUDA GPU: {why}", file=sys.stderr)
        return 2
    cpu = pin_cpu(a.cpu)
    arr = TypeDesc.array(PayloadType.ARRAY_UINT8, a.payload)
    payloads = [bytes((i * 7 + k) & 0xFF for i in range(a.payload)) for k in range(13)]
    per_block = a.requests // a.rounds
    host = UCQueuePair(HOST_MAC, HOST_IP, HOST_QPN, QSC_MAC, QSC_IP, QSC_QPN)
    config = FrameEndpointConfig.from_qp(host, num_slots=a.slots, slot_size=a.slot_size,
                                         ring_rkey=RKEY)
    plane = GPUFramePlane(config, timing_capacity=per_block + a.warmup)
    plane.add(FunctionEntry("rpc_increment", DispatchMode.DEVICE_CALL, (arr,), (arr,),
                            CudaHandler(INCREMENT_SRC)))
    plane.get_device_handler("rpc_increment")  # link + load before anything runs
    env = environment(plane.device)
    print(f"GPU {env['gpu']} ({env['arch']}), driver CUDA {env['driver_cuda_version']}, NVRTC "
          f"{env['nvrtc']}, nvJitLink {env['nvjitlink']}, Python {env['python']}, {env['date']}; "
          f"poller pinned to CPU {cpu}")
    floor = FloorPingPong(plane.device_ordinal, a.slots, a.slot_size, per_block + a.warmup)
    floor_requests = [Request(fnv1a32("rpc_increment"), k, k << 20, p).pack()
                      for k, p in enumerate(payloads)]
    lat = {"floor": [], "frames": []}
    kern = {"floor": [], "frames": [], "dispatch": []}
    block_ratios = []
    bad = 0
    for _ in range(a.rounds):
        got_floor, _ = run_loop(floor.start(), floor_requests, None, per_block, a.warmup)
        lat["floor"] += got_floor
        kern["floor"] += floor.stop()[a.warmup:]
        plane.start(psn=(0, 0))
        assert plane.frames is not None
        requests, expected = frames_for(per_block + a.warmup, payloads, a.slots, a.slot_size,
                                        tx_psn=plane.psn[0])
        got, in_kernel, b = run_frames(plane.frames, requests, expected, a.warmup)
        bad += b
        lat["frames"] += got
        kern["frames"] += in_kernel
        plane.stop()
        kern["dispatch"] += plane.timings_ns()[a.warmup:]
        block_ratios.append(round(statistics.median(got) / statistics.median(got_floor), 3))
    counters = plane.counters()
    plane.close()
    floor.close()
    print(f"\n{a.payload}-byte payload ({len(requests[0])}-byte request frames), {a.slots} x "
          f"{a.slot_size}-byte slots, {a.rounds} alternating blocks of {per_block} "
          f"(+{a.warmup} warm-up); wrong response frames: {bad}; kernel drops: "
          f"{sum(v for k, v in counters.items() if k.startswith('DROP_'))}")
    rows = [("floor: seq ping-pong, no data (round trip)", summary(lat["floor"])),
            ("RoCE endpoint: frame in -> frame out (round trip)", summary(lat["frames"])),
            ("floor: in-kernel turnaround", summary(kern["floor"])),
            ("endpoint: frame seen -> frame published", summary(kern["frames"])),
            ("endpoint: dispatch part (request -> published)", summary(kern["dispatch"]))]
    print_table("GPU RoCE endpoint against the loopback floor, Python poller (microseconds)",
                rows)
    ratio = rows[1][1]["p50_us"] / rows[0][1]["p50_us"]
    print(f"\np50 endpoint / floor = {ratio:.3f}; per block: "
          f"{' '.join(f'{r:.3f}' for r in block_ratios)}")
    args = vars(a)
    write_json(a.json, {"environment": env, "poller_cpu": cpu, "args": args,
                        "wrong_responses": bad, "counters": counters, "ratio_p50": ratio,
                        "block_ratios": block_ratios, "rows": dict(rows)})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
