"""Faults of the GPU real-time path found by reading the code, each with the test that failed
before its fix. Tests that need a GPU skip without one; the others compile and link for sm_90
(NVRTC, nvJitLink) or need neither."""

from __future__ import annotations

import pytest
from gpumodel import device_entries

from openqlink.errors import HostOrderError
from openqlink.gpu import GPUDataPlane, HostMemory, LoopbackRing
from openqlink.gpu.loopback import check_host_order

ARCH = "sm_90"


# ---- a host CPU that does not keep its stores in order ----

def test_a_host_that_is_not_x86_is_refused(monkeypatch):
    import platform

    plane = GPUDataPlane(num_slots=2, slot_size=64, arch=ARCH, cache=False)
    plane.add(device_entries()[0])
    for machine in ("aarch64", "arm64", "ppc64le", "riscv64"):
        monkeypatch.setattr(platform, "machine", lambda m=machine: m)
        with pytest.raises(HostOrderError, match="store") as info:
            plane.start()
        assert info.value.machine == machine and machine in str(info.value)
        assert not plane.running and plane._device is None  # refused before any GPU work
        with pytest.raises(HostOrderError):
            check_host_order()
        # Plain host memory no GPU reads (the tests' models) stays allowed.
        LoopbackRing(HostMemory(LoopbackRing.size_for(2, 64)), 2, 64)
    for machine in ("x86_64", "AMD64"):
        monkeypatch.setattr(platform, "machine", lambda m=machine: m)
        check_host_order()
