"""The packet stream convention used on every data path of the QSC.

A packet is a run of transfers on an :class:`amaranth.lib.stream` interface whose payload is
:func:`beat_layout`: ``data`` (``data_width`` bits; byte ``i`` of the beat, the ``i``-th byte
on the wire, at bits ``[8*i+7 : 8*i]``), ``keep`` (one bit per byte; all ones on every beat but
the last, whose ones are contiguous from bit 0), ``first`` (set on the first beat), ``last``
(set on the last beat) and ``error`` (meaningful on the last beat only: the MAC found the frame
bad, e.g. an FCS mismatch or a PHY receive error, and the receiver must drop the whole frame
without acting on any of it; transmitters set it to 0). A one-beat packet sets ``first`` and
``last``. The four transfer rules of
``amaranth.lib.stream`` hold: ``valid`` never waits for ``ready``, and payload stays stable while
``valid`` is set and ``ready`` is not.

On the MAC side the frame runs from the destination MAC address through the end of the payload
(padding included, FCS excluded: the MAC strips it on receive and appends it on transmit).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["beat_layout", "packet_signature", "RegisterSlice", "PingPongSlice", "DATA_WIDTH"]

#: Default data path width in bits (a 10GBASE-R MAC at 156.25 MHz).
DATA_WIDTH = 64


def beat_layout(data_width: int = DATA_WIDTH) -> data.StructLayout:
    """Payload layout of one beat: ``data``, ``keep``, ``first``, ``last``, ``error``."""
    if data_width % 8 or data_width <= 0:
        raise ValueError(f"data_width must be a positive multiple of 8, not {data_width}")
    return data.StructLayout({
        "data": data_width,
        "keep": data_width // 8,
        "first": 1,
        "last": 1,
        "error": 1,
    })


def packet_signature(data_width: int = DATA_WIDTH) -> stream.Signature:
    """Stream signature of a packet interface (use with ``In(...)``/``Out(...)``)."""
    return stream.Signature(beat_layout(data_width))


class RegisterSlice(wiring.Component):
    """A stream register slice: ``o.valid``, ``o.payload`` and ``i.ready`` are flip-flops.

    A transfer on ``i`` lands in the output register when that is free or being taken, else in a
    second (skid) register; ``i.ready`` is "the skid register is empty". Latency 1 cycle, no
    bubbles at one transfer per cycle. Put it where a stream crosses the die: nothing on either
    side waits on logic of the other side in the same cycle.

    Parameters
    ----------
    shape : ShapeCastable
        The payload (a :func:`beat_layout`, or any shape).

    Members
    -------
    i : In(stream.Signature(shape))
    o : Out(stream.Signature(shape))
    """

    def __init__(self, shape):
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        skid = Signal.like(self.o.payload)
        skid_valid = Signal()
        take = self.i.valid & ~skid_valid
        out_free = ~self.o.valid | self.o.ready
        m.d.comb += self.i.ready.eq(~skid_valid)
        with m.If(out_free):
            m.d.sync += [self.o.valid.eq(skid_valid | take),
                         self.o.payload.eq(Mux(skid_valid, skid, self.i.payload)),
                         skid_valid.eq(0)]
        with m.Elif(take):
            m.d.sync += [skid.eq(self.i.payload), skid_valid.eq(1)]
        return m


class PingPongSlice(wiring.Component):
    """A two-entry stream buffer whose consumer's ``ready`` enables no payload register.

    Like :class:`RegisterSlice`, ``i.ready`` and ``o.valid`` are flip-flops, the latency is 1
    cycle and a stream at one transfer per cycle passes without bubbles; unlike it, a transfer
    on ``i`` always lands in the entry at the write pointer, and ``o.payload`` is the entry at
    the read pointer (a 2:1 choice after the registers). ``o.ready`` reaches the read pointer
    and the two flags alone (three flip-flops), never the enables of the payload registers:
    use it where the consumer's ``ready`` comes from across the die and the payload is wide.

    Parameters
    ----------
    shape : ShapeCastable
        The payload.

    Members
    -------
    i : In(stream.Signature(shape))
        ``ready`` is "an entry is free" (a flip-flop; it does not depend on ``o.ready``).
    o : Out(stream.Signature(shape))
        ``valid`` is "an entry is full" (a flip-flop).
    """

    def __init__(self, shape):
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        entries = [Signal.like(self.o.payload, name=f"entry{k}") for k in range(2)]
        wp = Signal()
        rp = Signal()
        count = Signal(range(3))
        full = Signal()
        put = self.i.valid & ~full
        get = self.o.valid & self.o.ready
        m.d.comb += [
            self.i.ready.eq(~full),
            self.o.payload.eq(Mux(rp, entries[1], entries[0])),
        ]
        for k, entry in enumerate(entries):
            with m.If(put & (wp == k)):
                m.d.sync += entry.eq(self.i.payload)
        count_next = Signal.like(count)
        m.d.comb += count_next.eq(count + put - get)
        m.d.sync += [
            wp.eq(wp ^ put),
            rp.eq(rp ^ get),
            count.eq(count_next),
            full.eq(count_next == 2),
            self.o.valid.eq(count_next != 0),
        ]
        return m
