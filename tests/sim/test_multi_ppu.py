"""System tests of ``qlink sim --ppus 2``: two PPUs, each running its own program against the
host package, triggered at one start time (the QSC top's Verilog on Icarus, through cocotb).

One 2-PPU run (module fixture) is checked from several sides; a second run, with PPU 1 stopping
on an error, reuses the fixture's Verilog. Each takes about a minute on 2 cores.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from openqlink.cli import main
from openqlink.pcap import read_pcap
from openqlink.wire.packet import parse_frame
from openqlink.wire.roce import Opcode
from openqlink.wire.rpc import Request, Response, fnv1a32

pytestmark = [
    pytest.mark.cocotb,
    pytest.mark.skipif(shutil.which("iverilog") is None,
                       reason="Icarus Verilog is not installed (apt-get install iverilog)"),
]

#: PPU 0: two markers around a CALL answered by its own handlers (incr). Both PPUs' CALLs go
#: out as soon as they are triggered (the core runs ahead of the start time), so they are
#: outstanding at the same time and answered before the start time.
PPU0 = """\
        set r5, 100
        marker 0, duration=8
        call incr(r5:8) -> r6           ; r6 = 101
        sync 64
        marker 1, duration=8
        end
"""
PPU0_HANDLERS = """\
from openqlink.dispatch import FunctionTable, TypeDesc
table = FunctionTable()
@table.host_call("incr", args=[TypeDesc.uint8()], results=[TypeDesc.uint8()])
def incr(x):
    return (x + 1) & 0xFF
"""
#: PPU 1: a CALL that only its own handlers know (double), a pi pulse and a readout.
PPU1 = """\
.envelope gauss, gaussian, length=64, sigma=16, amp=1.0
        set r5, 21
        call double(r5:8) -> r6         ; r6 = 42
        sync 0
        play 0, gauss, amp=1.0          ; pi: the readout finds 1
        wait 64
        acquire 0, r1, window=100, threshold=0
        end
"""
PPU1_HANDLERS = """\
from openqlink.dispatch import FunctionTable, TypeDesc
table = FunctionTable()
@table.host_call("double", args=[TypeDesc.uint8()], results=[TypeDesc.uint8()])
def double(x):
    return (2 * x) & 0xFF
"""
#: PPU 1 calling a function no handlers file has: status -1, call_failed, ERROR.
PPU1_FAILS = """\
        set r5, 7
        call missing(r5:8) -> r6
        end
"""


def _write(directory: Path, name: str, source: str, handlers: str | None = None) -> str:
    (directory / f"{name}.s").write_text(source)
    if handlers is not None:
        (directory / f"{name}.py").write_text(handlers)
    return str(directory / f"{name}.s")


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("multi_ppu_build")


@pytest.fixture(scope="module")
def two_ppus(build_dir, tmp_path_factory):
    """``qlink sim --ppus 2 ppu0.s ppu1.s --json``: the command's result and the JSON."""
    out = tmp_path_factory.mktemp("multi_ppu_run")
    programs = [_write(out, "ppu0", PPU0, PPU0_HANDLERS), _write(out, "ppu1", PPU1, PPU1_HANDLERS)]
    res = CliRunner().invoke(main, ["sim", "--ppus", "2", *programs, "--json",
                                    str(out / "r.json"), "--pcap", str(out / "r.pcap"),
                                    "--build-dir", str(build_dir)])
    assert (out / "r.json").exists(), res.output
    return res, json.loads((out / "r.json").read_text()), out / "r.pcap"


def test_both_ppus_end_done_and_the_exit_status_is_0(two_ppus):
    res, results, _ = two_ppus
    assert res.exit_code == 0, res.output
    assert [p["status"]["state"] for p in results["ppus"]] == ["DONE", "DONE"]
    assert [p["ppu"] for p in results["ppus"]] == [0, 1]
    assert not results["run_limit_reached"] and results["host_log"] == []
    # The top level keeps PPU 0's status and registers, as with one PPU.
    assert results["status"] == results["ppus"][0]["status"]
    assert results["registers"] == results["ppus"][0]["registers"]
    assert results["params"]["num_ppus"] == 2


def test_each_ppu_ran_its_own_program(two_ppus):
    _, results, _ = two_ppus
    r0, r1 = (p["registers"] for p in results["ppus"])
    assert (r0["R5"], r0["R6"], r0["R1"]) == (100, 101, 0)
    assert (r1["R5"], r1["R6"], r1["R1"]) == (21, 42, 1)
    assert r0["CALL_COUNT"] == r1["CALL_COUNT"] == 1
    assert [Path(p["program"]).name for p in results["ppus"]] == ["ppu0.s", "ppu1.s"]


