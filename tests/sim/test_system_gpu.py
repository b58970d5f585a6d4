"""``qlink sim --gpu``: the example's CALL served by a DEVICE_CALL handler in the GPU unified
dispatch kernel. Linking runs anywhere the ``[gpu]`` extra is installed (CI too); the simulation
itself needs Icarus and a CUDA GPU and skips with the reason otherwise."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from openqlink.sim.handlers import load_function_table
from openqlink.sim.runner import run_sim

FIRMWARE = Path(__file__).resolve().parents[2] / "firmware"


def _installed(name: str) -> bool:
    """Whether module ``name`` can be imported (find_spec raises when its parent is missing)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


HAVE_CUDA_PYTHON = _installed("cuda.bindings")
needs_gpu_extra = pytest.mark.skipif(not HAVE_CUDA_PYTHON,
                                     reason="openqlink[gpu] (cuda-python) is not installed")


def _no_gpu_reason() -> str | None:
    if not HAVE_CUDA_PYTHON:
        return "openqlink[gpu] (cuda-python) is not installed"
    if shutil.which("iverilog") is None:
        return "Icarus Verilog is not installed"
    from openqlink.gpu import gpu_available

    ok, why = gpu_available()
    return None if ok else f"no CUDA GPU: {why}"


@needs_gpu_extra
def test_the_examples_device_handler_links_for_sm_90():
    from openqlink.gpu import DispatchProgram
    from openqlink.gpu.toolchain import cubin_symbols

    table = load_function_table(FIRMWARE / "active_reset.py", gpu=True)
    (entry,) = table.device_calls()
    assert entry.name == "reset_decision"
    prog = DispatchProgram("sm_90", cache=False)
    prog.add(entry)
    assert "qlink_fnptr_reset_decision" in cubin_symbols(prog.link().cubin)


@pytest.mark.gpu
@pytest.mark.cocotb
@pytest.mark.skipif(_no_gpu_reason() is not None, reason=str(_no_gpu_reason()))
def test_sim_gpu_gives_the_cpu_results_and_the_kernel_served_the_call(tmp_path):
    # On a GPU machine without Yosys, name the Verilog made by `qlink verilog --sim` elsewhere.
    verilog = os.environ.get("OPENQLINK_SIM_VERILOG")
    cpu = run_sim(FIRMWARE / "active_reset.s", build_dir=tmp_path, seed=1, verilog_path=verilog)
    gpu = run_sim(FIRMWARE / "active_reset.s", build_dir=tmp_path, seed=1, gpu=True,
                  verilog_path=verilog)
    measured = gpu.pop("gpu")
    assert gpu == cpu        # the simulated timeline does not depend on who answered
    assert measured["forwarded"] == 1
    assert measured["kernel_processed"] == measured["warmup_requests"] + 1
    assert len(measured["service_ns"]) == 1


@pytest.mark.gpu
@pytest.mark.cocotb
@pytest.mark.skipif(_no_gpu_reason() is not None, reason=str(_no_gpu_reason()))
def test_sim_gpu_frames_gives_the_cpu_results_with_no_python_per_call(tmp_path):
    """``--gpu --gpu-frames``: the request frame goes raw to the GPU RoCE endpoint, whose
    response frame goes back onto the simulated wire: the results are the CPU run's, the
    frame was checked on the GPU, and the QP's PSNs came back to the host."""
    verilog = os.environ.get("OPENQLINK_SIM_VERILOG")
    cpu = run_sim(FIRMWARE / "active_reset.s", build_dir=tmp_path, seed=2, verilog_path=verilog)
    gpu = run_sim(FIRMWARE / "active_reset.s", build_dir=tmp_path, seed=2, gpu=True,
                  gpu_frames=True, verilog_path=verilog)
    measured = gpu.pop("gpu")
    assert gpu == cpu
    assert measured["mode"] == "frames"
    assert measured["kernel_processed"] == 1 == len(measured["service_ns"])
    c = measured["counters"]
    warm = measured["warmup_counters"]
    assert c["RX_PUBLISHED"] - warm["RX_PUBLISHED"] == 1
    assert c["TX_FRAMES"] - warm["TX_FRAMES"] == 1
    assert all(c[k] == warm[k] for k in c if k.startswith("DROP_"))
