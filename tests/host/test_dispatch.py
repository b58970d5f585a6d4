"""Tests of the function table, slot ring and dispatcher (openqlink.dispatch)."""

import importlib.util
import logging
import struct
import threading
from pathlib import Path

import pytest

from openqlink.dispatch import (
    STATUS_BAD_ARG_LEN,
    STATUS_HANDLER_ERROR,
    STATUS_TRUNCATED,
    Dispatcher,
    DispatchMode,
    FunctionEntry,
    FunctionTable,
    Outcome,
    SlotRing,
    TypeDesc,
)
from openqlink.errors import DispatchError, FieldRangeError
from openqlink.wire.rpc import (
    STATUS_OK,
    STATUS_UNKNOWN_FUNCTION,
    PayloadType,
    Request,
    Response,
    fnv1a32,
    pack_bits,
)

ROOT = Path(__file__).resolve().parents[2]


class Sink:
    """send_response that records (slot, Response)."""

    def __init__(self):
        self.sent: list[tuple[int, Response]] = []
        self.lock = threading.Lock()

    def __call__(self, slot: int, data: bytes) -> None:
        with self.lock:
            self.sent.append((slot, Response.unpack(data)))


def make(num_slots=4, slot_size=64, **kw):
    table = FunctionTable()

    @table.host_call("add", args=[PayloadType.INT32, PayloadType.INT32],
                     results=[PayloadType.INT32])
    def add(a, b):
        return a + b

    @table.host_call("parity", args=[TypeDesc.bits(5)], results=[TypeDesc.uint8()])
    def parity(bits):
        return sum(bits) % 2

    @table.host_call("boom", args=[], results=[TypeDesc.uint8()])
    def boom():
        raise RuntimeError("handler failed on purpose")

    ring = SlotRing(num_slots, slot_size)
    sink = Sink()
    return table, ring, sink, Dispatcher(table, ring, sink, **kw)


def put(ring: SlotRing, slot: int, name: str, payload: bytes, rid: int, *, ts: int = 0):
    data = Request(fnv1a32(name), rid, ts, payload).pack()
    ring.write(slot, data)
    ring.publish(slot, len(data))


def test_request_response_and_echo():
    _, ring, sink, d = make()
    put(ring, 0, "add", struct.pack("<ii", 40, 2), rid=7, ts=0x1122334455667788)
    assert d.poll() == 1
    (slot, resp), = sink.sent
    assert slot == 0
    assert resp == Response(STATUS_OK, 7, 0x1122334455667788, struct.pack("<i", 42))
    assert not ring.ready(0) and ring.oldest() is None
    assert d.processed == 1 and d.counts[Outcome.OK] == 1


def test_bit_packed_args_arrive_as_bits():
    _, ring, sink, d = make()
    put(ring, 0, "parity", pack_bits([1, 1, 0, 1, 0]), rid=1)
    put(ring, 1, "parity", pack_bits([1, 1, 0, 0, 0]), rid=2)
    assert d.poll() == 2
    assert [r.result for _, r in sink.sent] == [b"\x01", b"\x00"]


def test_slots_are_served_as_published_and_a_lost_request_stalls_nothing():
    """The slot comes from each request's ImmDt: a request lost on the way (slot 0 never
    published) must not hold back the later ones until the ring wraps."""
    _, ring, sink, d = make(num_slots=3)
    put(ring, 1, "add", struct.pack("<ii", 1, 1), rid=11)
    assert d.poll() == 1, "slot 1 is served although slot 0 never came"
    put(ring, 2, "add", struct.pack("<ii", 2, 2), rid=12)
    put(ring, 0, "add", struct.pack("<ii", 0, 0), rid=10)
    put(ring, 1, "add", struct.pack("<ii", 3, 3), rid=13)
    assert d.poll(max_requests=2) == 2
    assert [(s, r.request_id) for s, r in sink.sent] == [(1, 11), (2, 12), (0, 10)]
    assert ring.oldest() == 1
    assert d.poll() == 1
    assert [(s, r.request_id) for s, r in sink.sent[3:]] == [(1, 13)]
    assert ring.oldest() is None and d.processed == 4


