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

        # Stage 2: the one's-complement sum of the partial sums' low and high parts (a sum
        # mod 0xFFFF is unchanged by moving bit 16 to bit 0): two 3:2 carry-save levels whose
        # carries out of bit 15 wrap to bit 0, then one end-around-carry adder, computed with
        # and without the carry in side by side (the ``+ 1`` is a carry into the low end:
        # ``2 x + 1 + 2 y + 1 = 2 (x + y + 1)``) and its own carry picking one. One carry chain;
        # the sum is 0 only when every part is (the carry-save words are 0 only then), so the
        # result is the sum's usual 16-bit form: 0 for an all-zero header, else 1..0xFFFF.
        def csa(a, b, c):
            carry = (a & b) | (a & c) | (b & c)
            return a ^ b ^ c, Cat(carry[15], carry[:15])

        parts = [sum_a[:16], sum_b[:16], sum_a[16:].as_unsigned(), sum_b[16:].as_unsigned()]
        s1, c1 = csa(parts[0], parts[1], Cat(parts[2], Const(0, 13)))
        s2, c2 = csa(s1, c1, Cat(parts[3], Const(0, 13)))
        pair = Signal(17)
        pair_p1 = Signal(18)
        fold2 = Signal(16)
        m.d.comb += [
            pair.eq(s2 + c2),
            pair_p1.eq(Cat(Const(1, 1), s2) + Cat(Const(1, 1), c2)),
            fold2.eq(Mux(pair[16], pair_p1[1:17], pair[:16])),
        ]
        m.d.sync += self.done.eq(stage1)
        with m.If(stage1):
            m.d.sync += self.checksum.eq(~fold2)
        return m
