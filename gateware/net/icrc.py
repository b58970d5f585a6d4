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

The CRC register is linear in its old value and the word: ``next = A(reg) ^ B(word)``.
:class:`ICRCEngine` takes the data terms ``B(word)`` of both processors (:func:`icrc_terms`) and
only does ``A(reg) ^ term`` per word, so that a caller can register the terms with the word
(the XOR trees of a 64-bit step split over two cycles without adding latency). :class:`ICRC`
takes the words themselves.

Lane order everywhere: byte ``i`` of a 64-bit word at bits ``[8*i+7 : 8*i]``, byte 0 first on the
wire (the convention of :mod:`openqlink.gateware.packet`).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import crc, wiring
from amaranth.lib.crc.catalog import CRC32_ETHERNET
from amaranth.lib.wiring import In, Out

__all__ = ["ICRC", "ICRCEngine", "ICRC_WORD_MASKS", "icrc_mask", "icrc_terms",
           "shifted_initial_crc"]


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


def _register_step(algorithm: crc.Algorithm, init: int, data: bytes) -> int:
    """The CRC register (unreflected, no output XOR) after ``data``, starting from ``init``."""
    raw = crc.Algorithm(crc_width=algorithm.crc_width, polynomial=algorithm.polynomial,
                        initial_crc=init, reflect_input=algorithm.reflect_input,
                        reflect_output=False, xor_output=0)
    return raw(data_width=8).compute(data)


def _state_columns(algorithm: crc.Algorithm = CRC32_ETHERNET) -> list[int]:
    """Columns of ``A``: the register after 8 zero bytes from each single-bit register."""
    return [_register_step(algorithm, 1 << i, bytes(8)) for i in range(algorithm.crc_width)]


def _data_columns(algorithm: crc.Algorithm = CRC32_ETHERNET) -> list[int]:
    """Columns of ``B``: the register after each single-bit 64-bit word (lane order), from 0."""
    return [_register_step(algorithm, 0, (1 << j).to_bytes(8, "little")) for j in range(64)]


def _apply(columns: list[int], vector: Value, width: int) -> Value:
    """The GF(2) product of the matrix with these columns and ``vector``."""
    vector = Value.cast(vector)
    bits = []
    for r in range(width):
        taps = [vector[c] for c, col in enumerate(columns) if (col >> r) & 1]
        bits.append(Cat(*taps).xor() if taps else Const(0, 1))
    return Cat(*bits)


def icrc_terms(word: Value, prev_hi: Value, parts: int = 1) -> tuple[Value, Value]:
    """The data terms of one word of ``V`` for :class:`ICRCEngine`: ``(whole, shifted)``.

    ``word`` is the (masked) word of ``V``; ``prev_hi`` lanes 4-7 of the previous word of
    ``V`` (0 for the first word). Each term is split into ``parts`` partial terms of 32 bits
    (``Cat``-ed, part ``i`` from bits ``[64*i/parts, 64*(i+1)/parts)`` of the processor's data
    word), whose XOR is the term: XOR trees of up to ``64 / parts`` inputs.
    """
    if parts not in (1, 2, 4):
        raise ValueError(f"parts must be 1, 2 or 4, not {parts}")
    columns = _data_columns()
    word = Value.cast(word)
    span = 64 // parts

    def split(data: Value) -> Value:
        return Cat(*(_apply(columns[span * i:span * (i + 1)], data[span * i:span * (i + 1)], 32)
                     for i in range(parts)))

    return split(word), split(Cat(Value.cast(prev_hi), word[:32]))


