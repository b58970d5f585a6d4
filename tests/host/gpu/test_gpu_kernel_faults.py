"""Faults of the GPU real-time path found by reading the code, each with the test that failed
before its fix. Tests that need a GPU skip without one; the others compile and link for sm_90
(NVRTC, nvJitLink) or need neither."""

from __future__ import annotations

import ctypes
import re
import struct

import pytest
from gpumodel import ADD_SRC, P, call, device_entries, request

from openqlink.dispatch import DispatchMode, FunctionEntry
from openqlink.errors import HostOrderError
from openqlink.gpu import (
    LOOPBACK_BRIDGE,
    CudaHandler,
    DispatchKernel,
    DispatchProgram,
    GPUDataPlane,
    HostMemory,
    LoopbackRing,
    TransportBridge,
    gpu_available,
)
from openqlink.gpu.dataplane import HANDLER_GUARD_BYTES
from openqlink.gpu.loopback import check_host_order
from openqlink.gpu.program import builtin_launch
from openqlink.wire.rpc import Response

ARCH = "sm_90"
_OK, _WHY = gpu_available()
needs_gpu = pytest.mark.skipif(not _OK, reason=f"no CUDA driver or GPU: {_WHY}")



def one_thread_kernel() -> DispatchKernel:
    """The built-in kernel launched <<<1, 1>>> (CUDA-Q's launch: the bridge's one-lane path)."""
    builtin = DispatchKernel.builtin()
    return DispatchKernel(builtin.source, builtin.entry, builtin_launch, builtin.name)


# ---- a request posted just before stop() ----

@pytest.mark.parametrize("single_thread", [False, True], ids=["warp", "one-thread"])
@pytest.mark.gpu
@needs_gpu
def test_request_posted_just_before_stop_is_answered(single_thread):
    # The bridge reads the shutdown flag after every empty poll here (SHUTDOWN_SPINS=1), and
    # the host stores the request's sequence word and, at once, the shutdown flag (two ctypes
    # stores, as stop() right after submit() without the Python between them), so the flag
    # often lands between a poll that found the slot empty and the flag read that follows it.
    # The request posted before the flag must still be answered, in every round.
    bridge = TransportBridge(LOOPBACK_BRIDGE.name, LOOPBACK_BRIDGE.source,
                             ("-DQLINK_LOOPBACK_SHUTDOWN_SPINS=1",))
    plane = GPUDataPlane(num_slots=4, slot_size=64, bridge=bridge,
                         kernel=one_thread_kernel() if single_thread else None)
    plane.add(device_entries()[1])  # rpc_increment
    try:
        for rnd in range(60):
            plane.start()
            ring = plane.ring
            # The kernel is polling slot 1 (sequence 2) once the first response is back.
            assert call(plane, request("rpc_increment", bytes(8), rid=1)).status == 0
            msg = request("rpc_increment", bytes([rnd] * 8), rid=2)
            ctypes.memmove(ring.request_host_address(1), msg, len(msg))
            word = ring.rx_seq[1]
            flag = ctypes.c_int32.from_address(ring.memory.host_ptr)  # shutdown_flag
            word.value = 2  # the request is posted (x86: its bytes are seen first) ...
            flag.value = 1  # ... then the host stops the kernel
            assert plane.stop() == 2, f"round {rnd}: the request posted before stop() was lost"
            assert ring.tx_seq[1].value == 2
            assert Response.unpack(ring.read_response(1)) == \
                Response(0, 2, 0, bytes([rnd + 1] * 8))
    finally:
        plane.close()


# ---- the lanes' response stores before the leader's sequence word ----

def _linked_ptx(bridge: TransportBridge) -> str:
    """The PTX of the dispatch module (kernel, bridge, call unit) linked for sm_90."""
    from cuda.bindings import nvjitlink
    program = DispatchProgram(ARCH, bridge=bridge, cache=False)
    handle = nvjitlink.create(3, [f"-arch={ARCH}", "-lto", "-ptx"])
    try:
        for item in program.compile_inputs():
            nvjitlink.add_data(handle, nvjitlink.InputType.LTOIR, item.ltoir, len(item.ltoir),
                               item.name)
        nvjitlink.complete(handle)
        buf = bytearray(nvjitlink.get_linked_ptx_size(handle))
        nvjitlink.get_linked_ptx(handle, buf)
    finally:
        nvjitlink.destroy(handle)
    return bytes(buf).rstrip(b"\0").decode()


