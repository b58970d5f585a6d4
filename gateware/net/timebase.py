"""Free-running nanosecond timebase of the network clock domain, for RPC ``ptp_timestamp``.

# Ref: cuda-quantum realtime/docs/cudaq_realtime_message_protocol.md (ptp_timestamp, opaque,
# by convention PTP time in ns); Holoscan Sensor Bridge timestamps {seconds, nanoseconds};
# IEEE 1588-2019 5.3.3 (Timestamp: seconds and nanoseconds fields). openqlink.memory_map
# TIMESTAMP_FORMAT register.

The time since reset advances by ``1e9 / clk_hz`` ns per cycle. That period is kept as an exact
rational number: an integer part added every cycle plus a fractional accumulator in units of
``1 / d`` ns (``d`` the denominator of ``1e9 / clk_hz`` in lowest terms; ``d = 5`` at
156.25 MHz, where the period is 6 + 2/5 ns). The accumulator therefore never drifts for any
integer ``clk_hz``: after ``n`` cycles, ``ns`` is exactly ``floor(n * 1e9 / clk_hz)``, so the
reading is at most ``(d - 1) / d`` ns (< 1 ns) behind the true time since reset, and never accrues
error. The clock's own ppm error is of course not corrected (there is no PTP servo yet).
"""

from fractions import Fraction

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Timebase", "NS_PER_SECOND"]

NS_PER_SECOND = 1_000_000_000


class Timebase(wiring.Component):
    """Free-running ns counter with the two ``ptp_timestamp`` encodings.

    Parameters
    ----------
    clk_hz : int
        Frequency of the clock this component runs on (the ``rti`` clock), in Hz, a positive
        integer. Raises :class:`TypeError` if it is not an int and :class:`ValueError` if it is
        not positive.

    Members
    -------
    format : In(1)
        TIMESTAMP_FORMAT: 0 = ns since reset as an unsigned 64-bit integer; 1 = Holoscan Sensor
        Bridge / IEEE 1588 style ``{seconds[63:32], nanoseconds[31:0]}`` since reset, with
        nanoseconds in 0..999_999_999.
    timestamp : Out(64)
        The time of this cycle in the selected format (combinational from ``format``).
    ns : Out(64)
        Plain ns since reset, ``floor(cycles * 1e9 / clk_hz)``; wraps after 2**64 ns.

    Both outputs come from registers updated every cycle; the value shown in cycle ``n`` after
    reset is the time of cycle ``n``. Seconds wrap after 2**32 s.
    """

    format: In(1)
    timestamp: Out(64)
    ns: Out(64)

    def __init__(self, clk_hz: int):
        if isinstance(clk_hz, bool) or not isinstance(clk_hz, int):
            raise TypeError(f"clk_hz must be an int, not {clk_hz!r}")
        if clk_hz <= 0:
            raise ValueError(f"clk_hz must be positive, not {clk_hz}")
        self.clk_hz = clk_hz
        period = Fraction(NS_PER_SECOND, clk_hz)
        #: Whole ns added every cycle.
        self.period_whole_ns = period.numerator // period.denominator
        #: Fractional ns per cycle, as ``period_frac_num / period_frac_den``.
        self.period_frac_num = period.numerator % period.denominator
        self.period_frac_den = period.denominator
        super().__init__()

    def elaborate(self, platform) -> Module:
        m = Module()

        den = self.period_frac_den
        num = self.period_frac_num
        whole = self.period_whole_ns

        frac = Signal(range(max(den, 2)))   # fractional ns, units of 1/den ns
        ns = Signal(64)
        nsec = Signal(range(NS_PER_SECOND))
        sec = Signal(32)

        # ``carry`` (the fraction overflows this cycle) is a register, computed a cycle ahead
        # from the next fraction: no compare sits in front of the wide adders.
        carry = Signal(init=int(num >= den) if num else 0)
        step = Signal(range(whole + 2))
        if num:
            frac_sum = frac + num
            frac_next = Signal.like(frac)
            m.d.comb += frac_next.eq(Mux(carry, frac_sum - den, frac_sum))
            m.d.sync += [frac.eq(frac_next), carry.eq(frac_next + num >= den)]
        m.d.comb += step.eq(whole + carry)

        # 64-bit ns as two 32-bit halves: the high half's increment is computed beside the low
        # half's sum, and the low sum's carry selects it (no 64-bit carry chain).
        ns_lo = Signal(33)
        m.d.comb += ns_lo.eq(ns[:32] + step)
        m.d.sync += ns.eq(Cat(ns_lo[:32], Mux(ns_lo[32], ns[32:] + 1, ns[32:])))
        # nsec + step and nsec + step - 1e9 side by side; the sign of the second picks one.
        nsec_sum = Signal(range(NS_PER_SECOND + whole + 2))
        nsec_wrap = Signal(signed(32))
        m.d.comb += [
            nsec_sum.eq(nsec + step),
            nsec_wrap.eq(nsec + step - NS_PER_SECOND),
        ]
        with m.If(~nsec_wrap[-1]):
            m.d.sync += [nsec.eq(nsec_wrap), sec.eq(sec + 1)]
        with m.Else():
            m.d.sync += nsec.eq(nsec_sum)

        nsec_32 = Signal(32)
        m.d.comb += [
            nsec_32.eq(nsec),
            self.ns.eq(ns),
            self.timestamp.eq(Mux(self.format, Cat(nsec_32, sec), ns)),
        ]
        return m
