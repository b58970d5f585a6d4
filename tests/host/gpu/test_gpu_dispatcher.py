"""The Dispatcher with a GPU data plane, HOST_CALL and DEVICE_CALL in one table (no GPU: the data
plane is the Python model of the kernel; the real one is in test_gpu_launch.py)."""

from __future__ import annotations

import struct

import pytest
from gpumodel import ADD_SRC, ModelPlane, P, raw_request, request

from openqlink.dispatch import (
    STATUS_BAD_ARG_LEN,
    STATUS_TRUNCATED,
    STATUS_UNKNOWN_FUNCTION,
    Dispatcher,
    DispatchMode,
    FunctionEntry,
    FunctionTable,
    Outcome,
    SlotRing,
)
from openqlink.errors import DispatchError
from openqlink.gpu import CudaHandler, GPUDataPlane
from openqlink.wire.rpc import REQUEST_MAGIC, Response, fnv1a32


class Sink:
    def __init__(self):
        self.sent: list[tuple[int, Response]] = []

    def __call__(self, slot: int, data: bytes) -> None:
        self.sent.append((slot, Response.unpack(data)))


def impls():
    def add(payload: bytes, cap: int):
        a, b = struct.unpack("<ii", payload)
        return 0, struct.pack("<i", a + b)

    def fail(payload: bytes, cap: int):
        return 7, b""

    return {"gadd": add, "gfail": fail}


def make(num_slots=8, gpu_slots=4, **kw):
    table = FunctionTable()

    @table.host_call("hsub", args=(P.INT32, P.INT32), results=(P.INT32,))
    def hsub(a, b):
        return a - b

    table.device_call("gadd", args=(P.INT32, P.INT32), results=(P.INT32,))
    table.device_call("gfail")
    ring = SlotRing(num_slots, 64)
    sink = Sink()
    plane = ModelPlane(impls(), num_slots=gpu_slots, slot_size=64)
    return table, ring, sink, plane, Dispatcher(table, ring, sink, gpu=plane, **kw)


def put(ring: SlotRing, slot: int, data: bytes) -> None:
    ring.write(slot, data)
    ring.publish(slot, len(data))


def test_host_and_device_calls_in_one_table():
    table, ring, sink, plane, d = make()
    d.start()
    assert [e.name for e in plane.started_with] == ["gadd", "gfail"]
    put(ring, 0, request("gadd", struct.pack("<ii", 2, 40), rid=10, ts=123))
    put(ring, 1, request("hsub", struct.pack("<ii", 2, 40), rid=11))
    put(ring, 2, request("gfail", b"", rid=12))
    assert d.poll() == 3
    by_rid = {r.request_id: (slot, r) for slot, r in sink.sent}
    assert by_rid[10] == (0, Response(0, 10, 123, struct.pack("<i", 42)))
    assert by_rid[11] == (1, Response(0, 11, 0, struct.pack("<i", -38)))
    assert by_rid[12] == (2, Response(7, 12, 0))
    assert d.forwarded == 2 and d.processed == 3 and d.gpu_processed == 2
    assert d.counts[Outcome.OK] == 2 and d.counts[Outcome.HANDLER_ERROR] == 1
    assert d.gpu_status_counts == {0: 1, 7: 1}
    d.stop()
    assert not plane.running


def test_bad_device_requests_are_answered_by_the_host():
    table, ring, sink, plane, d = make()
    d.start()
    put(ring, 0, request("gadd", b"\x01\x02", rid=1))                       # arg_len 2, not 8
    put(ring, 1, raw_request(REQUEST_MAGIC, fnv1a32("gadd"), 8, 2, b"1234"))  # truncated
    put(ring, 2, raw_request(0x12345678, fnv1a32("gadd"), 8, 3, bytes(8)))     # bad magic
    put(ring, 3, request("nowhere", b"", rid=4))
    assert d.poll() == 4
    assert [(r.request_id, r.status) for _, r in sink.sent] == [
        (1, STATUS_BAD_ARG_LEN), (2, STATUS_TRUNCATED), (3, STATUS_UNKNOWN_FUNCTION),
        (4, STATUS_UNKNOWN_FUNCTION)]
    assert d.forwarded == 0 and plane.processed == 0


