"""Packet stream width converters: :class:`PacketUpsizer` (narrow to wide, receive side) and
:class:`PacketDownsizer` (wide to narrow, transmit side).

# Ref: the packet convention of :mod:`openqlink.gateware.packet` (byte ``i`` of a beat is the
# ``i``-th byte on the wire, at bits ``[8i+7:8i]``; ``keep`` contiguous from lane 0 on the last
# beat, all ones before it).

Both are written in ``sync``. Neither reorders, adds or removes bytes; ``first`` goes with the
first byte of a packet, ``last`` and ``error`` with its last.
"""

from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal
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

    Two buffers take wide beats in turn; the narrow beat offered is lane ``lane`` of the buffer
    being sent, chosen by a multiplexer, while the other buffer takes the next wide beat. A beat
    taken at one edge is offered from the next (1 cycle of latency), and a packet streams
    without bubbles while ``i`` keeps up. No register of the wide side has an enable that
    depends on ``o``: an empty buffer copies ``i``'s payload every cycle and counts as full
    from the edge at which ``i`` offers a beat, and empties when its final narrow beat leaves;
    ``o``'s back-pressure reaches only the lane counter and the two buffers' full flags.
    ``i.ready`` is a flip-flop (the next buffer to fill is empty), so back-pressure reaches
    ``i`` a cycle late and never combinationally.

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

        buf = [Signal(beat_layout(self.i_width), name=f"buf{k}") for k in range(2)]
        full = [Signal(name=f"full{k}") for k in range(2)]
        wsel = Signal()                   # the buffer the next wide beat goes into
        rsel = Signal()                   # the buffer being sent
        lane = Signal(range(ratio))
        # ~full[wsel], registered from the next state. Two copies of one register: one for the
        # logic here, one for ``i.ready``, which the wide side's logic uses where it sits (the
        # build keeps ``__rep`` copies apart).
        in_ready, ready_out = (Signal(init=1, name=f"in_ready__rep{k}") for k in range(2))

        cur = Signal(beat_layout(self.i_width))
        m.d.comb += cur.eq(Mux(rsel, buf[1], buf[0]))
        # Each buffer's final lane, registered with it (``keep`` is contiguous: the highest lane
        # with a byte kept on a last beat, else the top lane), so that ``final`` is a compare of
        # the lane counter with small registers, not a selection from the wide buffers.
        ends = [Signal(range(ratio), name=f"end{k}") for k in range(2)]
        kept = [self.i.payload.keep[ok * k:ok * (k + 1)].any() for k in range(ratio)]
        end_in = Const(ratio - 1, range(ratio))
        for k in range(ratio - 1):        # a Mux chain: a continuous assignment in Verilog
            end_in = Mux(self.i.payload.last & ~kept[k + 1] & (kept[k] if k else 1), k, end_in)
        final = lane == Mux(rsel, ends[1], ends[0])

        o = self.o.payload
        valid = Mux(rsel, full[1], full[0])
        m.d.comb += [
            self.o.valid.eq(valid),
            o.first.eq(cur.first & (lane == 0)),
            o.last.eq(cur.last & final),
            o.error.eq(cur.error & cur.last & final),
            self.i.ready.eq(ready_out),
        ]
        m.d.comb += [o.data.eq(cur.data.word_select(lane, ow)),
                     o.keep.eq(cur.keep.word_select(lane, ok))]

        take = self.i.valid & in_ready
        done = valid & self.o.ready & final   # the buffer being sent empties at this edge
        full_next = [Signal(name=f"full{k}_next") for k in range(2)]
        for k in range(2):
            m.d.comb += full_next[k].eq((full[k] & ~(done & (rsel == k))) |
                                        (take & (wsel == k)))
            # An empty buffer copies whatever ``i`` offers, every cycle (its contents count only
            # once ``full`` is set): its enable is its own ``full`` flag, not ``i.valid``.
            with m.If(~full[k]):
                m.d.sync += [buf[k].eq(self.i.payload), ends[k].eq(end_in)]
        wsel_next = wsel ^ take
        m.d.sync += [
            full[0].eq(full_next[0]),
            full[1].eq(full_next[1]),
            wsel.eq(wsel_next),
            in_ready.eq(~Mux(wsel_next, full_next[1], full_next[0])),
            ready_out.eq(~Mux(wsel_next, full_next[1], full_next[0])),
        ]
        with m.If(valid & self.o.ready):
            m.d.sync += lane.eq(Mux(final, 0, lane + 1))
            with m.If(final):
                m.d.sync += rsel.eq(~rsel)
        return m
