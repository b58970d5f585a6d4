"""The physics of the experiments in firmware/, run as a user runs them (``qlink sim
PROGRAM.s --json``) on the QSC top's Verilog with the bench's seeded qubit model.

Each test checks the model's P(1) before every readout (deterministic: the physics the PPU's
pulses, NCO and timing produce) and the measured outcomes against it with binomial tolerances
(bounded shots), or, for active reset and the repetition code, the outcomes against the
probabilities the model's parameters (T1, T2, readout noise, pulse areas) and the run's timing
give. Each run takes one to two minutes on Icarus.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from fringe_fit import fringe_frequency

from openqlink.cli import main
from openqlink.isa import assemble
from openqlink.sim.qubit import FULL_SCALE

pytestmark = [
    pytest.mark.cocotb,
    pytest.mark.experiments,
    pytest.mark.skipif(shutil.which("iverilog") is None,
                       reason="Icarus Verilog is not installed (apt-get install iverilog)"),
]

FIRMWARE = Path(__file__).resolve().parents[2] / "firmware"


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("experiments_build")


def _run(name: str, build_dir: Path, out: Path, *options: str) -> dict:
    res = CliRunner().invoke(main, ["sim", *options, str(FIRMWARE / name),
                                    "--json", str(out / "r.json"),
                                    "--build-dir", str(build_dir)])
    assert res.exit_code == 0, res.output
    results = json.loads((out / "r.json").read_text())
    assert results["status"]["state"] == "DONE" and not results["run_limit_reached"]
    return results


def _blocks(results: dict, size: int) -> list[list[dict]]:
    m = results["measurements"]
    assert len(m) % size == 0
    return [m[k:k + size] for k in range(0, len(m), size)]


def _constants(name: str) -> dict[str, str]:
    """The ``.equ`` constants of ``firmware/NAME`` (name -> value as written)."""
    text = (FIRMWARE / name).read_text()
    return dict(re.findall(r"^\.equ\s+(\w+),\s*([^\s;]+)", text, re.MULTILINE))


def _count_ok(count: int, probabilities: list[float]) -> bool:
    """``count`` successes of independent trials with these success probabilities is within 3
    standard deviations (plus one) of its mean."""
    mean = sum(probabilities)
    var = sum(p * (1 - p) for p in probabilities)
    return abs(count - mean) <= 3 * math.sqrt(var) + 1


def _at_least_ok(count: int, probabilities: list[float]) -> bool:
    """``count`` is not below the mean of :func:`_count_ok` by more than its tolerance."""
    mean = sum(probabilities)
    var = sum(p * (1 - p) for p in probabilities)
    return count >= mean - 3 * math.sqrt(var) - 1


def _assignment_error(readout: dict, window_cycles: int, samples_per_cycle: int = 1) -> float:
    """P(a readout of the model's ``readout`` is thresholded at 0 to the other outcome): the
    integral over the ``window_cycles - 1`` cycles that carry the signal (the ADC answers a
    cycle after the window opens) is ``+-A N`` plus noise of ``sigma sqrt(N)`` (IF 0, outcomes
    on +-I)."""
    n = (window_cycles - 1) * samples_per_cycle
    assert readout["ro_if_hz"] == 0 and readout["phase1_rad"] == 0
    assert readout["phase0_rad"] == pytest.approx(math.pi)
    return 0.5 * math.erfc(readout["readout_amplitude"] * math.sqrt(n)
                           / (readout["noise_sigma"] * math.sqrt(2)))


def _binomial_ok(shots: list[dict]) -> bool:
    """The outcomes' count is within 3 standard deviations (plus one) of the shots' P(1)."""
    n = len(shots)
    p = sum(s["p1"] for s in shots) / n
    ones = sum(s["outcome"] for s in shots)
    return abs(ones - n * p) <= 3 * math.sqrt(n * p * (1 - p)) + 1


@pytest.fixture(scope="module")
def rabi(build_dir, tmp_path_factory):
    return _run("rabi.s", build_dir, tmp_path_factory.mktemp("rabi"))


@pytest.fixture(scope="module")
def ramsey(build_dir, tmp_path_factory):
    return _run("ramsey.s", build_dir, tmp_path_factory.mktemp("ramsey"))


def test_rabi_oscillates_with_the_models_pi_amplitude(rabi):
    """rabi.s: 12 shots at each amplitude 0.0, 0.2, ..., 1.0 of the gaussian whose amplitude 1.0
    the model calls a pi pulse: P(1) = sin^2(pi A / 2) before every readout (so active reset
    left each shot in |0>), and the outcomes agree with it."""
    amps = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    blocks = _blocks(rabi, 12)
    assert len(blocks) == len(amps)
    for a, shots in zip(amps, blocks, strict=True):
        want = math.sin(math.pi * a / 2) ** 2
        assert all(abs(s["p1"] - want) < 0.03 for s in shots), (a, [s["p1"] for s in shots])
        assert _binomial_ok(shots), (a, [s["outcome"] for s in shots])
    assert sum(s["outcome"] for s in blocks[0]) == 0
    assert sum(s["outcome"] for s in blocks[-1]) >= 11


def test_ramsey_fringes_at_the_ncos_detuning(ramsey):
    """ramsey.s: P(1) against the delay between the pi/2 pulses is a fringe whose frequency is
    the drive NCO's detuning (1 MHz), fitted over the 6 delays; the outcomes agree with it."""
    delays_ns = [0, 200, 400, 600, 800, 1000]
    blocks = _blocks(ramsey, 8)
    p1 = [sum(s["p1"] for s in shots) / len(shots) for shots in blocks]

    best = fringe_frequency([t * 1e-9 for t in delays_ns], p1, lo_hz=0.3e6, hi_hz=2e6) / 1e6
    assert abs(best - 1.0) < 0.03, best
    assert max(p1) - min(p1) > 0.8                         # a fringe, not noise
    for shots in blocks:
        assert _binomial_ok(shots), [s["outcome"] for s in shots]



@pytest.fixture(scope="module")
def reset_fidelity(build_dir, tmp_path_factory):
    return _run("active_reset_fidelity.s", build_dir, tmp_path_factory.mktemp("reset"),
                "--model", str(FIRMWARE / "active_reset_fidelity.json"))


def test_active_reset_leaves_the_qubit_in_0_with_the_models_fidelity(reset_fidelity):
    """active_reset_fidelity.s with its model file: each shot is a pi/2 pulse, a readout, the
    host's reset decision and the conditional pi pulse, then a check readout. The fraction of
    checks that find |0> is the fidelity the model's parameters give: the readout's assignment
    error (its amplitude, noise and window), T1 over the feedback latency (from the first
    readout to the middle of the pi pulse) and the pi pulse's rotation error (its area against
    the qubit's pi area); the PPU's bits are misassigned as often as the readout model says."""
    r = reset_fidelity
    const = _constants("active_reset_fidelity.s")
    pulse, window, shots = int(const["PULSE"]), int(const["WINDOW"]), int(const["SHOTS"])
    model = r["model"]["qubit"]
    qubit, readout = model["qubits"][0], model["readouts"][0]
    t1 = qubit["t1_ns"] * r["params"]["dtd_clk_hz"] / 1e9                   # cycles
    eps = _assignment_error(readout, window)
    program = assemble((FIRMWARE / "active_reset_fidelity.s").read_text())
    codes = sum((e * FULL_SCALE) >> 15 for e in program.envelopes["gauss"].samples)
    pi_error = math.cos(math.pi * codes / (qubit["pi_area"] * FULL_SCALE) / 2) ** 2

    m = r["measurements"]
    assert len(m) == 2 * shots and len(r["rpc"]) == shots
    pulses = [e["dtd_cycle"] for e in r["events"]
              if e["channel"] == "drive0.0" and e["kind"] == "play_start"]
    expected, misassigned, left_in_0 = [], 0, 0
    for first, check, rpc in zip(m[0::2], m[1::2], r["rpc"], strict=True):
        assert rpc["function"] == "reset_decision" and rpc["status"] == 0
        bit = int(rpc["args"], 16)
        assert int(rpc["result"], 16) == bit                 # the handler's decision
        misassigned += bit != first["outcome"]
        played = [c for c in pulses if first["dtd_cycle"] < c < check["dtd_cycle"]]
        assert len(played) == bit                            # the conditional pi pulse
        # From the projection to the pulse (or to the check, which then takes its place).
        latency = (played[0] if played else check["dtd_cycle"]) - first["dtd_cycle"]
        p = first["p1"]
        survive = math.exp(-(latency + pulse / 2) / t1)      # |1> until the pulse turns it
        decayed = 1 - math.exp(-latency / t1)                # |1> misread as 0, decays by itself
        expected.append((1 - p) * (1 - eps * (1 - pi_error))
                        + p * (1 - eps) * survive * (1 - pi_error) + p * eps * decayed)
        left_in_0 += check["outcome"] == 0
    assert _count_ok(misassigned, [eps] * shots), (misassigned, eps)
    fidelity = sum(expected) / shots
    assert 0.85 < fidelity < 0.97, fidelity                  # the model makes errors visible
    assert _count_ok(left_in_0, expected), (left_in_0, shots, fidelity)


@pytest.fixture(scope="module")
def repetition(tmp_path_factory):
    out = tmp_path_factory.mktemp("repetition")
    return _run("repetition_code.s", out / "build", out, "--qubits", "5")


#: The syndrome (bit 0: ancilla 1, bit 1: ancilla 3) of an X on each data qubit.
_FLAG = {0: 0b01, 2: 0b11, 4: 0b10}


def test_repetition_code_flags_and_corrects_the_injected_error(repetition):
    """repetition_code.s on 5 qubits: every round's `decode` CALL carries the round and the two
    ancillas' parities (their projections: the readout's assignment error is negligible), its
    answer is the single-error correction and that pi pulse is played; the injected round
    flags the injected qubit, the rounds before it are quiet and the data qubits end in the
    logical state, each as often as the model's T1 and T2 over the run's timing allow."""
    r = repetition
    const = _constants("repetition_code.s")
    shots, rounds = int(const["SHOTS"]), int(const["ROUNDS"])
    inject_round, inject_qubit = int(const["INJECT_ROUND"]), int(const["INJECT_QUBIT"])
    window, pulse = int(const["WINDOW"]), int(const["PULSE"])
    assert float(const["LOGICAL"]) == 0.0, "the expectations below are those of |000>"
    model = r["model"]["qubit"]
    per_cycle = r["params"]["dtd_clk_hz"] / 1e9
    t1 = [q["t1_ns"] * per_cycle for q in model["qubits"]]
    tphi = [1 / (1 / (q["t2_ns"] * per_cycle) - 0.5 / (q["t1_ns"] * per_cycle))
            for q in model["qubits"]]
    assert max(_assignment_error(ro, window) for ro in model["readouts"]) < 1e-9

    # Per shot: ROUNDS pairs of ancilla readouts (qubits 1, 3), then the data (0, 2, 4).
    m = r["measurements"]
    per_shot = 2 * rounds + 3
    assert len(m) == shots * per_shot and len(r["rpc"]) == shots * rounds
    plays: dict[int, list[int]] = {}
    for e in r["events"]:
        if e["kind"] == "play_start" and e["channel"].startswith("drive0."):
            plays.setdefault(int(e["channel"].split(".")[1]), []).append(e["dtd_cycle"])

    def played(channel: int, lo: int, hi: int) -> list[int]:
        return [c for c in plays.get(channel, []) if lo < c < hi]

    syndromes = []
    for s in range(shots):
        shot = m[s * per_shot:(s + 1) * per_shot]
        ancillas, data = shot[:2 * rounds], shot[2 * rounds:]
        assert [x["qubit"] for x in data] == [0, 2, 4]
        assert len({x["dtd_cycle"] for x in data}) == 1
        shot_syndromes = []
        for k in range(rounds):
            a1, a3 = ancillas[2 * k:2 * k + 2]
            assert (a1["qubit"], a3["qubit"]) == (1, 3) and a1["dtd_cycle"] == a3["dtd_cycle"]
            syndrome = a1["outcome"] | a3["outcome"] << 1
            call = r["rpc"][s * rounds + k]
            assert call["function"] == "decode" and call["status"] == 0
            assert bytes.fromhex(call["args"]) == bytes([k, syndrome & 1, syndrome >> 1]), \
                (s, k, call)
            fix = {v: q for q, v in _FLAG.items()}.get(syndrome)
            assert int(call["result"], 16) == (0 if fix is None else fix + 1), (s, k, call)
            # The correction plays before the next round's pulses (its injection, if any).
            end = (ancillas[2 * k + 2]["dtd_cycle"] - 4 * pulse - pulse * (k + 1 == inject_round)
                   if k + 1 < rounds else data[0]["dtd_cycle"])
            for q in (0, 2, 4):                               # the correction, and only it
                assert len(played(q, a1["dtd_cycle"], end)) == (q == fix), (s, k, q)
            shot_syndromes.append(syndrome)
        syndromes.append((shot_syndromes, [x["outcome"] for x in data]))

    # The timing of shot 0, round INJECT_ROUND, from the events (cycles).
    first = m[inject_round * 2]["dtd_cycle"]                  # its ancilla readout
    (inject,) = played(inject_qubit, first - 6 * pulse, first - 4 * pulse)
    check = min(played(1, inject, first))                     # the ancillas' Rx(pi/2)
    cz = max(c for ch in (5, 6, 7, 8) for c in played(ch, inject, first))
    # An ancilla misreports its parity after a Z from dephasing, or half the time after a
    # jump from T1 while it is in superposition (half its population in |1>).
    span = first - check
    eps_a = max((1 - math.exp(-span / tphi[a])) / 2 + (1 - math.exp(-span / t1[a])) / 4
                for a in (1, 3))
    # The injected qubit flags only if it has not decayed between the middles of the pi pulse
    # and of its last CZ.
    p_flag = math.exp(-(cz - inject) / t1[inject_qubit]) * (1 - eps_a) ** 2
    # The data end right unless an ancilla misreports in the last round (a wrong correction
    # no later round undoes) or, when the error comes in the last round, the injected qubit
    # decays between its CZ and the correction (which then flips it back to 1).
    p_ok = (1 - eps_a) ** 2
    if inject_round == rounds - 1:
        fix = min(played(inject_qubit, first, first + 2000))
        p_ok *= math.exp(-(fix - cz) / t1[inject_qubit])

    flagged = sum(syn[inject_round] == _FLAG[inject_qubit] for syn, _ in syndromes)
    quiet = sum(syn[k] == 0 for syn, _ in syndromes for k in range(inject_round))
    logical = sum(data == [0, 0, 0] for _, data in syndromes)
    assert _at_least_ok(flagged, [p_flag] * shots), (flagged, p_flag, syndromes)
    assert _at_least_ok(quiet, [(1 - eps_a) ** 2] * (shots * inject_round)), syndromes
    assert _at_least_ok(logical, [p_ok] * shots), (logical, p_ok, syndromes)
