"""Per-request cost of the host's real-time path, against the floor of its transport.

One request at a time, as a PPU's CALL arrives: the QSC side sends a UC
RDMA_WRITE_ONLY_WITH_IMMEDIATE of a 32-byte RPC request (24-byte header, two int32 arguments)
into the next ring slot, and the host runs its whole path, all in this one thread:

    frame in -> UCQueuePair.handle_frame (headers, checksums, ICRC, QP checks, ring slot)
    -> Dispatcher.poll (RPC header, HOST_CALL handler ``add``, response) -> UC SEND_ONLY built
    with its ICRC (UCQueuePair.send_frame) -> frame out

until the response frame is in the QSC side's hands. The floor is the same transport with the
host echoing a prebuilt response frame: receive, send, nothing else. The ratio says what the
host's own work costs on top of moving the frames.

Transports:

* ``memory``: :func:`openqlink.bridges.base.transport_pair` (in-process queues);
* ``veth``: a veth pair in a network namespace of its own (``unshare --net``), the host on one
  end through :class:`openqlink.bridges.rawsock.RawSocketTransport` (AF_PACKET), the QSC side
  on the other: the kernel's network path, as the ``raw`` bridge meets a board. Needs root and
  the ``unshare`` and ``ip`` commands; skipped with the reason otherwise.

Over the veth pair it also measures an upload as the host sends one (``QSC.upload_program``:
a batch of UC RDMA_WRITE_ONLY packets of PMTU 1024 bytes, 64 KiB of instructions): the time
from handing the batch to the transport to its last frame received on the other end, with the
raw bridge's ``PACKET_TX_RING`` (the batch in one system call) and without it (one ``send`` a
frame).

Usage: python benchmarks/host_dispatch.py [--requests N] [--transport memory veth] [--plot F]
       python benchmarks/host_dispatch.py --json OUT      (memory only; writes
       {"p50_us", "p99_us", "floor_p50_us", "ratio", "requests"})

``--plot F`` (PNG, SVG or PDF by the suffix; matplotlib, the ``[plot]`` extra) draws the
per-request latency histogram of each transport's full path and of its floor, with their
medians (``openqlink.plot.plot_histogram``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from openqlink.bridges.base import FrameTransport, transport_pair
from openqlink.bridges.rawsock import TX_RING_FRAMES
from openqlink.dispatch import Dispatcher, FunctionTable, SlotRing
from openqlink.roce import UCQueuePair
from openqlink.wire.roce import slot_immediate
from openqlink.wire.rpc import STATUS_OK, PayloadType, Request, Response, fnv1a32

HOST_MAC, HOST_IP, HOST_QPN = "02:00:00:00:00:0a", "10.77.0.1", 0x200
QSC_MAC, QSC_IP, QSC_QPN = "02:4e:56:51:00:02", "10.77.0.2", 0x100
RING_RKEY = 0x1BADC0DE
NUM_SLOTS, SLOT_SIZE = 16, 256
WARMUP = 500


def _table() -> FunctionTable:
    table = FunctionTable()

    @table.host_call("add", args=[PayloadType.INT32, PayloadType.INT32],
                     results=[PayloadType.INT32])
    def add(a: int, b: int) -> int:
        return a + b

    return table


def _requests(qsc_qp: UCQueuePair, n: int) -> list[bytes]:
    """``n`` request frames as the gateware sends them: request k into slot k % NUM_SLOTS."""
    out = []
    for k in range(n):
        slot = k % NUM_SLOTS
        req = Request(fnv1a32("add"), k, k, struct.pack("<ii", k, 1)).pack()
        out.append(qsc_qp.write_frame(slot * SLOT_SIZE, RING_RKEY, req,
                                      imm=slot_immediate(qsc_qp.tx_psn, slot)))
    return out


def _percentiles(samples_ns: list[int]) -> tuple[float, float]:
    q = statistics.quantiles(samples_ns, n=100, method="inclusive")
    return q[49] / 1e3, q[98] / 1e3


def measure(host_t: FrameTransport, qsc_send: Callable[[bytes], None],
            qsc_recv: Callable[[], bytes], requests: int, host_mac: str,
            qsc_mac: str) -> dict:
    """Full path and floor over one pair of endpoints; times in us, and under ``samples_ns``
    each request's time of both, ``{"full": [ns, ...], "floor": [ns, ...]}``."""
    qsc_qp = UCQueuePair(qsc_mac, QSC_IP, QSC_QPN, host_mac, HOST_IP, HOST_QPN)
    host_qp = UCQueuePair(host_mac, HOST_IP, HOST_QPN, qsc_mac, QSC_IP, QSC_QPN)
    ring = SlotRing(NUM_SLOTS, SLOT_SIZE)
    host_qp.register_ring(ring, RING_RKEY)
    dispatcher = Dispatcher(_table(), ring,
                            lambda slot, data: host_t.send_frame(host_qp.send_frame(data)))
    frames = _requests(qsc_qp, requests + WARMUP)

    def host_recv() -> bytes:
        # the next IPv4 frame (on a veth, the kernel's IPv6 neighbour discovery is not ours)
        while True:
            got = host_t.recv_frame(0)
            if got is not None and got[12:14] == b"\x08\x00":
                return got

    def full(frame: bytes) -> bytes:
        qsc_send(frame)
        host_qp.handle_frame(host_recv())
        dispatcher.poll()
        return qsc_recv()

    prebuilt = host_qp.send_frame(Response(STATUS_OK, 0, 0, b"\0" * 4).pack())

    def floor(frame: bytes) -> bytes:
        qsc_send(frame)
        host_recv()
        host_t.send_frame(prebuilt)
        return qsc_recv()

    results = {}
    kept: dict[str, list[int]] = {}
    for name, step in (("full", full), ("floor", floor)):
        samples = []
        gc.collect()
        for k, frame in enumerate(frames):
            t0 = time.perf_counter_ns()
            step(frame)
            dt = time.perf_counter_ns() - t0
            if k >= WARMUP:
                samples.append(dt)
        results[name] = _percentiles(samples)
        kept[name] = samples
    # every request was answered OK
    ok = dispatcher.counts
    if sum(ok.values()) != requests + WARMUP or len(ok) != 1:
        raise SystemExit(f"unexpected outcomes: {dict(ok)}")
    p50, p99 = results["full"]
    f50, f99 = results["floor"]
    return {"p50_us": round(p50, 2), "p99_us": round(p99, 2), "floor_p50_us": round(f50, 2),
            "floor_p99_us": round(f99, 2), "ratio": round(p50 / f50, 2), "requests": requests,
            "samples_ns": kept}


