"""The unified dispatch kernel on a real GPU: handlers, protocol errors, ring wrap, shutdown, the
Dispatcher end to end, handler addresses, a custom kernel. Skipped without a driver or GPU."""

from __future__ import annotations

import struct
import time

import pytest
from gpumodel import (
    ADD_SRC,
    HANG_GUARD_S,
    P,
    call,
    device_entries,
    raw_request,
    request,
    wait_response,
)

from openqlink.dispatch import (
    Dispatcher,
    DispatchMode,
    FunctionEntry,
    FunctionTable,
    Outcome,
    SlotRing,
    TypeDesc,
)
from openqlink.errors import DispatchError
from openqlink.gpu import (
    CudaHandler,
    DispatchKernel,
    GPUDataPlane,
    LaunchArgs,
    gpu_available,
)
from openqlink.gpu.program import builtin_launch
from openqlink.wire.rpc import REQUEST_MAGIC, Response, fnv1a32

_OK, _WHY = gpu_available()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _OK, reason=f"no CUDA driver or GPU: {_WHY}")]



@pytest.fixture(params=[False, True], ids=["pointer", "inline"])
def plane(request):
    # One data plane per test: while a persistent kernel runs, CUDA module loads and allocations
    # of another data plane can block until it stops (seen on the H200), so none outlives its
    # test. The link cache makes the second and later links free.
    p = GPUDataPlane(num_slots=4, slot_size=128, inline_handlers=request.param,
                     timing_capacity=256)
    for e in device_entries():
        p.add(e)
    p.start()
    yield p
    p.close()


def test_cpp_and_numba_handlers(plane):
    assert call(plane, request("add_i32", struct.pack("<ii", 2, 40), rid=1, ts=77)) == \
        Response(0, 1, 77, struct.pack("<i", 42))
    assert call(plane, request("rpc_increment", bytes(range(8)), rid=2)).result == \
        bytes(range(1, 9))
    assert call(plane, request("fail7", b"", rid=3)) == Response(7, 3, 0)
    assert call(plane, request("too_big", b"", rid=4)) == Response(1, 4, 0)
    assert call(plane, request("mul", struct.pack("<iq", -6, 7 << 33), rid=5)).result == \
        struct.pack("<q", -6 * (7 << 33))
    assert call(plane, request("popcount8", bytes([0b1011_0001]), rid=6)).result == bytes([4])
    got = call(plane, request("sum4", struct.pack("<4i", 1, 0, 3, -40), rid=7))
    assert got.status == 0 and got.result == struct.pack("<iB", -36, 3)


def test_protocol_errors_always_answered(plane):
    assert call(plane, raw_request(0xDEADBEEF, fnv1a32("add_i32"), 8, 11, bytes(8), ts=9)) == \
        Response(-1, 11, 9)
    assert call(plane, request("no_such_function", b"", rid=12)) == Response(-1, 12, 0)
    assert call(plane, request("add_i32", b"\x01\x02\x03", rid=13)) == Response(-2, 13, 0)
    assert call(plane, raw_request(REQUEST_MAGIC, fnv1a32("add_i32"), 4096, 14)) == \
        Response(-3, 14, 0)


def test_ring_wrap_back_pressure_and_processed(plane):
    before = plane.processed
    first = plane.ring.next_post
    sent = 0
    got = []
    n = 3 * plane.num_slots + 1
    while len(got) < n:
        while sent < n and plane.can_submit():
            plane.submit(request("add_i32", struct.pack("<ii", sent, 1000), rid=sent))
            sent += 1
        got.append(wait_response(plane))
    assert [s for s, _ in got] == [(first + i) % plane.num_slots for i in range(n)]
    assert [r.request_id for _, r in got] == list(range(n))
    assert [struct.unpack("<i", r.result)[0] for _, r in got] == [i + 1000 for i in range(n)]
    assert plane.processed == before + n
    times = plane.timings_ns()
    assert len(times) == plane.processed and all(0 < t < 10**9 for t in times)


