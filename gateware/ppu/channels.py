"""Timed channels of a PPU and its PTD (physical) interface.

Each channel owns a timed event queue (:class:`TimedQueue`: a distributed-RAM ring with its two
oldest events in registers, :data:`FIFO_DEPTH` entries) filled by the PPU core, which runs ahead of
the timeline. The channel pops its head event and fires it on *exactly* the DTD cycle its
timestamp names, so that the effect appears on the PTD port on the cycle in which the shared
timeline counter ``now`` equals the event's ``time``. An event that reaches the head of its
queue too late to fire on time is never played late (QICK would play it late silently): the
channel pulses ``late`` and the PPU stops with a LATE error.

Timing contract. The event queue (:class:`TimedQueue`: a ring and a head register) compares the
head's ``time`` with the timeline one cycle ahead, so the fire decision is one LUT of
flip-flops; an event is fired when its time comes (``time == now + LEAD_CYCLES - 1`` at the
decision) and is late when it is at the head too late for that. An event must reach the
queue's head (pushed into an empty queue, or next in line) at least ``LEAD_CYCLES`` cycles
before its time (:class:`DriveChannel`: 5, :class:`ReadoutChannel` and :class:`MarkerChannel`:
2): pushed in cycle ``c`` into an empty queue, it can fire at ``c + LEAD_CYCLES`` at the earliest.

All channels are written in ``sync`` (renamed to ``dtd`` by the top). Asserting ``flush`` resets
a channel synchronously: its queue empties and its outputs are 0 from the next cycle (the PPU
asserts it while it is in ERROR; a push that is offered in a flushed cycle is discarded). A
:class:`DriveChannel`'s ``dac`` needs ``flush_next`` for that (high the cycle before ``flush``
rises), else it is 0 a cycle later.

# Ref: ARTIQ RTIO (timestamped event FIFOs, LATE/UNDERFLOW, ``artiq/gateware/rtio/sed``);
# QICK tProcessor timed queues; openqlink docs/architecture.md (PTD interface).
"""

import math

from amaranth.hdl import (
    Cat,
    Const,
    Module,
    Mux,
    ResetInserter,
    Shape,
    Signal,
    Value,
    signed,
    unsigned,
)
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..logic import kept

__all__ = [
    "FIFO_DEPTH", "SAMPLE_BITS", "PTDSignature",
    "drive_event", "readout_event", "marker_event",
    "DriveChannel", "ReadoutChannel", "MarkerChannel",
]

#: Entries of each channel's event FIFO; the core stalls when the FIFO is full.
FIFO_DEPTH = 16
#: Width of one DAC or ADC sample (signed, Q1.15 of full scale).
SAMPLE_BITS = 16
#: Envelope samples per 64-bit envelope-memory word.
_SAMPLES_PER_WORD = 4


def equal(m: Module, a, b, name: str):
    """``a == b`` (same width) as kept 2-bit compares (one LUT each) and their AND: three LUT
    levels for 32 bits."""
    a = Value.cast(a)
    b = Const(b, len(a)) if isinstance(b, int) else Value.cast(b)
    assert len(a) == len(b)
    groups = [kept(m, a[i:i + 2] == b[i:i + 2], f"{name}_eq{i // 2}")
              for i in range(0, len(a), 2)]
    return Cat(*groups).all()


def add_small(a, b):
    """``a + b`` mod ``2**len(a)`` for a time ``a`` (33..64 bits) and a ``b`` of at most 32
    bits, carry-select: the low 32 bits' carry picks the high part or its increment (two carry
    chains side by side, none as long as the time)."""
    a = Value.cast(a)
    assert 32 < len(a) <= 64
    lo = a[:32] + b
    return Cat(lo[:32], Mux(lo[32], a[32:] + 1, a[32:]))


def less(m: Module, a, b, name: str):
    """``a < b`` for times (33..64 bits) from their low 32 bits and the rest: two carry chains
    and a kept equality of the high parts, joined by one LUT."""
    a, b = Value.cast(a), Value.cast(b)
    lt_hi = (Cat(a[32:], Const(0, 1)) - Cat(b[32:], Const(0, 1)))[-1]
    lt_lo = (Cat(a[:32], Const(0, 1)) - Cat(b[:32], Const(0, 1)))[32]
    return lt_hi | (equal(m, a[32:], b[32:], f"{name}_hi") & lt_lo)


class PTDSignature(wiring.Signature):
    """The physical-time-domain interface of one PPU (seen from the PPU: ``Out``).

    Parameters
    ----------
    n_drive : int
        Drive (DAC) channels, 1..16.
    n_readout : int
        Readout (ADC) channels, 1..16.
    n_marker : int
        Digital marker outputs, 1..16.
    samples_per_cycle : int
        ``S``: PTD samples per DTD cycle and converter, 1, 2 or 4.

    Members
    -------
    dac, dac_q : ``Out(ArrayLayout(signed(16), n_drive * S))``
        The I and Q samples of the drive channels, signed Q1.15, 0 when not playing: channel
        ``i``'s lane ``k`` (PTD sample ``S * now + k``) at index ``S * i + k``. ``dac`` is a
        real-IF converter's sample or an IQ mixer's I; ``dac_q`` is 0 in a build without NCOs.
    dac_active : ``Out(n_drive)``
        Bit ``i`` is high on the cycles a pulse is playing on drive channel ``i``.
    ro_window : ``Out(n_readout)``
        Bit ``i`` is high on the cycles of an ACQUIRE window of readout channel ``i``.
    adc : ``In(ArrayLayout(signed(16), n_readout * S))``
        The ADC samples, readout channel ``i``'s lane ``k`` at index ``S * i + k``; integrated
        while ``ro_window``.
    marker : ``Out(n_marker)``
        Digital marker outputs.
    """

    def __init__(self, n_drive: int = 1, n_readout: int = 1, n_marker: int = 4,
                 samples_per_cycle: int = 1):
        for name, value in (("n_drive", n_drive), ("n_readout", n_readout),
                            ("n_marker", n_marker)):
            if not isinstance(value, int) or not 1 <= value <= 16:
                raise ValueError(f"{name} must be an integer in 1..16, not {value!r}")
        if samples_per_cycle not in (1, 2, 4):
            raise ValueError(f"samples_per_cycle must be 1, 2 or 4, not {samples_per_cycle!r}")
        self.n_drive = n_drive
        self.n_readout = n_readout
        self.n_marker = n_marker
        self.samples_per_cycle = samples_per_cycle
        lanes = samples_per_cycle
        super().__init__({
            "dac": Out(data.ArrayLayout(signed(SAMPLE_BITS), n_drive * lanes)),
            "dac_q": Out(data.ArrayLayout(signed(SAMPLE_BITS), n_drive * lanes)),
            "dac_active": Out(n_drive),
            "ro_window": Out(n_readout),
            "adc": In(data.ArrayLayout(signed(SAMPLE_BITS), n_readout * lanes)),
            "marker": Out(n_marker),
        })

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and
                (other.n_drive, other.n_readout, other.n_marker, other.samples_per_cycle) ==
                (self.n_drive, self.n_readout, self.n_marker, self.samples_per_cycle))

    def __hash__(self) -> int:
        return hash((type(self), self.n_drive, self.n_readout, self.n_marker,
                     self.samples_per_cycle))

    def __repr__(self) -> str:
        return (f"PTDSignature(n_drive={self.n_drive}, n_readout={self.n_readout}, "
                f"n_marker={self.n_marker}, samples_per_cycle={self.samples_per_cycle})")


