"""Receive clock crossing: 8-bit frames from the PHY's receive clock into the core's domain.

# Ref: Amaranth ``lib.fifo.AsyncFIFO`` (Gray-coded pointers); IEEE 802.3 4.4.2 (the wire cannot
# be paused: a receiver that has no room must drop).

The wire cannot be stalled, so the write side decides what happens when the FIFO is full: the
frame being received is cut off and marked bad instead of stalling anything. Written for two
named domains (``w_domain``, ``r_domain``), as :class:`amaranth.lib.fifo.AsyncFIFO`.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from ..packet import beat_layout, packet_signature
from .ethernet import rx_frame_signature

__all__ = ["RxClockCrossing"]


class RxClockCrossing(wiring.Component):
    """An :class:`~amaranth.lib.fifo.AsyncFIFO` of 8-bit beats that drops instead of stalling.

    Overflow: when a byte arrives and the FIFO is full, that byte and the rest of its frame are
    dropped. If bytes of the frame are already in the FIFO, an abort beat (one byte, ``last`` and
    ``error`` set) is written as soon as there is room, so the reader sees the frame end as a bad
    frame and drops it; frames that start before the abort is written are dropped whole.
    ``overflow`` pulses once per frame cut off or dropped. A reader that takes a byte on most
    cycles never sees an overflow: both ends run at 125 MHz, and the gap between frames drains
    the FIFO of any clock offset (100 ppm is 0.15 bytes over a 1522-byte frame).

    Latency: a byte written in ``w_domain`` is readable about 3 to 4 ``r_domain`` cycles later
    (AsyncFIFO pointer synchronisers); the FIFO's read port is registered.

    Parameters
    ----------
    depth : int
        FIFO depth in bytes (a power of 2; the AsyncFIFO holds ``depth`` entries).
    w_domain, r_domain : str
        Write (PHY receive clock) and read (core) domains.

    Members
    -------
    i : In(rx_frame_signature())
        Frames from the receive MAC, ``w_domain``, no back-pressure.
    o : Out(packet_signature(8))
        The frames, ``r_domain``.
    overflow : Out(1)
        ``w_domain`` one-cycle pulse per frame cut off or dropped.
    """

    i: In(rx_frame_signature())
    o: Out(packet_signature(8))
    overflow: Out(1)

    def __init__(self, *, depth: int = 16, w_domain: str = "eth_rx", r_domain: str = "rti"):
        if not isinstance(depth, int) or depth < 4 or depth & (depth - 1):
            raise ValueError(f"depth must be a power of 2 and at least 4, not {depth!r}")
        self.depth = depth
        self.w_domain = w_domain
        self.r_domain = r_domain
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        layout = beat_layout(8)
        m.submodules.fifo = q = fifo.AsyncFIFO(
            width=layout.size, depth=self.depth, w_domain=self.w_domain, r_domain=self.r_domain)
        wd = m.d[self.w_domain]

        dropping = Signal()        # the rest of the current frame is being dropped
        abort_pending = Signal()   # the FIFO holds part of a frame that still needs its end
        abort = Signal(layout)
        m.d.comb += [abort.keep.eq(1), abort.last.eq(1), abort.error.eq(1)]

        beat = self.i.payload
        frame_dropping = ~beat.first & dropping    # this byte's frame is already being dropped
        write_byte = Signal()
        with m.If(abort_pending):
            m.d.comb += [q.w_data.eq(abort), q.w_en.eq(1)]
            with m.If(q.w_rdy):
                wd += abort_pending.eq(0)
        with m.Else():
            m.d.comb += [
                q.w_data.eq(beat),
                write_byte.eq(self.i.valid & ~frame_dropping),
                q.w_en.eq(write_byte),
            ]

        wd += self.overflow.eq(0)
        with m.If(self.i.valid):
            with m.If(frame_dropping):
                wd += dropping.eq(~beat.last)
            with m.Elif(write_byte & q.w_rdy):
                wd += dropping.eq(0)
            with m.Else():
                # This byte is lost: its frame ends here. If earlier bytes of it were written,
                # the FIFO needs an abort beat to end it.
                wd += [self.overflow.eq(1), dropping.eq(~beat.last)]
                with m.If(~beat.first):
                    wd += abort_pending.eq(1)

        m.d.comb += [
            self.o.valid.eq(q.r_rdy),
            self.o.payload.eq(q.r_data),
            q.r_en.eq(self.o.ready),
        ]
        return m
