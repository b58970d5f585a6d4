"""System test on the board top: ``firmware/active_reset.s`` end to end through RGMII.

The Colorlight board top's simulation build (MAC with its behavioural DDR model, QSC, the qubit
emulator) runs on Icarus; cocotbext-eth's RGMII source and sink are the PHY; the host package,
the dispatcher and the HOST_CALL handlers are the system bench's (:mod:`openqlink.sim.bench`).
Each run takes about half a minute.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from openqlink.pcap import read_pcap
from openqlink.wire.packet import parse_frame
from openqlink.wire.rpc import Request, fnv1a32

pytest.importorskip("cocotbext.eth")
pytestmark = [
    pytest.mark.cocotb,
    pytest.mark.skipif(shutil.which("iverilog") is None,
                       reason="Icarus Verilog is not installed (apt-get install iverilog)"),
]

FIRMWARE = Path(__file__).resolve().parents[2] / "firmware"
PROGRAM = FIRMWARE / "active_reset.s"


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("board_build")


@pytest.fixture(scope="module")
def pi_half_run(build_dir, tmp_path_factory):
    from openqlink.sim.board_bench import run_board_sim

    out = tmp_path_factory.mktemp("board_run")
    results = run_board_sim(PROGRAM, build_dir=build_dir, pcap_path=out / "a.pcap")
    return results, out / "a.pcap"


def _variant(tmp_path: Path, amplitude: str) -> Path:
    """``active_reset.s`` with its first pulse at ``amplitude`` (and its handlers beside it)."""
    text = PROGRAM.read_text()
    pulse = "play DRIVE, gauss, amp=0.5"
    assert text.count(pulse) == 1
    path = tmp_path / "active_reset_variant.s"
    path.write_text(text.replace(pulse, pulse.removesuffix("0.5") + amplitude))
    shutil.copyfile(FIRMWARE / "active_reset.py", tmp_path / "active_reset_variant.py")
    return path


def _check_active_reset(results: dict) -> int:
    """The checks every run of the program passes; returns the measured bit."""
    assert results["status"]["state"] == "DONE", results["status"]
    assert not results["run_limit_reached"]
    assert results["host_log"] == []
    (meas,) = results["measurements"]
    bit = meas["outcome"]
    # The PPU's ACQUIRE (r1) integrated the emulator's ADC samples to the emulator's outcome,
    # the host's handler answered it (r2), and the program played the reset pulse iff it was 1.
    regs = results["registers"]
    assert regs["R1"] == bit and regs["R2"] == bit and regs["CALL_COUNT"] == 1
    (rpc,) = results["rpc"]
    assert rpc["function"] == "reset_decision" and rpc["status"] == 0
    plays = [e for e in results["events"] if e["kind"] == "play_start"]
    acquire = [e for e in results["events"] if e["kind"] == "acquire_start"]
    assert len(plays) == 1 + bit and len(acquire) == 1
    start = results["start_time_cycles"]
    assert plays[0]["dtd_cycle"] == start and acquire[0]["dtd_cycle"] == start + 64
    # On the events' timeline, the CALL's request leaves after the window closed.
    (end,) = [e for e in results["events"] if e["kind"] == "acquire_end"]
    assert end["dtd_cycle"] < rpc["request_dtd_cycle"]
    if bit:
        # The reset pulse after the window closed and the host's answer came back.
        assert plays[1]["dtd_cycle"] > end["dtd_cycle"] + rpc["round_trip_cycles"]
        assert rpc["request_dtd_cycle"] + rpc["round_trip_cycles"] < plays[1]["dtd_cycle"]
    # Active reset works: the emulated qubit ends in |0>.
    assert results["qubit_final_p1"] < 1e-3
    assert all(v == 0 for k, v in results["counters"].items() if k.startswith("DROP_"))
    return bit


def test_active_reset_on_the_board_top(pi_half_run):
    results, pcap = pi_half_run
    bit = _check_active_reset(results)
    # The pi/2 pulse left the emulated qubit in an even superposition.
    assert results["measurements"][0]["p1"] == pytest.approx(0.5, abs=0.01)
    # Every frame crossed RGMII with a good FCS (the sink checks) and parses; the CALL's
    # request carries the measured bit.
    frames = [f for _, f in read_pcap(pcap)]
    assert results["wire"]["rgmii_frames_from_qsc"] >= 1
    requests = [Request.unpack(p.payload) for f in frames
                if (p := parse_frame(f)).bth is not None and p.bth["opcode"] == 0x2B]
    assert [r.function_id for r in requests] == [fnv1a32("reset_decision")]
    assert requests[0].payload == bytes([bit])


def test_active_reset_takes_the_other_branch_too(pi_half_run, build_dir, tmp_path):
    """The first run's outcome was random; a pi pulse (outcome 1 for certain) or no pulse
    (outcome 0 for certain) makes the other branch run."""
    from openqlink.sim.board_bench import run_board_sim

    first = pi_half_run[0]["measurements"][0]["outcome"]
    program = _variant(tmp_path, "0.0" if first else "1.0")
    results = run_board_sim(program, build_dir=build_dir)
    assert _check_active_reset(results) == 1 - first
    expected_p1 = 0.0 if first else 1.0
    assert results["measurements"][0]["p1"] == pytest.approx(expected_p1, abs=1e-3)
