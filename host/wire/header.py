"""Network headers defined once, in wire order, for the host codecs and the gateware alike.

A :class:`Header` lists its fields in the order the spec draws them, most significant bit first
(network byte order, RFC 1700 / IBTA Vol 1 ch. 9 figures). This module is the one place where
network byte order is handled:

* on the host, :meth:`Header.pack` and :meth:`Header.unpack` turn ``dict[str, int]`` into bytes
  and back;
* in the gateware, :meth:`Header.view` takes a flat Amaranth value holding the header's bytes in
  stream lane order (byte ``i`` of the header at bits ``[8*i+7 : 8*i]``, as on the 64-bit packet
  stream whose lane 0 is the first byte on the wire) and returns one slice per field, and
  :meth:`Header.build` does the reverse.

Amaranth layouts are LSB-first, so wire headers are not :class:`amaranth.lib.data.Struct`; the
little-endian RPC headers of CUDA-Q realtime are (see :mod:`openqlink.wire.rpc`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Value

from ..errors import FieldRangeError, TruncatedError

__all__ = ["Field", "Header"]


@dataclass(frozen=True)
class Field:
    """One header field: ``name`` as the spec spells it, ``width`` in bits."""

    name: str
    width: int


class Header:
    """A fixed-length header whose fields are listed in wire order, MSB first.

    Parameters
    ----------
    name : str
        Short name used in error messages (``"BTH"``).
    fields : list of (str, int)
        ``(name, width_bits)`` in wire order; widths must add up to a whole number of bytes.
    ref : str
        The specification section this header comes from.
    defaults : dict, optional
        Values :meth:`pack` and :meth:`build` use for fields the caller leaves out (otherwise 0).
    """

    def __init__(self, name: str, fields: list[tuple[str, int]], *, ref: str,
                 defaults: Mapping[str, int] | None = None):
        self.name = name
        self.ref = ref
        self.fields = tuple(Field(n, w) for n, w in fields)
        total = sum(f.width for f in self.fields)
        if total % 8:
            raise ValueError(f"{name}: fields add up to {total} bits, not whole bytes")
        self.length_bytes = total // 8
        self.defaults = dict(defaults or {})
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"{name}: duplicate field names")
        # Bit position of each field's LSB in the header read as one big-endian integer.
        self._lsb: dict[str, int] = {}
        pos = total
        for f in self.fields:
            pos -= f.width
            self._lsb[f.name] = pos
        self._width = {f.name: f.width for f in self.fields}

    def __repr__(self) -> str:
        return f"Header({self.name}, {self.length_bytes} bytes)"

    def field_width(self, name: str) -> int:
        """Width of field ``name`` in bits."""
        return self._width[name]

    def byte_offset(self, name: str) -> int:
        """Byte offset of the first byte holding field ``name`` (for byte-aligned fields)."""
        total = self.length_bytes * 8
        return (total - self._lsb[name] - self._width[name]) // 8

    # --- host side ----------------------------------------------------------------------------

    def pack(self, **values: int) -> bytes:
        """Encode ``values`` (missing fields take their default) into ``length_bytes`` bytes.

        Raises :class:`FieldRangeError` naming the field if a value does not fit its width, and
        :class:`KeyError` for an unknown field name.
        """
        unknown = set(values) - set(self._width)
        if unknown:
            raise KeyError(f"{self.name} has no field(s) {sorted(unknown)}")
        word = 0
        for f in self.fields:
            v = values.get(f.name, self.defaults.get(f.name, 0))
            v = int(v)
            if not 0 <= v < (1 << f.width):
                raise FieldRangeError(self.name, f.name, v,
                                      f"value {v:#x} does not fit in {f.width} bits")
            word |= v << self._lsb[f.name]
        return word.to_bytes(self.length_bytes, "big")

    def unpack(self, buf: bytes | bytearray | memoryview, offset: int = 0) -> dict[str, int]:
        """Decode the header at ``buf[offset:]`` into ``{field: int}``.

        Raises :class:`TruncatedError` if fewer than ``length_bytes`` bytes remain.
        """
        chunk = bytes(buf[offset:offset + self.length_bytes])
        if len(chunk) < self.length_bytes:
            raise TruncatedError(self.name, self.fields[0].name, None,
                                 f"needs {self.length_bytes} bytes at offset {offset}, "
                                 f"{len(chunk)} remain")
        word = int.from_bytes(chunk, "big")
        return {f.name: (word >> self._lsb[f.name]) & ((1 << f.width) - 1) for f in self.fields}

    # --- gateware side ------------------------------------------------------------------------

    def _big_endian(self, flat: Value) -> Value:
        nbytes = self.length_bytes
        if len(flat) != nbytes * 8:
            raise ValueError(f"{self.name}: expected a {nbytes * 8}-bit value, got {len(flat)}")
        return Cat(*(flat[8 * i:8 * i + 8] for i in reversed(range(nbytes))))

    def view(self, flat: Value) -> dict[str, Value]:
        """Slice ``flat`` (header bytes in stream lane order) into ``{field: Value}``.

        Purely combinational wiring; no logic, no latency.
        """
        be = self._big_endian(Value.cast(flat))
        return {f.name: be[self._lsb[f.name]:self._lsb[f.name] + f.width] for f in self.fields}

    def build(self, **values) -> Value:
        """Assemble field values (Amaranth values or ints) into a flat value in lane order.

        Missing fields take their default. Values wider than their field are truncated; ints are
        range-checked like :meth:`pack`.
        """
        unknown = set(values) - set(self._width)
        if unknown:
            raise KeyError(f"{self.name} has no field(s) {sorted(unknown)}")
        chunks = []
        for f in reversed(self.fields):  # Cat is LSB first: the last wire field comes first
            v = values.get(f.name, self.defaults.get(f.name, 0))
            if isinstance(v, int):
                if not 0 <= v < (1 << f.width):
                    raise FieldRangeError(self.name, f.name, v,
                                          f"value {v:#x} does not fit in {f.width} bits")
                v = Const(v, f.width)
            v = Value.cast(v)
            if len(v) < f.width:
                v = Cat(v, Const(0, f.width - len(v)))
            chunks.append(v[:f.width])
        be = Cat(*chunks)
        nbytes = self.length_bytes
        return Cat(*(be[8 * i:8 * i + 8] for i in reversed(range(nbytes))))
