"""Readout calibration of a PPU: the windows' raw I/Q sums and a raw trace of ADC samples.

:class:`ReadoutCalibration` keeps, for each readout channel, the I and Q integrals of its last
completed ACQUIRE window (the channel's ``iq_*``) with a count of completed windows, and a
snapshot of them that a register read takes; and, with ``trace_depth`` > 0, a trace memory
that records the ADC samples of one window of an armed channel. The PPU (:mod:`.core`) maps
them into its register block and window (``openqlink.memory_map``: ``READOUT_REGISTERS``,
TRACE_ARM, TRACE_STATUS, TRACE_COUNT, ``TRACE_OFFSET``) and serves them through its bus read
pipeline.

Everything is written in ``sync`` (the PPU's ``dtd``), from flip-flops: the channels' outputs
land in registers here, and the trace selects its channel through a register stage.

# Ref: openqlink docs/isa.md (ACQUIRE: calibration registers and trace);
# openqlink.memory_map (READOUT_REGISTERS, TRACE_*).
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .. import bram
from .channels import SAMPLE_BITS, ReadoutChannel

__all__ = ["ReadoutCalibration", "TraceState"]

_IQ_BITS = ReadoutChannel.IQ_BITS


class TraceState(enum.Enum, shape=3):
    """The trace capture's state (TRACE_STATUS bits 0..2 decode it: see ``status``)."""

    IDLE = 0       # never armed
    PENDING = 1    # armed a cycle ago: the channel selection settles
    ARMED = 2      # waiting for a window's first sample
    CAPTURE = 3    # recording the window
    DONE = 4       # the window ended, or the memory filled up


def _sext32(value):
    """The bits ``value`` (fewer than 32, the top one the sign) sign-extended to 32 bits."""
    return Cat(value, value[-1].replicate(32 - len(value)))


