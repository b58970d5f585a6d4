"""The dispatch-path probe (``benchmarks/gpu_dispatch_probe.py``) still fits the built-in kernel:
every text it edits is there once, and the probed kernels compile and link for ``sm_90`` (no
GPU needed: NVRTC and nvJitLink only)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from openqlink.dispatch import DispatchMode, FunctionEntry, PayloadType, TypeDesc
from openqlink.gpu import CudaHandler, DispatchKernel, GPUDataPlane
from openqlink.gpu.program import warp_launch

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.fixture(scope="module")
def probe():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("gpu_dispatch_probe",
                                                      BENCH / "gpu_dispatch_probe.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.parametrize("twice", [False, True], ids=["probes", "lookup-twice"])
def test_the_probed_kernel_links(probe, twice):
    source = probe.probe_source(twice)
    assert source.count("qlink_probe_clock(") == 1 + (9 if twice else 8)   # with its definition
    kernel = DispatchKernel(source, "qlink_unified_dispatch", warp_launch, "probe.cu")
    plane = GPUDataPlane(8, 256, arch="sm_90", kernel=kernel, timing_capacity=16, cache=False)
    arr = TypeDesc.array(PayloadType.ARRAY_UINT8, 32)
    plane.add(FunctionEntry("rpc_empty", DispatchMode.DEVICE_CALL, (arr,), (),
                            CudaHandler(probe.EMPTY_SRC)))
    assert "qlink_unified_dispatch" in plane.program.link().symbols


def test_a_kernel_without_an_edited_text_is_refused(probe, monkeypatch):
    builtin = DispatchKernel.builtin()
    changed = builtin.source.replace("cudaq_dev_tx_publish(session, response);", "")
    monkeypatch.setattr(DispatchKernel, "builtin",
                        classmethod(lambda cls: DispatchKernel(changed, builtin.entry)))
    with pytest.raises(SystemExit, match="no longer has this text once"):
        probe.probe_source()
