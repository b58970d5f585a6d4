"""System tests of ``qlink sim --qubits 2``, ``--samples-per-cycle 2`` and a drive detuned by
its NCO (Ramsey): the gateware's NCO I/Q samples drive the
:class:`~openqlink.sim.qubit.QubitSystem` of the bench through the documented channel map, and
its ADC samples come back through the demodulating readouts (the QSC top's Verilog on Icarus,
through cocotb).

Each module fixture runs one simulation (about a minute and a half on 2 cores, most of it
building the top) and the tests check it from several sides.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from openqlink.cli import main
from openqlink.isa.asm import assemble
from openqlink.sim.channel_map import channel_map, make_system, sim_params

pytestmark = [
    pytest.mark.cocotb,
    pytest.mark.skipif(shutil.which("iverilog") is None,
                       reason="Icarus Verilog is not installed (apt-get install iverilog)"),
]

FIRMWARE = Path(__file__).resolve().parents[2] / "firmware"

#: Two qubits: drive 0 and 1 drive qubits 0 and 1, drive 2 is their coupler, readouts 0 and 1
#: read them. First a pi pulse on qubit 1 only, both measured (0, 1); then qubit 0 to |1>,
#: qubit 1 back to |0>, and pi/2 - CZ (the coupler's pulse) - pi/2 on qubit 1: with qubit 0 in
#: |1> the CZ's Z between the two pi/2 pulses brings qubit 1 back to |0> (1, 0); without the
#: coupler it would end in |1>.
TWO_QUBITS = """\
.equ PULSE, 64
.equ GAP, 72                                    ; the pulse and 8 idle cycles
.equ WINDOW, 100
.envelope gauss, gaussian, length=PULSE, sigma=16, amp=1.0   ; amp 1.0 = pi
        play 1, gauss, amp=1.0                  ; pi on qubit 1 only
        wait GAP
        acquire 0, r1, window=WINDOW, threshold=0
        acquire 1, r2, window=WINDOW, threshold=0
        wait 108                                ; the window and 8 idle cycles
        play 0, gauss, amp=1.0                  ; qubit 0: |0> -> |1>
        play 1, gauss, amp=1.0                  ; qubit 1: |1> -> |0>
        wait GAP
        play 1, gauss, amp=0.5                  ; pi/2
        wait GAP
        play 2, gauss, amp=1.0                  ; the coupler: a CZ
        wait GAP
        play 1, gauss, amp=0.5                  ; pi/2
        wait GAP
        acquire 0, r3, window=WINDOW, threshold=0
        acquire 1, r4, window=WINDOW, threshold=0
        wait WINDOW
        end
"""
#: The model file of the run: each qubit's own T1 and T2, one readout noise for both.
MODEL = {"qubits": [{"t1_ns": 60_000, "t2_ns": 50_000}, {"t1_ns": 80_000, "t2_ns": 70_000}],
         "readouts": {"noise_sigma": 200}}


def _run(out: Path, build_dir: Path, args: list[str]) -> tuple[object, dict]:
    res = CliRunner().invoke(main, ["sim", *args, "--json", str(out / "r.json"),
                                    "--build-dir", str(build_dir)])
    assert (out / "r.json").exists(), res.output
    return res, json.loads((out / "r.json").read_text())


@pytest.fixture(scope="module")
def two_qubits(tmp_path_factory):
    """``qlink sim --qubits 2 --model m.json two.s``: the command's result and the JSON."""
    out = tmp_path_factory.mktemp("two_qubits")
    (out / "two.s").write_text(TWO_QUBITS)
    (out / "m.json").write_text(json.dumps(MODEL))
    return _run(out, tmp_path_factory.mktemp("two_qubits_build"),
                ["--qubits", "2", "--model", str(out / "m.json"), str(out / "two.s")])


def test_two_qubits_build_and_run(two_qubits):
    res, results = two_qubits
    assert res.exit_code == 0, res.output
    assert results["status"]["state"] == "DONE" and results["host_log"] == []
    params = results["params"]
    assert (params["drives_per_ppu"], params["readouts_per_ppu"]) == (3, 2)


