"""Packet stream width converters: :class:`PacketUpsizer` (narrow to wide, receive side) and
:class:`PacketDownsizer` (wide to narrow, transmit side).

# Ref: the packet convention of :mod:`openqlink.gateware.packet` (byte ``i`` of a beat is the
# ``i``-th byte on the wire, at bits ``[8i+7:8i]``; ``keep`` contiguous from lane 0 on the last
# beat, all ones before it).

Both are written in ``sync``. Neither reorders, adds or removes bytes; ``first`` goes with the
first byte of a packet, ``last`` and ``error`` with its last.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..packet import beat_layout, packet_signature

__all__ = ["PacketUpsizer", "PacketDownsizer"]


def _check_widths(narrow: int, wide: int) -> int:
    for name, width in (("narrow", narrow), ("wide", wide)):
        if not isinstance(width, int) or width <= 0 or width % 8:
            raise ValueError(f"{name} width must be a positive multiple of 8 bits, not {width!r}")
    if wide % narrow or wide == narrow:
        raise ValueError(f"wide width {wide} must be a multiple of narrow width {narrow} (> 1x)")
    return wide // narrow


class _WidthConverter(wiring.Component):
    """A packet stream ``i`` of ``i_width`` bits in, ``o`` of ``o_width`` bits out."""

    def __init__(self, i_width: int, o_width: int, *, narrow: int, wide: int):
        self.ratio = _check_widths(narrow, wide)
        self.i_width = i_width
        self.o_width = o_width
        super().__init__({
            "i": In(packet_signature(i_width)),
            "o": Out(packet_signature(o_width)),
        })


class PacketUpsizer(_WidthConverter):
    """Gathers ``ratio`` = ``o_width // i_width`` narrow beats into one wide beat.

    A wide beat is offered on the cycle after its last narrow beat was taken (its ``ratio``-th,
    or the packet's last); latency 1 cycle. ``i.ready`` is low only while a completed wide beat
    waits in the output register and is not being taken, so a packet at one narrow beat per
    cycle passes without stalls while ``o.ready`` is high.

    Parameters
    ----------
    i_width, o_width : int
        Data widths in bits (multiples of 8; ``o_width`` a multiple of ``i_width``).

    Members
    -------
    i : In(packet_signature(i_width))
    o : Out(packet_signature(o_width))
    """

    def __init__(self, i_width: int = 8, o_width: int = 64):
        super().__init__(i_width, o_width, narrow=i_width, wide=o_width)

    def elaborate(self, platform):
        m = Module()
        ratio, iw = self.ratio, self.i_width
        ik = iw // 8
        i, o = self.i.payload, self.o.payload

        lane = Signal(range(ratio))
        acc = Signal(self.o_width)
        acc_keep = Signal(self.o_width // 8)
        acc_first = Signal()

        merged = Signal(self.o_width)
        merged_keep = Signal(self.o_width // 8)
        m.d.comb += [merged.eq(acc), merged_keep.eq(acc_keep)]
        m.d.comb += [
            merged.word_select(lane, iw).eq(i.data),
            merged_keep.word_select(lane, ik).eq(i.keep),
        ]
        completes = (lane == ratio - 1) | i.last

        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        # Not ``~completes | ...``: ``ready`` stays off the payload, off the critical path.
        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)

        with m.If(self.i.valid & self.i.ready):
            with m.If(completes):
                m.d.sync += [
                    self.o.valid.eq(1),
                    o.data.eq(merged),
                    o.keep.eq(merged_keep),
                    o.first.eq(Mux(lane == 0, i.first, acc_first)),
                    o.last.eq(i.last),
                    o.error.eq(i.error & i.last),
                    lane.eq(0),
                    acc.eq(0),
                    acc_keep.eq(0),
                    acc_first.eq(0),
                ]
            with m.Else():
                m.d.sync += [
                    acc.eq(merged),
                    acc_keep.eq(merged_keep),
                    lane.eq(lane + 1),
                ]
                with m.If(lane == 0):
                    m.d.sync += acc_first.eq(i.first)
        return m


class PacketDownsizer(_WidthConverter):
    """Splits each wide beat into ``ratio`` = ``i_width // o_width`` narrow beats, skipping the
    lanes ``keep`` leaves out on the last beat.

    A wide beat is taken into an input register, moves into a shift register (2 cycles after
    it was taken, when idle) and is offered one narrow beat per cycle from its lowest lane. The
    input register takes the next wide beat while the shift register is being sent, and moves
    into it in the cycle the final narrow beat leaves, so a packet streams without bubbles
    while ``i`` keeps up (with ``ratio`` >= 3; a packet after a last beat of one narrow lane
    starts a cycle later). ``i.ready`` is a flip-flop (high while the input register is empty):
    back-pressure from ``o`` reaches ``i`` a cycle late and never combinationally, and the
    shift register loads from the input register alone, so nothing on the wide side is in a
    path with the narrow side's logic.

    Parameters
    ----------
    i_width, o_width : int
        Data widths in bits (multiples of 8; ``i_width`` a multiple of ``o_width``).

    Members
    -------
    i : In(packet_signature(i_width))
    o : Out(packet_signature(o_width))
    """

    def __init__(self, i_width: int = 64, o_width: int = 8):
        super().__init__(i_width, o_width, narrow=o_width, wide=i_width)

    def elaborate(self, platform):
        m = Module()
        ratio, ow = self.ratio, self.o_width
        ok = ow // 8

        # The beat is shifted down one narrow lane per narrow beat taken, so the output is lane
        # 0 of a register (no lane multiplexer in front of the consumer).
        beat = Signal(beat_layout(self.i_width))
        full = Signal()
        lane = Signal(range(ratio))
        final = (lane == ratio - 1) | (beat.last & ~beat.keep[ok])
        # The next wide beat, taken while ``beat`` is busy.
        nxt = Signal(beat_layout(self.i_width))
        nxt_full = Signal()

        o = self.o.payload
        m.d.comb += [
            self.o.valid.eq(full),
            o.data.eq(beat.data[:ow]),
            o.keep.eq(beat.keep[:ok]),
            o.first.eq(beat.first & (lane == 0)),
            o.last.eq(beat.last & final),
            o.error.eq(beat.error & beat.last & final),
            self.i.ready.eq(~nxt_full),
        ]
        take = self.i.valid & ~nxt_full
        free = ~full | (self.o.ready & final)      # ``beat`` may be loaded this cycle
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [
                lane.eq(lane + 1),
                beat.data.eq(beat.data >> ow),
                beat.keep.eq(beat.keep >> ok),
            ]
        # ``nxt`` takes every beat offered and taken (``take`` alone enables it: the input's
        # ``valid`` is not combined with this side's state); ``beat`` loads only from ``nxt``,
        # so no path runs from the wide side's logic into the shift register (the wide side
        # may sit far across the die; only ``nxt``'s flip-flops face it).
        with m.If(take):
            m.d.sync += [nxt.eq(self.i.payload), nxt_full.eq(1)]
        with m.If(free):
            m.d.sync += [
                lane.eq(0),
                full.eq(nxt_full),
                nxt_full.eq(take),
                beat.eq(nxt),
            ]
        return m