def test_unknown_function_answers_minus_one():
    _, ring, sink, d = make()
    put(ring, 0, "nobody", b"", rid=5)
    assert d.poll() == 1
    assert sink.sent[0][1].status == STATUS_UNKNOWN_FUNCTION == -1
    assert sink.sent[0][1].request_id == 5
    assert d.counts[Outcome.UNKNOWN_FUNCTION] == 1


def test_bad_magic_answers_minus_one():
    _, ring, sink, d = make()
    data = bytearray(Request(fnv1a32("add"), 9, 3, bytes(8)).pack())
    data[0] ^= 0xFF
    ring.write(0, bytes(data))
    ring.publish(0, len(data))
    assert d.poll() == 1
    resp = sink.sent[0][1]
    assert (resp.status, resp.request_id, resp.ptp_timestamp) == (-1, 9, 3)
    assert d.counts[Outcome.BAD_MAGIC] == 1 and d.status_counts == {-1: 1}


def test_arg_len_schema_mismatch():
    _, ring, sink, d = make()
    put(ring, 0, "add", struct.pack("<i", 1), rid=1)          # 4 bytes, schema needs 8
    put(ring, 1, "parity", b"\x01\x00", rid=2)                # 2 bytes, schema needs 1
    assert d.poll() == 2
    assert [r.status for _, r in sink.sent] == [STATUS_BAD_ARG_LEN] * 2
    assert d.counts[Outcome.BAD_ARG_LEN] == 2


def test_truncated_requests():
    _, ring, sink, d = make()
    full = Request(fnv1a32("add"), 3, 0, struct.pack("<ii", 1, 2)).pack()
    ring.write(0, full)
    ring.publish(0, 28)       # header says 8 argument bytes, only 4 published
    ring.write(1, full)
    ring.publish(1, 10)       # not even a header
    assert d.poll() == 2
    assert [r.status for _, r in sink.sent] == [STATUS_TRUNCATED] * 2
    assert sink.sent[0][1].request_id == 3


def test_handler_error_is_status_one_and_logged(caplog):
    _, ring, sink, d = make()
    put(ring, 0, "boom", b"", rid=1)
    put(ring, 1, "add", struct.pack("<ii", 2, 3), rid=2)
    with caplog.at_level(logging.ERROR, logger="openqlink.dispatch"):
        assert d.poll() == 2
    assert [r.status for _, r in sink.sent] == [STATUS_HANDLER_ERROR, STATUS_OK]
    assert "handler failed on purpose" in caplog.text
    assert d.counts == {Outcome.HANDLER_ERROR: 1, Outcome.OK: 1}


def test_bad_result_is_handler_error():
    table = FunctionTable()
    table.host_call("big", results=[TypeDesc.uint8()])(lambda: 300)
    table.host_call("two", results=[TypeDesc.uint8(), TypeDesc.int32()])(lambda: 1)
    table.host_call("many", results=[TypeDesc.array(PayloadType.ARRAY_UINT8, 50)])(
        lambda: bytes(50))
    table.host_call("ok2", results=[TypeDesc.uint8(), TypeDesc.float64()])(lambda: (1, 0.5))
    ring, sink = SlotRing(4, 64), Sink()
    d = Dispatcher(table, ring, sink)
    for slot, name in enumerate(["big", "two", "many", "ok2"]):
        put(ring, slot, name, b"", rid=slot)
    assert d.poll() == 4
    assert [r.status for _, r in sink.sent] == [1, 1, 1, 0]   # "many": 50 > 40 result bytes
    assert sink.sent[3][1].result == b"\x01" + struct.pack("<d", 0.5)


