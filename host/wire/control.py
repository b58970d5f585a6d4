"""QSC control plane: Holoscan Sensor Bridge control-bus compatible requests and responses.

UDP port 8192, big-endian. A DWORD request is 14 bytes (a RD_DWORD may come without its data
word: 10 bytes), its response 16 bytes. A block request (WR_BLOCK, RD_BLOCK) is a 6-byte header
(cmd, flags, seq, reserved) and then 1 to :data:`BLOCK_MAX_PAIRS` (addr, value) pairs (a
RD_BLOCK's values are 0); its response is a 6-byte header (cmd, flags, seq, status, reserved),
one (addr, value) pair per pair executed (value 0 for a write), and the latched sequence
number: ``6 + 8 n + 2`` bytes. Every
response is at least 18 bytes (zero padding), as Holoscan Sensor Bridge's RTL pads them.

# Ref: Holoscan Sensor Bridge host library (hololink ``ECB`` control packets) and its FPGA IP
# user guide.
"""

from __future__ import annotations

from amaranth.lib import enum

from ..errors import FieldRangeError, TruncatedError
from .header import Header

__all__ = ["CONTROL_REQUEST", "CONTROL_RESPONSE", "CONTROL_BLOCK_HEADER", "CONTROL_PAIR",
           "CONTROL_RESPONSE_HEADER", "Command", "Flags", "Status", "RD_DWORD_SHORT_BYTES",
           "BLOCK_MAX_PAIRS", "RESPONSE_MIN_BYTES", "pack_block_request", "unpack_block_request",
           "pack_response", "unpack_response"]

#: Request: cmd(8) flags(8) seq(16) reserved(16) addr(32) data(32).
CONTROL_REQUEST = Header("ControlRequest", [
    ("cmd", 8), ("flags", 8), ("seq", 16), ("reserved", 16), ("addr", 32), ("data", 32),
], ref="HSB control bus (ECB) request")

#: Bytes of a RD_DWORD as the Holoscan Sensor Bridge host library sends it (``read_uint32``):
#: the request without its data word. A QSC takes both this form and the 14-byte one.
RD_DWORD_SHORT_BYTES = 10

#: Response: cmd|0x80 (8) flags(8) seq(16) status(8) reserved(8) addr(32) value(32)
#: latched_seq(16).
CONTROL_RESPONSE = Header("ControlResponse", [
    ("cmd", 8), ("flags", 8), ("seq", 16), ("status", 8), ("reserved", 8),
    ("addr", 32), ("value", 32), ("latched_seq", 16),
], ref="HSB control bus (ECB) response")


#: A block request's header: cmd(8) flags(8) seq(16) reserved(16); the pairs follow (a DWORD
#: request is this header and one pair).
CONTROL_BLOCK_HEADER = Header("ControlBlockHeader", [
    ("cmd", 8), ("flags", 8), ("seq", 16), ("reserved", 16),
], ref="HSB control bus (ECB) block request")

#: One (addr, value) pair of a block request or of a response.
CONTROL_PAIR = Header("ControlPair", [("addr", 32), ("value", 32)],
                      ref="HSB control bus (ECB) block pair")

#: A response's header: cmd|0x80 (8) flags(8) seq(16) status(8) reserved(8); the pairs and
#: ``latched_seq`` (16) follow.
CONTROL_RESPONSE_HEADER = Header("ControlResponseHeader", [
    ("cmd", 8), ("flags", 8), ("seq", 16), ("status", 8), ("reserved", 8),
], ref="HSB control bus (ECB) response")

#: Pairs in the largest block request: the Holoscan Sensor Bridge host's 1472-byte control
#: packet (a 1500-byte IPv4 MTU less the IPv4 and UDP headers) less the 6-byte header.
BLOCK_MAX_PAIRS = (1472 - CONTROL_BLOCK_HEADER.length_bytes) // CONTROL_PAIR.length_bytes

#: Bytes of the shortest response (one pair, padded): Holoscan Sensor Bridge's RTL pads every
#: response of at most one pair to 18 bytes.
RESPONSE_MIN_BYTES = 18

assert CONTROL_RESPONSE.length_bytes == (CONTROL_RESPONSE_HEADER.length_bytes +
                                         CONTROL_PAIR.length_bytes + 2)


class Command(enum.IntEnum, shape=8):
    WR_DWORD = 0x04
    WR_BLOCK = 0x09
    RD_DWORD = 0x14
    RD_BLOCK = 0x19


#: Bit set in ``cmd`` of every response.
RESPONSE_BIT = 0x80


class Flags(enum.IntFlag, shape=8):
    ACK_REQUEST = 0x01
    SEQUENCE_CHECK = 0x02


