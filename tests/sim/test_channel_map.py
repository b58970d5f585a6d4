"""openqlink.sim.channel_map: the simulation build's PTD channels, the model file's checks, and
``qlink sim``'s options for them (no simulation: the simulator is replaced)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from openqlink.cli import main
from openqlink.memory_map import QSCParams
from openqlink.sim.channel_map import (
    ModelError,
    channel_map,
    check_build,
    check_model,
    load_model,
    make_system,
    sim_params,
)
from openqlink.sim.qubit import DEFAULT_PI_AREA


@pytest.mark.parametrize("qubits", [1, 2, 3, 5])
def test_sim_params_have_2q_minus_1_drives_and_q_readouts(qubits):
    params = sim_params(2, qubits, 4)
    assert (params.num_ppus, params.drives_per_ppu, params.readouts_per_ppu,
            params.samples_per_cycle) == (2, 2 * qubits - 1, qubits, 4)
    check_build(params, qubits)
    assert sim_params() == QSCParams()      # one qubit: the default build


def test_check_build_refuses_channels_that_do_not_fit():
    with pytest.raises(ModelError, match="2 qubit\\(s\\) per PPU map onto 3 drive and 2 "
                                         "readout channel\\(s\\), but the build has 1 and 1"):
        check_build(QSCParams(), 2)
    with pytest.raises(ModelError, match="qubits must be 1..5"):
        sim_params(qubits=6)


def test_channel_map_drives_then_couplers_then_readouts():
    assert channel_map(3) == {
        "qubits": 3,
        "drive": [{"channel": 0, "role": "drive", "qubit": 0},
                  {"channel": 1, "role": "drive", "qubit": 1},
                  {"channel": 2, "role": "drive", "qubit": 2},
                  {"channel": 3, "role": "coupler", "coupler": 0, "qubits": [0, 1]},
                  {"channel": 4, "role": "coupler", "coupler": 1, "qubits": [1, 2]}],
        "readout": [{"channel": 0, "qubit": 0}, {"channel": 1, "qubit": 1},
                    {"channel": 2, "qubit": 2}],
    }
    assert channel_map(1)["drive"] == [{"channel": 0, "role": "drive", "qubit": 0}]


def test_model_file_objects_apply_to_every_entry_and_lists_to_one_each():
    model = {"qubits": [{"if_hz": 1e6, "t1_ns": None, "t2_ns": None}, {"pi_area": 40}],
             "readouts": {"noise_sigma": 100}, "couplers": [{"cz_area": 20}],
             "trotter_fraction": 0.01}
    checked = check_model(model, 2)
    assert checked["qubits"] == [{"if_hz": 1e6, "t1_ns": None, "t2_ns": None},
                                 {"pi_area": 40.0}]
    assert checked["readouts"] == [{"noise_sigma": 100.0}, {"noise_sigma": 100.0}]
    system = make_system(checked, 2, seed=7, sample_rate_hz=500e6)
    d = system.describe()
    assert (d["seed"], d["sample_rate_hz"], d["trotter_fraction"]) == (7, 500e6, 0.01)
    assert d["qubits"][0]["t1_ns"] is None and d["qubits"][0]["if_hz"] == 1e6
    assert d["qubits"][1]["t1_ns"] == 50_000 and d["qubits"][1]["pi_area"] == 40
    assert [r["noise_sigma"] for r in d["readouts"]] == [100, 100]
    assert [r["qubit"] for r in d["readouts"]] == [0, 1]
    assert d["couplers"] == [{"channel": 0, "qubits": [0, 1], "cz_area": 20}]
    assert d["drives"] == [{"channel": 0, "qubit": 0}, {"channel": 1, "qubit": 1}]
    assert math.isinf(system.qubits[0].t1_ns)
    # No model: the model's own defaults.
    default = make_system(None, 1, seed=1, sample_rate_hz=250e6).describe()
    assert default["qubits"][0]["pi_area"] == DEFAULT_PI_AREA and default["couplers"] == []


@pytest.mark.parametrize(("model", "message"), [
    ({"qubit": {}}, "unknown key 'qubit' \\(known: qubits, readouts, couplers, "
                    "trotter_fraction\\)"),
    ({"qubits": {"t1": 5}}, "qubits: unknown key 't1' \\(known: if_hz, t1_ns, t2_ns, "
                            "pi_area\\)"),
    ({"readouts": [{}, {"gain": 1}]}, "readouts\\[1\\]: unknown key 'gain'"),
    ({"couplers": [{}, {}]}, "couplers is a list of 2, not 1"),
    ({"qubits": [{}]}, "qubits is a list of 1, not 2"),
    ({"qubits": {"if_hz": "5MHz"}}, "qubits.if_hz must be a number, not '5MHz'"),
    ({"qubits": {"pi_area": None}}, "qubits.pi_area must be a number, not None"),
    ({"qubits": [{}, {"t1_ns": 100, "t2_ns": 300}]},
     "qubits\\[1\\]: t2_ns must be <= 2 \\* t1_ns"),
    ({"readouts": 3}, "readouts must be an object or a list of objects"),
    ([], "the model must be a JSON object"),
])
def test_model_file_errors_name_the_key(model, message):
    with pytest.raises(ModelError, match=message):
        check_model(model, 2)


def test_an_if_beyond_nyquist_is_refused_when_the_system_is_made():
    model = check_model({"qubits": {"if_hz": 200e6}}, 1)
    with pytest.raises(ModelError, match="if_hz"):
        make_system(model, 1, seed=1, sample_rate_hz=250e6)
    make_system(model, 1, seed=1, sample_rate_hz=500e6)     # 2 samples per cycle


def test_load_model_names_the_file(tmp_path):
    path = tmp_path / "m.json"
    path.write_text("{not json")
    with pytest.raises(ModelError, match="m.json"):
        load_model(path, 1)
    path.write_text(json.dumps({"qubits": {"t1_ns": 1000, "t2_ns": 1500}}))
    assert load_model(path, 1)["qubits"] == [{"t1_ns": 1000.0, "t2_ns": 1500.0}]


# -- qlink sim --qubits / --samples-per-cycle / --model (the simulator replaced) ----------------

@pytest.fixture
def fake_run_sim(monkeypatch):
    """Record run_sim's arguments instead of simulating; return the recorded dict."""
    import openqlink.sim.runner

    calls: dict = {}

    def run_sim(programs, **kwargs):
        calls.update(kwargs, programs=programs)
        return {"status": {"state": "DONE"}, "registers": {}, "ppus": [
            {"ppu": 0, "status": {"state": "DONE"}, "registers": {}, "measurements": []}]}

    monkeypatch.setattr(openqlink.sim.runner, "run_sim", run_sim)
    return calls


