"""The loopback ring's host side over plain memory, with the Python model of the kernel."""

from __future__ import annotations

import ctypes
import struct

import pytest
from gpumodel import KernelModel, ModelRing, P, request

from openqlink.dispatch import DispatchMode, FunctionEntry, TypeDesc
from openqlink.errors import DispatchError
from openqlink.gpu import ENTRY_BYTES, HostMemory, LoopbackRing, pack_device_entry
from openqlink.gpu.loopback import CTX_BYTES, SEQ_BYTES, slot_stride
from openqlink.wire.rpc import Response, fnv1a32


def echo(payload: bytes, cap: int) -> tuple[int, bytes]:
    return 0, payload


ECHO = FunctionEntry("echo", DispatchMode.DEVICE_CALL, (TypeDesc.array(P.ARRAY_UINT8, 4),),
                     (TypeDesc.array(P.ARRAY_UINT8, 4),))


def test_geometry_is_checked():
    for slots, size in ((0, 64), (4097, 64), (2, 24), (2, 72)):
        with pytest.raises(DispatchError):
            LoopbackRing(HostMemory(1 << 16), slots, size)
    with pytest.raises(DispatchError, match="needed"):
        LoopbackRing(HostMemory(100), 2, 64)


def test_layout_and_ctx():
    assert [slot_stride(n) for n in (32, 48, 56, 64, 112, 256)] == [64, 64, 64, 128, 128, 320]
    ring = LoopbackRing(HostMemory(LoopbackRing.size_for(3, 64)), 3, 64)
    assert ring.stride == 128 and ring.rx_data_offset == 128
    assert ring.tx_data_offset % 128 == 0 and ring.tx_data_offset >= 128 + 3 * 128
    base = ring.memory.device_ptr
    assert ring.request_address(2) == base + 128 + 2 * 128
    assert ring.request_host_address(2) == ring.memory.host_ptr + 128 + 2 * 128 + SEQ_BYTES
    assert ring.response_address(1) == base + ring.tx_data_offset + 128
    raw = ring.ctx_bytes(0xABC0, 0xDEF0, 0x1230, 9)
    assert len(raw) == CTX_BYTES == 56
    ctx = struct.unpack("<QQQQQIIII", raw)
    assert ctx == (base + 128, base + ring.tx_data_offset, 0xABC0, 0xDEF0, 0x1230, 3, 64, 128, 9)
    assert ring.shutdown_device_ptr == base and ring.processed_device_ptr == base + 8


def test_sequence_word_follows_the_message_in_the_first_line():
    ring = ModelRing(2, 64)
    msg = request("echo", bytes([9, 8, 7, 6]), rid=5)
    ring.submit(msg)
    line = ctypes.string_at(ring.request_address(0), 64)  # HostMemory: device == host address
    assert struct.unpack_from("<Q", line)[0] == 1 and line[8:8 + len(msg)] == msg
    ring.submit(msg)
    assert ring.rx_seq[1].value == 2 and ring.rx_seq[0].value == 1


def test_strict_order_wrap_and_back_pressure():
    ring = ModelRing(2, 64)
    model = KernelModel(ring, {"echo": (ECHO, echo)}, 40)
    for i in range(3):  # three passes round the ring
        assert ring.submit(request("echo", bytes([i, 1, 2, 3]), rid=2 * i)) == 0
        assert ring.submit(request("echo", bytes([i, 4, 5, 6]), rid=2 * i + 1)) == 1
        assert not ring.can_submit()
        with pytest.raises(DispatchError, match="full"):
            ring.submit(request("echo", b"xxxx", rid=99))
        assert ring.poll_response() is None  # the kernel has not run
        assert ring.rx_seq[0].value == 2 * i + 1  # sequence numbers, never cleared
        assert model.step() == 2
        assert ring.tx_seq[1].value == 2 * i + 2 and ring.response_ready(1)
        slot, data = ring.poll_response()
        assert slot == 0 and Response.unpack(data) == Response(0, 2 * i, 0, bytes([i, 1, 2, 3]))
        assert ring.slot_free(0) and ring.can_submit()
        slot, data = ring.poll_response()
        assert slot == 1 and Response.unpack(data).request_id == 2 * i + 1
        assert ring.outstanding == 0 and ring.slot_free(0) and ring.slot_free(1)
    assert ring.model_processed == 6
    ring.reset_cursors()
    assert ring.next_seq == 1 and ring.rx_seq[0].value == 0 and ring.tx_seq[1].value == 0


def test_stale_sequence_word_is_not_taken_for_a_new_request():
    ring = ModelRing(1, 64)
    model = KernelModel(ring, {"echo": (ECHO, echo)}, 40)
    ring.submit(request("echo", b"abcd", rid=1))
    model.step()
    assert ring.poll_response() is not None
    assert model.step() == 0  # the slot still holds sequence 1: not a request
    assert not ring.response_ready(0)


def test_model_status_rules():
    ring = ModelRing(8, 64)
    model = KernelModel(ring, {"echo": (ECHO, echo)}, 40)
    ring.submit(struct.pack("<IIIIQ", 0xDEADBEEF, fnv1a32("echo"), 4, 1, 5) + b"abcd")
    ring.submit(request("nope", b"", rid=2))
    ring.submit(request("echo", b"abc", rid=3))
    ring.submit(struct.pack("<IIIIQ", 0x43555152, fnv1a32("echo"), 1000, 4, 0))
    model.step()
    got = [Response.unpack(ring.poll_response()[1]) for _ in range(4)]
    assert [(r.status, r.request_id) for r in got] == [(-1, 1), (-1, 2), (-2, 3), (-3, 4)]
    assert got[0].ptp_timestamp == 5


def test_post_refuses_long_requests_bad_sequence_and_busy_slots():
    ring = ModelRing(2, 64)
    with pytest.raises(DispatchError, match="does not fit"):
        ring.post(0, bytes(65), 1)
    with pytest.raises(DispatchError, match="sequence"):
        ring.post(0, bytes(24), 0)
    ring.post(0, bytes(24), 1)
    with pytest.raises(DispatchError, match="not free"):
        ring.post(0, bytes(24), 2)


def test_device_entry_layout():
    e = FunctionEntry("mul", DispatchMode.DEVICE_CALL, (P.INT32, P.INT64), (P.INT64,))
    raw = pack_device_entry(e, 0x7F00_1234_5678)
    assert len(raw) == ENTRY_BYTES == 168
    addr, fid, mode = struct.unpack_from("<QIB", raw)
    assert (addr, fid, mode) == (0x7F00_1234_5678, fnv1a32("mul"), 0)
    assert raw[16:164] == e.schema_bytes() and raw[164:] == bytes(4)
    assert raw[16:18] == bytes([2, 1])  # num_args, num_results


def test_ring_order_of_timing_buffers():
    from openqlink.gpu.dataplane import _ring_order
    assert _ring_order([1, 2, 0, 0], 2) == [1, 2]
    assert _ring_order([5, 6, 3, 4], 6) == [3, 4, 5, 6]
    assert _ring_order([1, 2, 3], 3) == [1, 2, 3]
