"""Kernels on the simulated QSC through the library API (:mod:`openqlink.nvqlink` over a
:class:`~openqlink.sim.SimulatedQSC`): the NVQLink seed kernel (also as the example script,
and on the GPU where there is one), a loop with a measurement-conditioned reset, QPU memory,
a failing device_call, and CZ on a two-qubit build. Each simulation takes a minute or two of
wall-clock time on a small machine, so one simulation serves several launches."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shutil
from pathlib import Path

import pytest

from openqlink import nvqlink
from openqlink.kernels import cz, device_call, h, kernel, mz, qubit, qvector, x

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "simple_quantum_kernel.py"

needs_icarus = pytest.mark.skipif(shutil.which("iverilog") is None,
                                  reason="Icarus Verilog is not installed "
                                         "(apt-get install iverilog)")


def adder(i: int, r: int) -> int:
    return i + r


def refuse(r: int) -> int:
    raise ValueError(f"refused {r}")


@kernel
def seed(i: int):
    q = qubit()
    h(q)
    r = mz(q)
    return device_call(adder, i, r)


@kernel
def reset_loop(n: int):
    q = qubit()
    flips = 0
    for _ in range(n):
        h(q)
        m = mz(q)
        if m:
            x(q)
            flips += 1
    last = mz(q)
    return flips, last


@kernel
def failing():
    q = qubit()
    r = mz(q)
    return device_call(refuse, r)


@kernel
def bell_phase():
    qs = qvector(2)
    h(qs[0])
    h(qs[1])
    cz(qs[0], qs[1])
    h(qs[1])
    a = mz(qs[0])
    b = mz(qs[1])
    return a, b


def _example():
    spec = importlib.util.spec_from_file_location("simple_quantum_kernel", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.cocotb
@needs_icarus
def test_kernels_launch_on_the_simulated_qsc(tmp_path):
    """One simulation, several launches: the seed kernel twice (the value is the handler's
    of the measured bit), a loop of measure-and-reset (its count of flips and its last
    readout are the simulation's measurements), a round trip through QPU memory, and a
    device_call whose handler fails (LaunchError naming call_failed)."""
    dev = nvqlink.initialize("sim", qubits=1, build_dir=tmp_path / "build", seed=3)
    try:
        handle = nvqlink.load_kernel(seed)
        values = []
        for i in (5, -2):
            value = nvqlink.launch_kernel(handle, i)
            launch = dev.last_launch
            assert launch.mode == "HOST_CALL"
            (call,) = launch.calls
            bit = launch.measurements["r"]
            assert call["name"] == "adder" and call["status"] == 0
            assert call["args"] == i.to_bytes(4, "little", signed=True) + bytes([bit, 0, 0, 0])
            assert value == adder(i, bit)
            values.append(bit)

        loop = nvqlink.load_kernel(reset_loop)
        flips, last = nvqlink.launch_kernel(loop, 4)
        assert dev.last_launch.status.state.name == "DONE"

        buf = nvqlink.malloc(40)
        data = bytes(range(40))
        nvqlink.memcpy_to_qpu(buf, data)
        assert nvqlink.memcpy_from_qpu(buf) == data
        assert nvqlink.memcpy_from_qpu(buf, 8, offset=4) == data[4:12]
        nvqlink.free(buf)

        with pytest.raises(nvqlink.LaunchError, match=r"ended ERROR \(call_failed, "
                                                      r"LAST_CALL_STATUS 1\)") as info:
            nvqlink.launch_kernel(nvqlink.load_kernel(failing))
        assert info.value.errors == ("call_failed",)
    finally:
        nvqlink.shutdown()
    measured = [m["outcome"] for m in dev.simulation_results["ppus"][0]["measurements"]]
    assert measured[:2] == values
    loop_bits = measured[2:7]
    assert flips == sum(loop_bits[:4]) and last == loop_bits[4] == 0
    assert len(measured) == 8            # and the failing kernel's one


@pytest.mark.cocotb
@needs_icarus
def test_the_example_prints_the_seed_kernels_value_as_its_last_line(tmp_path):
    module = _example()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert module.main(["--i", "3", "--build-dir", str(tmp_path / "build")]) == 0
    last = out.getvalue().rstrip("\n").splitlines()[-1]
    sim = __import__("json").loads((tmp_path / "build" / "serve.json").read_text())
    (meas,) = sim["ppus"][0]["measurements"]
    bit = meas["outcome"]
    assert last == f"device_call gpu_adder(i=3, readout={bit}) = {module.gpu_adder(3, bit)} " \
                   "[HOST_CALL]"


def _no_gpu_reason() -> str | None:
    try:
        from openqlink.gpu import gpu_available

        ok, why = gpu_available()
    except ImportError as exc:
        return f"openqlink[gpu] is not installed: {exc}"
    if shutil.which("iverilog") is None:
        return "Icarus Verilog is not installed"
    return None if ok else f"no CUDA GPU: {why}"


def test_the_example_with_gpu_and_no_gpu_says_why_in_one_line_and_exits_2(capsys):
    if _no_gpu_reason() is None:
        pytest.skip("this machine has a GPU")
    assert _example().main(["--gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("simple_quantum_kernel: --gpu: no CUDA GPU")


@pytest.mark.gpu
@pytest.mark.cocotb
@pytest.mark.skipif(_no_gpu_reason() is not None, reason=str(_no_gpu_reason()))
def test_the_example_serves_gpu_adder_on_the_gpu(tmp_path):
    module = _example()
    # A GPU host may have no Yosys: the Verilog made elsewhere (docs/gpu_machine.md).
    out = module.run(4, gpu=True, build_dir=tmp_path / "build",
                     verilog_path=os.environ.get("OPENQLINK_SIM_VERILOG"))
    assert out["mode"] == "DEVICE_CALL"
    assert out["value"] == module.gpu_adder(4, out["readout"])
    (meas,) = out["simulation"]["ppus"][0]["measurements"]
    assert meas["outcome"] == out["readout"]


@pytest.mark.cocotb
@needs_icarus
def test_cz_between_two_hadamards_is_a_cnot_on_a_two_qubit_build(tmp_path):
    """H on both, CZ, H on the target: a CNOT from the first qubit in superposition, so the
    two readouts agree (the simulation's default model: readout errors far below one in a
    hundred)."""
    with nvqlink.initialize("sim", qubits=2, build_dir=tmp_path / "build", seed=5) as dev:
        handle = dev.load_kernel(bell_phase)
        results = [dev.launch_kernel(handle) for _ in range(3)]
    assert all(a == b for a, b in results), results
    measured = [m["outcome"] for m in dev.simulation_results["ppus"][0]["measurements"]]
    assert [bit for pair in results for bit in pair] == measured