def test_a_pi_pulse_on_qubit_1_only_reads_0_then_1(two_qubits):
    _, results = two_qubits
    start = results["start_time_cycles"]
    first = results["measurements"][:2]
    assert [(m["qubit"], m["channel"], m["outcome"]) for m in first] == [(0, 0, 0), (1, 1, 1)]
    assert [m["dtd_cycle"] - start for m in first] == [72, 72]
    # The model's fidelity: P(1) is what the pulses and 72 cycles of decay left.
    assert first[0]["p1"] < 1e-3 and first[1]["p1"] > 0.99
    # The gateware's demodulated, thresholded bits are the model's outcomes.
    regs = results["registers"]
    assert (regs["R1"], regs["R2"]) == (0, 1)
    plays = [(e["channel"], e["kind"], e["dtd_cycle"] - start, e.get("qubit"))
             for e in results["events"] if e["kind"].startswith("play")]
    assert plays[:2] == [("drive0.1", "play_start", 0, 1), ("drive0.1", "play_end", 64, 1)]


def test_the_coupler_channel_gives_the_conditional_phase(two_qubits):
    _, results = two_qubits
    second = results["measurements"][2:]
    assert [(m["qubit"], m["outcome"]) for m in second] == [(0, 1), (1, 0)]
    assert second[0]["p1"] > 0.99 and second[1]["p1"] < 0.01
    regs = results["registers"]
    assert (regs["R3"], regs["R4"]) == (1, 0)
    coupler = [e for e in results["events"] if e["channel"] == "drive0.2"]
    assert [e["kind"] for e in coupler] == ["play_start", "play_end"]
    assert all(e["qubits"] == [0, 1] for e in coupler)
    assert results["qubits_final_p1"] == [1.0, 0.0]
    assert results["qubit_final_p1"] == 1.0


def test_the_json_and_the_report_show_the_channel_map_and_the_model(two_qubits):
    res, results = two_qubits
    model = results["model"]
    assert model["qubits"] == 2 and model["channel_map"] == channel_map(2)
    (ppu,) = results["ppus"]
    assert ppu["model"] == model["qubit"]
    described = ppu["model"]
    assert [(q["t1_ns"], q["t2_ns"]) for q in described["qubits"]] == [(60_000, 50_000),
                                                                        (80_000, 70_000)]
    assert [r["noise_sigma"] for r in described["readouts"]] == [200, 200]
    assert described["couplers"][0]["qubits"] == [0, 1] and described["seed"] == 1
    assert described["sample_rate_hz"] == 250e6
    text = " ".join(res.output.split())
    assert "PTD channels -> qubit model (2 qubit(s) per PPU, 250 MS/s" in text
    assert "drive 2 │ coupler of qubits 0, 1" in text
    assert "readout 1 │ qubit 1" in text
    assert "T1 80000 ns, T2 70000 ns" in text
    assert "P(1) after each qubit's last pulse or readout: qubit 0 1.000, qubit 1 0.000" in text
    assert "measurement of qubit 1 (readout 1) at cycle" in text


@pytest.fixture(scope="module")
def two_lanes(tmp_path_factory):
    """``qlink sim --samples-per-cycle 2 firmware/active_reset.s``: the result and the JSON."""
    out = tmp_path_factory.mktemp("two_lanes")
    return _run(out, tmp_path_factory.mktemp("two_lanes_build"),
                ["--samples-per-cycle", "2", str(FIRMWARE / "active_reset.s")])


def test_active_reset_with_two_samples_per_cycle(two_lanes):
    res, results = two_lanes
    assert res.exit_code == 0, res.output
    assert results["params"]["samples_per_cycle"] == 2
    assert results["model"]["qubit"]["sample_rate_hz"] == 500e6
    start = results["start_time_cycles"]
    # The 64-sample pi/2 pulse plays in 32 cycles; the readout still opens after `wait 64`.
    plays = [(e["kind"], e["dtd_cycle"] - start) for e in results["events"]
             if e["channel"] == "drive0.0"]
    assert plays[:2] == [("play_start", 0), ("play_end", 32)]
    (meas,) = results["measurements"]
    assert meas["dtd_cycle"] == start + 64 and meas["outcome"] == 1
    assert meas["p1"] == pytest.approx(0.5, abs=0.01)
    # Both lanes of the ADC reach the demodulator: the gateware's bit is the model's.
    assert results["registers"]["R1"] == 1 and results["registers"]["R2"] == 1
    # The reset pulse (64 samples, 32 cycles) really resets the qubit.
    assert len(plays) == 4 and plays[3][1] - plays[2][1] == 32
    assert results["qubit_final_p1"] < 1e-3


