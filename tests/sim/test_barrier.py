"""System test of the BARRIER example: ``qlink sim --ppus 2 firmware/barrier_a.s
firmware/barrier_b.s`` (the QSC top's Verilog on Icarus, through cocotb, about two minutes on
2 cores).

PPU 1 waits at the BARRIER from the start; PPU 0 gets there only once its measurement's result
lands. Both leave it in one cycle, so their markers and pi/2 pulses after it start together.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from openqlink.cli import main

pytestmark = [
    pytest.mark.cocotb,
    pytest.mark.skipif(shutil.which("iverilog") is None,
                       reason="Icarus Verilog is not installed (apt-get install iverilog)"),
]

FIRMWARE = Path(__file__).resolve().parents[2] / "firmware"
SLACK = 64                      #: barrier_a.s / barrier_b.s: ``.equ SLACK, 64``


@pytest.fixture(scope="module")
def barrier_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("barrier")
    res = CliRunner().invoke(main, [
        "sim", "--ppus", "2", str(FIRMWARE / "barrier_a.s"), str(FIRMWARE / "barrier_b.s"),
        "--json", str(out / "r.json"), "--build-dir", str(out / "build")])
    assert (out / "r.json").exists(), res.output
    return res, json.loads((out / "r.json").read_text())


def _first(events: list[dict], kind: str, channel: str) -> int:
    return next(e["dtd_cycle"] for e in events if e["kind"] == kind and e["channel"] == channel)


def test_both_ppus_end_done(barrier_run):
    res, results = barrier_run
    assert res.exit_code == 0, res.output
    assert [p["status"]["state"] for p in results["ppus"]] == ["DONE", "DONE"]
    for p in results["ppus"]:
        assert not any(v for k, v in p["status"].items() if k != "state"), p["status"]


def test_the_events_after_the_barrier_start_in_one_cycle_after_the_later_ppu_arrived(barrier_run):
    _, results = barrier_run
    ev0, ev1 = (p["events"] for p in results["ppus"])
    marker = [_first(ev0, "marker_on", "marker0.0"), _first(ev1, "marker_on", "marker1.0")]
    pulse0 = [e["dtd_cycle"] for e in ev0 if e["kind"] == "play_start"]
    pulse1 = [e["dtd_cycle"] for e in ev1 if e["kind"] == "play_start"]
    assert marker[0] == marker[1] == pulse0[1] == pulse1[0]
    # PPU 0 arrives once its window's result has landed: a few cycles after the window's end.
    window_end = _first(ev0, "acquire_end", "readout0.0")
    assert window_end + SLACK < marker[0] <= window_end + SLACK + 8
    # PPU 1 did nothing before: its first event is the common one.
    assert min(e["dtd_cycle"] for e in ev1) == marker[0]
    assert [m["outcome"] for m in results["ppus"][0]["measurements"]] == [1]   # after a pi pulse