def test_status_counters():
    _, ring, sink, d = make(num_slots=8)
    put(ring, 0, "add", struct.pack("<ii", 1, 1), rid=0)
    put(ring, 1, "nobody", b"", rid=1)
    put(ring, 2, "boom", b"", rid=2)
    put(ring, 3, "add", b"", rid=3)
    put(ring, 4, "add", struct.pack("<ii", 1, 1), rid=4)
    assert d.poll() == 5
    assert d.status_counts == {0: 2, -1: 1, 1: 1, -2: 1}
    assert d.processed == 5


def test_ring_checks():
    ring = SlotRing(2, 32)
    assert len(ring.memory) == 64 and ring.num_slots == 2 and ring.slot_size == 32
    with pytest.raises(DispatchError, match="num_slots"):
        SlotRing(0, 64)
    with pytest.raises(DispatchError, match="num_slots"):
        SlotRing(4097, 64)
    with pytest.raises(DispatchError, match="slot_size"):
        SlotRing(2, 16)
    with pytest.raises(DispatchError, match="outside 0..1"):
        ring.publish(2, 4)
    with pytest.raises(DispatchError, match="length"):
        ring.publish(0, 33)
    with pytest.raises(DispatchError, match="do not fit"):
        ring.write(1, bytes(30), offset_bytes=4)
    ring.publish(0, 24)
    with pytest.raises(DispatchError, match="unprocessed"):
        ring.publish(0, 24)
    assert ring.overruns == 1
    ring.slot(1)[0:2] = b"\xAB\xCD"
    assert ring.memory[32:34] == b"\xAB\xCD"


def test_function_table_rules():
    table = FunctionTable()
    f = table.host_call("decode", args=[TypeDesc.bits(12), PayloadType.INT32],
                        results=[PayloadType.UINT8])(lambda bits, n: 0)
    entry = table["decode"]
    assert entry.function_id == fnv1a32("decode") and table.lookup(entry.function_id) is entry
    assert entry.arg_len_bytes == 6 and entry.result_len_bytes == 1
    assert entry.mode == DispatchMode.HOST_CALL == 2
    assert "decode" in table and entry.function_id in table and len(table) == 1
    assert table.names == {"decode": fnv1a32("decode")}
    assert table.entries() == [entry] == list(table)
    assert callable(f)
    schema = entry.schema_bytes()
    assert len(schema) == 4 + 12 * 12 and schema[:2] == b"\x02\x01"
    assert schema[4:16] == struct.pack("<B3xII", 0x30, 2, 12)
    with pytest.raises(DispatchError, match="already"):
        table.host_call("decode")(lambda: None)
    table.host_call("costarring")(lambda: None)
    with pytest.raises(DispatchError, match="share function_id"):
        table.host_call("liquid")(lambda: None)
    with pytest.raises(DispatchError, match="at most 8"):
        FunctionEntry("x", DispatchMode.HOST_CALL, (PayloadType.UINT8,) * 9, (), lambda: 0)
    with pytest.raises(DispatchError, match="at most 4"):
        FunctionEntry("x", DispatchMode.HOST_CALL, (), (PayloadType.UINT8,) * 5, lambda: 0)
    with pytest.raises(DispatchError, match="callable"):
        FunctionEntry("x", DispatchMode.HOST_CALL)
    with pytest.raises(DispatchError, match="ASCII"):
        FunctionEntry("décode", DispatchMode.HOST_CALL, handler=lambda: 0)
    with pytest.raises(DispatchError, match="needs a size"):
        TypeDesc.of(PayloadType.ARRAY_INT32)
    with pytest.raises(DispatchError, match="not a valid scalar"):
        TypeDesc(PayloadType.INT32, 8)
    with pytest.raises(DispatchError, match="not a valid BIT_PACKED"):
        TypeDesc(PayloadType.BIT_PACKED, 1, 9)


