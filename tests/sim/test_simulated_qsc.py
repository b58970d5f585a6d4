"""A plain script drives the simulated QSC through the QSC API (:class:`openqlink.sim.
SimulatedQSC`: ``qlink sim --serve`` in a child process, reached over the socket bridge), and
``qlink sim --serve``'s usage errors.

The system test runs ``examples/script_against_simulation.py`` (the active-reset example from
a script: connect, configure, upload, trigger, serve the CALL, read the registers) in one
simulation, which takes minutes of wall-clock time on a small machine.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from openqlink.cli import main
from openqlink.isa import PPUState
from openqlink.isa.layout import ISA_VERSION
from openqlink.memory_map import version_word
from openqlink.pcap import read_pcap
from openqlink.sim import SimulatedQSC, SimulationError
from openqlink.wire.packet import parse_frame
from openqlink.wire.roce import Opcode
from openqlink.wire.rpc import Request, Response, fnv1a32

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "script_against_simulation.py"
PROGRAM = ROOT / "firmware" / "active_reset.s"


def _example():
    spec = importlib.util.spec_from_file_location("script_against_simulation", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.cocotb
@pytest.mark.skipif(shutil.which("iverilog") is None,
                    reason="Icarus Verilog is not installed (apt-get install iverilog)")
def test_a_script_runs_active_reset_on_the_simulated_qsc(tmp_path):
    """The example end to end: the PPU ends DONE, its one CALL answered by the script's
    dispatcher with the measured bit, read back over the control plane; the simulation saw
    the client leave and the qubit reset."""
    out = _example().run(tmp_path / "build", pcap_path=tmp_path / "wire.pcap")

    assert out["version"] == version_word(ISA_VERSION)
    assert out["status"].state == PPUState.DONE
    assert not any(v for name, v in _status_bits(out["status"]).items())
    sim = out["simulation"]
    assert sim["serve"]["ended"] == "client_closed" and sim["serve"]["write_errors"] == 0
    (ppu,) = sim["ppus"]
    (meas,) = ppu["measurements"]
    (call,) = out["calls"].values()
    # reset_decision answers the measured bit: 1 plays the reset pulse, 0 does not.
    assert call["args"] == call["result"] == bytes([meas["outcome"]])
    assert call["status"] == 0 and out["calls_answered"] == 1
    regs = out["registers"]
    assert (regs["R2"], regs["CALL_COUNT"], regs["LAST_CALL_STATUS"]) == (meas["outcome"], 1, 0)
    plays = [e for e in ppu["events"] if e["kind"] == "play_start"]
    assert len(plays) == 1 + meas["outcome"]
    assert ppu["qubits_final_p1"][0] < 1e-3
    # The wire: one CALL request out of the QSC and the script's response into it.
    frames = [parse_frame(f) for _, f in read_pcap(tmp_path / "wire.pcap")]
    requests = [f for f in frames
                if f.bth is not None and f.bth["opcode"] == Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE]
    responses = [f for f in frames if f.bth is not None and f.bth["opcode"] == Opcode.SEND_ONLY]
    assert len(requests) == len(responses) == 1
    request, response = Request.unpack(requests[0].payload), Response.unpack(responses[0].payload)
    assert request.function_id == fnv1a32("reset_decision")
    assert response.request_id == request.request_id and response.result == call["result"]
    assert sim["serve"]["frames_from_client"] + sim["serve"]["frames_to_client"] == len(frames)


def _status_bits(status) -> dict:
    from openqlink.sim.bench import status_dict

    return {k: v for k, v in status_dict(status).items() if k != "state"}


def test_a_simulation_that_ends_before_serving_raises_with_its_log(tmp_path):
    """A child that stops before it listens (here: a model file that is not JSON) is a
    SimulationError that quotes the child's log."""
    bad = tmp_path / "model.json"
    bad.write_text("not json")
    with pytest.raises(SimulationError) as info:
        SimulatedQSC(build_dir=tmp_path / "build", model=bad, startup_timeout_s=300)
    message = str(info.value)
    assert "before it served" in message and "model.json" in message.split("\n", 1)[1]


def test_simulated_qsc_refuses_a_build_it_cannot_make(tmp_path):
    for kwargs in ({"qubits": 9}, {"params": None}, {"simulator": "nope"}):
        with pytest.raises(SimulationError):
            SimulatedQSC(build_dir=tmp_path, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_qlink_sim_serve_usage_errors(tmp_path):
    """``--serve`` takes no PROGRAM and none of a program run's host options; a socket path
    that cannot serve stops before the build with one line and status 2."""
    for args, message in (
            (["--serve", str(tmp_path / "s"), str(PROGRAM)], "--serve runs no PROGRAM"),
            (["--serve", str(tmp_path / "s"), "--tap", "t0"], "--tap: not with --serve"),
            (["--serve", str(tmp_path / "s"), "--calls", "udp"], "--calls: not with --serve"),
            (["--serve", str(tmp_path / "s"), "--host-mac", "02:00:00:00:00:01"],
             "--host-mac: not with --serve"),
            (["--serve-limit-s", "3", str(PROGRAM)], "--serve-limit-s: only with --serve")):
        res = CliRunner().invoke(main, ["sim", *args])
        assert res.exit_code == 2 and message in res.output, (args, res.output)
    missing = tmp_path / "no" / "qsc.sock"
    res = CliRunner().invoke(main, ["sim", "--serve", str(missing), "--build-dir",
                                    str(tmp_path / "build")])
    assert res.exit_code == 2
    assert res.output.splitlines() == [
        f"qlink sim: socket {missing}: directory {missing.parent} does not exist"]
    assert not (tmp_path / "build").exists()
