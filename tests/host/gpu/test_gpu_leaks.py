"""What the GPU data plane takes from the driver it gives back: on close(), and on every error
path of start() and of the driver wrappers. Each driver call that takes something is counted
against the one that gives it back (the real calls, on the real GPU, seen through wrappers);
a failure is injected by answering one call with a driver error instead of making it.
Skipped without a driver or GPU."""

from __future__ import annotations

import struct
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from gpumodel import device_entries, request

from openqlink.dispatch import FunctionEntry
from openqlink.errors import GPUError
from openqlink.gpu import GPUDataPlane, gpu_available
from openqlink.gpu.driver import Device, DeviceMemory, PinnedMemory
from openqlink.wire.rpc import Response

_OK, _WHY = gpu_available()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _OK, reason=f"no CUDA driver or GPU: {_WHY}")]

HANG_GUARD_S = 20.0  # a kernel that never answers fails the test instead of hanging it

#: Driver calls that take something -> the call that gives it back.
PAIRS = {
    "cuDevicePrimaryCtxRetain": "cuDevicePrimaryCtxRelease",
    "cuMemHostAlloc": "cuMemFreeHost",
    "cuMemAlloc": "cuMemFree",
    "cuModuleLoadData": "cuModuleUnload",
    "cuStreamCreate": "cuStreamDestroy",
}
#: Calls a failure can be injected into (besides the ones in PAIRS).
FALLIBLE = ("cuMemHostGetDevicePointer", "cuMemsetD8", "cuMemcpyHtoD", "cuModuleGetFunction",
            "cuModuleGetGlobal", "cuLaunchKernel")