def test_typedesc_codecs():
    arr = TypeDesc.array(PayloadType.ARRAY_INT32, 3)
    assert arr.size_bytes == 12
    assert arr.decode(arr.encode([1, -2, 3])) == [1, -2, 3]
    f32 = TypeDesc.float32()
    assert f32.decode(f32.encode(0.25)) == 0.25
    u8s = TypeDesc.array(PayloadType.ARRAY_UINT8, 2)
    assert u8s.decode(b"\x01\x02") == b"\x01\x02"
    with pytest.raises(DispatchError, match="ARRAY_INT32"):
        arr.encode([1, 2])
    with pytest.raises(DispatchError, match="INT64"):
        TypeDesc.int64().encode(1 << 63)


def test_device_call_entries_refused():
    table = FunctionTable([FunctionEntry("gpu_decode", DispatchMode.DEVICE_CALL,
                                         (TypeDesc.bits(8),), (TypeDesc.uint8(),))])
    ring = SlotRing(2, 64)
    with pytest.raises(DispatchError, match="'gpu_decode' \\(DEVICE_CALL\\).*GPU"):
        Dispatcher(table, ring, Sink())
    ok = FunctionTable()
    d = Dispatcher(ok, ring, Sink())
    ok.add(FunctionEntry("graph", DispatchMode.GRAPH_LAUNCH))
    put(ring, 0, "graph", b"", rid=0)
    with pytest.raises(DispatchError, match="GRAPH_LAUNCH"):
        d.poll()
    assert ring.ready(0), "a refused poll must not consume the request"


def test_send_failure_is_counted_and_raised():
    table, ring, _, _ = make()

    def broken(slot, data):
        raise OSError("link down")

    d = Dispatcher(table, ring, broken)
    put(ring, 0, "add", struct.pack("<ii", 1, 1), rid=0)
    with pytest.raises(OSError):
        d.poll()
    assert d.send_errors == 1 and d.processed == 1 and not ring.ready(0)


def test_thread_mode():
    _, ring, sink, d = make(num_slots=4)
    stop = threading.Event()
    thread = threading.Thread(target=d.run_forever, args=(stop,), daemon=True)
    thread.start()
    try:
        for i in range(20):
            slot = i % 4
            while ring.ready(slot):       # the producer keeps at most num_slots outstanding
                threading.Event().wait(0.0005)
            put(ring, slot, "add", struct.pack("<ii", i, 1000), rid=i)
        for _ in range(2000):
            if d.processed == 20:
                break
            threading.Event().wait(0.001)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    assert d.processed == 20
    assert [r.request_id for _, r in sink.sent] == list(range(20))
    assert [struct.unpack("<i", r.result)[0] for _, r in sink.sent] == \
        [i + 1000 for i in range(20)]


def test_dispatch_single_datagram():
    _, _, _, d = make()
    resp = d.dispatch(Request(fnv1a32("add"), 4, 0, struct.pack("<ii", 5, 6)).pack()
                      + bytes(100))  # a full UDP-bridge slot with padding
    assert resp.status == 0 and struct.unpack("<i", resp.result)[0] == 11


def _firmware_module(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_fw", ROOT / "firmware" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", ["active_reset", "active_reset_fidelity"])
def test_active_reset_handlers(name):
    """active_reset.py's handler, and active_reset_fidelity.py serving the same one."""
    mod = _firmware_module(name)
    assert [e.name for e in mod.table] == ["reset_decision"]
    if name == "active_reset":
        prog = mod.program()
        assert set(prog.functions) == {e.name for e in mod.table}
        with pytest.raises(ValueError):
            mod.reset_decision([1, 0])
    ring, sink = SlotRing(2, 64), Sink()
    d = Dispatcher(mod.table, ring, sink)
    put(ring, 0, "reset_decision", pack_bits([1]), rid=1)
    put(ring, 1, "reset_decision", pack_bits([0]), rid=2)
    assert d.poll() == 2
    assert [(r.status, r.result) for _, r in sink.sent] == [(0, b"\x01"), (0, b"\x00")]


