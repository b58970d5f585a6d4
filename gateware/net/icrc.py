"""RoCEv2 Invariant CRC (ICRC) over a 64-bit word stream.

# Ref: IBTA Vol 1 Release 1.4 7.8.1 (ICRC); IBTA Annex A17 (RoCEv2) A17.4.4 (ICRC over the
# IPv4/UDP headers with the variant fields masked to ones); IEEE 802.3-2018 3.2.9 (CRC-32).

The ICRC is the Ethernet CRC-32 (``amaranth.lib.crc.catalog.CRC32_ETHERNET``: polynomial
0x04C11DB7, reflected, initial value and final XOR 0xFFFFFFFF) over the message ``V``: 8 bytes of
0xFF, then the IPv4 header with TOS, TTL and header checksum set to all ones, the UDP header with
its checksum set to all ones, the BTH with its byte 4 (FECN, BECN, resv6) set to all ones, then the
rest of the BTH, the extension headers, the payload and the pad bytes. The software reference is
:func:`openqlink.wire.roce.icrc` / :func:`openqlink.wire.roce.icrc_masked_bytes`.

Every RoCE packet is padded to a multiple of 4 bytes (BTH PadCnt), so ``V`` is ``8k`` or
``8k + 4`` bytes long. :class:`ICRC` runs two 64-bit :class:`amaranth.lib.crc.Processor`\\ s side
by side: one fed ``V`` itself, one fed ``V`` delayed by 4 bytes behind 4 zero bytes, starting from
an initial register value ``S`` chosen so that 32 zero bits take ``S`` to the standard initial
value. At the end, the result of the processor whose stream ended on a word boundary is taken.
No keep multiplexer sits in the CRC path.

Lane order everywhere: byte ``i`` of a 64-bit word at bits ``[8*i+7 : 8*i]``, byte 0 first on the
wire (the convention of :mod:`openqlink.gateware.packet`).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import crc, wiring
from amaranth.lib.crc.catalog import CRC32_ETHERNET
from amaranth.lib.wiring import In, Out

__all__ = ["ICRC", "ICRC_WORD_MASKS", "icrc_mask", "shifted_initial_crc"]


def _solve_gf2(columns: list[int], target: int, width: int) -> int:
    """Solve ``M x = target`` over GF(2), ``M`` given by its ``width`` columns (as ints).

    Raises :class:`ValueError` if ``M`` is singular.
    """
    # Augmented rows: row r holds bit r of every column, then bit r of the target.
    rows = []
    for r in range(width):
        row = 0
        for c, col in enumerate(columns):
            row |= ((col >> r) & 1) << c
        row |= ((target >> r) & 1) << width
        rows.append(row)
    pivot_row = 0
    pivots = []
    for c in range(width):
        for r in range(pivot_row, width):
            if (rows[r] >> c) & 1:
                rows[pivot_row], rows[r] = rows[r], rows[pivot_row]
                break
        else:
            raise ValueError("singular matrix over GF(2)")
        for r in range(width):
            if r != pivot_row and (rows[r] >> c) & 1:
                rows[r] ^= rows[pivot_row]
        pivots.append(c)
        pivot_row += 1
    x = 0
    for r, c in enumerate(pivots):
        x |= ((rows[r] >> width) & 1) << c
    return x


def shifted_initial_crc(algorithm: crc.Algorithm = CRC32_ETHERNET, zero_bytes: int = 4) -> int:
    """The CRC register value ``S`` that ``zero_bytes`` zero bytes take to ``initial_crc``.

    Computed at elaboration time from the linearity of the CRC register update: the effect of
    ``zero_bytes`` zero bytes on each register bit is found with ``Algorithm(...)(8).compute``,
    and the resulting 32x32 system is solved over GF(2). The value is in the register's own
    (unreflected) bit order, as :class:`amaranth.lib.crc.Algorithm`'s ``initial_crc``.
    """
    width = algorithm.crc_width
    columns = []
    for i in range(width):
        probe = crc.Algorithm(crc_width=width, polynomial=algorithm.polynomial,
                              initial_crc=1 << i, reflect_input=False, reflect_output=False,
                              xor_output=0)
        columns.append(probe(data_width=8).compute([0] * zero_bytes))
    return _solve_gf2(columns, algorithm.initial_crc, width)


def _with_initial(algorithm: crc.Algorithm, initial_crc: int) -> crc.Algorithm:
    return crc.Algorithm(crc_width=algorithm.crc_width, polynomial=algorithm.polynomial,
                         initial_crc=initial_crc, reflect_input=algorithm.reflect_input,
                         reflect_output=algorithm.reflect_output,
                         xor_output=algorithm.xor_output)


def _lane_mask(lanes: list[int]) -> int:
    return sum(0xFF << (8 * lane) for lane in lanes)


#: ICRC masks of ``V`` (IPv4 without options) per 64-bit word index: bits set to one.
#: V bytes 0-7 (the 8 bytes of ones), 9 (IPv4 TOS), 16 (TTL), 18-19 (IPv4 header checksum),
#: 34-35 (UDP checksum), 40 (BTH byte 4: FECN, BECN, resv6). Other words are not masked.
ICRC_WORD_MASKS: dict[int, int] = {
    0: _lane_mask(list(range(8))),
    1: _lane_mask([1]),
    2: _lane_mask([0, 2, 3]),
    4: _lane_mask([2, 3]),
    5: _lane_mask([0]),
}


def icrc_mask(word_index: Value | int, word: Value) -> Value:
    """Apply the ICRC masks to word ``word_index`` of ``V`` (IPv4 without options).

    ``word`` is the 64-bit word ``word_index`` of ``V`` in lane order (V bytes
    ``[8*word_index, 8*word_index + 8)``); the result is ``word`` with the bytes listed in
    :data:`ICRC_WORD_MASKS` forced to 0xFF. ``word_index`` may be an int (constant masks) or an
    unsigned Amaranth value (a small comparator and OR per masked word). Combinational: no
    latency. Word indices above 5 pass through unchanged.
    """
    word = Value.cast(word)
    if len(word) != 64:
        raise ValueError(f"icrc_mask: word must be 64 bits, not {len(word)}")
    if isinstance(word_index, int):
        return word | Const(ICRC_WORD_MASKS.get(word_index, 0), 64)
    word_index = Value.cast(word_index)
    mask = Const(0, 64)
    for index, lanes in ICRC_WORD_MASKS.items():
        mask = mask | Mux(word_index == index, Const(lanes, 64), Const(0, 64))
    return word | mask


class ICRC(wiring.Component):
    """ICRC of one word-aligned message ``V`` at a time, one 64-bit word per cycle.

    The caller feeds ``V`` (already masked, see :func:`icrc_mask`) word by word: ``first`` on
    word 0, ``last`` on the final word, with ``last_half`` when only lanes 0-3 of that final word
    belong to ``V`` (``V`` of ``8k + 4`` bytes; the upper lanes are ignored). Words with ``valid``
    low are skipped. Words arriving after ``last`` and before the next ``first`` are ignored.

    Members
    -------
    valid : In(1)
        ``word`` holds a word of ``V``. Accepted every cycle (no back-pressure).
    first : In(1)
        This word is word 0 of a new message: restart.
    last : In(1)
        This word is the final word of the message.
    last_half : In(1)
        With ``last``: only lanes 0-3 of this word belong to ``V``.
    word : In(64)
        Word of ``V``, byte ``i`` at bits ``[8*i+7 : 8*i]``, byte 0 first.
    crc : Out(32)
        The ICRC: its little-endian bytes are the 4 wire bytes (the value ``zlib.crc32`` gives).
        Valid from the cycle ``done`` pulses until the next accepted ``first``.
    done : Out(1)
        Pulses for one cycle, the cycle after the ``last`` word was accepted (latency 1 cycle).
    """

    valid: In(1)
    first: In(1)
    last: In(1)
    last_half: In(1)
    word: In(64)
    crc: Out(32)
    done: Out(1)

    def elaborate(self, platform) -> Module:
        m = Module()

        m.submodules.whole = whole = crc.Processor(CRC32_ETHERNET(data_width=64))
        shifted_algorithm = _with_initial(CRC32_ETHERNET, shifted_initial_crc(CRC32_ETHERNET))
        m.submodules.shifted = shifted = crc.Processor(shifted_algorithm(data_width=64))

        busy = Signal()         # between an accepted first and the accepted last
        prev_hi = Signal(32)    # lanes 4-7 of the previous accepted word
        use_shifted = Signal()  # the message ended on a half word
        accept = Signal()

        m.d.comb += accept.eq(self.valid & (self.first | busy))
        shifted_word = Cat(Mux(self.first, 0, prev_hi), self.word[:32])

        m.d.comb += [
            whole.start.eq(accept & self.first),
            whole.valid.eq(accept),
            whole.data.eq(self.word),
            shifted.start.eq(accept & self.first),
            shifted.valid.eq(accept),
            shifted.data.eq(shifted_word),
        ]

        m.d.sync += self.done.eq(0)
        with m.If(accept):
            m.d.sync += prev_hi.eq(self.word[32:])
            with m.If(self.last):
                m.d.sync += [
                    busy.eq(0),
                    use_shifted.eq(self.last_half),
                    self.done.eq(1),
                ]
            with m.Else():
                m.d.sync += busy.eq(1)

        m.d.comb += self.crc.eq(Mux(use_shifted, shifted.crc, whole.crc))
        return m