class ICRCEngine(wiring.Component):
    """ICRC of one word-aligned message ``V`` at a time, from the data terms of its words.

    As :class:`ICRC`, with ``term_whole`` and ``term_shifted`` (:func:`icrc_terms` of the word
    and of the word shifted behind lanes 4-7 of the previous one) in place of ``word``. The
    first word of ``V`` is always all ones: with ``first`` the terms are ignored and the
    registers start from their value after that word.

    Parameters
    ----------
    parts : int
        Partial terms per term (see :func:`icrc_terms`).

    Members
    -------
    valid, first, last, last_half : In(1)
        As :class:`ICRC`.
    first_half : In(1)
        With ``first``: start the whole processor as the shifted one, for a caller that feeds a
        ``V`` of ``8k + 4`` bytes behind 4 zero bytes itself (the words of the shifted
        processor, whole) and uses only the whole processor (``term_shifted`` and ``last_half``
        0: the shifted processor is then left out by synthesis).
    term_whole, term_shifted : In(32 * parts)
        The data terms of the word, as ``parts`` partial terms.
    crc : Out(32)
        As :class:`ICRC`: valid from the cycle ``done`` pulses until the next accepted ``first``.
    done : Out(1)
        Pulses for one cycle, the cycle after the ``last`` word was accepted.
    """

    def __init__(self, parts: int = 1):
        self.parts = parts
        super().__init__({
            "valid": In(1), "first": In(1), "last": In(1), "last_half": In(1),
            "first_half": In(1),
            "term_whole": In(32 * parts), "term_shifted": In(32 * parts),
            "crc": Out(32), "done": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        algorithm = CRC32_ETHERNET

        def term(value: Value) -> Value:
            result = value[:32]
            for i in range(1, self.parts):
                result = result ^ value[32 * i:32 * (i + 1)]
            return result
        columns = _state_columns(algorithm)
        # The registers after V's first word (8 bytes of ones; the shifted processor sees 4
        # zero bytes and 4 of them).
        start_whole = _register_step(algorithm, algorithm.initial_crc, b"\xff" * 8)
        start_shifted = _register_step(algorithm, shifted_initial_crc(algorithm),
                                       bytes(4) + b"\xff" * 4)

        whole = Signal(32, init=algorithm.initial_crc)
        shifted = Signal(32, init=shifted_initial_crc(algorithm))
        busy = Signal()         # between an accepted first and the accepted last
        use_shifted = Signal()  # the message ended on a half word
        accept = Signal()
        m.d.comb += accept.eq(self.valid & (self.first | busy))

        m.d.sync += self.done.eq(0)
        with m.If(accept):
            m.d.sync += [
                whole.eq(Mux(self.first, Mux(self.first_half, start_shifted, start_whole),
                             _apply(columns, whole, 32) ^ term(self.term_whole))),
                shifted.eq(Mux(self.first, start_shifted,
                               _apply(columns, shifted, 32) ^ term(self.term_shifted))),
            ]
            with m.If(self.last):
                m.d.sync += [
                    busy.eq(0),
                    use_shifted.eq(self.last_half),
                    self.done.eq(1),
                ]
            with m.Else():
                m.d.sync += busy.eq(1)

        reg = Mux(use_shifted, shifted, whole)
        if algorithm.reflect_output:
            reg = Cat(*reversed(list(reg)))
        m.d.comb += self.crc.eq(reg ^ algorithm.xor_output)
        return m


class ICRC(wiring.Component):
    """ICRC of one word-aligned message ``V`` at a time, one 64-bit word per cycle.

    The caller feeds ``V`` (already masked, see :func:`icrc_mask`) word by word: ``first`` on
    word 0 (all ones in every ``V``), ``last`` on the final word, with ``last_half`` when only
    lanes 0-3 of that final word belong to ``V`` (``V`` of ``8k + 4`` bytes; the upper lanes are
    ignored). Words with ``valid`` low are skipped. Words arriving after ``last`` and before the
    next ``first`` are ignored. An :class:`ICRCEngine` with the data terms computed in front of
    it, combinationally.

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
        m.submodules.engine = engine = ICRCEngine()
        prev_hi = Signal(32)    # lanes 4-7 of the previous accepted word
        with m.If(self.valid):
            m.d.sync += prev_hi.eq(self.word[32:])
        term_whole, term_shifted = icrc_terms(self.word, Mux(self.first, 0, prev_hi))
        m.d.comb += [
            engine.valid.eq(self.valid),
            engine.first.eq(self.first),
            engine.last.eq(self.last),
            engine.last_half.eq(self.last_half),
            engine.term_whole.eq(term_whole),
            engine.term_shifted.eq(term_shifted),
            self.crc.eq(engine.crc),
            self.done.eq(engine.done),
        ]
        return m
