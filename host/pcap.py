"""Classic pcap files: a writer (nanosecond timestamps) and a reader (nanosecond or microsecond).

File layout (all fields in the byte order the magic number reveals; we write little-endian):
a 24-byte global header ``magic(32) version_major(16) version_minor(16) thiszone(32)
sigfigs(32) snaplen(32) network(32)``, then one 16-byte record header ``ts_sec(32) ts_frac(32)
incl_len(32) orig_len(32)`` before each frame. ``ts_frac`` is in nanoseconds when the magic is
``0xA1B23C4D`` and in microseconds when it is ``0xA1B2C3D4``. We write link type 1 (Ethernet:
frames from the destination MAC address, no FCS), as Wireshark and tcpdump expect.

No third-party code: scapy is GPL and stays in the tests.

# Ref: draft-ietf-opsawg-pcap (PCAP Capture File Format), sections 4-5; LINKTYPE_ETHERNET = 1
# (tcpdump.org link-layer header types).
"""

from __future__ import annotations

import os
import struct
from types import TracebackType
from typing import BinaryIO

from .errors import TruncatedError, WireFormatError

__all__ = [
    "PcapWriter",
    "read_pcap",
    "MAGIC_NANOSECONDS",
    "MAGIC_MICROSECONDS",
    "LINKTYPE_ETHERNET",
]

#: Magic number of a file whose record timestamps hold nanoseconds.
MAGIC_NANOSECONDS = 0xA1B23C4D
#: Magic number of a file whose record timestamps hold microseconds (the original format).
MAGIC_MICROSECONDS = 0xA1B2C3D4
#: Link type of Ethernet frames (IEEE 802.3, no FCS).
LINKTYPE_ETHERNET = 1

_GLOBAL = struct.Struct("<IHHiIII")
_RECORD_FIELDS = "IIII"
_VERSION = (2, 4)


class PcapWriter:
    """Write Ethernet frames to a classic pcap file with nanosecond timestamps.

    Parameters
    ----------
    path : str | os.PathLike | BinaryIO
        File to create (truncated if it exists), or an open binary file to write into (not
        closed by :meth:`close`).
    snaplen_bytes : int
        Largest frame length the file announces; longer frames are cut to it and their original
        length recorded (default 262144, tcpdump's).

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike[str] | BinaryIO, *,
                 snaplen_bytes: int = 262144):
        if not 0 < snaplen_bytes < 1 << 32:
            raise ValueError(f"snaplen_bytes must be 1..2**32-1, not {snaplen_bytes}")
        self.snaplen_bytes = snaplen_bytes
        if isinstance(path, str | os.PathLike):
            self._file: BinaryIO = open(path, "wb")
            self._owns = True
        else:
            self._file = path
            self._owns = False
        self._file.write(_GLOBAL.pack(MAGIC_NANOSECONDS, *_VERSION, 0, 0, snaplen_bytes,
                                      LINKTYPE_ETHERNET))
        self.closed = False

    def write(self, frame: bytes | bytearray | memoryview, time_ns: int) -> None:
        """Append one frame captured at ``time_ns`` (ns since the Unix epoch, or any epoch the
        reader agrees on; 0 <= time_ns < 2**32 s).

        Raises :class:`ValueError` for a negative or too-large time and :class:`RuntimeError`
        after :meth:`close`.
        """
        if self.closed:
            raise RuntimeError("PcapWriter is closed")
        if not 0 <= time_ns < (1 << 32) * 1_000_000_000:
            raise ValueError(f"time_ns {time_ns} is outside 0..2**32 s")
        frame = bytes(frame)
        sec, ns = divmod(int(time_ns), 1_000_000_000)
        incl = frame[:self.snaplen_bytes]
        self._file.write(struct.pack("<" + _RECORD_FIELDS, sec, ns, len(incl), len(frame)))
        self._file.write(incl)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        """Flush, and close the file if this writer opened it. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._file.flush()
        if self._owns:
            self._file.close()

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def read_pcap(path: str | os.PathLike[str], *,
              whole: bool = False) -> list[tuple[int, bytes]]:
    """Read a classic pcap file of Ethernet frames: ``[(time_ns, frame), ...]`` in file order.

    Accepts nanosecond and microsecond magics in either byte order (microseconds are scaled to
    ns). A frame cut by the snap length is returned as stored (``incl_len`` bytes), unless
    ``whole`` asks for whole frames only (to replay them): then a cut or empty record raises.

    Raises
    ------
    WireFormatError
        ``pcap.magic`` is not a classic pcap magic (pcapng files are not read),
        ``pcap.network`` is not Ethernet, a record's ``incl_len`` exceeds its ``orig_len``, or
        (with ``whole``) is less than it or 0 (``record.incl_len``).
    TruncatedError
        The global header or a record ends early (names ``pcap.magic`` or ``record.incl_len``).
    """
    with open(path, "rb") as fh:
        data = fh.read()
    if len(data) < _GLOBAL.size:
        raise TruncatedError("pcap", "magic", None,
                             f"the global header needs {_GLOBAL.size} bytes, got {len(data)}")
    for order in ("<", ">"):
        (magic,) = struct.unpack_from(order + "I", data)
        if magic in (MAGIC_NANOSECONDS, MAGIC_MICROSECONDS):
            break
    else:
        raise WireFormatError("pcap", "magic", data[:4].hex(),
                              "not a classic pcap file (pcapng is not supported)")
    scale = 1 if magic == MAGIC_NANOSECONDS else 1000
    _, _, _, _, _, _, network = struct.unpack_from(order + "IHHiIII", data)
    if network != LINKTYPE_ETHERNET:
        raise WireFormatError("pcap", "network", network,
                              f"link type {network} is not Ethernet ({LINKTYPE_ETHERNET})")
    record = struct.Struct(order + _RECORD_FIELDS)
    out: list[tuple[int, bytes]] = []
    pos = _GLOBAL.size
    while pos < len(data):
        if len(data) - pos < record.size:
            raise TruncatedError("record", "ts_sec", None,
                                 f"record {len(out)} header at byte {pos} is cut short")
        sec, frac, incl, orig = record.unpack_from(data, pos)
        pos += record.size
        if incl > orig:
            raise WireFormatError("record", "incl_len", incl,
                                  f"record {len(out)}: incl_len {incl} exceeds orig_len {orig}")
        if whole and (incl < orig or incl == 0):
            why = "is empty" if incl == 0 else f"holds {incl} of the frame's {orig} bytes"
            raise WireFormatError("record", "incl_len", incl,
                                  f"record {len(out)} {why}: not a whole frame")
        if len(data) - pos < incl:
            raise TruncatedError("record", "incl_len", incl,
                                 f"record {len(out)} needs {incl} bytes, {len(data) - pos} remain")
        out.append((sec * 1_000_000_000 + frac * scale, data[pos:pos + incl]))
        pos += incl
    return out
