"""The internal bus between the network core (``rti``) and the PPUs (``dtd``).

Everything that reaches a PPU from the network, RDMA WRITE data, control-plane register accesses,
SEND payloads for the response mailbox, crosses the clock domains as a :class:`BusCommand` through
one asynchronous FIFO (``rti`` -> ``dtd``, :class:`~openqlink.gateware.cdc.CrossingFIFO`), in
order; reads are answered with a :class:`BusReadData` through a second one (``dtd`` -> ``rti``),
in order. CALL requests leave the PPUs as :class:`CallRequest` through a third one
(``dtd`` -> ``rti``).

Every READ carries a tag of :data:`READ_TAG_BITS` bits in ``data`` that its answer echoes, so the
network side can tell the answer it waits for from a late answer to a READ it has given up on
(the ``dtd`` side stopped or was reset; see :class:`~openqlink.gateware.top.QSCTop` for how the
crossings behave when either domain is in reset or has no clock).

Because the network core only emits the commands of a packet after the packet's ICRC has checked
good (the commit rule), and the FIFO keeps their order, a PPU sees the writes of a packet before
any later packet's writes, and an atomic trigger sees all instructions written before it.
"""

# No ``from __future__ import annotations``: data.Struct reads its annotations as shapes.
from amaranth.hdl import unsigned
from amaranth.lib import data, enum

__all__ = [
    "BusOp", "BusCommand", "BusReadData", "CallRequest", "MAX_CALL_ARG_BYTES", "READ_TAG_BITS",
    "call_request_layout",
]

#: Width of a READ's tag (``BusCommand.data[READ_TAG_BITS-1:0]``, echoed in ``BusReadData.tag``).
#: Tags of READs still in flight never repeat as long as fewer than ``2**READ_TAG_BITS`` READs
#: fit between the network side and the PPUs (the top checks this against its FIFO depths).
READ_TAG_BITS = 6


class BusOp(enum.Enum, shape=2):
    WRITE = 0           #: write ``data`` at ``word_addr`` under byte enable ``be``
    READ = 1            #: read the 64-bit word at ``word_addr``; answered by one BusReadData
    #:                     that echoes the tag in ``data[READ_TAG_BITS-1:0]`` (other bits 0)
    MAILBOX_COMMIT = 2  #: a SEND of ``data[15:0]`` bytes has been written to the mailbox at
    #:                     ``word_addr`` (the mailbox base): hand it to the PPU's CALL unit


class BusCommand(data.Struct):
    """One bus command (``rti`` -> ``dtd``). Addresses are byte addresses >> 3."""

    op: BusOp
    word_addr: unsigned(29)
    be: unsigned(8)       #: byte enables, bit i for data[8i+7:8i] (byte address 8*word_addr+i)
    data: unsigned(64)    #: little-endian: byte i of the word at bits [8i+7:8i]


class BusReadData(data.Struct):
    """Answer to one ``BusOp.READ`` (``dtd`` -> ``rti``). Unmapped addresses set ``error``."""

    data: unsigned(64)
    error: unsigned(1)
    tag: unsigned(READ_TAG_BITS)    #: the READ's ``data[READ_TAG_BITS-1:0]``


#: A CALL carries at most this many argument bytes (up to four 32-bit argument registers).
MAX_CALL_ARG_BYTES = 16


class CallRequest(data.Struct):
    """A PPU's CALL, handed to the network core to send as an RPC request (``dtd`` -> ``rti``).

    The network core stamps ``ptp_timestamp`` at transmit and picks the ring slot and PSN. The
    request's ``arg_len`` argument bytes are the RPC payload after the 24-byte RPCHeader
    (cuda-quantum realtime/docs/cudaq_realtime_message_protocol.md: ``arg_len``, then the
    arguments, unpadded; the RoCE frame pads them to a multiple of 4 bytes, IBTA Vol 1 9.2 BTH
    PadCnt). 201 bits in all.
    """

    ppu: unsigned(4)
    function_id: unsigned(32)
    request_id: unsigned(32)
    arg_len: unsigned(5)    #: bytes, 0..MAX_CALL_ARG_BYTES (16)
    #: Argument bytes, byte i at bits [8i+7:8i] (16 bytes); bytes at and above ``arg_len`` are
    #: ignored (the network core sends zeros in their place as pad).
    args: unsigned(8 * MAX_CALL_ARG_BYTES)


def call_request_layout(arg_bytes: int = MAX_CALL_ARG_BYTES):
    """The layout of a build's CALL requests: :class:`CallRequest` with ``arg_bytes`` bytes.

    The PPUs and the crossing to the network core carry requests of at most the build's
    ``QSCParams.call_arg_bytes`` (0..16) argument bytes: ``arg_len`` is ``range(arg_bytes + 1)``
    wide and ``args`` ``8 * arg_bytes`` bits, the other fields as in :class:`CallRequest`
    (``68 + bits(arg_len) + 8 * arg_bytes`` bits: 103 for 4 bytes, 201 for 16). The network
    core takes :class:`CallRequest`; the top zero-extends the fields into it.
    ``arg_bytes == MAX_CALL_ARG_BYTES`` gives :class:`CallRequest` itself. Raises ``ValueError``
    for ``arg_bytes`` outside 0..16.
    """
    if not 0 <= arg_bytes <= MAX_CALL_ARG_BYTES:
        raise ValueError(f"arg_bytes must be 0..{MAX_CALL_ARG_BYTES}, not {arg_bytes}")
    if arg_bytes == MAX_CALL_ARG_BYTES:
        return CallRequest
    fields = {name: field.shape for name, field in data.Layout.cast(CallRequest)}
    fields.update(arg_len=unsigned(arg_bytes.bit_length()), args=unsigned(8 * arg_bytes))
    return data.StructLayout(fields)
