"""CUDA-Q realtime RPC message protocol: request and response headers, function ids, payloads.

All fields little-endian; 24-byte headers followed by the payload. Because Amaranth layouts are
LSB-first and the protocol is little-endian, the headers are :class:`amaranth.lib.data.Struct`
layouts, used as they are by the gateware. The host packs and unpacks them with
:class:`struct.Struct` codecs derived from those layouts at import (:data:`REQUEST_CODEC`,
:data:`RESPONSE_CODEC`): no Amaranth object runs per request.

# Ref: cuda-quantum realtime/docs/cudaq_realtime_message_protocol.md;
# realtime/include/cudaq/realtime/daemon/dispatcher/rpc_wire_format.h
"""

# No ``from __future__ import annotations``: data.Struct reads its annotations as shapes.
import struct
from dataclasses import dataclass

from amaranth.hdl import signed, unsigned
from amaranth.lib import data, enum

from ..errors import FieldRangeError, TruncatedError, WireFormatError

__all__ = [
    "REQUEST_MAGIC", "RESPONSE_MAGIC", "HEADER_BYTES",
    "RPCHeader", "RPCResponse", "PayloadType",
    "Request", "Response", "fnv1a32", "pack_bits", "unpack_bits",
    "struct_codec", "REQUEST_CODEC", "RESPONSE_CODEC",
    "STATUS_OK", "STATUS_UNKNOWN_FUNCTION",
]

#: ``RPCHeader.magic``: ASCII "CUQR" read as a little-endian u32 (wire bytes ``52 51 55 43``).
REQUEST_MAGIC = 0x43555152
#: ``RPCResponse.magic``: "CUQS" (wire bytes ``53 51 55 43``).
RESPONSE_MAGIC = 0x43555153
#: Size of both headers in bytes (``CUDAQ_RPC_HEADER_SIZE``).
HEADER_BYTES = 24
#: Response status of a handled call.
STATUS_OK = 0
#: Protocol error returned for a function_id that no function-table entry matches.
STATUS_UNKNOWN_FUNCTION = -1


class RPCHeader(data.Struct):
    """Request header (24 bytes): magic, function_id, arg_len, request_id, ptp_timestamp."""

    magic: unsigned(32)
    function_id: unsigned(32)
    arg_len: unsigned(32)
    request_id: unsigned(32)
    ptp_timestamp: unsigned(64)


class RPCResponse(data.Struct):
    """Response header (24 bytes): magic, status (i32), result_len, request_id, ptp_timestamp."""

    magic: unsigned(32)
    status: signed(32)
    result_len: unsigned(32)
    request_id: unsigned(32)
    ptp_timestamp: unsigned(64)


def struct_codec(layout, byte_order: str = "<") -> struct.Struct:
    """The :class:`struct.Struct` that packs and unpacks ``layout``'s fields in offset order.

    ``layout`` is a :class:`~amaranth.lib.data.Struct` (or its layout) whose fields are byte
    aligned and 8, 16, 32 or 64 bits wide, signed or not; ``byte_order`` is a :mod:`struct`
    prefix (``"<"``: the protocol's little-endian). Raises :class:`ValueError` for a field the
    :mod:`struct` module cannot represent. The layout stays the single definition; this is its
    fast form for the host's per-request path.
    """
    codes = {8: "b", 16: "h", 32: "i", 64: "q"}
    fmt, pos = byte_order, 0
    for name, f in sorted(data.Layout.cast(layout), key=lambda item: item[1].offset):
        if f.offset != pos or f.width not in codes:
            raise ValueError(f"field {name!r} ({f.width} bits at bit {f.offset}) is not a "
                             "whole, byte-aligned 8/16/32/64-bit field")
        code = codes[f.width]
        fmt += code if f.shape.signed else code.upper()
        pos += f.width
    return struct.Struct(fmt)


#: ``(magic, function_id, arg_len, request_id, ptp_timestamp)`` of :class:`RPCHeader`.
REQUEST_CODEC = struct_codec(RPCHeader)
#: ``(magic, status, result_len, request_id, ptp_timestamp)`` of :class:`RPCResponse`.
RESPONSE_CODEC = struct_codec(RPCResponse)


class PayloadType(enum.IntEnum, shape=8):
    """``cudaq_payload_type_id`` of the function-table schema."""

    UINT8 = 0x10
    INT32 = 0x11
    INT64 = 0x12
    FLOAT32 = 0x13
    FLOAT64 = 0x14
    ARRAY_UINT8 = 0x20
    ARRAY_INT32 = 0x21
    ARRAY_FLOAT32 = 0x22
    ARRAY_FLOAT64 = 0x23
    BIT_PACKED = 0x30


def fnv1a32(name: str) -> int:
    """32-bit FNV-1a of a handler name: CUDA-Q's ``function_id``.

    Offset basis 2166136261, prime 16777619. Names must be ASCII: CUDA-Q hashes C ``char``, whose
    signedness differs between x86 and Arm, so non-ASCII names would hash differently there.
    Raises :class:`ValueError` for a non-ASCII or empty name.
    """
    if not name:
        raise ValueError("function name must not be empty")
    if not name.isascii():
        raise ValueError(f"function name {name!r} is not ASCII (CUDA-Q hashes signed chars)")
    h = 2166136261
    for byte in name.encode("ascii"):
        h ^= byte
        h = (h * 16777619) & 0xFFFFFFFF
    return h