def drive_event(time_bits: int = 64) -> data.StructLayout:
    """A queued PLAY (``time_bits + 97`` bits): see :class:`DriveChannel` for the NCO fields."""
    return data.StructLayout({
        "time": unsigned(time_bits),        # DTD cycle of the first sample
        "env_addr": unsigned(16),           # first envelope sample (taken mod env_depth)
        "env_len": unsigned(16),            # samples to play, one per cycle
        "amplitude": signed(16),            # Q1.15
        "phase": unsigned(16),              # NCO phase offset, turns / 2**16
        "freq_word": unsigned(32),          # NCO phase step per sample, turns / 2**32
        "phase_reset": unsigned(1),         # NCO accumulator starts at 0 on the first sample
    })


def readout_event(time_bits: int = 64, *, nco: bool = False) -> data.StructLayout:
    """A queued ACQUIRE (``time_bits + 52`` bits, ``+ 48`` with the NCO's fields)."""
    fields = {
        "time": unsigned(time_bits),        # DTD cycle of the first integrated sample
        "window_cycles": unsigned(16),      # 1..65535 cycles integrated
        "threshold": signed(32),            # result bit = (I > threshold)
        "rd": unsigned(4),                  # register that receives the result bit
    }
    if nco:
        fields["phase"] = unsigned(16)      # demodulation phase at the window's start
        fields["freq_word"] = unsigned(32)  # demodulation phase step per sample
    return data.StructLayout(fields)


def marker_event(time_bits: int = 64) -> data.StructLayout:
    """A queued MARKER (``time_bits + 16`` bits)."""
    return data.StructLayout({
        "time": unsigned(time_bits),        # first DTD cycle the marker is high
        "duration_cycles": unsigned(16),    # cycles high (0: drive it low)
    })


