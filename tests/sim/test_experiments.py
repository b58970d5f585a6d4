"""The physics of the experiments in firmware/, run as a user runs them (``qlink sim
PROGRAM.s --json``) on the QSC top's Verilog with the bench's seeded qubit model.

Each test checks the model's P(1) before every readout (deterministic: the physics the PPU's
pulses, NCO and timing produce) and the measured outcomes against it with binomial tolerances
(bounded shots). Each run takes one to two minutes on Icarus.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from fringe_fit import fringe_frequency

from openqlink.cli import main

pytestmark = [
    pytest.mark.cocotb,
    pytest.mark.skipif(shutil.which("iverilog") is None,
                       reason="Icarus Verilog is not installed (apt-get install iverilog)"),
]

FIRMWARE = Path(__file__).resolve().parents[2] / "firmware"


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("experiments_build")


def _run(name: str, build_dir: Path, out: Path) -> dict:
    res = CliRunner().invoke(main, ["sim", str(FIRMWARE / name), "--json", str(out / "r.json"),
                                    "--build-dir", str(build_dir)])
    assert res.exit_code == 0, res.output
    results = json.loads((out / "r.json").read_text())
    assert results["status"]["state"] == "DONE" and not results["run_limit_reached"]
    return results


def _blocks(results: dict, size: int) -> list[list[dict]]:
    m = results["measurements"]
    assert len(m) % size == 0
    return [m[k:k + size] for k in range(0, len(m), size)]


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

