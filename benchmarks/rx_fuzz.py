"""Deep fuzzing of the receive engine against the reference model of its rules.

Frames from the generator of ``tests/gateware/net/test_rx_fuzz.py`` (valid RoCEv2 WRITEs and
SENDs to every QP, ONLY and messages of several packets (FIRST, MIDDLE, LAST, with or without
immediate) at the QPs' PMTU, control requests, ARP and ICMP echo requests, mutated: header
fields at edge values, opcodes out of sequence, bit flips, cut and extended frames, MAC errors,
the IPv4 checksum, the UDP checksum and the ICRC recomputed or not; messages cut short, with
packets lost, duplicated, swapped or of the wrong length and other frames between their packets;
packets from another QP's peer or with another QP's R_Key; QPs restarted, rekeyed, moved to
another PPU and given another peer between frames; valid probes between them) go through a
RoCEReceiver with its register block in Amaranth's simulator, in batches of one simulation
each. Every QP of the build is configured: its peer (some QPs another host's), the PPU an extra
QP reaches, its map of regions (a random subset of R_Keys for an extra QP). Each batch is
checked against ``openqlink.sim.rx_model`` for the test file's properties: (a) no bus write
outside the regions of the PPU the packet's QP reaches, (b) nothing of a frame with a bad ICRC
on the bus, (c) exactly the writes the model expects, where it expects them, (d) one outcome per
frame, the model's, counters that add up, and each QP's RX_EPSN and counters (RX_PACKETS,
RX_DROPS, RX_DROPS_PSN) the model's, (e) valid frames after garbage taken, (f) no wedge under
back-pressure. Batches rotate through three drives: the default configuration (one or two PPUs,
four QPs) with the bus always ready, varied configurations (PPU and QP counts, addresses,
P_Keys, keys never written, QPs left unconfigured, PMTUs, RX_ENABLE off), and back-pressure (the
bus and the control plane taking at random, idle cycles inside frames).

    python benchmarks/rx_fuzz.py [--frames 100000] [--seed 1] [--batch 400] [--jobs N]
                                 [--jsonl FILE]

Prints the outcome of every frame by counter, the violations found (each with its batch, which
``--only-batch K`` with the same ``--seed`` runs again), frames per second and wall time; the
exit status is 1 if any property was violated.

A batch depends on the seed and its index alone, so a deep run can be split: ``--jobs N`` runs
batches in N processes, and ``--jsonl FILE`` appends one JSON line per batch done (seed, index,
drive, frames, outcomes, violations, seconds) and, run again with the same file and seed, skips
the batches it holds: an interrupted run resumes, and several hosts or sessions can finish one
run. The table then covers every batch of the seed in the file.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gateware" / "net"))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from test_rx_fuzz import (  # noqa: E402  (the generator lives beside the tests that use it)
    FrameGen,
    RandomChooser,
    check,
    make_drive,
    make_setup,
    simulate,
)

from openqlink.sim.rx_model import (  # noqa: E402
    ACCEPTED,
    CONTROL,
    DROP_REASONS,
    UDP_RESPONSE,
)

DRIVES = ("default", "configurations", "back-pressure")


def run_batch(seed: int, index: int, size: int) -> tuple[list[str], list[str], str]:
    """Batch ``index`` of the run ``seed``: about ``size`` frames through one simulation.
    Returns each frame's observed outcome, the violations and the drive's name."""
    rng = random.Random(seed * 1_000_003 + index)
    ch = RandomChooser(rng)
    drive_name = DRIVES[index % len(DRIVES)]
    setup = make_setup(ch, rng, vary=drive_name != "default")
    gen = FrameGen(setup.config, ch, rng)
    pressure = drive_name == "back-pressure"
    frames = gen.batch(max(1, round(size / 1.3)), probes=20 if pressure else 40)
    drive = make_drive(ch, rng, len(frames), pressure=pressure)
    report = check(setup, frames, drive, simulate(setup, frames, drive))
    return report.outcomes, report.violations, drive_name


def _batch_record(seed: int, index: int, size: int) -> dict:
    """Batch ``index`` run and recorded as one line of ``--jsonl``."""
    t0 = time.perf_counter()
    seen, found, drive_name = run_batch(seed, index, size)
    return {"seed": seed, "index": index, "drive": drive_name, "frames": len(seen),
            "outcomes": dict(Counter(seen)), "violations": found,
            "seconds": round(time.perf_counter() - t0, 2)}


def _recorded(path: Path | None, seed: int) -> dict[int, dict]:
    """The batches of ``seed`` already in the ``--jsonl`` file, by index."""
    if path is None or not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["seed"] == seed:
            out[rec["index"]] = rec
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=100_000, help="frames to send in all")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch", type=int, default=400, help="frames per simulation")
    parser.add_argument("--only-batch", type=int, default=None,
                        help="run only this batch of the run (to reproduce a violation)")
    parser.add_argument("--quiet", action="store_true", help="no progress line per batch")
    parser.add_argument("--jobs", type=int, default=1, help="batches run at once (processes)")
    parser.add_argument("--jsonl", type=Path, default=None,
                        help="append each batch's result here; batches of the seed already "
                             "in it are not run again")
    args = parser.parse_args()
    if args.jobs < 1 or args.batch < 1:
        parser.error("--jobs and --batch must be at least 1")
    console = Console()
    err = Console(stderr=True)

    size = min(args.batch, args.frames)
    done = {} if args.only_batch is not None else _recorded(args.jsonl, args.seed)
    t0 = time.perf_counter()
    ran = 0

    def record(rec: dict) -> None:
        nonlocal ran
        done[rec["index"]] = rec
        ran += rec["frames"]
        if args.jsonl is not None and args.only_batch is None:
            with args.jsonl.open("a") as f:
                f.write(json.dumps(rec) + "\n")
        if not args.quiet:
            wall = time.perf_counter() - t0
            err.print(f"batch {rec['index']} ({rec['drive']}): {rec['frames']} frames, "
                      f"{len(rec['violations'])} violations; {ran} frames run in {wall:.0f} s "
                      f"({ran / wall:.1f}/s), {sum(r['frames'] for r in done.values())} in all")

    if args.only_batch is not None:
        record(_batch_record(args.seed, args.only_batch, size))
    with ProcessPoolExecutor(args.jobs) as pool:
        while args.only_batch is None:
            have = sum(r["frames"] for r in done.values())
            if have >= args.frames:
                break
            need = -(-(args.frames - have) // size)
            todo = [i for i in range(len(done) + need + args.jobs) if i not in done][:need]
            for rec in pool.map(_batch_record, [args.seed] * len(todo), todo,
                                [size] * len(todo)):
                record(rec)
    wall = time.perf_counter() - t0

    outcomes: Counter = Counter()
    by_drive: Counter = Counter()
    violations: list[str] = []
    for index, rec in sorted(done.items()):
        outcomes.update(rec["outcomes"])
        by_drive[rec["drive"]] += rec["frames"]
        violations += [f"batch {index} ({rec['drive']}): {v}" for v in rec["violations"]]
    frames = sum(by_drive.values())
    seconds = sum(r["seconds"] for r in done.values())

    table = Table(title=f"RX fuzzing vs rx_model, seed {args.seed}")
    table.add_column("outcome")
    table.add_column("frames", justify="right")
    table.add_row("frames sent", str(frames))
    for drive_name in DRIVES:
        table.add_row(f"  of them: {drive_name}", str(by_drive[drive_name]))
    table.add_row("accepted RoCEv2 (RX_ROCE_ACCEPTED)", str(outcomes[ACCEPTED]))
    table.add_row("UDP-mode responses taken (RX_RPC_RESPONSES)", str(outcomes[UDP_RESPONSE]))
    table.add_row("control requests taken", str(outcomes[CONTROL]))
    table.add_row("ARP requests taken (RX_ARP_REQUESTS)", str(outcomes["RX_ARP_REQUESTS"]))
    table.add_row("echo requests taken (RX_ECHO_REQUESTS)", str(outcomes["RX_ECHO_REQUESTS"]))
    for reason in DROP_REASONS:
        table.add_row(f"dropped: {reason}", str(outcomes[reason]))
    table.add_row("property violations", str(len(violations)))
    table.add_row("batches", str(len(done)))
    table.add_row("frames per second of one process", f"{frames / max(seconds, 1e-9):.1f}")
    table.add_row("wall time of this invocation", f"{wall:.1f} s ({ran} frames run)")
    console.print(table)
    for v in violations[:20]:
        console.print(v, markup=False, highlight=False)
    if len(violations) > 20:
        console.print(f"... and {len(violations) - 20} more")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
