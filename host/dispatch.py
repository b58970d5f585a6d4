"""Function table, request ring and non-blocking RPC dispatcher of the real-time host.

The host side of a PPU's CALL, in the shape of CUDA-Q realtime's host dispatch path:

* :class:`SlotRing` is the receive ring: ``num_slots`` slots of ``slot_size`` bytes. The
  transport's RX side writes a request into a slot (the QSC's UC RDMA WRITE at
  ``VA = slot * slot_size``) and then calls :meth:`SlotRing.publish` (CUDA-Q's rx flag).
* :class:`FunctionTable` holds :class:`FunctionEntry` items: ``function_id = fnv1a32(name)``,
  a dispatch mode (:class:`DispatchMode`, CUDA-Q's values) and the argument/result schema
  (:class:`TypeDesc`, at most 8 arguments and 4 results).
* :class:`Dispatcher` takes the published slots in the order they were published (the slot
  comes from each request's ImmDt, as the protocol says, so a lost request stalls nothing),
  decodes each request, calls the HOST_CALL handler and sends an ``RPCResponse`` through
  ``send_response(slot, bytes)``. :meth:`Dispatcher.poll` never blocks, so the same object runs
  in a thread (:meth:`Dispatcher.run_forever`) or is stepped from a cocotb coroutine.
* Per request, the headers go through :class:`struct.Struct` codecs derived from the
  :mod:`openqlink.wire.rpc` layouts, and each function's arguments and results through codecs
  compiled once per table entry: no Amaranth object runs per request.
* With a GPU data plane attached (``Dispatcher(..., gpu=GPUDataPlane(...))`` or
  :meth:`Dispatcher.attach_gpu`), the same table also holds DEVICE_CALL entries:
  :meth:`Dispatcher.start` links and launches the persistent unified dispatch kernel
  (:mod:`openqlink.gpu`), :meth:`Dispatcher.poll` answers HOST_CALLs inline, forwards each
  well-formed DEVICE_CALL request into the GPU ring and sends the GPU's responses, and
  :meth:`Dispatcher.stop` stops the kernel.

Every request taken from the ring gets exactly one response (as CUDA-Q's unified dispatch
kernel does, never silencing a PPU that waits). Response status:

====  =================================================================================
   0  ok (``STATUS_OK``)
   1  handler error: the handler raised, or its return value does not fit the result
      schema or ``max_result_bytes``, or the transport could not deliver the response with
      its result (``STATUS_HANDLER_ERROR``); logged
  -1  unknown function_id, or bad magic (``STATUS_UNKNOWN_FUNCTION``, as CUDA-Q)
  -2  ``arg_len`` differs from the entry's schema (``STATUS_BAD_ARG_LEN``)
  -3  the published bytes end before the 24-byte header or before ``24 + arg_len``
      (``STATUS_TRUNCATED``)
====  =================================================================================

Schema checks of DEVICE_CALL requests happen on the host, before forwarding: a request with bad
magic, an unknown function_id, an ``arg_len`` other than the schema's, or fewer bytes than
``24 + arg_len`` is answered by the host with the status above and never reaches the GPU. The
kernel checks magic, function_id and ``arg_len`` again (statuses -1, -2, -3), for transports that
write its ring directly. GPU responses carry the handler's own status (0 ok, > 0 its error, 1
when its result does not fit ``max_result_bytes``). Responses of forwarded requests may be sent
after those of later HOST_CALL requests (the PPU matches responses by request_id).

Without a GPU data plane, :class:`Dispatcher` refuses a table holding DEVICE_CALL entries, and
GRAPH_LAUNCH entries always, with a :class:`openqlink.errors.DispatchError` naming the entry.

# Ref: cuda-quantum realtime/docs/cudaq_realtime_message_protocol.md (RPCHeader, RPCResponse,
# payload types, schema); realtime/include/cudaq/realtime/cudaq_realtime.h
# (cudaq_function_entry_t, cudaq_handler_schema_t, cudaq_dispatch_mode_t);
# realtime/lib/daemon/dispatcher (host ring loop; unified kernel: status -1 responses)
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, Protocol, TypeVar

from .errors import DispatchError, FieldRangeError
from .memory_map import MAILBOX_BYTES
from .wire.rpc import (
    HEADER_BYTES,
    REQUEST_CODEC,
    REQUEST_MAGIC,
    RESPONSE_CODEC,
    RESPONSE_MAGIC,
    STATUS_OK,
    STATUS_UNKNOWN_FUNCTION,
    PayloadType,
    Response,
    fnv1a32,
    pack_bits,
    unpack_bits,
)

__all__ = [
    "DispatchMode",
    "TypeDesc",
    "FunctionEntry",
    "FunctionTable",
    "SlotRing",
    "Dispatcher",
    "Outcome",
    "GPUPlane",
    "MAX_ARGS",
    "MAX_RESULTS",
    "MAX_SLOTS",
    "STATUS_OK",
    "STATUS_HANDLER_ERROR",
    "STATUS_UNKNOWN_FUNCTION",
    "STATUS_BAD_ARG_LEN",
    "STATUS_TRUNCATED",
]

log = logging.getLogger(__name__)

#: ``cudaq_handler_schema_t`` holds at most 8 argument and 4 result descriptors.
MAX_ARGS = 8
MAX_RESULTS = 4
#: The ring slot travels in ImmDt[11:0], so a ring has at most 4096 slots.
MAX_SLOTS = 4096

#: Response status: the handler raised or returned a value the result schema cannot encode.
STATUS_HANDLER_ERROR = 1
#: Response status: the request's ``arg_len`` differs from the function's schema.
STATUS_BAD_ARG_LEN = -2
#: Response status: the published request is shorter than its header or its ``arg_len``.
STATUS_TRUNCATED = -3


class DispatchMode(IntEnum):
    """``cudaq_dispatch_mode_t``: where a function-table entry's handler runs."""

    DEVICE_CALL = 0   #: CUDA device function in the GPU dispatch kernel (openqlink.gpu)
    GRAPH_LAUNCH = 1  #: CUDA graph launched per request (not supported)
    HOST_CALL = 2     #: Python function called by the host dispatcher