#: Ramsey shots on one ideal qubit (no decay) at IF 0: two pi/2 pulses T apart whose NCO runs
#: at the detuning df (phase-continuous: the second pulse's axis is 2 pi df T further on), so
#: from |0> P(1) = cos^2(pi df T). The first shot has no detuning (the two pulses make a pi
#: pulse), the last the same T at 250 kHz (a half turn of the axis: nothing).
RAMSEY = """\
.equ PULSE, 64
.envelope half, gaussian, length=PULSE, sigma=16, amp=1.0   ; amp 0.5 = pi/2
        play 0, half, amp=0.5, freq=0
        wait 2us
        play 0, half, amp=0.5, freq=0
        wait PULSE
        acquire 0, r1, window=100, threshold=0
        wait 108
        play 0, half, amp=0.5, freq=250kHz
        wait 500ns
        play 0, half, amp=0.5, freq=250kHz
        wait PULSE
        acquire 0, r2, window=100, threshold=0
        wait 108
        play 0, half, amp=0.5, freq=250kHz
        wait 1us
        play 0, half, amp=0.5, freq=250kHz
        wait PULSE
        acquire 0, r3, window=100, threshold=0
        wait 108
        play 0, half, amp=0.5, freq=250kHz
        wait 2us
        play 0, half, amp=0.5, freq=250kHz
        wait PULSE
        acquire 0, r4, window=100, threshold=0
        wait 100
        end
"""
#: Each shot's detuning (Hz) and the time between its pulses' starts (DTD cycles at 250 MHz).
#: The pulses' own 256 ns at the detuning shift P(1) from cos^2(pi df T) by up to 0.04.
RAMSEY_SHOTS = [(0.0, 500), (250e3, 125), (250e3, 250), (250e3, 500)]
IDEAL = {"qubits": {"t1_ns": None, "t2_ns": None}}


@pytest.fixture(scope="module")
def ramsey(tmp_path_factory):
    """``qlink sim --model ideal.json ramsey.s``: the result and the JSON."""
    out = tmp_path_factory.mktemp("ramsey")
    (out / "ramsey.s").write_text(RAMSEY)
    (out / "ideal.json").write_text(json.dumps(IDEAL))
    return _run(out, tmp_path_factory.mktemp("ramsey_build"),
                ["--model", str(out / "ideal.json"), str(out / "ramsey.s")])


def _shot_p1(env: list[int], word: int, t_cycles: int) -> float:
    """P(1) from |0> after two pulses of ``env`` at amplitude 0.5, ``t_cycles`` apart, mixed
    with an ideal NCO of ``word`` (turns / 2**32 per sample): the model's own prediction."""
    system = make_system(IDEAL, 1, seed=1, sample_rate_hz=250e6)
    for start in (0, t_cycles):
        for k, e in enumerate(env):
            n = start + k
            theta = 2 * math.pi * (n * word % 2**32) / 2**32
            system.drive(0, n, round(e * 0.5 * math.cos(theta)),
                         round(e * 0.5 * math.sin(theta)))
    return system.p1(0)


def test_a_drive_detuned_by_the_nco_gives_ramsey_fringes(ramsey):
    res, results = ramsey
    assert res.exit_code == 0, res.output
    env = assemble(RAMSEY, params=sim_params()).envelopes["half"].samples
    measured = results["measurements"]
    assert len(measured) == len(RAMSEY_SHOTS)
    before = 0          # each shot starts from the previous shot's outcome
    for (df, t_cycles), m, reg in zip(RAMSEY_SHOTS, measured, ("R1", "R2", "R3", "R4"),
                                      strict=True):
        word = round(df / 250e6 * 2**32)
        from_zero = _shot_p1(env, word, t_cycles)
        # The NCO's samples through the bench give the model's own prediction ...
        assert m["p1"] == pytest.approx(from_zero if before == 0 else 1 - from_zero, abs=0.01)
        # ... which follows the detuning: cos^2(pi df T), the pulses' own length aside.
        fringe = math.cos(math.pi * (word / 2**32 * 250e6) * t_cycles * 4e-9) ** 2
        assert from_zero == pytest.approx(fringe, abs=0.06)
        assert results["registers"][reg] == m["outcome"]
        before = m["outcome"]
    # The same T without and with the detuning: a pi pulse, then nothing.
    assert _shot_p1(env, 0, 500) > 0.99 and _shot_p1(env, round(250e3 / 250e6 * 2**32), 500) \
        < 0.01