class TimedQueue(wiring.Component):
    """A channel's event queue: a ring and a head register with its time already compared.

    The head register ``head`` holds the oldest event. Its comparisons with the timeline are
    computed in the cycle before (from the next event in line, the pushed event or the head
    itself and a registered ``now + 1 + fire_lead``), so ``on_time`` and ``past`` come from
    flip-flops: no full-width compare sits on a channel's fire decision. The level is kept as
    flip-flop flags, and ``ready`` is a flip-flop: a pop makes room from the next cycle on.

    Parameters
    ----------
    layout : data.StructLayout
        The event; its ``time`` member (``unsigned(time_bits)``, the timeline's width) is
        compared.
    fire_lead : int
        Cycles between the fire decision and the event's time.
    tag : callable, optional
        ``tag(event) -> Value`` of exactly ``tag_bits`` bits, computed as an event is pushed
        and kept with it (in the ring too) to ``head_tag``. Elaboration raises ``ValueError``
        when its width differs (a wider value would move its fields).

    Members
    -------
    event : ``In(stream.Signature(layout))``
        Events from the core; ``ready`` (registered) is low while the queue holds
        :data:`FIFO_DEPTH` events, and in the cycle after a pop that made room in a full queue.
    now : ``In(time_bits)``
        The timeline counter; it must advance by one every cycle.
    flush : ``In(1)``
        Synchronous reset: the queue is empty from the next cycle.
    head : ``Out(layout)``; ``valid : Out(1)``
        The head event.
    on_time : ``Out(1)``; ``past : Out(1)``; ``due : Out(1)``
        ``valid`` and ``head.time == now + fire_lead`` (resp. ``<``, ``<=``: ``on_time | past``,
        two LUT levels from flip-flops, for ``pop``). ``on_time`` is one LUT of flip-flops.
    pop : ``In(1)``
        Drop the head this cycle; the next event is the head from the next cycle on.
    empty : ``Out(1)``
        Nothing queued.
    head_tag : ``Out(tag_bits)``
        With ``tag``: ``tag(head)``, a flip-flop (computed from the event in line before it
        becomes the head), so that what a channel derives from its head sits in front of the
        head's register, not behind it.

    Latency: an event pushed in cycle ``c`` into an empty queue (or next in line in cycle
    ``c``) is the head, with its compares, from ``c + 1``: it must be there at least
    ``fire_lead + 1`` cycles before its time.
    """

    def __init__(self, layout, fire_lead: int, *, tag=None, tag_bits: int = 0):
        self._layout = layout
        self._fire_lead = fire_lead
        self._time_bits = Shape.cast(data.Layout.cast(layout)["time"].shape).width
        if tag is not None and tag_bits < 1:
            raise ValueError(f"a tag needs tag_bits of at least 1, not {tag_bits}")
        self._tag = tag
        members = {
            "event": In(stream.Signature(layout)),
            "now": In(self._time_bits),
            "flush": In(1),
            "head": Out(layout),
            "valid": Out(1),
            "on_time": Out(1),
            "past": Out(1),
            "due": Out(1),
            "pop": In(1),
            "empty": Out(1),
        }
        if tag is not None:
            members["head_tag"] = Out(tag_bits)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        # ``now + fire_lead`` of the next cycle. Reset-less: a flush must not touch it (the
        # timeline keeps running); after a domain reset it is right from the second cycle,
        # before any event can be queued.
        due_next = Signal(self._time_bits, init=1 + self._fire_lead, reset_less=True)
        m.d.sync += due_next.eq(add_small(self.now, 2 + self._fire_lead))

        q = Module()
        width = data.Layout.cast(self._layout).size
        # Every pushed event is written to a distributed RAM ring (``wr`` is the next entry);
        # the oldest event is also in ``head``, the next one in ``second``, and ``rd`` is the
        # entry after ``second``. ``n`` counts the events queued, with flags ``ge[k] = n >= k``
        # kept as flip-flops: the pop of a cycle (the last signal to settle) only picks
        # between values prepared from flip-flops. With ``tag``, each entry holds the event's
        # tag too (computed as it is pushed), so that nothing but a multiplexer follows the
        # RAM's read on the way to ``second``'s tag.
        tag_bits = len(self.head_tag) if self._tag is not None else 0
        if tag_bits:
            pushed_tag = Value.cast(self._tag(self.event.payload))
            if len(pushed_tag) != tag_bits:
                # A wider value would put its fields at other bits than the reader expects.
                raise ValueError(f"tag gives {len(pushed_tag)} bits, not tag_bits={tag_bits}")
        mem = q.submodules.mem = Memory(shape=unsigned(width + tag_bits), depth=FIFO_DEPTH,
                                        init=[])
        mem_w = mem.write_port()
        mem_r = mem.read_port(domain="comb")
        wr = Signal(range(FIFO_DEPTH))
        rd = Signal(range(FIFO_DEPTH), init=2)
        n = Signal(range(FIFO_DEPTH + 1))
        ge1, ge2, ge3 = Signal(), Signal(), Signal()
        ge4 = n >= 4
        # ``ready`` is registered: ``n + push < FIFO_DEPTH`` before this cycle's pop (a pop
        # makes room from the next cycle on).
        ready = Signal(init=1)
        second = Signal(self._layout)
        pushed = self.event.payload
        push = self.event.valid & ready
        pop = self.pop
        load = ~ge1 | pop
        up = push & ~pop
        down = pop & ~push
        ge1_next = Signal()
        q.d.comb += [
            ge1_next.eq(Mux(up, 1, Mux(down, ge2, ge1))),
            self.event.ready.eq(ready),
            mem_w.addr.eq(wr), mem_w.en.eq(push),
            mem_w.data.eq(Cat(pushed, pushed_tag) if tag_bits else pushed),
            mem_r.addr.eq(rd),
        ]
        q.d.sync += [
            wr.eq(wr + push),
            rd.eq(rd + pop),
            n.eq(Mux(up, n + 1, Mux(down, n - 1, n))),
            ge1.eq(ge1_next),
            ge2.eq(Mux(up, ge1, Mux(down, ge3, ge2))),
            ge3.eq(Mux(up, ge2, Mux(down, ge4, ge3))),
            ready.eq(Mux(push, n < FIFO_DEPTH - 1, n < FIFO_DEPTH)),
        ]
        # The head takes ``second`` (or, with one event or none queued, the pushed event) when
        # it leaves or is empty; ``second`` takes the RAM's entry (or the pushed event) when the
        # head takes it, or when it is empty and the head stays.
        with q.If(load):
            q.d.sync += self.head.eq(Mux(ge2, second.as_value(), pushed.as_value()))
        with q.If(Mux(ge2, pop, ~pop)):
            q.d.sync += second.eq(Mux(ge3, mem_r.data[:width], pushed.as_value()))
        if tag_bits:
            # ``tag`` of ``second`` kept beside it, and both moved like the events.
            second_tag = Signal.like(self.head_tag)
            with q.If(load):
                q.d.sync += self.head_tag.eq(Mux(ge2, second_tag, pushed_tag))
            with q.If(Mux(ge2, pop, ~pop)):
                q.d.sync += second_tag.eq(Mux(ge3, mem_r.data[width:], pushed_tag))

        # The three candidates for the next cycle's head (the pushed event, ``second``, the
        # head itself) are compared in parallel with the next cycle's ``now + fire_lead`` and
        # registered; the choice (registered too) is made after the flip-flops. ``le``
        # (``time <= due``, the sign of one subtraction: one carry chain) is the pop, ``eq``
        # the fire. A head that stays was not due, so it is never past: one chain is enough.
        loaded = Signal()
        from_second = Signal()
        q.d.sync += [loaded.eq(load), from_second.eq(ge2)]

        def compare(name, time, with_eq=True):
            # ``le`` from the halves side by side: the high half below (a 32-bit chain), or
            # equal (a LUT tree) with the low half not above (a 32-bit chain); one LUT joins
            # them. The equality of the halves is registered too (three LUT levels each).
            # Returns the registered ``le`` and ``eq`` and the unregistered ``le`` and ``eq``.
            hi, lo = time[32:], time[:32]
            due_hi, due_lo = due_next[32:], due_next[:32]
            lt_hi = (Cat(hi, Const(0, 1)) - Cat(due_hi, Const(0, 1)))[-1]
            le_lo = ~(Cat(due_lo, Const(0, 1)) - Cat(lo, Const(0, 1)))[32]
            eq_hi_now = equal(q, hi, due_hi, f"{name}_hi")
            le_now = lt_hi | (eq_hi_now & le_lo)
            le = Signal(name=f"{name}_le")
            q.d.sync += le.eq(le_now)
            if not with_eq:
                return le, le, le_now, le_now
            eq_lo_now = equal(q, lo, due_lo, f"{name}_lo")
            eq_hi = Signal(name=f"{name}_eq_hi")
            eq_lo = Signal(name=f"{name}_eq_lo")
            q.d.sync += [eq_hi.eq(eq_hi_now), eq_lo.eq(eq_lo_now)]
            return le, eq_hi & eq_lo, le_now, eq_hi_now & eq_lo_now

        le_p, eq_p, _, _ = compare("pushed", pushed.time)
        le_s, eq_s, _, eq_s_now = compare("second", second.time)
        le_h, _, le_h_now, _ = compare("head", self.head.time, with_eq=False)
        due = Mux(loaded, Mux(from_second, le_s, le_p), le_h)
        past = loaded & Mux(from_second, le_s & ~eq_s, le_p & ~eq_p)
        # ``on_time``: one LUT of four flip-flops. The head that stays and ``second`` (both
        # registers here) are chosen in front of a flip-flop of their own, with this cycle's
        # ``load`` and ``ge2`` (what ``loaded`` and ``from_second`` will hold); the pushed
        # event, which comes from the core's execute stage with no time to spare, only through
        # its registered equality and a registered flag that it became the head. Neither of
        # the first two needs ``ge1_next`` (the push): ``ge2`` implies ``ge1``, so the queue
        # is not empty after a load from ``second``, nor after a cycle without a load (the
        # head stays: ``ge1`` and no pop).
        on_time_kept = Signal()
        head_pushed = Signal()
        q.d.sync += [
            on_time_kept.eq(Mux(load, ge2 & eq_s_now, le_h_now)),
            head_pushed.eq(ge1_next & load & ~ge2),
        ]
        q.d.comb += [
            self.valid.eq(ge1),
            self.on_time.eq(on_time_kept | (head_pushed & eq_p)),
            self.past.eq(ge1 & past),
            self.due.eq(ge1 & due),
            self.empty.eq(~ge1),
        ]
        m.submodules.queue = ResetInserter(self.flush)(q)
        return m