def test_calls_of_each_ppu_are_answered_by_its_own_handlers(two_ppus):
    _, results, pcap = two_ppus
    assert sorted((r["ppu"], r["function"], r["status"]) for r in results["rpc"]) == [
        (0, "incr", 0), (1, "double", 0)]
    p0, p1 = results["ppus"]
    assert [r["function_id"] for r in p1["rpc"]] == [fnv1a32("double")]
    assert p0["calls_answered"] == p1["calls_answered"] == 1
    assert results["dispatcher"]["processed"] == 2
    assert results["counters"]["TX_RPC_REQUESTS"] == results["counters"]["RX_RPC_RESPONSES"] == 2
    assert p1["registers"]["LAST_CALL_STATUS"] == 0
    # On the wire: both requests are out before the first answer, each to its PPU's host QP,
    # and each answer goes to the QSC QP of the PPU that asked, with its request_id.
    calls = []
    for t, frame in read_pcap(pcap):
        f = parse_frame(frame)
        if f.bth is not None and f.bth["opcode"] == Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE:
            calls.append((t, "request", f.bth["dest_qp"], Request.unpack(f.payload).request_id))
        elif f.bth is not None and f.bth["opcode"] == Opcode.SEND_ONLY:
            calls.append((t, "response", f.bth["dest_qp"], Response.unpack(f.payload).request_id))
    assert [kind for _, kind, _, _ in calls] == ["request", "request", "response", "response"]
    host_qpn, qpn_base = 0x11, results["params"]["qpn_base"]
    asked = {qpn - host_qpn: rid for _, kind, qpn, rid in calls if kind == "request"}
    answered = {qpn - qpn_base: rid for _, kind, qpn, rid in calls if kind == "response"}
    assert set(asked) == {0, 1} and answered == asked
    assert asked[1] == p1["rpc"][0]["request_id"]
    # Both were answered before the start time: the CALLs ran while the PPUs were armed.
    assert calls[-1][0] < results["start_time_cycles"] * 1e9 / results["params"]["dtd_clk_hz"]


def test_both_ppus_share_one_start_time_and_timeline(two_ppus):
    _, results, _ = two_ppus
    start = results["start_time_cycles"]
    p0, p1 = results["ppus"]
    assert [(e["channel"], e["kind"], e["dtd_cycle"] - start) for e in p0["events"]][:2] == [
        ("marker0.0", "marker_on", 0), ("marker0.0", "marker_off", 8)]
    assert [(e["channel"], e["kind"], e["dtd_cycle"] - start) for e in p1["events"]] == [
        ("drive1.0", "play_start", 0), ("drive1.0", "play_end", 64),
        ("readout1.0", "acquire_start", 64), ("readout1.0", "acquire_end", 164)]
    # The CALL came back before the start time, so `sync 64` anchors at the start time.
    assert [(e["channel"], e["kind"], e["dtd_cycle"] - start) for e in p0["events"]][2:] == [
        ("marker0.1", "marker_on", 64), ("marker0.1", "marker_off", 72)]
    # The top level's events are both PPUs', in time order.
    assert sorted(results["events"], key=lambda e: e["dtd_cycle"]) == results["events"]
    assert len(results["events"]) == len(p0["events"]) + len(p1["events"])


def test_each_ppu_has_its_own_qubit(two_ppus):
    _, results, _ = two_ppus
    p0, p1 = results["ppus"]
    assert (p0["qubit_seed"], p1["qubit_seed"]) == (1, 2)
    assert p0["measurements"] == [] and results["measurements"] == []
    assert [m["outcome"] for m in p1["measurements"]] == [1]
    assert p1["measurements"][0]["dtd_cycle"] == results["start_time_cycles"] + 64
    assert p0["qubit_final_p1"] == 0.0 and p1["qubit_final_p1"] > 0.999


def test_the_report_shows_each_ppu(two_ppus):
    res, _, _ = two_ppus
    assert ("final PPU status: PPU 0 DONE (no error bits); PPU 1 DONE (no error bits)"
            in res.output)
    assert "r5=100 r6=101" in res.output and "r1=1 r5=21 r6=42" in res.output
    assert "PPU 1 measurement at cycle" in res.output


def test_a_ppu_ending_in_error_makes_the_exit_status_1(two_ppus, build_dir, tmp_path):
    # ``two_ppus`` wrote the Verilog this run reuses (with pytest-xdist this test may run in
    # another worker, where the module's fixtures run again)
    programs = [_write(tmp_path, "ppu0", PPU0, PPU0_HANDLERS),
                _write(tmp_path, "fails", PPU1_FAILS)]
    res = CliRunner().invoke(main, ["sim", "--ppus", "2", *programs, "--handlers",
                                    str(tmp_path / "ppu0.py"), "--json", str(tmp_path / "r.json"),
                                    "--build-dir", str(build_dir),
                                    "--verilog", str(build_dir / "qsc_top.v")])
    assert res.exit_code == 1, res.output
    results = json.loads((tmp_path / "r.json").read_text())
    p0, p1 = results["ppus"]
    assert p0["status"]["state"] == "DONE" and p0["registers"]["R6"] == 101
    assert p1["status"]["state"] == "ERROR" and p1["status"]["call_failed"] == 1
    assert p1["fault_location"] == "fails.s:2: call missing(r5:8) -> r6"
    assert results["status"]["state"] == "DONE"      # the top level is PPU 0's
    assert sorted((r["ppu"], r["status"]) for r in results["rpc"]) == [(0, 0), (1, -1)]
    assert "PPU 1 ERROR (errors: call_failed)" in res.output