def pack_bits(bits: list[int] | tuple[int, ...]) -> bytes:
    """Measurement bits packed LSB-first into ``ceil(len(bits)/8)`` bytes, unused bits zero."""
    out = bytearray((len(bits) + 7) // 8)
    for i, b in enumerate(bits):
        if b not in (0, 1, True, False):
            raise ValueError(f"bit {i} is {b!r}, not 0 or 1")
        if b:
            out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def unpack_bits(buf: bytes, nbits: int) -> list[int]:
    """Inverse of :func:`pack_bits`."""
    if len(buf) < (nbits + 7) // 8:
        raise TruncatedError("BIT_PACKED", "payload", None,
                             f"{nbits} bits need {(nbits + 7) // 8} bytes, got {len(buf)}")
    return [(buf[i // 8] >> (i % 8)) & 1 for i in range(nbits)]


def _u(header: str, field: str, value: int, bits: int, *, signed_: bool = False) -> int:
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed_ else (0, 1 << bits)
    if not lo <= value < hi:
        raise FieldRangeError(header, field, value, f"{value} does not fit in {bits} bits")
    return value


@dataclass(frozen=True)
class Request:
    """A decoded RPC request: the header fields and the argument bytes."""

    function_id: int
    request_id: int
    ptp_timestamp: int
    payload: bytes

    def pack(self) -> bytes:
        """Header and payload as sent on the wire (no slot padding)."""
        _u("RPCHeader", "function_id", self.function_id, 32)
        _u("RPCHeader", "request_id", self.request_id, 32)
        _u("RPCHeader", "ptp_timestamp", self.ptp_timestamp, 64)
        return REQUEST_CODEC.pack(REQUEST_MAGIC, self.function_id, len(self.payload),
                                  self.request_id, self.ptp_timestamp) + bytes(self.payload)

    @classmethod
    def unpack(cls, buf: bytes | bytearray | memoryview) -> "Request":
        """Decode a request from the start of ``buf`` (e.g. a whole ring slot).

        Raises :class:`WireFormatError` naming ``magic`` or ``arg_len`` when they are wrong and
        :class:`TruncatedError` when ``buf`` is shorter than the header plus ``arg_len``.
        """
        buf = bytes(buf)
        if len(buf) < HEADER_BYTES:
            raise TruncatedError("RPCHeader", "magic", None,
                                 f"needs {HEADER_BYTES} bytes, got {len(buf)}")
        magic, function_id, arg_len, request_id, ptp_timestamp = REQUEST_CODEC.unpack_from(buf)
        if magic != REQUEST_MAGIC:
            raise WireFormatError("RPCHeader", "magic", magic,
                                  f"{magic:#010x} is not CUQR ({REQUEST_MAGIC:#010x})")
        end = HEADER_BYTES + arg_len
        if len(buf) < end:
            raise TruncatedError("RPCHeader", "arg_len", arg_len,
                                 f"arg_len {arg_len} runs past the {len(buf)}-byte buffer")
        return cls(function_id, request_id, ptp_timestamp, buf[HEADER_BYTES:end])


@dataclass(frozen=True)
class Response:
    """A decoded RPC response: status, echoed request_id and ptp_timestamp, result bytes."""

    status: int
    request_id: int
    ptp_timestamp: int
    result: bytes = b""

    def pack(self) -> bytes:
        _u("RPCResponse", "status", self.status, 32, signed_=True)
        _u("RPCResponse", "request_id", self.request_id, 32)
        _u("RPCResponse", "ptp_timestamp", self.ptp_timestamp, 64)
        return RESPONSE_CODEC.pack(RESPONSE_MAGIC, self.status, len(self.result),
                                   self.request_id, self.ptp_timestamp) + bytes(self.result)

    @classmethod
    def unpack(cls, buf: bytes | bytearray | memoryview) -> "Response":
        buf = bytes(buf)
        if len(buf) < HEADER_BYTES:
            raise TruncatedError("RPCResponse", "magic", None,
                                 f"needs {HEADER_BYTES} bytes, got {len(buf)}")
        magic, status, result_len, request_id, ptp_timestamp = RESPONSE_CODEC.unpack_from(buf)
        if magic != RESPONSE_MAGIC:
            raise WireFormatError("RPCResponse", "magic", magic,
                                  f"{magic:#010x} is not CUQS ({RESPONSE_MAGIC:#010x})")
        end = HEADER_BYTES + result_len
        if len(buf) < end:
            raise TruncatedError("RPCResponse", "result_len", result_len,
                                 f"result_len {result_len} runs past the {len(buf)}-byte buffer")
        return cls(status, request_id, ptp_timestamp, buf[HEADER_BYTES:end])
