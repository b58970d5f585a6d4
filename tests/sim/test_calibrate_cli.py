"""``qlink calibrate --sim`` end to end: a short readout calibration on the simulated QSC with
a model file, writing the table, the results and the pictures (one simulation, a minute or two
on a small machine)."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil

import pytest
from click.testing import CliRunner

from openqlink.calibration import CalibrationTable
from openqlink.cli import main

pytestmark = [
    pytest.mark.experiments,
    pytest.mark.cocotb,
    pytest.mark.skipif(shutil.which("iverilog") is None,
                       reason="Icarus Verilog is not installed (apt-get install iverilog)"),
]


def test_qlink_calibrate_readout_writes_the_table_results_and_plots(tmp_path):
    """A model whose readout puts |1> on -I (phases 0.4 and 2.9 rad): four shots per state
    find the angle pi, written into the table beside the rest of the nominal table."""
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"readouts": {"phase0_rad": 0.4, "phase1_rad": 2.9}}))
    table = CalibrationTable.for_simulation(1, readout_window_ns=100.0)
    start = tmp_path / "start.json"
    table.save(start)
    plots = tmp_path / "plots"
    plots.mkdir()
    out, results = tmp_path / "cal.json", tmp_path / "results.json"
    args = ["calibrate", "readout", "--sim", "--model", str(model), "--table", str(start),
            "--shots", "4", "-o", str(out), "--json", str(results),
            "--build-dir", str(tmp_path / "build")]
    have_plot = importlib.util.find_spec("matplotlib") is not None
    if have_plot:
        args += ["--plot", str(plots)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("qubit 0 readout: phase 3.14")
    calibrated = CalibrationTable.load(out)
    assert abs(math.remainder(calibrated.qubits[0].readout_phase_rad - math.pi,
                              2 * math.pi)) < 0.05
    assert calibrated.qubits[0].pi_amplitude == table.qubits[0].pi_amplitude
    data = json.loads(results.read_text())
    (readout,) = data["results"]
    assert readout["experiment"] == "readout" and len(readout["points"]["0"]) == 4
    assert data["table"] == calibrated.to_dict()
    if have_plot:
        assert (plots / "q0_readout.png").stat().st_size > 0