class ReadoutCalibration(wiring.Component):
    """The I/Q registers and the raw-trace capture of one PPU's readout channels.

    Parameters
    ----------
    n_readout : int
        Readout channels, 1..16.
    samples_per_cycle : int
        ``S``: ADC lanes per channel and DTD cycle (1, 2 or 4).
    trace_depth : int
        Samples of the trace memory: 0 (no trace logic at all; ``status``, ``count`` and
        ``rd_data`` are constant 0) or a power of two >= 4.

    Members
    -------
    iq_valid : ``In(n_readout)``; iq_i, iq_q : ``In(signed(40)).array(n_readout)``
        The channels' ``iq_*`` (:class:`~.channels.ReadoutChannel`): ``iq_valid[c]`` high for
        the one cycle that ``iq_*[c]`` first hold a window's integrals.
    latch : ``In(n_readout)``
        Take channel ``c``'s snapshot at this edge: ``words[c]`` then return the values of this
        cycle (the bus's I_LO read).
    words : ``Out(ArrayLayout(unsigned(64), 3)).array(n_readout)``
        The channel's 64-bit register words (``READOUT_REGISTERS``), combinational from
        flip-flops: ``[0]`` ``{I[31:0], I[39:32] sign-extended}`` of the live values (I_LO and
        I_HI as a latching read returns them), ``[1]`` ``{Q_LO, Q_HI}`` of the snapshot,
        ``[2]`` ``{IQ_COUNT, WINDOW_COUNT}``: the snapshot's window count and the live one.
        ``i_hi_snap`` is I_HI of the snapshot (what a read of I_HI alone returns).
    i_hi_snap : ``Out(32).array(n_readout)``
    window, window_last : ``In(n_readout)``
        The channels' ``window`` and ``window_last``.
    adc : ``In(ArrayLayout(signed(16), n_readout * S))``
        The ADC samples (the PTD port's ``adc``: channel ``c``'s lane ``k`` at ``S * c + k``).
    arm : ``In(1)``; arm_value : ``In(32)``
        A TRACE_ARM write (all byte lanes) of ``arm_value`` in this cycle. Registered here, it
        acts the next cycle: a channel ``< n_readout`` stops any capture, zeroes ``count`` and
        arms the trace (PENDING, then ARMED a cycle later, once the channel selection has
        settled); any other value only sets ``refused``.
    status : ``Out(32)``
        TRACE_STATUS: bit 0 armed (PENDING or ARMED), 1 capturing, 2 done, 3 full, 4 refused,
        bits 11..8 the channel.
    count : ``Out(32)``
        TRACE_COUNT: samples written since the last accepted arm (a multiple of ``S``).
    rd_addr : ``In(range(trace_depth // 4))``; rd_en : ``In(1)``; rd_data : ``Out(64)``
        The bus's read port of the trace memory: ``rd_data`` is the 64-bit word (samples
        ``4 a .. 4 a + 3``, sample ``4 a`` in bits 15..0) at the ``rd_addr`` of the last edge
        with ``rd_en`` high; 1 cycle of latency, no logic after the block RAM. A word written
        in the same cycle reads undefined data.

    Timing: a window's sample on the ADC port in cycle ``t`` is registered with its channel's
    flags at ``t + 1`` (the channel selection) and written to the trace memory at the end of
    ``t + 1``; ``count`` and ``status`` count it from ``t + 2``. A capture records the armed
    channel's next window whose first cycle is selected while ARMED: every sample from its
    first, ``S`` per cycle in sample order, until its last (done) or until ``trace_depth``
    samples (done and full); a window cut short by the PPU's flush (an error) ends it too.
    The I/Q words change the cycle after ``iq_valid``, with WINDOW_COUNT.
    """

    def __init__(self, n_readout: int = 1, samples_per_cycle: int = 1, trace_depth: int = 0):
        if not 1 <= n_readout <= 16:
            raise ValueError(f"n_readout must be 1..16, not {n_readout}")
        if samples_per_cycle not in (1, 2, 4):
            raise ValueError(f"samples_per_cycle must be 1, 2 or 4, not {samples_per_cycle}")
        if trace_depth and (trace_depth < 4 or trace_depth & (trace_depth - 1)):
            raise ValueError(f"trace_depth must be 0 or a power of two >= 4, not {trace_depth}")
        self._n = n_readout
        self._spc = samples_per_cycle
        self._depth = trace_depth
        words = max(1, trace_depth // 4)
        super().__init__({
            "iq_valid": In(n_readout),
            "iq_i": In(signed(_IQ_BITS)).array(n_readout),
            "iq_q": In(signed(_IQ_BITS)).array(n_readout),
            "latch": In(n_readout),
            "words": Out(data.ArrayLayout(unsigned(64), 3)).array(n_readout),
            "i_hi_snap": Out(32).array(n_readout),
            "window": In(n_readout),
            "window_last": In(n_readout),
            "adc": In(data.ArrayLayout(signed(SAMPLE_BITS), n_readout * samples_per_cycle)),
            "arm": In(1),
            "arm_value": In(32),
            "status": Out(32),
            "count": Out(32),
            "rd_addr": In(range(words)),
            "rd_en": In(1),
            "rd_data": Out(64),
        })

    def elaborate(self, platform):
        m = Module()
        self._iq(m)
        if self._depth:
            self._trace(m)
        return m

    def _iq(self, m: Module) -> None:
        for c in range(self._n):
            live_i = Signal(signed(_IQ_BITS), name=f"iq{c}_i")
            live_q = Signal(signed(_IQ_BITS), name=f"iq{c}_q")
            windows = Signal(32, name=f"iq{c}_windows")
            snap_i_hi = Signal(_IQ_BITS - 32, name=f"iq{c}_snap_i_hi")
            snap_q = Signal(signed(_IQ_BITS), name=f"iq{c}_snap_q")
            snap_windows = Signal(32, name=f"iq{c}_snap_windows")
            with m.If(self.iq_valid[c]):
                m.d.sync += [live_i.eq(self.iq_i[c]), live_q.eq(self.iq_q[c]),
                             windows.eq(windows + 1)]
            with m.If(self.latch[c]):
                m.d.sync += [snap_i_hi.eq(live_i[32:]), snap_q.eq(live_q),
                             snap_windows.eq(windows)]
            m.d.comb += [
                self.words[c][0].eq(Cat(live_i[:32], _sext32(live_i[32:]))),
                self.words[c][1].eq(Cat(snap_q[:32], _sext32(snap_q[32:]))),
                self.words[c][2].eq(Cat(snap_windows, windows)),
                self.i_hi_snap[c].eq(_sext32(snap_i_hi)),
            ]

    def _trace(self, m: Module) -> None:
        n, S, depth = self._n, self._spc, self._depth
        # A window's first cycle: ``window`` high where the cycle before was not the middle of
        # a window (``cont``: a window cycle that was not its last).
        cont = Signal(n)
        m.d.sync += cont.eq(self.window & ~self.window_last)
        first = self.window & ~cont

        # The arm write, registered: its compare and channel, a cycle later.
        a_r = Signal()
        a_ok = Signal()
        a_ch = Signal(4)
        m.d.sync += [a_r.eq(self.arm), a_ok.eq(self.arm_value < n),
                     a_ch.eq(self.arm_value[:4])]

        state = Signal(TraceState)
        ch = Signal(4)
        full = Signal()
        refused = Signal()
        count = Signal(range(depth + 1))
        # The selection stage: the armed channel's flags and samples, registered.
        s_win = Signal()
        s_first = Signal()
        s_last = Signal()
        s_adc = Signal(data.ArrayLayout(signed(SAMPLE_BITS), S))

        def pick(bits):
            return Array(bits[c] for c in range(n))[ch] if n > 1 else bits[0]

        lanes = [Array(self.adc[S * c + k] for c in range(n))[ch] if n > 1 else self.adc[k]
                 for k in range(S)]
        m.d.sync += [s_win.eq(pick(self.window)), s_first.eq(pick(first)),
                     s_last.eq(pick(self.window_last)),
                     *(s_adc[k].eq(lanes[k]) for k in range(S))]

        mem = Memory(shape=unsigned(64), depth=depth // 4, init=[],
                     attrs={"no_rw_check": True})
        m.submodules.trace_mem = mem
        w = mem.write_port(granularity=SAMPLE_BITS)
        r = bram.read_port(m, mem, name="trace_rd")
        m.d.comb += [r.addr.eq(self.rd_addr), r.en.eq(self.rd_en), self.rd_data.eq(r.data)]

        start = (state == TraceState.ARMED) & s_first
        more = (state == TraceState.CAPTURE) & s_win & ~s_first
        write = start | more
        at_end = count == depth - S                 # this write fills the memory
        # Samples ``count .. count + S - 1`` go to lanes ``count % 4 ..`` of word ``count // 4``
        # (S divides 4 and ``count``): the samples repeat across the word and the lanes'
        # enables pick their place.
        m.d.comb += [
            w.addr.eq(count[2:]),
            w.data.eq(Cat(*([s_adc.as_value()] * (4 // S)))),
            w.en.eq(Mux(write, (Const((1 << S) - 1, 4) << count[:2])[:4], 0)),
        ]
        with m.Switch(state):
            with m.Case(TraceState.PENDING):
                m.d.sync += state.eq(TraceState.ARMED)
            with m.Case(TraceState.ARMED, TraceState.CAPTURE):
                with m.If(write):
                    m.d.sync += count.eq(count + S)
                    with m.If(s_last | at_end):
                        m.d.sync += [state.eq(TraceState.DONE), full.eq(~s_last)]
                    with m.Else():
                        m.d.sync += state.eq(TraceState.CAPTURE)
                with m.Elif(state == TraceState.CAPTURE):
                    # The window stopped without its last cycle (a flush), or a new one began.
                    m.d.sync += state.eq(TraceState.DONE)
        with m.If(a_r):
            with m.If(a_ok):
                m.d.sync += [state.eq(TraceState.PENDING), ch.eq(a_ch), count.eq(0),
                             full.eq(0), refused.eq(0)]
            with m.Else():
                m.d.sync += refused.eq(1)

        armed = (state == TraceState.PENDING) | (state == TraceState.ARMED)
        m.d.comb += [
            self.status.eq(Cat(armed, state == TraceState.CAPTURE, state == TraceState.DONE,
                               full, refused, Const(0, 3), ch)),
            self.count.eq(count),
        ]