def run_memory(requests: int) -> dict:
    host_t, qsc_t = transport_pair()

    def recv() -> bytes:
        frame = None
        while frame is None:
            frame = qsc_t.recv_frame(0)
        return frame

    return measure(host_t, qsc_t.send_frame, recv, requests, HOST_MAC, QSC_MAC)


def _veth_pair() -> tuple[str, str]:
    """Make the veth pair ``vhost``/``vqsc`` (up) in this process's network namespace."""
    for cmd in (["ip", "link", "add", "vhost", "type", "veth", "peer", "name", "vqsc"],
                ["ip", "link", "set", "vhost", "up"], ["ip", "link", "set", "vqsc", "up"]):
        subprocess.run(cmd, check=True, capture_output=True)
    return "vhost", "vqsc"


def _veth_in_namespace(requests: int) -> dict:
    """The measurement over a veth pair in a network namespace of its own: this script again,
    under ``unshare --net`` (the namespace and its pair vanish with the process).
    Raises OSError with the reason when that cannot be done here."""
    if os.geteuid() != 0:
        raise OSError("needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) for a network namespace")
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            raise OSError(f"needs the {tool} command (util-linux, iproute2)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "veth.json"
        run = subprocess.run(["unshare", "--net", sys.executable, __file__, "--requests",
                              str(requests), "--inside-netns", str(out)],
                             capture_output=True, text=True)
        if run.returncode != 0 or not out.exists():
            raise OSError(f"veth run failed: {(run.stderr or run.stdout).strip()[-300:]}")
        return json.loads(out.read_text())


def run_veth(requests: int) -> dict:
    """Inside the namespace: host on ``vhost`` through the raw bridge, the QSC side on
    ``vqsc``."""
    from openqlink.bridges.rawsock import RawSocketTransport

    host_if, qsc_if = _veth_pair()
    with RawSocketTransport(host_if) as host_t, RawSocketTransport(qsc_if) as qsc_t:

        def recv() -> bytes:
            while True:
                frame = qsc_t.recv_frame(1.0)
                if frame is None:
                    raise SystemExit("veth: no response within 1 s")
                if frame[12:14] == b"\x08\x00":     # IPv4: ours
                    return frame

        out = measure(host_t, qsc_t.send_frame, recv, requests, host_t.mac, qsc_t.mac)
    out["upload"] = {name: _upload_batches(host_if, qsc_if, ring)
                     for name, ring in (("tx_ring", TX_RING_FRAMES), ("send", 0))}
    return out


#: An upload: 64 KiB of instructions in PMTU-1024 RDMA WRITEs (64 frames of 1082 bytes).
UPLOAD_BYTES, UPLOAD_PMTU, UPLOAD_BATCHES = 64 * 1024, 1024, 200


def _upload_batches(host_if: str, qsc_if: str, tx_ring: int) -> dict:
    """Send UPLOAD_BATCHES uploads from ``host_if`` (raw bridge, ``tx_ring`` frames of transmit
    ring) and time each from ``send_frames`` to its last frame received on ``qsc_if``."""
    from openqlink.bridges.rawsock import RawSocketTransport

    with RawSocketTransport(host_if, tx_ring_frames=tx_ring) as host_t, \
            RawSocketTransport(qsc_if, rcvbuf_bytes=16 << 20) as qsc_t:
        qp = UCQueuePair(host_t.mac, HOST_IP, HOST_QPN, qsc_t.mac, QSC_IP, QSC_QPN,
                         pmtu_bytes=UPLOAD_PMTU)
        program = bytes(range(256)) * (UPLOAD_BYTES // 256)
        samples: list[int] = []
        for _ in range(UPLOAD_BATCHES):
            frames = [qp.write_frame(0x1000_0000 + off, 0x494D_0000,
                                     program[off:off + UPLOAD_PMTU])
                      for off in range(0, UPLOAD_BYTES, UPLOAD_PMTU)]
            t0 = time.perf_counter_ns()
            host_t.send_frames(frames)
            got = 0
            while got < len(frames):
                frame = qsc_t.recv_frame(1.0)
                if frame is None:
                    raise SystemExit("veth upload: a frame did not arrive within 1 s")
                got += frame[12:14] == b"\x08\x00"
            samples.append(time.perf_counter_ns() - t0)
        p50, p99 = _percentiles(samples)
        return {"frames": len(frames), "p50_us": p50, "p99_us": p99,
                "mb_per_s": UPLOAD_BYTES / p50}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--transport", nargs="+", choices=["memory", "veth"],
                        default=["memory", "veth"])
    parser.add_argument("--json", type=Path, metavar="OUT",
                        help="run the in-memory transport only and write its figures here")
    parser.add_argument("--plot", type=Path, metavar="FILE",
                        help="draw each transport's per-request latency histogram and its "
                        "floor's (PNG, SVG or PDF by the suffix; needs matplotlib)")
    parser.add_argument("--inside-netns", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plot is not None:
        from openqlink.errors import PlotError, PlotUnavailableError
        from openqlink.plot import check_path, require_matplotlib

        try:
            check_path(args.plot)
            require_matplotlib()
        except (PlotError, PlotUnavailableError) as exc:
            parser.error(f"--plot: {exc}")
        if not args.plot.parent.is_dir():
            parser.error(f"--plot {args.plot}: directory {args.plot.parent} does not exist")
    if args.inside_netns is not None:
        args.inside_netns.write_text(json.dumps(run_veth(args.requests)))
        return
    if args.json is not None:
        out = run_memory(args.requests)
        samples = {"memory": out.pop("samples_ns")}
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out))
        if args.plot is not None:
            _plot(args.plot, samples, args.requests)
        return
    table = Table(title=f"host dispatcher, one request at a time ({args.requests} requests; "
                        f"Python {sys.version.split()[0]})")
    for col in ("transport", "p50 us", "p99 us", "floor p50 us", "floor p99 us", "ratio"):
        table.add_column(col, justify="right")
    uploads: dict = {}
    samples: dict[str, dict[str, list[int]]] = {}
    for name in args.transport:
        try:
            r = (run_memory(args.requests) if name == "memory"
                 else _veth_in_namespace(args.requests))
        except OSError as exc:
            table.add_row(name, f"skipped: {exc}", "", "", "", "")
            continue
        samples[name] = r.pop("samples_ns")
        table.add_row(name, f"{r['p50_us']:.1f}", f"{r['p99_us']:.1f}",
                      f"{r['floor_p50_us']:.1f}", f"{r['floor_p99_us']:.1f}", f"{r['ratio']:.2f}")
        uploads.update(r.get("upload", {}))
    Console().print(table)
    if uploads:
        up = Table(title=f"raw bridge over veth: one upload ({UPLOAD_BYTES // 1024} KiB, "
                         f"{UPLOAD_BATCHES} uploads), send_frames to last frame received")
        for col in ("send path", "frames", "p50 us", "p99 us", "MB/s at p50"):
            up.add_column(col, justify="right")
        for name, u in uploads.items():
            up.add_row(name, str(u["frames"]), f"{u['p50_us']:.1f}", f"{u['p99_us']:.1f}",
                       f"{u['mb_per_s']:.0f}")
        Console().print(up)
    if args.plot is not None:
        _plot(args.plot, samples, args.requests)


def _plot(path: Path, samples: dict[str, dict[str, list[int]]], requests: int) -> None:
    """Each transport's full path and floor, one histogram each, to ``path``."""
    from openqlink.plot import plot_histogram

    series = {f"{name} {part}": ns for name, parts in samples.items()
              for part, ns in (("full path", parts["full"]), ("floor", parts["floor"]))}
    plot_histogram(series, path, title=f"host dispatcher, one request at a time ({requests} "
                   f"requests; Python {sys.version.split()[0]})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