def test_repetition_code_decoder():
    mod = _firmware_module("repetition_code")
    prog = mod.program()
    assert set(prog.functions) == {e.name for e in mod.table} == {"decode"}
    # A single X on a data qubit flags its neighbouring ancillas (bit 0: ancilla 1 between
    # qubits 0 and 2, bit 1: ancilla 3 between qubits 2 and 4); the answer is qubit + 1.
    assert [mod.correction(s) for s in range(4)] == [None, 0, 4, 2]
    ring, sink = SlotRing(8, 64), Sink()
    d = Dispatcher(mod.table, ring, sink)
    shot = [(0, 0b00), (1, 0b11), (2, 0b00), (0, 0b01), (1, 0b10)]
    for k, (rnd, syndrome) in enumerate(shot):
        put(ring, k, "decode", mod.arguments(rnd, syndrome), rid=k)
    assert d.poll() == len(shot)
    assert [(r.status, r.result) for _, r in sink.sent] == [
        (0, b"\x00"), (0, b"\x03"), (0, b"\x00"), (0, b"\x01"), (0, b"\x05")]
    assert mod.DECODER.shots[-2:] == [[0b00, 0b11, 0b00], [0b01, 0b10]]
    # A round out of order is a handler error: status 1, the PPU stops with call_failed.
    put(ring, 5, "decode", mod.arguments(3, 0), rid=5)
    assert d.poll() == 1 and sink.sent[-1][1].status == 1
    assert mod.arguments(5, 2) == b"\x05\x00\x01"
    with pytest.raises(ValueError):
        mod.arguments(256, 0)


def test_the_default_result_limit_is_what_the_mailbox_holds():
    """A PPU's mailbox holds 64 bytes: 24 of header and 40 of result. A 48-byte result used to
    be counted OK and then fail to send, leaving the PPU to its time-out."""
    table = FunctionTable()

    @table.host_call("wide", results=[TypeDesc.array(PayloadType.ARRAY_UINT8, 48)])
    def wide():
        return bytes(48)

    ring, sink = SlotRing(4, 256), Sink()
    d = Dispatcher(table, ring, sink)
    assert d.max_result_bytes == 40
    assert Dispatcher(table, SlotRing(4, 48), sink).max_result_bytes == 24
    put(ring, 0, "wide", b"", rid=5)
    assert d.poll() == 1
    assert sink.sent == [(0, Response(STATUS_HANDLER_ERROR, 5, 0))]
    assert d.counts == {Outcome.HANDLER_ERROR: 1}


def test_a_response_the_transport_cannot_deliver_becomes_an_error_response():
    """With a limit above what the transport carries, the response that send_response refuses
    as too long goes out again as a HANDLER_ERROR response without its result."""
    table = FunctionTable()

    @table.host_call("wide", results=[TypeDesc.array(PayloadType.ARRAY_UINT8, 48)])
    def wide():
        return bytes(range(48))

    sent = []

    def send(slot: int, data: bytes) -> None:
        if len(data) > 64:
            raise FieldRangeError("RPCResponse", "response_bytes", len(data), "too long")
        sent.append((slot, Response.unpack(data)))

    ring = SlotRing(4, 256)
    d = Dispatcher(table, ring, send, max_result_bytes=200)
    put(ring, 3, "wide", b"", rid=9, ts=77)
    assert d.poll() == 1
    assert sent == [(3, Response(STATUS_HANDLER_ERROR, 9, 77))]
    assert d.counts == {Outcome.HANDLER_ERROR: 1} and d.send_errors == 0


def test_a_table_put_in_place_later_is_checked_again():
    """poll() checks the table only when it changes; a table of the same size put in place of
    the first (here one with a DEVICE_CALL entry and no GPU data plane) is still refused."""
    _, ring, sink, d = make()
    assert d.poll() == 0
    other = FunctionTable()
    for name in ("a", "b", "c"):
        other.device_call(name)
    assert len(other) == len(d.table)
    d.table = other
    with pytest.raises(DispatchError, match="need the GPU dispatch path"):
        d.poll()
