"""IPv4 header checksum, pipelined over two cycles.

# Ref: RFC 791 3.1 (header checksum); RFC 1071 (one's-complement sum, end-around carry);
# RFC 1624 3 (the two zero forms).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ...wire.header import Header
from ...wire.ipv4 import IPV4

__all__ = ["IPv4Checksum"]

#: The IPv4 header seen as ten big-endian 16-bit words (RFC 1071): byte order handled by Header.
_WORDS = Header("IPv4Words", [(f"w{i}", 16) for i in range(IPV4.length_bytes // 2)],
                ref="RFC 1071")


class IPv4Checksum(wiring.Component):
    """One's-complement checksum of a 20-byte IPv4 header (no options).

    To generate a checksum, give the header with its checksum field zero: ``checksum`` is the
    value to put in the field. To verify one, give the header as received: ``checksum`` is 0 when
    the header is good (a sum of 0xFFFF, the one's-complement zero).

    Members
    -------
    header : In(160)
        The header bytes in stream lane order (byte ``i`` at bits ``[8*i+7 : 8*i]``, as
        :meth:`openqlink.wire.header.Header.build` makes them). Sampled when ``valid`` is high.
    valid : In(1)
        Start a computation on ``header``. One may start every cycle (fully pipelined).
    checksum : Out(16)
        The complemented one's-complement sum (an integer; the field's value), registered.
    done : Out(1)
        ``checksum`` belongs to the header given 2 cycles earlier (latency 2 cycles).

    No back-pressure; ``checksum`` holds until the next result.
    """

    header: In(IPV4.length_bytes * 8)
    valid: In(1)
    checksum: Out(16)
    done: Out(1)

    def elaborate(self, platform) -> Module:
        m = Module()

        words = list(_WORDS.view(self.header).values())
        half = len(words) // 2
        # Stage 1: two partial sums of five 16-bit words each (19 bits).
        sum_a = Signal(19)
        sum_b = Signal(19)
        stage1 = Signal()
        m.d.sync += stage1.eq(self.valid)
        with m.If(self.valid):
            m.d.sync += [
                sum_a.eq(sum(words[:half])),
                sum_b.eq(sum(words[half:])),
            ]

        # Stage 2: total (< 2**20), the end-around-carry folds, complement. The first fold is
        # computed with and without the second fold's carry side by side, and its own carry
        # picks one: two adders in a row, not three. The ``+ 1`` is a carry into the low end
        # (``2 lo + 1 + 2 hi + 1 = 2 (lo + hi + 1)``), so it is one carry chain, not a chain
        # behind the fold's.
        total = Signal(20)
        fold1 = Signal(17)
        fold1_p1 = Signal(18)
        fold2 = Signal(16)
        m.d.comb += [
            total.eq(sum_a + sum_b),
            fold1.eq(total[:16] + total[16:]),
            fold1_p1.eq(Cat(Const(1, 1), total[:16]) + Cat(Const(1, 1), total[16:])),
            fold2.eq(Mux(fold1[16], fold1_p1[1:17], fold1[:16])),
        ]
        m.d.sync += self.done.eq(stage1)
        with m.If(stage1):
            m.d.sync += self.checksum.eq(~fold2)
        return m