class DriverLedger:
    """Counts the successful calls of :data:`PAIRS` (both sides) and :data:`FALLIBLE` made
    through ``cuda.bindings.driver``; :meth:`fail` makes the ``nth`` next call of ``name``
    answer ``CUDA_ERROR_OUT_OF_MEMORY`` without calling the driver."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        from cuda.bindings import driver
        self.ok: Counter[str] = Counter()
        self.seen: Counter[str] = Counter()
        self._fail: tuple[str, int] | None = None
        self.injected = False
        self._success = driver.CUresult.CUDA_SUCCESS
        self._error = driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY
        for name in (*PAIRS, *PAIRS.values(), *FALLIBLE):
            monkeypatch.setattr(driver, name, self._wrap(name, getattr(driver, name)))

    def _wrap(self, name, real):
        def call(*args):
            self.seen[name] += 1
            if self._fail == (name, self.seen[name]):
                self.injected = True
                return (self._error,)
            result = real(*args)
            err = result[0] if isinstance(result, tuple) else result
            if err == self._success:
                self.ok[name] += 1
            return result
        return call

    def fail(self, name: str, nth: int) -> None:
        self.seen.clear()
        self._fail = (name, nth)

    def outstanding(self) -> dict[str, int]:
        """Takes not given back, by the taking call (empty when everything was given back)."""
        out = {take: self.ok[take] - self.ok[give] for take, give in PAIRS.items()}
        return {k: v for k, v in out.items() if v}


@pytest.fixture
def ledger(monkeypatch) -> Iterator[DriverLedger]:
    yield DriverLedger(monkeypatch)


def make_plane() -> GPUDataPlane:
    plane = GPUDataPlane(num_slots=2, slot_size=64, timing_capacity=8)
    plane.add(device_entries()[1])  # rpc_increment
    return plane


def serve_one(plane: GPUDataPlane, rid: int) -> None:
    plane.submit(request("rpc_increment", bytes(8), rid=rid))
    deadline = time.monotonic() + HANG_GUARD_S
    while (got := plane.poll_response()) is None:
        assert time.monotonic() < deadline, "no response from the kernel"
    assert Response.unpack(got[1]) == Response(0, rid, 0, bytes([1] * 8))


def test_close_gives_back_the_context_and_everything_else(ledger):
    plane = make_plane()
    plane.start()
    serve_one(plane, 1)
    plane.stop()
    plane.start()  # a restart frees the previous run's buffers
    serve_one(plane, 2)
    plane.close()
    assert ledger.ok["cuDevicePrimaryCtxRetain"] == 1
    assert ledger.ok["cuMemHostAlloc"] == 2 and ledger.ok["cuStreamCreate"] == 2
    assert ledger.outstanding() == {}
    plane.start()  # closed planes start again (the context retained anew)
    serve_one(plane, 3)
    plane.close()
    assert ledger.ok["cuDevicePrimaryCtxRetain"] == 2
    assert ledger.outstanding() == {}


@pytest.mark.parametrize("name, nth", [
    ("cuModuleLoadData", 1), ("cuModuleGetFunction", 1), ("cuModuleGetGlobal", 1),
    ("cuModuleGetFunction", 2), ("cuMemHostAlloc", 1), ("cuMemHostGetDevicePointer", 1),
    ("cuMemAlloc", 1), ("cuMemAlloc", 2), ("cuMemAlloc", 3), ("cuMemAlloc", 4),
    ("cuMemAlloc", 5), ("cuMemsetD8", 2), ("cuMemsetD8", 3), ("cuMemcpyHtoD", 1),
    ("cuMemcpyHtoD", 2), ("cuStreamCreate", 1), ("cuLaunchKernel", 1),
])
def test_a_failed_start_gives_back_what_it_took(ledger, name, nth):
    # start() retains the context, loads the module and allocates; whichever step fails,
    # everything taken so far is given back and the plane does not run.
    plane = make_plane()
    ledger.fail(name, nth)
    with pytest.raises(GPUError, match=name):
        plane.start()
    assert ledger.injected, f"start() made fewer than {nth} {name} calls"
    assert not plane.running and plane.ring is None and not plane.loaded
    assert ledger.outstanding() == {}, f"after {name} #{nth} failed"
    ledger.fail("none", 0)
    plane.start()  # and it starts after all
    serve_one(plane, 4)
    plane.close()
    assert ledger.outstanding() == {}


def test_a_failed_start_keeps_the_module_whose_addresses_were_handed_out(ledger):
    plane = make_plane()
    address = plane.get_device_handler("rpc_increment")
    entry = device_entries()[1]
    table = [FunctionEntry(entry.name, entry.mode, entry.args, entry.results, address)]
    for name, nth in (("cuStreamCreate", 1), ("cuMemAlloc", 3)):
        ledger.fail(name, nth)
        with pytest.raises(GPUError, match=name):
            plane.start(table)
        assert not plane.running and plane.loaded and plane.owns_address(address)
        assert ledger.outstanding() == {"cuDevicePrimaryCtxRetain": 1, "cuModuleLoadData": 1}
    ledger.fail("none", 0)
    plane.start(table)  # the same address, still this module's
    serve_one(plane, 2)
    plane.close()
    assert ledger.outstanding() == {}


def test_pinned_and_device_memory_free_what_they_took_on_error(ledger):
    device = Device()
    try:
        ledger.fail("cuMemHostGetDevicePointer", 1)
        with pytest.raises(GPUError, match="cuMemHostGetDevicePointer"):
            PinnedMemory(device, 4096)
        assert ledger.ok["cuMemHostAlloc"] == 1 and ledger.ok["cuMemFreeHost"] == 1
        ledger.fail("cuMemsetD8", 1)
        with pytest.raises(GPUError, match="cuMemsetD8"):
            DeviceMemory(device, 4096)
        assert ledger.ok["cuMemAlloc"] == 1 and ledger.ok["cuMemFree"] == 1
        ledger.fail("none", 0)
        ok = PinnedMemory(device, 64)
        ok.view()[0] = 7
        ok.free()
        mem = DeviceMemory(device, 8)
        mem.upload(struct.pack("<Q", 5))
        assert mem.download() == struct.pack("<Q", 5)
        mem.free()
    finally:
        device.release()
    assert device.released and ledger.outstanding() == {}
    with pytest.raises(GPUError, match="released"):
        device.make_current()


def make_frame_plane():
    from openqlink.gpu.frames import FrameEndpointConfig, GPUFramePlane
    cfg = FrameEndpointConfig(host_mac=0x020000000001, host_ip=0xC0A80001,
                              qsc_mac=0x020000000010, qsc_ip=0xC0A8000A, host_qpn=0x11,
                              qsc_qpn=0x2, ring_rkey=0x1234, num_slots=2, slot_size=64)
    plane = GPUFramePlane(cfg, timing_capacity=8)
    plane.add(device_entries()[1])  # rpc_increment
    return plane


@pytest.mark.parametrize("name, nth", [
    ("cuMemHostAlloc", 1), ("cuMemAlloc", 1), ("cuMemAlloc", 2), ("cuMemAlloc", 3),
    ("cuMemAlloc", 4), ("cuMemAlloc", 5), ("cuMemcpyHtoD", 1), ("cuMemcpyHtoD", 2),
    ("cuStreamCreate", 1), ("cuLaunchKernel", 1),
])
def test_a_failed_frame_plane_start_gives_back_what_it_took(ledger, name, nth):
    # The GPU RoCE endpoint allocates its own rings and context (_make_transport): a failure
    # at any step gives back everything, as the loopback plane's start does.
    plane = make_frame_plane()
    ledger.fail(name, nth)
    with pytest.raises(GPUError, match=name):
        plane.start()
    assert ledger.injected, f"start() made fewer than {nth} {name} calls"
    assert not plane.running and plane.frames is None and not plane.loaded
    assert ledger.outstanding() == {}, f"after {name} #{nth} failed"
    ledger.fail("none", 0)
    plane.start()
    plane.stop()
    plane.close()
    assert ledger.outstanding() == {}