def _cos_sin_reads(m: Module, thetas: list) -> list[tuple[Value, Value]]:
    """Read ``cos`` and ``sin`` of each 32-bit phase in ``thetas`` (one turn = ``2**32``) from
    the NCO's table (:meth:`DriveChannel.cos_table`, added to ``m`` once as ``cos``), two
    synchronous read ports per phase: the values are valid the cycle after the phases.
    ``sin`` is the table a quarter turn back. Signals ``theta<k>`` name the phases."""
    m.submodules.cos = table = Memory(shape=signed(DriveChannel.COS_BITS),
                                      depth=DriveChannel.COS_ENTRIES,
                                      init=DriveChannel.cos_table())
    index_bits = (DriveChannel.COS_ENTRIES - 1).bit_length()
    quarter = DriveChannel.COS_ENTRIES // 4
    reads = []
    for k, value in enumerate(thetas):
        theta = Signal(32, name=f"theta{k}")
        m.d.comb += theta.eq(value)
        index = theta[32 - index_bits:]
        ports = []
        for addr in (index, (index - quarter)[:index_bits]):
            port = table.read_port()
            m.d.comb += port.addr.eq(addr)
            ports.append(port.data)
        reads.append(tuple(ports))
    return reads


class DriveChannel(wiring.Component):
    """One drive (DAC) channel: plays ``env[env_addr ..] * amplitude``, mixed with its NCO.

    ``S = samples_per_cycle`` samples leave per DTD cycle (lanes ``0 .. S-1``, lane ``k`` at
    PTD sample index ``S * now + k``). A pulse whose event has time ``T`` plays ``env_len``
    samples from ``env_addr`` (both multiples of ``S``: the core refuses others): on the cycle
    with ``now == T + j``, lane ``k`` carries envelope sample ``e = env[env_addr + S j + k]``
    (addresses wrap mod ``env_depth``), and ``active`` is high on exactly those cycles.

    Without the NCO (``nco=False``): ``dac = sat16((e * amplitude) >> 15)`` (arithmetic shift,
    floor; the only saturating product is ``-1 * -1``, which gives 32767) and ``dac_q = 0``.

    With the NCO: per channel a 32-bit phase accumulator ``acc`` (one turn = ``2**32``)
    advances by ``S * freq_word`` every cycle, playing or not, so that a pulse's phase follows
    from the ones before it (phase-continuous: a new ``freq_word`` takes effect on its pulse's
    first sample, from the phase the previous frequency reached; ``phase_reset`` starts the
    accumulator at 0 on that sample instead). Lane ``k``'s phase is
    ``theta = acc + k * freq_word + (phase << 16)`` (mod ``2**32``, ``phase`` in turns /
    ``2**16``, taken on the pulse's first sample like the frequency), and ::

        c, s = COS[theta >> 22], COS[((theta >> 22) - 256) % 1024]   # cos, sin; Q2.16
        a_c = clamp((amplitude * c) >> 16), a_s = clamp((amplitude * s) >> 16)  # to 16 bits
        dac = sat16((e * a_c) >> 15),  dac_q = sat16((e * a_s) >> 15)

    ``COS[i] = round(65536 * cos(2 pi i / 1024))`` (18-bit, computed once at elaboration; a
    phase of 0 gives ``amplitude`` itself, so with ``freq_word = phase = 0`` ``dac`` equals the
    no-NCO output bit for bit). ``I + jQ = e * amplitude * exp(j theta)``: ``dac`` is the real
    part (the DAC of a real-IF output, or the I of an IQ mixer) and ``dac_q`` the imaginary.
    The phase is truncated to 10 bits (spurs below -60 dBc). The NCO's state is reset with the
    channel (``flush``). A new event whose time comes while a pulse is still playing takes over
    from that cycle on (the later event wins, as on an RTIO output); a PLAY with ``env_len ==
    0`` thus stops a playing pulse (and still sets the NCO's frequency and phase).

    Parameters
    ----------
    env_depth : int
        Samples in the PPU's envelope memory (power of two, at least 4).
    time_bits : int
        Width of the timeline and of event times (``QSCParams.timeline_bits``, 33..64).
    samples_per_cycle : int
        ``S``, 1, 2 or 4 lanes per cycle (the envelope memory gives 4 samples per read).
    nco : bool
        Mix with the NCO (two multipliers and a cosine-table read per lane more).

    Members
    -------
    event : ``In(stream.Signature(drive_event(time_bits)))``
        Events from the core; ``ready`` is low while the FIFO is full (the core stalls).
    now : ``In(time_bits)``
        The shared timeline counter.
    flush : ``In(1)``
        Synchronous reset of the channel (FIFO, NCO and outputs).
    flush_next : ``In(1)``
        High in the cycle before ``flush`` rises (the PPU's error stage). ``dac`` is not among
        the registers that ``flush`` resets (nothing but a flip-flop follows the multiplier):
        the product stage takes a zero operand while ``flush_next`` is high, so ``dac`` is 0
        from the cycle after ``flush`` rises, with the outputs that ``flush`` resets. Tie it to
        0 and ``dac`` is 0 a cycle later.
    env_rd_addr : ``Out(range(env_depth // 4))``
        Word address for a synchronous (1-cycle latency) read port of the envelope memory,
        64-bit words of 4 samples, sample ``i`` at bits ``[16i+15:16i]``.
    env_rd_data : ``In(64)``
        Data of that read port.
    env_rd_min : ``In(8)``
        With the data, one bit per byte: the byte is that of -32768 at its place in a sample
        (0x00 for bits ``[16i+7:16i]``, 0x80 for ``[16i+15:16i+8]``), so sample ``i`` is -32768
        iff bits ``2i`` and ``2i+1`` are set. The PPU stores the bit beside each byte in the
        block RAM (written with it), so that the saturation's compare is not behind the read.
    dac, dac_q : ``Out(ArrayLayout(signed(16), S))``; ``active`` : ``Out(1)``
        The output samples (lane ``k`` at index ``k``) and "a pulse is playing".
    late : ``Out(1)``
        Pulses when the head event's time is less than ``now + LEAD_CYCLES`` (it is dropped).
    idle : ``Out(1)``
        High when the FIFO is empty and nothing is playing or in the pipeline.
    """

    #: Cycles an event must be queued before its time (fire decision: four cycles before,
    #: then envelope read, envelope word register, operand register, product register; the
    #: NCO's table read and amplitude product run beside the envelope's).
    LEAD_CYCLES = 5
    #: Entries of the NCO's cosine table (one turn); the phase's top 10 bits index it.
    COS_ENTRIES = 1024
    #: Bits of the table's entries (signed, 1.0 = 65536).
    COS_BITS = 18

    def __init__(self, env_depth: int, *, time_bits: int = 64, samples_per_cycle: int = 1,
                 nco: bool = True):
        if env_depth < _SAMPLES_PER_WORD or env_depth & (env_depth - 1):
            raise ValueError(f"env_depth must be a power of two >= 4, not {env_depth}")
        if samples_per_cycle not in (1, 2, 4):
            raise ValueError(f"samples_per_cycle must be 1, 2 or 4, not {samples_per_cycle!r}")
        self._env_depth = env_depth
        self._spc = samples_per_cycle
        self._nco = nco
        self._event = drive_event(time_bits)
        lanes = data.ArrayLayout(signed(SAMPLE_BITS), samples_per_cycle)
        super().__init__({
            "event": In(stream.Signature(self._event)),
            "now": In(time_bits),
            "flush": In(1),
            "flush_next": In(1),
            "env_rd_addr": Out(range(env_depth // _SAMPLES_PER_WORD)),
            "env_rd_data": In(64),
            "env_rd_min": In(8),
            "dac": Out(lanes),
            "dac_q": Out(lanes),
            "active": Out(1),
            "late": Out(1),
            "idle": Out(1),
        })

    @classmethod
    def cos_table(cls) -> list[int]:
        """The NCO's table: ``round(65536 * cos(2 pi i / COS_ENTRIES))``."""
        n = cls.COS_ENTRIES
        return [round(65536 * math.cos(2 * math.pi * i / n)) for i in range(n)]

    def elaborate(self, platform):
        m = Module()
        S = self._spc
        lane_bits = S.bit_length() - 1          # log2(S)
        m.submodules.queue = q = TimedQueue(self._event, self.LEAD_CYCLES - 1)
        wiring.connect(m, wiring.flipped(self.event), q.event)
        fire = q.on_time
        late = q.past
        m.d.comb += [q.now.eq(self.now), q.flush.eq(self.flush), q.pop.eq(q.due),
                     self.late.eq(late)]
        head = q.head

        # Fire stage: sample address generator, S samples per cycle. ``addr`` is the next
        # cycle's first address and ``rem`` the cycles left after the one being read.
        addr = Signal(range(self._env_depth))
        rem = Signal(16)
        more = Signal()          # rem != 0, registered
        amp = Signal(signed(SAMPLE_BITS))
        rd_addr = Signal(range(self._env_depth))
        reading = Signal()
        head_addr = Cat(Const(0, lane_bits), head.env_addr[lane_bits:len(addr)])
        head_cycles = head.env_len >> lane_bits
        with m.If(fire):
            m.d.comb += [rd_addr.eq(head_addr), reading.eq(head_cycles != 0)]
            m.d.sync += [
                addr.eq(head_addr + S),
                rem.eq(Mux(head_cycles != 0, head_cycles - 1, 0)),
                more.eq(head_cycles > 1),
                amp.eq(head.amplitude),
            ]
        with m.Else():
            m.d.comb += [rd_addr.eq(addr), reading.eq(more)]
            with m.If(more):
                m.d.sync += [addr.eq(addr + S), rem.eq(rem - 1), more.eq(rem != 1)]
        m.d.comb += self.env_rd_addr.eq(rd_addr >> 2)

        # Envelope read stage: the memory's output is valid in this cycle.
        s1_valid = Signal()
        s1_lane = Signal(2)      # the first lane's sample in the word
        s1_amp = Signal(signed(SAMPLE_BITS))
        m.d.sync += [s1_valid.eq(reading), s1_lane.eq(rd_addr[:2]),
                     s1_amp.eq(Mux(fire, head.amplitude, amp))]

        # Envelope word stage: the memory's output registered, nothing between them (the word
        # is reset-less, so that neither the domain's reset nor the flush puts a LUT in front
        # of it: it is only used while ``s2_valid``, which both clear).
        lo = -(1 << (SAMPLE_BITS - 1))
        s2_valid = Signal()
        s2_lane = Signal(2)
        s2_amp = Signal(signed(SAMPLE_BITS))
        s2_amp_lo = Signal()     # s2_amp == -32768
        s2_word = Signal(64, reset_less=True)
        s2_min = Signal(8, reset_less=True)
        m.d.sync += [s2_valid.eq(s1_valid), s2_lane.eq(s1_lane), s2_amp.eq(s1_amp),
                     s2_amp_lo.eq(s1_amp == lo), s2_word.eq(self.env_rd_data),
                     s2_min.eq(self.env_rd_min)]
        samples = [s2_word.word_select(s2_lane + k, SAMPLE_BITS).as_signed() for k in range(S)]
        sample_lo = [s2_min.word_select(s2_lane + k, 2).all() for k in range(S)]
        live = s2_valid & ~self.flush_next

        # Operand stage: each lane's sample, and the operand it is multiplied with: made 0
        # when nothing plays (or the channel is flushed from the next cycle on), and -32767
        # for -1 * -1 (the only product out of range: 2**30 >> 15 = 32768; -32768 * -32767
        # >> 15 = 32767, the saturated value), so nothing follows the multiplier. -32767
        # differs from -32768 in bit 0 alone.
        s3_valid = Signal()
        s3_sample = [Signal(signed(SAMPLE_BITS), name=f"s3_sample{k}") for k in range(S)]
        s3_op = [[Signal(signed(SAMPLE_BITS), name=f"s3_op{k}_{iq}") for k in range(S)]
                 for iq in "iq"]
        m.d.sync += s3_valid.eq(s2_valid)
        m.d.sync += [s3.eq(x) for s3, x in zip(s3_sample, samples, strict=True)]
        if not self._nco:
            for k in range(S):
                m.d.sync += s3_op[0][k].eq(Mux(live, Cat(s2_amp[0] | (sample_lo[k] & s2_amp_lo),
                                                         s2_amp[1:]), 0))
        else:
            # NCO: the phase of each lane is formed in the fire stage (the event's frequency
            # and phase on its first sample), the table read beside the envelope's read, the
            # amplitude multiplied in the word stage, clamped to 16 bits for the operand.
            acc = Signal(32)
            freq = Signal(32)
            phase = Signal(16)
            f_now = Mux(fire, head.freq_word, freq)
            ph_now = Mux(fire, head.phase, phase)
            base = Mux(fire & head.phase_reset, 0, acc)
            m.d.sync += [acc.eq(base + f_now * S), freq.eq(f_now), phase.eq(ph_now)]
            thetas = [base + f_now * k + Cat(Const(0, 16), ph_now) for k in range(S)]
            for k, cos_sin in enumerate(_cos_sin_reads(m, thetas)):
                for iq, data_k in enumerate(cos_sin):
                    # Word stage: amplitude * table value; operand stage: clamped, 0 when
                    # idle, -32767 for -1 * -1 as above.
                    prod = Signal(signed(SAMPLE_BITS + self.COS_BITS), name=f"a{iq}{k}")
                    m.d.sync += prod.eq(s1_amp * data_k)
                    scaled = prod[16:].as_signed()              # floor(prod / 2**16)
                    op = Mux(scaled > (1 << 15) - 1, (1 << 15) - 1, scaled)
                    op_lo = op == lo
                    m.d.sync += s3_op[iq][k].eq(Mux(live, Cat(op[0] | (sample_lo[k] & op_lo),
                                                              op[1:16]), 0))

        # Product stage: the multiplier's output, scaled, is the output register. ``dac`` is
        # outside the flush (a synchronous reset would be a LUT between the multiplier and
        # the flip-flop, whose asynchronous reset is the domain's): the operand stage is zero
        # from the cycle ``flush_next`` is high, so the product is 0 when ``flush`` acts.
        m.d.comb += self.idle.eq(q.empty & ~more & ~s1_valid & ~s2_valid & ~s3_valid)
        m.d.sync += self.active.eq(s3_valid)
        top = Module()
        top.submodules.flushed = ResetInserter(self.flush)(m)
        outs = (self.dac, self.dac_q) if self._nco else (self.dac,)
        for iq, out in enumerate(outs):
            for k in range(S):
                prod = Signal(signed(2 * SAMPLE_BITS), name=f"p{iq}{k}")
                top.d.comb += prod.eq(s3_sample[k] * s3_op[iq][k])
                top.d.sync += out[k].eq(prod[SAMPLE_BITS - 1:2 * SAMPLE_BITS - 1].as_signed())
        return top


class ReadoutChannel(wiring.Component):
    """One readout (ADC) channel: demodulate, integrate over a window, compare with a threshold.

    For an event with time ``T`` and ``W = window_cycles`` (1..65535), ``window`` is high on the
    cycles ``now = T .. T+W-1``, and the ``S = samples_per_cycle`` signed ``adc`` lanes present
    on exactly those cycles are integrated. Windows may follow back to back (the next starting
    at ``T+W``); a window that starts inside an open window cannot fire on time and is LATE
    (the PPU refuses such a window when it queues it: ``sequence``). The core must not queue
    a window of 0 cycles (it is an illegal instruction).

    Without the NCO (``nco=False``): ``I`` is the sum of the samples (34 + log2 S bits, signed;
    no overflow is possible) and ``Q = 0``; on the window's last cycle the result
    ``I > threshold`` is presented on ``result_*`` (``result_valid`` high for that one cycle),
    so the register file holds it from ``now = T+W``.

    With the NCO: sample ``n = S j + k`` of the window (cycle ``T + j``, lane ``k``) is
    multiplied by ``exp(-j theta_n)``, ``theta_n = (phase << 16) + n * freq_word`` (mod
    ``2**32``: the demodulator starts at the event's ``phase`` on the window's first sample,
    so the integrated vector's angle is the signal's phase relative to the window's start,
    rotated by ``-phase``: ``phase`` is the channel's IQ rotation angle). With ``COS`` the drive
    channel's table (:meth:`DriveChannel.cos_table`)::

        I = sum floor(adc_n * COS[theta_n >> 22] / 2**16)
        Q = sum floor(-adc_n * COS[((theta_n >> 22) - 256) % 1024] / 2**16)

    (so ``freq_word = phase = 0`` gives the plain sum). The product stage adds one cycle: the
    result is presented on cycle ``T+W`` and held in the register file from ``T+W+1``.

    ``iq_valid`` pulses with ``iq_i``/``iq_q`` holding the window's ``I`` and ``Q`` on the cycle
    after the result with the NCO, two cycles after it without (cycle ``T+W+1`` in both).

    Members
    -------
    event : ``In(stream.Signature(readout_event(time_bits, nco=nco)))``; now : ``In(time_bits)``;
    flush : ``In(1)``
        As :class:`DriveChannel` (``time_bits``, default 64, is the constructor's argument).
    adc : ``In(ArrayLayout(signed(16), S))``
        The ADC samples of this cycle, lane ``k`` at index ``k``.
    window : ``Out(1)``
        High during the integration window.
    window_last : ``Out(1)``
        High on the window's last cycle (``now = T+W-1``), a flip-flop: with ``window``, it
        tells back-to-back windows apart (a window's first cycle is a ``window`` cycle that
        does not follow a ``window`` cycle without ``window_last``).
    result_valid : ``Out(1)``; result_rd : ``Out(4)``; result_bit : ``Out(1)``
        The measurement result, for one cycle, and its destination register.
    result_hit : ``Out(16)``
        ``result_valid`` decoded by ``result_rd``, one-hot (bit ``i`` for register ``i``), from
        a register of its own: the register file's writes and scoreboard start at a flip-flop.
    iq_valid : ``Out(1)``; iq_i, iq_q : ``Out(signed(IQ_BITS))``
        The window's integrals (``iq_*`` hold their values until the next window's).
    late : ``Out(1)``; idle : ``Out(1)``
        As :class:`DriveChannel`.
    """

    #: Cycles an event must be queued before its time (fire decision: one cycle before).
    LEAD_CYCLES = 2
    #: Width of ``iq_i`` and ``iq_q``: every window of 65535 cycles of 4 lanes fits.
    IQ_BITS = 40

    def __init__(self, *, time_bits: int = 64, samples_per_cycle: int = 1, nco: bool = False):
        if samples_per_cycle not in (1, 2, 4):
            raise ValueError(f"samples_per_cycle must be 1, 2 or 4, not {samples_per_cycle!r}")
        self._spc = samples_per_cycle
        self._nco = nco
        self._event = readout_event(time_bits, nco=nco)
        super().__init__({
            "event": In(stream.Signature(self._event)),
            "now": In(time_bits),
            "flush": In(1),
            "adc": In(data.ArrayLayout(signed(SAMPLE_BITS), samples_per_cycle)),
            "window": Out(1),
            "window_last": Out(1),
            "result_valid": Out(1),
            "result_rd": Out(4),
            "result_hit": Out(16),
            "result_bit": Out(1),
            "iq_valid": Out(1),
            "iq_i": Out(signed(self.IQ_BITS)),
            "iq_q": Out(signed(self.IQ_BITS)),
            "late": Out(1),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        S = self._spc

        def onehot(rd):
            # 16 bits: a shift by a 4-bit signal is 31 bits wide before the slice.
            return (Const(1, 16) << rd)[:16]

        def last_hit(event):
            # An event whose window is one cycle, and its result's one-hot: its window ends in
            # the cycle that it opens.
            one = event.window_cycles == 1
            return Cat(Mux(one, onehot(event.rd), 0), one)

        m.submodules.queue = q = TimedQueue(self._event, self.LEAD_CYCLES - 1, tag=last_hit,
                                            tag_bits=17)
        wiring.connect(m, wiring.flipped(self.event), q.event)
        head = q.head
        rem = Signal(16)
        rem_two = Signal()       # rem == 2, from the values ``rem`` is loaded with
        rd = Signal(4)
        last = Signal()          # rem == 1, registered
        open_ = Signal()         # rem != 0, registered
        free = ~open_ | last     # no window, or its last cycle: a new one may start next cycle
        fire = q.on_time & free
        late = q.past | (q.on_time & ~free)
        m.d.comb += [q.now.eq(self.now), q.flush.eq(self.flush), q.pop.eq(q.due),
                     self.late.eq(late), self.window.eq(open_), self.window_last.eq(last)]
        head_hit, head_last = q.head_tag[:16], q.head_tag[16]
        open_last = kept(m, open_ & rem_two, "open_last")
        open_hit = kept(m, Mux(open_last, onehot(rd), 0), "open_hit")
        with m.If(fire):
            m.d.sync += open_.eq(head.window_cycles != 0)
        with m.Elif(open_):
            m.d.sync += open_.eq(~last)
        with m.If(free):
            m.d.sync += [rem.eq(head.window_cycles), rem_two.eq(head.window_cycles == 2),
                         rd.eq(head.rd)]
        with m.Else():
            m.d.sync += [rem.eq(rem - 1), rem_two.eq(rem == 3)]
        lane_sum = sum(self.adc[k] for k in range(S)) if S > 1 else self.adc[0]
        iq_i = Signal(signed(self.IQ_BITS))
        iq_q = Signal(signed(self.IQ_BITS))
        iq_valid = Signal()
        m.d.comb += [self.iq_valid.eq(iq_valid), self.iq_i.eq(iq_i), self.iq_q.eq(iq_q)]

        if not self._nco:
            # ``acc`` starts at ``-threshold - 1`` (= ~threshold): ``I > threshold`` is then
            # ``acc + I >= 0``, the sign of one adder. ``I`` is ``acc + threshold + 1``.
            acc = Signal(signed(34 + S.bit_length() - 1))
            thr = Signal(signed(32))
            total = Signal.like(acc)
            m.d.comb += [
                total.eq(acc + lane_sum),
                self.result_valid.eq(last),
                self.result_rd.eq(rd),
                self.result_bit.eq(~total[-1]),
            ]
            # Only ``open_`` and ``last`` depend on ``fire``. The window's data (``rem``,
            # ``acc``, ``rd``) is loaded from the head in every cycle that a window may start
            # (``free``, from flip-flops): they are unused until ``open_`` is set, and ``fire``
            # (the last signal to settle) then drives two flip-flops instead of sixty.
            # The window that starts now (``fire``) and an open one with two cycles left never
            # both end next cycle: ``fire`` needs ``free``, and an open window with two cycles
            # left is not in its last. So each one's result one-hot is ready from flip-flops
            # (the head's is the queue's ``head_tag``), and ``fire`` meets them in one LUT per
            # bit.
            m.d.sync += [last.eq((fire & head_last) | open_last),
                         self.result_hit.eq(Mux(fire, head_hit, 0) | open_hit)]
            with m.If(free):
                m.d.sync += [acc.eq(~head.threshold), thr.eq(head.threshold)]
            with m.Else():
                m.d.sync += acc.eq(total)
            # ``I = total - ~threshold`` (``acc`` started at ``~threshold``), a cycle later from
            # registers: one subtractor behind flip-flops, not two adders behind the lane sum.
            iq_sum = Signal.like(acc)
            iq_init = Signal(signed(32))
            iq_pend = Signal()
            m.d.sync += [iq_pend.eq(last), iq_valid.eq(iq_pend)]
            with m.If(last):
                m.d.sync += [iq_sum.eq(total), iq_init.eq(~thr)]
            with m.If(iq_pend):
                m.d.sync += [iq_i.eq(iq_sum - iq_init), iq_q.eq(0)]
        else:
            m.d.sync += last.eq((fire & head_last) | open_last)
            # The demodulator's phase: ``ph`` is lane 0's of the next cycle. The table is read
            # a cycle ahead of the samples (from the event's phase as the window opens).
            ph = Signal(32)
            freq = Signal(32)
            thr = Signal(signed(32))
            f_now = Mux(fire, head.freq_word, freq)
            base = Mux(fire, Cat(Const(0, 16), head.phase), ph)
            m.d.sync += [ph.eq(base + f_now * S), freq.eq(f_now)]
            with m.If(free):
                m.d.sync += thr.eq(head.threshold)
            prods = {"i": [], "q": []}
            cos_sin = _cos_sin_reads(m, [base + f_now * k for k in range(S)])
            for k, (cos_k, sin_k) in enumerate(cos_sin):
                prods["i"].append((self.adc[k] * cos_k)[16:].as_signed())
                prods["q"].append((-(self.adc[k] * sin_k))[16:].as_signed())
            # Product stage: each lane's products, summed, with the window's flags.
            p_i = Signal(signed(20))
            p_q = Signal(signed(20))
            p_valid = Signal()
            p_first = Signal()
            p_last = Signal()
            p_rd = Signal(4)
            p_hit = Signal(16)
            p_thr = Signal(signed(32))
            first = Signal()         # the window's first cycle, registered
            m.d.sync += first.eq(fire & (head.window_cycles != 0))
            m.d.sync += [p_i.eq(sum(prods["i"])), p_q.eq(sum(prods["q"])),
                         p_valid.eq(open_), p_first.eq(first), p_last.eq(last), p_rd.eq(rd),
                         p_hit.eq(Mux(last, onehot(rd), 0)), p_thr.eq(thr)]
            # Accumulate stage: the result on the window's last product.
            acc_i = Signal(signed(self.IQ_BITS))
            acc_q = Signal(signed(self.IQ_BITS))
            tot_i = Signal(signed(self.IQ_BITS))
            tot_q = Signal(signed(self.IQ_BITS))
            m.d.comb += [
                tot_i.eq(Mux(p_first, 0, acc_i) + p_i),
                tot_q.eq(Mux(p_first, 0, acc_q) + p_q),
                self.result_valid.eq(p_last),
                self.result_rd.eq(p_rd),
                self.result_hit.eq(p_hit),
                self.result_bit.eq(tot_i > p_thr),
            ]
            with m.If(p_valid):
                m.d.sync += [acc_i.eq(tot_i), acc_q.eq(tot_q)]
            m.d.sync += iq_valid.eq(p_last)
            with m.If(p_last):
                m.d.sync += [iq_i.eq(tot_i), iq_q.eq(tot_q)]

        busy = open_ if not self._nco else open_ | p_valid
        m.d.comb += self.idle.eq(q.empty & ~busy)
        return ResetInserter(self.flush)(m)


class MarkerChannel(wiring.Component):
    """One digital marker: high on the cycles ``now = T .. T+duration_cycles-1``.

    A new event whose time comes while the marker is high takes over (its duration counts from
    its own time); ``duration_cycles == 0`` drives the marker low from its time.

    Members
    -------
    event : ``In(stream.Signature(marker_event(time_bits)))``; now : ``In(time_bits)``;
    flush : ``In(1)``
        As :class:`DriveChannel` (``time_bits``, default 64, is the constructor's argument).
    marker : ``Out(1)``
        The marker output.
    late : ``Out(1)``; idle : ``Out(1)``
        As :class:`DriveChannel`.
    """

    #: Cycles an event must be queued before its time (fire decision: one cycle before).
    LEAD_CYCLES = 2

    def __init__(self, *, time_bits: int = 64):
        self._event = marker_event(time_bits)
        super().__init__({
            "event": In(stream.Signature(self._event)),
            "now": In(time_bits),
            "flush": In(1),
            "marker": Out(1),
            "late": Out(1),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.queue = q = TimedQueue(self._event, self.LEAD_CYCLES - 1)
        wiring.connect(m, wiring.flipped(self.event), q.event)
        rem = Signal(16)
        high = Signal()          # rem != 0, registered
        fire = q.on_time
        late = q.past
        m.d.comb += [q.now.eq(self.now), q.flush.eq(self.flush), q.pop.eq(q.due),
                     self.late.eq(late)]
        with m.If(fire):
            m.d.sync += [rem.eq(q.head.duration_cycles),
                         high.eq(q.head.duration_cycles != 0)]
        with m.Elif(high):
            m.d.sync += [rem.eq(rem - 1), high.eq(rem != 1)]
        m.d.comb += [
            self.marker.eq(high),
            self.idle.eq(q.empty & ~high),
        ]
        return ResetInserter(self.flush)(m)