def test_get_device_handler_and_dispatcher_end_to_end():
    plane = GPUDataPlane(num_slots=4, slot_size=64)
    plane.add_handler("add_i32", CudaHandler(ADD_SRC), args=(P.INT32, P.INT32),
                      results=(P.INT32,))
    address = plane.get_device_handler("add_i32")
    assert address != 0 and plane.owns_address(address)
    table = FunctionTable()

    @table.host_call("host_neg", args=(P.INT32,), results=(P.INT32,))
    def host_neg(a):
        return -a

    table.device_call("add_i32", address, args=(P.INT32, P.INT32), results=(P.INT32,))
    sent = []
    ring = SlotRing(8, 64)
    d = Dispatcher(table, ring, lambda slot, data: sent.append((slot, Response.unpack(data))),
                   gpu=plane)
    d.start()
    try:
        for i in range(20):
            slot = i % 8
            name, payload = (("add_i32", struct.pack("<ii", i, 5)) if i % 3
                             else ("host_neg", struct.pack("<i", i)))
            deadline = time.monotonic() + HANG_GUARD_S
            while ring.ready(slot):
                d.poll()
                assert time.monotonic() < deadline
            ring.write(slot, request(name, payload, rid=i))
            ring.publish(slot, 24 + len(payload))
            d.poll()
        deadline = time.monotonic() + HANG_GUARD_S
        while len(sent) < 20:
            d.poll()
            assert time.monotonic() < deadline, f"{len(sent)} responses"
    finally:
        d.stop()
    results = {r.request_id: struct.unpack("<i", r.result)[0] for _, r in sent}
    assert results == {i: (i + 5 if i % 3 else -i) for i in range(20)}
    assert d.forwarded == 13 and d.gpu_processed == 13 and d.counts[Outcome.OK] == 20
    plane.close()

    other = GPUDataPlane(num_slots=4, slot_size=64)  # another module: the address is foreign
    other.add_handler("add_i32", CudaHandler(ADD_SRC), args=(P.INT32, P.INT32),
                      results=(P.INT32,))
    other.get_device_handler("add_i32")
    with pytest.raises(DispatchError, match="did not come from"):
        other.start([FunctionEntry("add_i32", DispatchMode.DEVICE_CALL, (P.INT32, P.INT32),
                                   (P.INT32,), address + 16)])
    other.close()


XOR_LONG_SRC = r'''
#include "openqlink_dispatch.cuh"
// 96 argument bytes (the request spans two 64-byte lines of a slot), each XOR 0x5A.
extern "C" __device__ int xor_long(const void* in, void* out, uint32_t arg_len,
                                   uint32_t max_result_len, uint32_t* result_len) {
    if (arg_len > max_result_len) { *result_len = 0; return 2; }
    for (uint32_t i = 0; i < arg_len; ++i) {
        static_cast<uint8_t*>(out)[i] = static_cast<const uint8_t*>(in)[i] ^ 0x5A;
    }
    *result_len = arg_len;
    return 0;
}
'''


