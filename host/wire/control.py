"""QSC control plane: Holoscan Sensor Bridge control-bus compatible requests and responses.

UDP port 8192, big-endian. A request is 14 bytes, a response 16 bytes.

# Ref: Holoscan Sensor Bridge host library (hololink ``ECB`` control packets) and its FPGA IP
# user guide.
"""

from __future__ import annotations

from amaranth.lib import enum

from .header import Header

__all__ = ["CONTROL_REQUEST", "CONTROL_RESPONSE", "Command", "Flags", "Status",
           "RD_DWORD_SHORT_BYTES"]

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