class Status(enum.IntEnum, shape=8):
    """Response status: Holoscan Sensor Bridge's values, then openqlink's own from 0x20.

    ``PPU_TIMEOUT`` (an openqlink extension; HSB defines 0x00-0x0B and the host-side 0xF0): the
    PPU side (``dtd`` domain) did not take or answer the access within the control plane's
    bound (:data:`openqlink.gateware.net.control.PPU_TIMEOUT_CYCLES` ``rti`` cycles): its clock is
    stopped, it is held in reset, or the crossing to it stayed full. A WR_DWORD so answered was
    not executed; a RD_DWORD may still be executed later (its answer is discarded).

    ``CLAIMED`` (an openqlink extension): another host claimed the QSC (its global CLAIM
    register, see :mod:`openqlink.memory_map`): the write was not executed, and the request
    neither checked nor latched the sequence number. Reads are never refused.
    """

    OK = 0x00
    BAD_ADDRESS = 0x03
    BAD_COMMAND = 0x04
    BAD_LENGTH = 0x05
    BAD_FLAGS = 0x06
    SEQUENCE_ERROR = 0x0B
    PPU_TIMEOUT = 0x20
    CLAIMED = 0x21


def pack_block_request(cmd: int, flags: int, seq: int, pairs: list[tuple[int, int]]) -> bytes:
    """A WR_BLOCK or RD_BLOCK request: the header, then ``pairs`` as (addr, value) (32 bits each;
    a RD_BLOCK's values are 0), as the Holoscan Sensor Bridge host serializes it.

    Raises :class:`~openqlink.errors.FieldRangeError` for no pairs or more than
    :data:`BLOCK_MAX_PAIRS`, or a field that does not fit.
    """
    if not 1 <= len(pairs) <= BLOCK_MAX_PAIRS:
        raise FieldRangeError("ControlBlockHeader", "pairs", len(pairs),
                              f"a block carries 1..{BLOCK_MAX_PAIRS} pairs, not {len(pairs)}")
    return (CONTROL_BLOCK_HEADER.pack(cmd=cmd, flags=flags, seq=seq) +
            b"".join(CONTROL_PAIR.pack(addr=a, value=v) for a, v in pairs))


def unpack_block_request(payload: bytes) -> tuple[dict[str, int], list[tuple[int, int]]]:
    """The header and the whole (addr, value) pairs of a block request (trailing bytes that
    make no whole pair are ignored, as the QSC ignores them).

    Raises :class:`~openqlink.errors.TruncatedError` when ``payload`` is shorter than the header.
    """
    head = CONTROL_BLOCK_HEADER.unpack(payload)
    at = CONTROL_BLOCK_HEADER.length_bytes
    size = CONTROL_PAIR.length_bytes
    pairs = [tuple(CONTROL_PAIR.unpack(payload, at + size * k).values())
             for k in range((len(payload) - at) // size)]
    return head, pairs


def pack_response(*, cmd: int, flags: int, seq: int, status: int,
                  pairs: list[tuple[int, int]], latched_seq: int) -> bytes:
    """A response with ``pairs`` (at least one), padded to :data:`RESPONSE_MIN_BYTES`."""
    if not pairs:
        raise FieldRangeError("ControlResponse", "pairs", 0, "a response carries a pair")
    body = (CONTROL_RESPONSE_HEADER.pack(cmd=cmd, flags=flags, seq=seq, status=status) +
            b"".join(CONTROL_PAIR.pack(addr=a, value=v) for a, v in pairs) +
            latched_seq.to_bytes(2, "big"))
    return body.ljust(RESPONSE_MIN_BYTES, b"\0")


def unpack_response(payload: bytes) -> dict:
    """Decode a response (DWORD or block): the header's fields, ``pairs`` [(addr, value)],
    ``addr`` and ``value`` of the first pair, and ``latched_seq``.

    The pair count comes from the length: ``(len - 8) // 8``, at least 1 (a response of one
    pair is padded to 18 bytes).

    Raises :class:`~openqlink.errors.TruncatedError` when ``payload`` is shorter than a one-pair
    response (16 bytes).
    """
    if len(payload) < CONTROL_RESPONSE.length_bytes:
        raise TruncatedError("ControlResponse", "latched_seq", None,
                             f"needs {CONTROL_RESPONSE.length_bytes} bytes, {len(payload)} came")
    out: dict = CONTROL_RESPONSE_HEADER.unpack(payload)
    at = CONTROL_RESPONSE_HEADER.length_bytes
    size = CONTROL_PAIR.length_bytes
    count = max(1, (len(payload) - at - 2) // size)
    pairs = [tuple(CONTROL_PAIR.unpack(payload, at + size * k).values()) for k in range(count)]
    end = at + size * count
    out.update(addr=pairs[0][0], value=pairs[0][1], pairs=pairs,
               latched_seq=int.from_bytes(payload[end:end + 2], "big"))
    return out
