"""Shared helpers of the MAC tests: frames with their FCS, the wire form of a frame (preamble, SFD,
FCS), a parser of GMII byte streams, and packet-stream drivers/monitors for ``amaranth.sim``."""

from __future__ import annotations

import random
import struct
import zlib
from dataclasses import dataclass, field

PREAMBLE = bytes([0x55] * 7 + [0xD5])


def fcs(frame: bytes) -> bytes:
    """The Ethernet FCS of ``frame`` (CRC-32, least significant byte first on the wire)."""
    return struct.pack("<I", zlib.crc32(frame))


def padded(frame: bytes) -> bytes:
    return frame + bytes(max(0, 60 - len(frame)))


def wire(frame: bytes, *, bad_fcs: bool = False, preamble: bytes = PREAMBLE) -> bytes:
    """Preamble, SFD, ``frame`` (not padded) and its FCS (corrupted when ``bad_fcs``)."""
    check = bytearray(fcs(frame))
    if bad_fcs:
        check[1] ^= 0x20
    return preamble + frame + bytes(check)


def random_frame(rng: random.Random, length: int) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(length))


@dataclass
class WireFrame:
    """One run of ``en`` on a GMII bus: its bytes, the cycles with ``er``, and its first cycle."""

    data: bytes
    errors: list[int]
    start: int
    end: int          # cycle after the last byte


def split_gmii(samples: list[tuple[int, int, int]]) -> list[WireFrame]:
    """Split per-cycle ``(data, en, er)`` samples into the frames ``en`` delimits."""
    frames, cur, errs, start = [], bytearray(), [], None
    for cycle, (data, en, er) in enumerate(samples):
        if en:
            if start is None:
                start, cur, errs = cycle, bytearray(), []
            if er:
                errs.append(len(cur))
            cur.append(data)
        elif start is not None:
            frames.append(WireFrame(bytes(cur), errs, start, cycle))
            start = None
    return frames


@dataclass
class Packet:
    """A packet collected from a stream: its bytes and the ``error`` flag of its last beat."""

    data: bytes
    error: int
    cycles: list[int] = field(default_factory=list)


def beat_fields(value, width: int) -> tuple[bytes, int, int, int]:
    """(bytes kept, first, last, error) of a packet beat read with ``ctx.get`` (a View)."""
    keep = int(value.keep)
    count = keep.bit_length()
    if keep != (1 << count) - 1:
        raise AssertionError(f"keep {keep:#x} not contiguous from lane 0")
    data = int(value.data).to_bytes(width // 8, "little")[:count]
    return data, int(value.first), int(value.last), int(value.error)


class PacketCollector:
    """Rebuilds packets from beats, checking ``first``/``last``/``keep`` placement."""

    def __init__(self, width: int):
        self.width = width
        self.packets: list[Packet] = []
        self._cur: bytearray | None = None
        self._cycles: list[int] = []

    def beat(self, value, cycle: int = 0) -> None:
        data, first, last, error = beat_fields(value, self.width)
        if first != (self._cur is None):
            raise AssertionError(f"cycle {cycle}: first={first} out of place")
        if not last and len(data) != self.width // 8:
            raise AssertionError(f"cycle {cycle}: partial beat that is not last")
        if first:
            self._cur, self._cycles = bytearray(), []
        self._cur += data
        self._cycles.append(cycle)
        if last:
            self.packets.append(Packet(bytes(self._cur), error, self._cycles))
            self._cur = None


def to_beats(frame: bytes, width: int, *, error: int = 0) -> list[dict]:
    """The beats of ``frame`` as ``ctx.set`` payload dicts."""
    n = width // 8
    chunks = [frame[i:i + n] for i in range(0, len(frame), n)]
    return [{
        "data": int.from_bytes(c, "little"),
        "keep": (1 << len(c)) - 1,
        "first": int(i == 0),
        "last": int(i == len(chunks) - 1),
        "error": error if i == len(chunks) - 1 else 0,
    } for i, c in enumerate(chunks)]