@pytest.mark.parametrize("single_thread", [False, True], ids=["warp", "one-thread"])
def test_distinct_requests_short_and_multi_line_never_stale(single_thread):
    # Every request differs from the one its slot held before, so a response computed from
    # stale bytes (a torn line, an early read) cannot pass; responses span one and two lines.
    import random

    kernel = None
    if single_thread:  # CUDA-Q's launch: the bridge's two-round-trip path
        builtin = DispatchKernel.builtin()
        kernel = DispatchKernel(builtin.source, builtin.entry, builtin_launch, builtin.name)
    plane = GPUDataPlane(num_slots=3, slot_size=128, kernel=kernel)
    plane.add(device_entries()[1])  # rpc_increment, 8 bytes
    plane.add_handler("xor_long", CudaHandler(XOR_LONG_SRC),
                      args=(TypeDesc.array(P.ARRAY_UINT8, 96),),
                      results=(TypeDesc.array(P.ARRAY_UINT8, 96),))
    plane.start()
    rng = random.Random(3)
    want = {}
    sent = 0
    n = 1500
    try:
        got = 0
        while got < n:
            while sent < n and plane.can_submit():
                if sent % 3 == 2:
                    payload = rng.randbytes(96)
                    want[sent] = bytes(b ^ 0x5A for b in payload)
                    plane.submit(request("xor_long", payload, rid=sent, ts=sent))
                else:
                    payload = rng.randbytes(8)
                    want[sent] = bytes((b + 1) & 0xFF for b in payload)
                    plane.submit(request("rpc_increment", payload, rid=sent, ts=sent))
                sent += 1
            _, r = wait_response(plane)
            assert (r.status, r.request_id, r.ptp_timestamp) == (0, got, got)
            assert r.result == want.pop(got), f"request {got}"
            got += 1
    finally:
        plane.close()


CUSTOM_KERNEL = r'''
#include "openqlink_dispatch.cuh"
// A custom dispatch kernel: answers every request with status 42 and the function_id as result.
extern "C" __global__ void my_dispatch(void* transport_ctx, const qlink_function_entry*, uint32_t,
                                       uint32_t, uint32_t, volatile int* shutdown_flag,
                                       volatile uint64_t* processed, uint64_t*, uint32_t) {
    __align__(16) unsigned char storage[CUDAQ_DEV_TRANSPORT_SESSION_BYTES];
    void* s = cudaq_dev_transport_attach(storage, transport_ctx, shutdown_flag);
    if (s == nullptr) return;
    uint64_t n = 0;
    void* req;
    void* resp;
    while (cudaq_dev_rx_poll(s, &req, &resp) == CUDAQ_RX_DEV_READY) {
        const qlink_rpc_header* h = static_cast<const qlink_rpc_header*>(req);
        qlink_rpc_response* r = static_cast<qlink_rpc_response*>(resp);
        memcpy(r + 1, &h->function_id, 4);
        r->magic = QLINK_RPC_RESPONSE_MAGIC;
        r->status = 42;
        r->result_len = 4;
        r->request_id = h->request_id;
        r->ptp_timestamp = h->ptp_timestamp;
        cudaq_dev_tx_publish(s, resp);
        *processed = ++n;
    }
}
'''


def test_custom_dispatch_kernel_and_launcher():
    launches: list[LaunchArgs] = []

    def launcher(args: LaunchArgs) -> None:
        launches.append(args)
        builtin_launch(args)

    plane = GPUDataPlane(num_slots=2, slot_size=64,
                         kernel=DispatchKernel(CUSTOM_KERNEL, "my_dispatch", launcher))
    plane.add_handler("add_i32", CudaHandler(ADD_SRC), args=(P.INT32, P.INT32),
                      results=(P.INT32,))
    plane.start()
    try:
        for i in range(5):
            got = call(plane, request("whatever", b"", rid=i))
            assert got == Response(42, i, 0, struct.pack("<I", fnv1a32("whatever")))
    finally:
        assert plane.stop() == 5
        plane.close()
    assert len(launches) == 1 and launches[0].count == 1


def test_stop_answers_posted_requests_and_restart():
    plane = GPUDataPlane(num_slots=8, slot_size=64)
    plane.add(device_entries()[1])  # rpc_increment
    plane.start()
    for i in range(8):
        plane.submit(request("rpc_increment", bytes([i] * 8), rid=i))
    assert plane.stop() == 8
    assert [Response.unpack(plane.poll_response()[1]).request_id for _ in range(8)] == \
        list(range(8))
    plane.start()  # again, with fresh rings
    assert call(plane, request("rpc_increment", bytes(8), rid=99)).result == bytes([1] * 8)
    plane.close()
    assert not plane.running