_SCALAR = {  # type -> (struct format, size in bytes)
    PayloadType.UINT8: ("B", 1),
    PayloadType.INT32: ("i", 4),
    PayloadType.INT64: ("q", 8),
    PayloadType.FLOAT32: ("f", 4),
    PayloadType.FLOAT64: ("d", 8),
}
_ARRAY = {  # array type -> (element struct format, element size in bytes)
    PayloadType.ARRAY_UINT8: ("B", 1),
    PayloadType.ARRAY_INT32: ("i", 4),
    PayloadType.ARRAY_FLOAT32: ("f", 4),
    PayloadType.ARRAY_FLOAT64: ("d", 8),
}


@dataclass(frozen=True)
class TypeDesc:
    """``cudaq_type_desc_t``: one argument or result of a handler's schema.

    ``size_bytes`` is the bytes it takes in the payload; ``num_elements`` is 1 for scalars, the
    element count for arrays and the number of bits for ``BIT_PACKED``
    (``size_bytes = ceil(bits / 8)``). Build them with the class methods (``TypeDesc.int32()``,
    ``TypeDesc.bits(n)``, ...). Decoded Python values: ``int`` for UINT8/INT32/INT64, ``float``
    for FLOAT32/FLOAT64, ``bytes`` for ARRAY_UINT8, ``list`` for the other arrays, and a list of
    0/1 ints for BIT_PACKED.
    """

    type_id: PayloadType
    size_bytes: int
    num_elements: int = 1

    def __post_init__(self) -> None:
        try:
            type_id = PayloadType(self.type_id)
        except ValueError:
            raise DispatchError(f"TypeDesc.type_id {self.type_id!r} is not a PayloadType") \
                from None
        object.__setattr__(self, "type_id", type_id)
        n = self.num_elements
        if type_id in _SCALAR:
            expect, what = (1, _SCALAR[type_id][1]), "scalar"
        elif type_id in _ARRAY:
            expect, what = (n, n * _ARRAY[type_id][1]), "array"
        else:
            expect, what = (n, (n + 7) // 8), "BIT_PACKED"
        if n < 1 or (n, self.size_bytes) != expect:
            raise DispatchError(
                f"TypeDesc {type_id.name}: size_bytes={self.size_bytes}, "
                f"num_elements={n} is not a valid {what} (expected {expect[1]} bytes, "
                f"{expect[0]} elements)")

    @classmethod
    def uint8(cls) -> TypeDesc:
        return cls(PayloadType.UINT8, 1)

    @classmethod
    def int32(cls) -> TypeDesc:
        return cls(PayloadType.INT32, 4)

    @classmethod
    def int64(cls) -> TypeDesc:
        return cls(PayloadType.INT64, 8)

    @classmethod
    def float32(cls) -> TypeDesc:
        return cls(PayloadType.FLOAT32, 4)

    @classmethod
    def float64(cls) -> TypeDesc:
        return cls(PayloadType.FLOAT64, 8)

    @classmethod
    def bits(cls, num_bits: int) -> TypeDesc:
        """``BIT_PACKED`` measurement bits, LSB-first, ``ceil(num_bits / 8)`` bytes."""
        return cls(PayloadType.BIT_PACKED, (num_bits + 7) // 8, num_bits)

    @classmethod
    def array(cls, type_id: PayloadType, count: int) -> TypeDesc:
        """An ``ARRAY_*`` of ``count`` elements."""
        if type_id not in _ARRAY:
            raise DispatchError(f"TypeDesc.array: {type_id!r} is not an ARRAY_* type")
        return cls(type_id, count * _ARRAY[type_id][1], count)

    @classmethod
    def of(cls, spec: TypeDesc | PayloadType) -> TypeDesc:
        """A :class:`TypeDesc` as is, or a scalar :class:`PayloadType` made into one."""
        if isinstance(spec, TypeDesc):
            return spec
        try:
            type_id = PayloadType(spec)
        except ValueError:
            raise DispatchError(f"{spec!r} is neither a TypeDesc nor a PayloadType") from None
        if type_id not in _SCALAR:
            raise DispatchError(f"{type_id.name} needs a size: use TypeDesc.array() or "
                                "TypeDesc.bits()")
        return cls(type_id, _SCALAR[type_id][1])

    def pack(self) -> bytes:
        """The 12-byte ``cudaq_type_desc_t``: u8 type_id, 3 reserved, u32 size, u32 count."""
        return struct.pack("<B3xII", int(self.type_id), self.size_bytes, self.num_elements)

    def decode(self, buf: bytes) -> Any:
        """Decode exactly ``size_bytes`` bytes of payload into a Python value."""
        assert len(buf) == self.size_bytes
        t = self.type_id
        if t in _SCALAR:
            return struct.unpack("<" + _SCALAR[t][0], buf)[0]
        if t == PayloadType.ARRAY_UINT8:
            return bytes(buf)
        if t in _ARRAY:
            return list(struct.unpack(f"<{self.num_elements}{_ARRAY[t][0]}", buf))
        return unpack_bits(buf, self.num_elements)

    def encode(self, value: Any) -> bytes:
        """Encode a Python value; raises :class:`DispatchError` when it does not fit."""
        t = self.type_id
        try:
            if t in _SCALAR:
                return struct.pack("<" + _SCALAR[t][0], value)
            if t == PayloadType.BIT_PACKED:
                bits = list(value)
                if len(bits) != self.num_elements:
                    raise ValueError(f"{len(bits)} bits, schema says {self.num_elements}")
                return pack_bits(bits)
            values = list(value)
            if len(values) != self.num_elements:
                raise ValueError(f"{len(values)} elements, schema says {self.num_elements}")
            return struct.pack(f"<{self.num_elements}{_ARRAY[t][0]}", *values)
        except (struct.error, TypeError, ValueError, OverflowError) as exc:
            raise DispatchError(f"{value!r} does not encode as {t.name}: {exc}") from None


def _scalar_codec(descs: tuple[TypeDesc, ...]) -> struct.Struct | None:
    """One little-endian struct for a schema of scalars only (``None`` when it has arrays or
    bits: those go through :meth:`TypeDesc.decode`/:meth:`TypeDesc.encode` one by one)."""
    if not all(d.type_id in _SCALAR for d in descs):
        return None
    return struct.Struct("<" + "".join(_SCALAR[d.type_id][0] for d in descs))


def _descs(specs: Iterable[TypeDesc | PayloadType], limit: int, what: str,
           name: str) -> tuple[TypeDesc, ...]:
    out = tuple(TypeDesc.of(s) for s in specs)
    if len(out) > limit:
        raise DispatchError(f"function {name!r}: {len(out)} {what}, at most {limit}")
    return out


@dataclass(frozen=True)
class FunctionEntry:
    """``cudaq_function_entry_t``: one handler, its mode, its schema and its ``function_id``.

    ``handler`` (HOST_CALL) is called with one decoded value per argument and returns ``None``
    (no results), the value of its single result, or a tuple with one value per result. For a
    DEVICE_CALL entry ``handler`` is an :class:`openqlink.gpu.CudaHandler` or
    :class:`~openqlink.gpu.NumbaHandler` (linked into the dispatch module), an address returned by
    :meth:`openqlink.gpu.GPUDataPlane.get_device_handler`, or ``None`` (the GPU data plane has a
    handler of that name).
    ``function_id`` is ``fnv1a32(name)``, computed here. Raises :class:`DispatchError` for a
    non-ASCII or empty name, more than 8 arguments or 4 results, or a HOST_CALL entry without a
    callable handler.
    """

    name: str
    mode: DispatchMode
    args: tuple[TypeDesc, ...] = ()
    results: tuple[TypeDesc, ...] = ()
    handler: Any = None
    function_id: int = field(init=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "function_id", fnv1a32(self.name))
        except ValueError as exc:
            raise DispatchError(f"function name: {exc}") from None
        object.__setattr__(self, "mode", DispatchMode(self.mode))
        object.__setattr__(self, "args", _descs(self.args, MAX_ARGS, "arguments", self.name))
        object.__setattr__(self, "results",
                           _descs(self.results, MAX_RESULTS, "results", self.name))
        if self.mode == DispatchMode.HOST_CALL and not callable(self.handler):
            raise DispatchError(f"HOST_CALL function {self.name!r} needs a callable handler")
        # Scalar-only schemas (the common case) decode and encode with one precompiled struct.
        object.__setattr__(self, "_args_codec", _scalar_codec(self.args))
        object.__setattr__(self, "_results_codec", _scalar_codec(self.results))

    @property
    def arg_len_bytes(self) -> int:
        """The ``arg_len`` every request to this function must carry."""
        return sum(d.size_bytes for d in self.args)

    @property
    def result_len_bytes(self) -> int:
        return sum(d.size_bytes for d in self.results)

    def schema_bytes(self) -> bytes:
        """The 148-byte ``cudaq_handler_schema_t``: u8 num_args, u8 num_results, u16 reserved,
        8 argument and 4 result descriptors of 12 bytes (unused ones zero)."""
        empty = bytes(12)
        return (struct.pack("<BBH", len(self.args), len(self.results), 0)
                + b"".join(d.pack() for d in self.args) + empty * (MAX_ARGS - len(self.args))
                + b"".join(d.pack() for d in self.results)
                + empty * (MAX_RESULTS - len(self.results)))

    def decode_args(self, payload: bytes) -> list[Any] | tuple[Any, ...]:
        """Split ``payload`` (exactly :attr:`arg_len_bytes` long) into decoded arguments."""
        codec = self._args_codec  # type: ignore[attr-defined]
        if codec is not None:
            return codec.unpack(payload)
        out, pos = [], 0
        for d in self.args:
            out.append(d.decode(payload[pos:pos + d.size_bytes]))
            pos += d.size_bytes
        return out

    def encode_results(self, value: Any) -> bytes:
        """Encode a handler's return value per the result schema (see the class docstring)."""
        n = len(self.results)
        if n == 0:
            if value is not None:
                raise DispatchError(f"{self.name}: returned {value!r}, schema has no results")
            return b""
        if n == 1:
            values = [value]
        else:
            if not isinstance(value, tuple | list) or len(value) != n:
                raise DispatchError(f"{self.name}: returned {value!r}, schema has {n} results")
            values = list(value)
        codec = self._results_codec  # type: ignore[attr-defined]
        if codec is not None:
            try:
                return codec.pack(*values)
            except (struct.error, TypeError):
                pass   # the per-result encoders below name the result that does not fit
        out = []
        for i, (d, v) in enumerate(zip(self.results, values, strict=True)):
            try:
                out.append(d.encode(v))
            except DispatchError as exc:
                raise DispatchError(f"{self.name}: result {i}: {exc}") from None
        return b"".join(out)


_F = TypeVar("_F", bound=Callable[..., Any])


class FunctionTable:
    """``cudaq_function_table_t``: entries looked up by ``function_id``.

    Raises :class:`DispatchError` when a name is added twice or two names share a function_id.
    """

    def __init__(self, entries: Iterable[FunctionEntry] = ()):
        self._by_id: dict[int, FunctionEntry] = {}
        for e in entries:
            self.add(e)

    def add(self, entry: FunctionEntry) -> FunctionEntry:
        other = self._by_id.get(entry.function_id)
        if other is not None:
            if other.name == entry.name:
                raise DispatchError(f"function {entry.name!r} is already in the table")
            raise DispatchError(f"functions {other.name!r} and {entry.name!r} share "
                                f"function_id {entry.function_id:#010x}")
        self._by_id[entry.function_id] = entry
        return entry

    def host_call(self, name: str, *, args: Iterable[TypeDesc | PayloadType] = (),
                  results: Iterable[TypeDesc | PayloadType] = ()) -> Callable[[_F], _F]:
        """Decorator registering a Python function as the HOST_CALL handler ``name``."""
        def register(fn: _F) -> _F:
            self.add(FunctionEntry(name, DispatchMode.HOST_CALL, tuple(args), tuple(results),
                                   fn))
            return fn
        return register

    def device_call(self, name: str, handler: Any = None, *,
                    args: Iterable[TypeDesc | PayloadType] = (),
                    results: Iterable[TypeDesc | PayloadType] = ()) -> FunctionEntry:
        """Add the DEVICE_CALL entry ``name`` (``handler``: see :class:`FunctionEntry`)."""
        return self.add(FunctionEntry(name, DispatchMode.DEVICE_CALL, tuple(args),
                                      tuple(results), handler))

    def lookup(self, function_id: int) -> FunctionEntry | None:
        return self._by_id.get(function_id)

    def __getitem__(self, name: str) -> FunctionEntry:
        for e in self._by_id.values():
            if e.name == name:
                return e
        raise KeyError(name)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            return any(e.name == key for e in self._by_id.values())
        return key in self._by_id

    def __iter__(self) -> Iterator[FunctionEntry]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)

    def entries(self) -> list[FunctionEntry]:
        """Every entry, in the order they were added."""
        return list(self._by_id.values())

    @property
    def names(self) -> dict[str, int]:
        """Name -> function_id of every entry (e.g. for :func:`openqlink.isa.disassemble`)."""
        return {e.name: e.function_id for e in self._by_id.values()}

    def unsupported(self) -> list[FunctionEntry]:
        """Entries the host dispatcher cannot run by itself (DEVICE_CALL, GRAPH_LAUNCH)."""
        return [e for e in self._by_id.values() if e.mode != DispatchMode.HOST_CALL]

    def device_calls(self) -> list[FunctionEntry]:
        """The DEVICE_CALL entries, in the order they were added."""
        return [e for e in self._by_id.values() if e.mode == DispatchMode.DEVICE_CALL]


class SlotRing:
    """The host's request ring: ``num_slots`` slots of ``slot_size`` bytes in :attr:`memory`.

    Slot ``s`` occupies ``memory[s * slot_size : (s + 1) * slot_size]``. The transport writes a
    request there (directly, or with :meth:`write`) and then calls :meth:`publish`; the
    dispatcher reads it and :meth:`clear` frees the slot. In CPython the flag store in
    :meth:`publish` happens after the data stores that precede it, so a thread that sees the
    flag sees the data.

    Raises :class:`DispatchError` for ``num_slots`` outside 1..4096 or ``slot_size`` below the
    24-byte RPC header.
    """

    def __init__(self, num_slots: int, slot_size: int):
        if not 1 <= num_slots <= MAX_SLOTS:
            raise DispatchError(f"num_slots must be 1..{MAX_SLOTS}, not {num_slots}")
        if slot_size < HEADER_BYTES:
            raise DispatchError(f"slot_size must be at least {HEADER_BYTES} bytes, "
                                f"not {slot_size}")
        self.num_slots = num_slots
        self.slot_size = slot_size
        self.memory = bytearray(num_slots * slot_size)
        #: Published length of each slot, ``None`` when the slot is free (the rx flags).
        self._flags: list[int | None] = [None] * num_slots
        #: Published slots not yet cleared, oldest first.
        self._order: deque[int] = deque()
        self._wakeup = threading.Event()
        #: :meth:`publish` calls refused because the slot was still full.
        self.overruns = 0

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise DispatchError(f"slot {slot} is outside 0..{self.num_slots - 1}")

    def slot(self, slot: int) -> memoryview:
        """A writable view of slot ``slot``'s ``slot_size`` bytes."""
        self._check_slot(slot)
        return memoryview(self.memory)[slot * self.slot_size:(slot + 1) * self.slot_size]

    def write(self, slot: int, data: bytes, offset_bytes: int = 0) -> None:
        """Copy ``data`` into slot ``slot`` at ``offset_bytes`` (does not publish)."""
        self._check_slot(slot)
        if offset_bytes < 0 or offset_bytes + len(data) > self.slot_size:
            raise DispatchError(f"{len(data)} bytes at offset {offset_bytes} do not fit a "
                                f"{self.slot_size}-byte slot")
        start = slot * self.slot_size + offset_bytes
        self.memory[start:start + len(data)] = data

    def publish(self, slot: int, length: int) -> None:
        """Mark slot ``slot`` as holding a complete request of ``length`` bytes (the rx flag).

        Raises :class:`DispatchError` when ``length`` is outside 1..slot_size, or when the slot
        still holds a request the dispatcher has not taken (counted in :attr:`overruns`).
        """
        self._check_slot(slot)
        if not 1 <= length <= self.slot_size:
            raise DispatchError(f"length {length} is outside 1..{self.slot_size}")
        if self._flags[slot] is not None:
            self.overruns += 1
            raise DispatchError(f"slot {slot} still holds an unprocessed request")
        self._flags[slot] = length
        self._order.append(slot)
        if not self._wakeup.is_set():   # set() takes a lock: only when a waiter may sleep
            self._wakeup.set()

    def ready(self, slot: int) -> bool:
        """True when slot ``slot`` holds a published request."""
        return self._flags[slot] is not None

    def oldest(self) -> int | None:
        """The slot published longest ago and not cleared yet, or ``None``: the order the
        dispatcher serves them in."""
        order = self._order
        return order[0] if order else None

    def take(self, slot: int) -> bytes:
        """A copy of the published bytes of slot ``slot`` (the slot stays full)."""
        length = self._flags[slot]
        if length is None:
            raise DispatchError(f"slot {slot} holds no request")
        start = slot * self.slot_size
        return bytes(self.memory[start:start + length])

    def clear(self, slot: int) -> None:
        """Free slot ``slot`` for the next request."""
        self._check_slot(slot)
        if self._flags[slot] is None:
            return
        self._flags[slot] = None
        order = self._order
        if order and order[0] == slot:
            order.popleft()
        else:
            order.remove(slot)

    def wait(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` for a :meth:`publish` since the last call; True if one
        came. For idle waiting in :meth:`Dispatcher.run_forever`, never in a cocotb bench."""
        got = self._wakeup.wait(timeout_s)
        self._wakeup.clear()
        return got


def _error_response(request_id: int, ptp_timestamp: int) -> bytes:
    return RESPONSE_CODEC.pack(RESPONSE_MAGIC, STATUS_HANDLER_ERROR, 0, request_id, ptp_timestamp)


class Outcome(Enum):
    """What became of one request, with the response status it got."""

    OK = "ok"
    HANDLER_ERROR = "handler_error"
    UNKNOWN_FUNCTION = "unknown_function"
    BAD_MAGIC = "bad_magic"
    BAD_ARG_LEN = "bad_arg_len"
    TRUNCATED = "truncated"

    @property
    def status(self) -> int:
        return _STATUS_OF[self]


_STATUS_OF = {
    Outcome.OK: STATUS_OK,
    Outcome.HANDLER_ERROR: STATUS_HANDLER_ERROR,
    Outcome.UNKNOWN_FUNCTION: STATUS_UNKNOWN_FUNCTION,
    Outcome.BAD_MAGIC: STATUS_UNKNOWN_FUNCTION,
    Outcome.BAD_ARG_LEN: STATUS_BAD_ARG_LEN,
    Outcome.TRUNCATED: STATUS_TRUNCATED,
}


def _outcome_of_status(status: int) -> Outcome:
    """The :class:`Outcome` a GPU response status stands for (> 0: the handler's error)."""
    if status == STATUS_OK:
        return Outcome.OK
    if status > 0:
        return Outcome.HANDLER_ERROR
    return {STATUS_BAD_ARG_LEN: Outcome.BAD_ARG_LEN,
            STATUS_TRUNCATED: Outcome.TRUNCATED}.get(status, Outcome.UNKNOWN_FUNCTION)


class GPUPlane(Protocol):
    """What :class:`Dispatcher` needs of a GPU data plane (:class:`openqlink.gpu.GPUDataPlane`).

    ``start(entries, max_result_bytes=)`` builds the device table from the DEVICE_CALL entries
    and launches the kernel; ``can_submit()``/``submit(request) -> gpu_slot`` forward a request
    into the GPU ring in ring order; ``poll_response()`` returns the next ``(gpu_slot,
    response)`` in ring order or ``None``; ``stop()`` stops the kernel (every request posted
    before is still answered); ``processed`` counts the kernel's answers.
    """

    slot_size: int

    @property
    def running(self) -> bool: ...

    @property
    def processed(self) -> int: ...

    def start(self, entries: Iterable[FunctionEntry] | None = None, *,
              max_result_bytes: int | None = None) -> None: ...

    def stop(self, timeout_s: float = 10.0) -> int: ...

    def can_submit(self) -> bool: ...

    def submit(self, request: bytes) -> int: ...

    def poll_response(self) -> tuple[int, bytes] | None: ...


class Dispatcher:
    """Non-blocking RPC dispatcher over a :class:`SlotRing` and a :class:`FunctionTable`.

    Parameters
    ----------
    table : FunctionTable
        Handlers. HOST_CALL entries run inline; DEVICE_CALL entries need ``gpu``; GRAPH_LAUNCH
        entries make the constructor and :meth:`poll` raise :class:`DispatchError`.
    ring : SlotRing
        The request ring the transport publishes into.
    send_response : callable(slot: int, response: bytes) -> None
        Sends one packed ``RPCResponse`` (24-byte header + result) for the request that was in
        ``slot``; e.g. the transport's UC SEND to the PPU's mailbox.
    max_result_bytes : int, optional
        Largest result a response may carry: default 40, what a PPU's 64-byte mailbox holds
        after the 24-byte header (:data:`~openqlink.memory_map.MAILBOX_BYTES`), or less when
        the slot is smaller (``slot_size - 24``, CUDA-Q's ``max_result_len``). It caps GPU
        handlers too. A longer result becomes a HANDLER_ERROR response; so does a response
        that ``send_response`` refuses with a
        :class:`~openqlink.errors.FieldRangeError` (too long for the transport): the PPU
        gets an error status at once instead of waiting for its time-out.
    gpu : GPUPlane, optional
        The GPU data plane running DEVICE_CALL entries (:class:`openqlink.gpu.GPUDataPlane`);
        :meth:`start` must be called before :meth:`poll` when one is attached.

    Attributes
    ----------
    processed : int
        Requests answered (inline, and GPU responses sent).
    forwarded : int
        DEVICE_CALL requests forwarded to the GPU.
    gpu_status_counts : collections.Counter[int]
        GPU responses per status, as the kernel wrote it.
    counts : collections.Counter[Outcome]
        Requests per :class:`Outcome`; :attr:`status_counts` groups them by response status.
    send_errors : int
        ``send_response`` calls that raised.
    """

    def __init__(self, table: FunctionTable, ring: SlotRing,
                 send_response: Callable[[int, bytes], None], *,
                 max_result_bytes: int | None = None, gpu: GPUPlane | None = None):
        self.table = table
        self.ring = ring
        self.send_response = send_response
        self.max_result_bytes = (min(ring.slot_size, MAILBOX_BYTES) - HEADER_BYTES
                                 if max_result_bytes is None else max_result_bytes)
        if self.max_result_bytes < 0:
            raise DispatchError(f"max_result_bytes must be >= 0, not {max_result_bytes}")
        self.processed = 0
        self.counts: Counter[Outcome] = Counter()
        self.send_errors = 0
        self.forwarded = 0
        self.gpu_status_counts: Counter[int] = Counter()
        self.gpu: GPUPlane | None = gpu
        self._gpu_pending: deque[int] = deque()  # host slots of forwarded requests, in order
        self._started = False
        self._checked: tuple[int, int, int] | None = None
        self._refuse_unsupported()

    def attach_gpu(self, gpu: GPUPlane) -> None:
        """Attach a GPU data plane (before :meth:`start`); raises :class:`DispatchError` when one
        is attached and started already."""
        if self._started and self.gpu is not None:
            raise DispatchError("a GPU data plane is already attached and started")
        self.gpu = gpu

    @property
    def gpu_processed(self) -> int:
        """Requests the GPU kernel has answered (its own counter; 0 without a GPU)."""
        return self.gpu.processed if self.gpu is not None else 0

    @property
    def gpu_outstanding(self) -> int:
        """Requests forwarded to the GPU whose response has not been sent yet."""
        return len(self._gpu_pending)

    def start(self) -> None:
        """Start the GPU path: build the device table from the DEVICE_CALL entries, link and
        launch the persistent kernel (:meth:`GPUPlane.start`). Without a GPU data plane, or
        without DEVICE_CALL entries, there is nothing to start.

        Raises :class:`DispatchError` for unsupported entries or a DEVICE_CALL handler address
        that did not come from the data plane's ``get_device_handler``, and what the data plane
        raises (compile, link and GPU errors).
        """
        self._refuse_unsupported()
        entries = self.table.device_calls()
        if self.gpu is not None and entries and not self.gpu.running:
            self.gpu.start(entries, max_result_bytes=self.max_result_bytes)
        self._started = True

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the GPU kernel (it answers what was forwarded first) and send the responses
        still in its ring. Raises what ``send_response`` raises and
        :class:`openqlink.errors.GPUError` when the kernel does not stop."""
        self._started = False
        if self.gpu is not None and self.gpu.running:
            self.gpu.stop(timeout_s)
        if self.gpu is not None:
            self._collect_gpu()

    @property
    def status_counts(self) -> dict[int, int]:
        """Requests per response status (bad magic and unknown function both count as -1)."""
        out: Counter[int] = Counter()
        for outcome, n in self.counts.items():
            out[outcome.status] += n
        return dict(out)

    def _refuse_unsupported(self) -> None:
        # Entries are only ever added: a table is checked again when it has grown (or when
        # another table or data plane took its place).
        checked = (id(self.table), len(self.table), id(self.gpu))
        if checked == self._checked:
            return
        bad = self.table.unsupported()
        if self.gpu is not None:
            bad = [e for e in bad if e.mode != DispatchMode.DEVICE_CALL]
        if bad:
            names = ", ".join(f"{e.name!r} ({e.mode.name})" for e in bad)
            if all(e.mode == DispatchMode.DEVICE_CALL for e in bad):
                raise DispatchError(f"the host dispatcher runs HOST_CALL entries only; {names} "
                                    "need the GPU dispatch path: attach a GPU data plane "
                                    "(Dispatcher(..., gpu=openqlink.gpu.GPUDataPlane(...)))")
            raise DispatchError(f"{names}: GRAPH_LAUNCH entries are not supported; HOST_CALL "
                                "runs on the host, DEVICE_CALL on the GPU data plane")
        self._checked = checked

    def _device_request(self, buf: bytes) -> bytes | None:
        """The bytes to forward when ``buf`` is a well-formed DEVICE_CALL request, else None
        (then :meth:`dispatch` answers it, with the error status it deserves)."""
        if len(buf) < HEADER_BYTES:
            return None
        magic, function_id, arg_len, _rid, _ts = REQUEST_CODEC.unpack_from(buf)
        if magic != REQUEST_MAGIC:
            return None
        entry = self.table.lookup(function_id)
        if entry is None or entry.mode != DispatchMode.DEVICE_CALL:
            return None
        end = HEADER_BYTES + arg_len
        if arg_len != entry.arg_len_bytes or end > len(buf):
            return None
        return buf[:end]

    def _collect_gpu(self) -> int:
        """Send the GPU responses that are ready, in ring order; returns how many."""
        gpu = self.gpu
        assert gpu is not None
        n = 0
        while self._gpu_pending:
            got = gpu.poll_response()
            if got is None:
                break
            _gpu_slot, data = got
            slot = self._gpu_pending.popleft()
            status = struct.unpack_from("<i", data, 4)[0] if len(data) >= 8 else \
                STATUS_UNKNOWN_FUNCTION
            self.processed += 1
            self.gpu_status_counts[status] += 1
            n += 1
            self._send(slot, data, _outcome_of_status(status))
        return n

    def _send(self, slot: int, data: bytes, outcome: Outcome) -> None:
        """Send one response and count its outcome. A response with a result that the transport
        refuses as too long (:class:`FieldRangeError`) goes out as a HANDLER_ERROR response
        without it; what else ``send_response`` raises is counted in :attr:`send_errors` and
        re-raised."""
        try:
            try:
                self.send_response(slot, data)
            except FieldRangeError as exc:
                if len(data) <= HEADER_BYTES:
                    raise
                _magic, _status, _len, rid, ts = RESPONSE_CODEC.unpack_from(data)
                log.error("request %#x: the response cannot be delivered (%s); sending status "
                          "%d", rid, exc, STATUS_HANDLER_ERROR)
                outcome = Outcome.HANDLER_ERROR
                self.send_response(slot, _error_response(rid, ts))
        except Exception:
            self.counts[outcome] += 1
            self.send_errors += 1
            raise
        self.counts[outcome] += 1

    def dispatch(self, request: bytes) -> Response:
        """Answer one request (the published bytes of a slot, or one UDP datagram).

        Counts the outcome and returns the :class:`Response`; never raises for bad input.
        """
        response, outcome = self._handle(bytes(request))
        self.processed += 1
        self.counts[outcome] += 1
        return Response.unpack(response)

    def _handle(self, buf: bytes) -> tuple[bytes, Outcome]:
        """The packed response to request ``buf`` and its outcome."""
        n = len(buf)
        magic, function_id, arg_len, rid, ts = REQUEST_CODEC.unpack_from(
            buf if n >= HEADER_BYTES else bytes(buf).ljust(HEADER_BYTES, b"\0"))

        def fail(outcome: Outcome, why: str) -> tuple[bytes, Outcome]:
            log.warning("request %#x: %s -> status %d", rid, why, outcome.status)
            return RESPONSE_CODEC.pack(RESPONSE_MAGIC, outcome.status, 0, rid, ts), outcome

        if n < HEADER_BYTES:
            return fail(Outcome.TRUNCATED, f"{n} bytes, shorter than the header")
        if magic != REQUEST_MAGIC:
            return fail(Outcome.BAD_MAGIC, f"magic {magic:#010x} is not CUQR")
        entry = self.table.lookup(function_id)
        if entry is None:
            return fail(Outcome.UNKNOWN_FUNCTION, f"unknown function_id {function_id:#010x}")
        if arg_len != entry.arg_len_bytes:
            return fail(Outcome.BAD_ARG_LEN, f"{entry.name}: arg_len {arg_len}, schema "
                                             f"needs {entry.arg_len_bytes}")
        end = HEADER_BYTES + arg_len
        if end > n:
            return fail(Outcome.TRUNCATED, f"{entry.name}: arg_len {arg_len} runs past "
                                           f"the {n} published bytes")
        if entry.mode != DispatchMode.HOST_CALL:
            return fail(Outcome.UNKNOWN_FUNCTION, f"{entry.name} is {entry.mode.name} and no "
                                                  "GPU data plane runs it")
        assert entry.handler is not None  # HOST_CALL entries always have one
        try:
            value = entry.handler(*entry.decode_args(buf[HEADER_BYTES:end]))
        except Exception:
            log.exception("request %#x: handler %r raised", rid, entry.name)
            return _error_response(rid, ts), Outcome.HANDLER_ERROR
        try:
            result = entry.encode_results(value)
        except DispatchError as exc:
            log.error("request %#x: %s", rid, exc)
            return _error_response(rid, ts), Outcome.HANDLER_ERROR
        if len(result) > self.max_result_bytes:
            log.error("request %#x: %s: %d result bytes, at most %d", rid, entry.name,
                      len(result), self.max_result_bytes)
            return _error_response(rid, ts), Outcome.HANDLER_ERROR
        return (RESPONSE_CODEC.pack(RESPONSE_MAGIC, STATUS_OK, len(result), rid, ts) + result,
                Outcome.OK)

    def poll(self, max_requests: int | None = None) -> int:
        """Answer the published requests, oldest first (:meth:`SlotRing.oldest`); never blocks.

        Stops when no slot is published, or after ``max_requests`` taken. A slot is served
        whenever it is published, whatever became of the slots before it (a lost request stalls
        nothing). For each request: decode, call the handler, free the slot, then
        ``send_response(slot, bytes)`` (the slot is freed first: the response is built from a
        copy, and the QSC may reuse the slot as soon as it has the response). With a GPU data
        plane, a well-formed DEVICE_CALL request is copied into the GPU ring and its slot freed
        (when the GPU ring is full, it stays and polling stops there), and the GPU responses
        that are ready are sent. Returns the number of responses sent.

        Raises :class:`DispatchError` for unsupported entries, or a GPU data plane not started,
        and re-raises what ``send_response`` raised (counted in :attr:`send_errors`; the
        request is already counted and its slot freed).
        """
        self._refuse_unsupported()
        if max_requests is not None and max_requests < 0:
            raise ValueError(f"max_requests must be >= 0, not {max_requests}")
        gpu = self.gpu
        if gpu is not None and self.table.device_calls() and not gpu.running \
                and not self._gpu_pending:
            raise DispatchError("the GPU data plane is not running: call Dispatcher.start()")
        done = self._collect_gpu() if gpu is not None else 0
        taken = 0
        ring = self.ring
        while max_requests is None or taken < max_requests:
            slot = ring.oldest()
            if slot is None:
                break
            request = ring.take(slot)
            if gpu is not None:
                forward = self._device_request(request)
                if forward is not None:
                    if not gpu.running or not gpu.can_submit():
                        break
                    gpu.submit(forward)
                    self._gpu_pending.append(slot)
                    self.forwarded += 1
                    ring.clear(slot)
                    taken += 1
                    continue
            response, outcome = self._handle(request)
            ring.clear(slot)
            taken += 1
            done += 1
            self.processed += 1
            self._send(slot, response, outcome)
        if gpu is not None:
            done += self._collect_gpu()
        return done

    def run_forever(self, stop_event: threading.Event, *, idle_wait_s: float = 1e-3) -> None:
        """Poll until ``stop_event`` is set: the thread mode.

        Waits on the ring's wake-up (up to ``idle_wait_s``) when nothing is ready, so an idle
        dispatcher does not spin (it does not wait while GPU responses are outstanding);
        ``idle_wait_s=0`` busy-polls for the lowest latency. A
        ``send_response`` failure is logged and polling goes on; a :class:`DispatchError` from
        :meth:`poll` (unsupported entries) ends the loop by raising.
        """
        self._refuse_unsupported()
        while not stop_event.is_set():
            try:
                n = self.poll()
            except DispatchError:
                raise
            except Exception:
                log.exception("send_response failed")
                continue
            if n == 0 and idle_wait_s > 0 and not self._gpu_pending:
                self.ring.wait(idle_wait_s)