@pytest.mark.parametrize("direct_tx", [1, 0], ids=["in-place", "staged"])
@pytest.mark.parametrize("fence", [0, 1])
def test_lanes_response_stores_are_ordered_before_the_sequence_word(fence, direct_tx):
    # Several lanes store parts of the response: in place (the default), the caller its header
    # and the lanes the result's words; staged, tx_publish's copy (st.relaxed.sys.v4) by every
    # lane. Then the leader fences and stores the sequence word (st.volatile.u64). A fence by
    # each lane orders its own stores only; the lanes must meet (bar.warp.sync) after the last
    # store and before the leader's fence, or the host may see the word before another lane's
    # bytes.
    bridge = TransportBridge(LOOPBACK_BRIDGE.name, LOOPBACK_BRIDGE.source,
                             (f"-DQLINK_LOOPBACK_FENCE={fence}",
                              f"-DQLINK_LOOPBACK_DIRECT_TX={direct_tx}"))
    lines = [ln.strip() for ln in _linked_ptx(bridge).splitlines()]
    fence_re = re.compile(r"(membar\.sys|fence\.(sc|acq_rel)\.sys)\b")
    word_re = re.compile(r"st\.volatile(\.global)?\.u64\b")
    # The publishing fence: the one whose next store is the sequence word.
    publish = [i for i, ln in enumerate(lines) if fence_re.match(ln)
               and word_re.match(next((x for x in lines[i + 1:] if x.startswith("st.")), ""))]
    assert len(publish) == 1, "no single fence followed by the sequence word's store"
    before = lines[:publish[0]]
    last_store = max(i for i, ln in enumerate(before) if ln.startswith("st."))
    if not direct_tx:
        assert before[last_store].startswith("st.relaxed.sys.global.v4"), \
            "the staged response's copy is not the last store before the fence"
    assert any(ln.startswith("bar.warp.sync") for ln in before[last_store + 1:]), \
        "no bar.warp.sync between the lanes' last store and the publishing fence"


# ---- a handler writing past max_result_len ----

SPILL_SRC = r'''
#include "openqlink_dispatch.cuh"
// Writes SPILL bytes past max_result_len (0xEE), and claims a 4-byte result.
extern "C" __device__ int spill(const void*, void* out, uint32_t, uint32_t max_result_len,
                                uint32_t* result_len) {
    uint8_t* o = static_cast<uint8_t*>(out);
    for (uint32_t i = 0; i < max_result_len + SPILL; ++i) o[i] = 0xEE;
    *result_len = 4;
    return 0;
}
'''


def _spill_entry() -> FunctionEntry:
    return FunctionEntry("spill", DispatchMode.DEVICE_CALL, (), (P.INT32,),
                         CudaHandler(SPILL_SRC, options=(f"-DSPILL={HANDLER_GUARD_BYTES}u",)))


@pytest.mark.parametrize("single_thread", [False, True], ids=["warp", "one-thread"])
@pytest.mark.gpu
@needs_gpu
def test_handler_writing_past_its_result_leaves_the_table_intact(single_thread):
    # 64-byte slots: the request and response are staged in shared memory, the table (seven
    # entries) is copied into shared memory and held in the lanes' registers.
    plane = GPUDataPlane(num_slots=4, slot_size=64,
                         kernel=one_thread_kernel() if single_thread else None)
    for e in device_entries():
        plane.add(e)
    plane.add(_spill_entry())
    plane.start()
    try:
        for rnd in range(3):
            got = call(plane, request("spill", b"", rid=10 * rnd))
            assert got == Response(0, 10 * rnd, 0, b"\xee" * 4)
            assert call(plane, request("add_i32", struct.pack("<ii", 2, 40), rid=1)) == \
                Response(0, 1, 0, struct.pack("<i", 42))
            assert call(plane, request("rpc_increment", bytes(range(8)), rid=2)).result == \
                bytes(range(1, 9))
            assert call(plane, request("fail7", b"", rid=3)) == Response(7, 3, 0)
            assert call(plane, request("too_big", b"", rid=4)) == Response(1, 4, 0)
            assert call(plane, request("mul", struct.pack("<iq", -6, 7), rid=5)).result == \
                struct.pack("<q", -42)
            got = call(plane, request("sum4", struct.pack("<4i", 1, 0, 3, -40), rid=7))
            assert got.status == 0 and got.result == struct.pack("<iB", -36, 3)
    finally:
        plane.close()


@pytest.mark.gpu
@needs_gpu
def test_handler_writing_past_its_result_large_slots_and_table():
    # 2048-byte slots: the staging buffers are device memory, next to the transport context
    # and the device table; 40 entries: the table is searched in global memory.
    plane = GPUDataPlane(num_slots=2, slot_size=2048, inline_handlers=False)
    plane.add_handler("add_i32", CudaHandler(ADD_SRC), args=(P.INT32, P.INT32),
                      results=(P.INT32,))
    plane.add(device_entries()[1])  # rpc_increment
    plane.add(_spill_entry())
    add = plane.get_device_handler("add_i32")
    aliases = [FunctionEntry(f"add_{i}", DispatchMode.DEVICE_CALL, (P.INT32, P.INT32),
                             (P.INT32,), add) for i in range(37)]
    entries = [*plane.program.entries, *aliases]
    assert len(entries) == 40
    plane.start(entries)
    try:
        for rnd in range(2):
            assert call(plane, request("spill", b"", rid=rnd)) == \
                Response(0, rnd, 0, b"\xee" * 4)
            for i in (0, 17, 36):
                assert call(plane, request(f"add_{i}", struct.pack("<ii", i, 1), rid=i)) == \
                    Response(0, i, 0, struct.pack("<i", i + 1))
            assert call(plane, request("rpc_increment", bytes(8), rid=99)).result == \
                bytes([1] * 8)
    finally:
        plane.close()


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