def test_gpu_ring_full_keeps_order_and_request():
    table, ring, sink, plane, d = make(num_slots=8, gpu_slots=2)
    d.start()
    plane_step = plane.model.step
    plane.model.step = lambda: 0  # the "kernel" stalls
    for i in range(4):
        put(ring, i, request("gadd", struct.pack("<ii", i, 1), rid=i))
    put(ring, 4, request("hsub", struct.pack("<ii", 5, 1), rid=4))
    assert d.poll() == 0
    assert d.forwarded == 2 and ring.oldest() == 2 and ring.ready(2) and d.gpu_outstanding == 2
    plane.model.step = plane_step
    total = 0
    for _ in range(4):
        total += d.poll()
    assert total == 5 and d.forwarded == 4
    assert sorted(r.request_id for _, r in sink.sent) == [0, 1, 2, 3, 4]
    gpu_rids = [r.request_id for _, r in sink.sent if r.request_id != 4]
    assert gpu_rids == [0, 1, 2, 3]  # GPU responses in request order
    assert [struct.unpack("<i", r.result)[0] for _, r in sink.sent if r.request_id < 4] == \
        [1, 2, 3, 4]


def test_stop_sends_what_the_kernel_answered_last():
    table, ring, sink, plane, d = make()
    d.start()
    plane.model.step, step = (lambda: 0), plane.model.step
    put(ring, 0, request("gadd", struct.pack("<ii", 1, 1), rid=5))
    assert d.poll() == 0 and d.gpu_outstanding == 1
    plane.model.step = step
    d.stop()
    assert [r.request_id for _, r in sink.sent] == [5] and d.gpu_outstanding == 0
    with pytest.raises(DispatchError, match="not running"):
        d.poll()


def test_poll_before_start_and_max_result_bytes():
    table, ring, sink, plane, d = make(max_result_bytes=2)
    with pytest.raises(DispatchError, match="start"):
        d.poll()
    d.start()
    put(ring, 0, request("gadd", struct.pack("<ii", 1, 1), rid=1))
    d.poll()
    assert sink.sent[0][1].status == 1  # 4 result bytes do not fit 2


def test_graph_launch_refused_even_with_gpu():
    table, ring, sink, plane, d = make()
    table.add(FunctionEntry("graph", DispatchMode.GRAPH_LAUNCH))
    with pytest.raises(DispatchError, match="GRAPH_LAUNCH"):
        d.start()


def test_without_gpu_device_calls_are_refused():
    table = FunctionTable()
    table.device_call("gadd", args=(P.INT32, P.INT32), results=(P.INT32,))
    with pytest.raises(DispatchError, match="attach a GPU data plane"):
        Dispatcher(table, SlotRing(2, 64), Sink())


def test_attach_gpu_later():
    table = FunctionTable()
    table.device_call("gadd", args=(P.INT32, P.INT32), results=(P.INT32,))
    d = Dispatcher(FunctionTable(), SlotRing(2, 64), Sink())
    d.table = table
    plane = ModelPlane(impls(), slot_size=64)
    d.attach_gpu(plane)
    d.start()
    assert plane.running
    # the table put in place and the plane attached after construction serve a request
    ring = d.ring
    put(ring, 0, request("gadd", struct.pack("<ii", 40, 2), rid=3))
    d.poll()
    assert d.forwarded == 1
    while d.gpu_outstanding:
        plane.model.step()
        d.poll()
    (slot, resp), = d.send_response.sent
    assert slot == 0 and (resp.status, resp.request_id, resp.result) == \
        (0, 3, struct.pack("<i", 42))


def test_foreign_handler_address_refused():
    """A DEVICE_CALL address that get_device_handler() did not return is refused before any GPU
    work (so this runs without a driver)."""
    plane = GPUDataPlane(4, 64, arch="sm_90", cache=False)
    table = FunctionTable()
    table.device_call("gadd", 0x7F00_0000_1000, args=(P.INT32, P.INT32), results=(P.INT32,))
    d = Dispatcher(table, SlotRing(4, 64), Sink(), gpu=plane)
    with pytest.raises(DispatchError, match="did not come from get_device_handler"):
        d.start()
    assert not plane.running
    table2 = FunctionTable()
    table2.device_call("gadd", "not a handler")
    with pytest.raises(DispatchError, match="neither a device handler"):
        Dispatcher(table2, SlotRing(4, 64), Sink(), gpu=plane).start()


def test_plane_links_handlers_from_the_table_without_gpu():
    plane = GPUDataPlane(4, 64, arch="sm_90", cache=False)
    plane.add(FunctionEntry("gadd", DispatchMode.DEVICE_CALL, (P.INT32, P.INT32), (P.INT32,),
                            CudaHandler(ADD_SRC, "add_i32")))
    linked = plane.link()
    assert linked.fnptr_symbols == {"gadd": "qlink_fnptr_add_i32"}
    with pytest.raises(DispatchError, match="not running"):
        plane.submit(b"")
    assert plane.poll_response() is None and plane.processed == 0