def _program(tmp_path: Path) -> str:
    (tmp_path / "p.s").write_text("end\n")
    return str(tmp_path / "p.s")


def test_sim_qubits_and_samples_per_cycle_size_the_build(tmp_path, fake_run_sim):
    model = tmp_path / "m.json"
    model.write_text(json.dumps({"qubits": [{"if_hz": 1e6}, {}, {}], "couplers": {}}))
    res = CliRunner().invoke(main, ["sim", "--qubits", "3", "--samples-per-cycle", "2",
                                    "--model", str(model), _program(tmp_path), "--quiet"])
    assert res.exit_code == 0, res.output
    assert fake_run_sim["params"] == sim_params(1, 3, 2)
    assert fake_run_sim["qubits"] == 3
    assert fake_run_sim["model"]["qubits"] == [{"if_hz": 1e6}, {}, {}]


@pytest.mark.parametrize(("model", "message"), [
    ({"qubits": {"T1": 1}}, "qubits: unknown key 'T1'"),
    ({"readouts": [{}, {}]}, "readouts is a list of 2, not 1"),
    ({"qubits": {"if_hz": 130e6}}, "if_hz \\(130000000.0\\) must be within"),
])
def test_sim_bad_model_file_is_a_usage_error(tmp_path, fake_run_sim, model, message):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(model))
    res = CliRunner().invoke(main, ["sim", "--model", str(path), _program(tmp_path)])
    assert res.exit_code == 2, res.output
    assert "Invalid value for '--model'" in res.output
    assert str(path) in res.output.replace("\n", "")
    assert re.search(message, res.output.replace("\n", " ")), res.output
    assert "programs" not in fake_run_sim         # refused before the simulation


def test_sim_qubits_out_of_range_is_a_usage_error(tmp_path, fake_run_sim):
    res = CliRunner().invoke(main, ["sim", "--qubits", "6", _program(tmp_path)])
    assert res.exit_code == 2 and "--qubits" in res.output


def test_run_sim_refuses_a_build_that_does_not_fit_the_qubits(tmp_path):
    from openqlink.sim.runner import SimulationError, run_sim

    with pytest.raises(SimulationError, match="map onto 3 drive and 2 readout"):
        run_sim(_program(tmp_path), qubits=2, params=QSCParams())
    with pytest.raises(SimulationError, match="unknown key 'x'"):
        run_sim(_program(tmp_path), model={"x": 1})
