"""Clock-domain crossings between ``rti`` and ``dtd`` that survive either side's reset or clock
loss.

# Ref: C. E. Cummings, "Simulation and Synthesis Techniques for Asynchronous FIFO Design", SNUG
# 2002 (style #2: Gray pointers, two-flop synchronizers); amaranth.lib.cdc (AsyncFFSynchronizer).

``amaranth.lib.fifo.AsyncFIFO`` is reset from its write side only: a reset of the read side alone
leaves its contents in place. Between the network core and the PPUs that is wrong both ways (a
late answer to a READ survives an ``rti`` reset; commands queued for a PPU survive a ``dtd``
reset), so the crossings here are reset from both sides:

* :class:`CrossingReset` turns the two domains' resets into, for each domain, ``clr`` (empty the
  crossings' pointers on this side) and ``hold`` (no transfer on this side): either domain's
  reset clears both sides, and each side stays held until the other side has been cleared and
  released and its pointer has crossed over, so neither side ever acts on a stale pointer of the
  other, even while the other side has no clock (then this side stays held until it runs).
* :class:`CrossingFIFO` is a Gray-pointer asynchronous FIFO with those inputs.

Each domain's own reset must be synchronous to its clock and last at least one of its clock
edges (a board top's reset synchronizer guarantees both); the other domain may be stopped.
"""

from amaranth.hdl import (
    ClockDomain,
    ClockSignal,
    Module,
    ResetSignal,
    Shape,
    ShapeCastable,
    Signal,
)
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["CrossingReset", "CrossingFIFO"]


def _gray(value):
    return value ^ (value >> 1)


def _reset_sync(m: Module, i, o: Signal, o_domain: str, stages: int, name: str):
    """``o`` follows ``i`` into ``o_domain``: set at once while ``i`` is high, released
    ``stages`` edges of ``o_domain`` after ``i`` falls.

    The circuit of ``amaranth.lib.cdc.AsyncFFSynchronizer`` (flip-flops with an asynchronous
    set, in a local domain on ``o_domain``'s clock), with its flip-flops named ``name__rep*``:
    every :class:`CrossingReset` synchronizes the same domain resets, and the build keeps each
    crossing's copy (``openqlink.build.YOSYS_AFTER_READ``) where synthesis would merge them.
    """
    domain = f"{name}_async"
    m.domains += ClockDomain(domain, async_reset=True, local=True)
    flops = [Signal(init=1, name=f"{name}__rep{k}") for k in range(stages)]
    for d, q in zip((0, *flops[:-1]), flops, strict=True):
        m.d[domain] += q.eq(d)
    m.d.comb += [
        ResetSignal(domain).eq(i),
        ClockSignal(domain).eq(ClockSignal(o_domain)),
        o.eq(flops[-1]),
    ]


class CrossingReset(wiring.Component):
    """Crossing resets of the two domains ``a`` and ``b`` from their domain resets.

    Parameters
    ----------
    a, b : str
        The two clock domains (``"rti"``, ``"dtd"``).

    Members
    -------
    clr_a, clr_b : Out(1)
        High while the crossings' pointers on that side are to be cleared: the domain's own reset,
        registered (one edge of this side later; high from power-up), or the other domain's
        reset (asserted at once, released 2 edges of this side's clock after it; asynchronous
        set, synchronous release).
    hold_a, hold_b : Out(1)
        High while no transfer may happen on that side: ``clr`` of this side, or ``clr`` of the
        other side (asserted at once, released 3 edges of this side's clock after it). With the
        other domain stopped and its ``clr`` high, this side stays held.

    Latency: when the reset of ``a`` falls (both clocks running), ``clr_a`` falls 1 ``a`` edge
    later, ``clr_b`` 2 ``b`` edges later, ``hold_b`` 1 ``a`` + 3 ``b`` edges later and
    ``hold_a`` 2 ``b`` + 3 ``a`` edges later; the same with ``a`` and ``b`` exchanged for a
    reset of ``b``. A domain's own reset reaches its ``clr`` one edge late; that domain's
    registers are in reset meanwhile.
    """

    clr_a: Out(1)
    clr_b: Out(1)
    hold_a: Out(1)
    hold_b: Out(1)

    def __init__(self, a: str, b: str):
        self._a = a
        self._b = b
        super().__init__()

    def elaborate(self, platform) -> Module:
        m = Module()
        a, b = self._a, self._b
        # Every flip-flop here is equal to its twin in the other crossings' CrossingReset (the
        # same domain resets, registered or synchronized the same way): the ``__rep`` names
        # keep each crossing's copy, beside that crossing, where synthesis would merge them
        # into one flip-flop driving every crossing's pointers across the die.
        b_rst_a = Signal()      # b's reset, seen in a
        a_rst_b = Signal()      # a's reset, seen in b
        _reset_sync(m, ResetSignal(b), b_rst_a, a, 2, "b_rst_a")
        _reset_sync(m, ResetSignal(a), a_rst_b, b, 2, "a_rst_b")
        # Each domain's own reset, registered (reset-less, set from power-up): the domain resets
        # are global networks and reach logic here only through these flip-flops, so every
        # path from a ``clr`` starts at a register. The other side's reset stays asynchronous.
        a_rst = Signal(init=1, reset_less=True, name="a_rst__rep")
        b_rst = Signal(init=1, reset_less=True, name="b_rst__rep")
        m.d[a] += a_rst.eq(ResetSignal(a))
        m.d[b] += b_rst.eq(ResetSignal(b))
        m.d.comb += [
            self.clr_a.eq(a_rst | b_rst_a),
            self.clr_b.eq(b_rst | a_rst_b),
        ]
        clr_b_a = Signal()      # clr_b, seen in a
        clr_a_b = Signal()      # clr_a, seen in b
        _reset_sync(m, self.clr_b, clr_b_a, a, 3, "clr_b_a")
        _reset_sync(m, self.clr_a, clr_a_b, b, 3, "clr_a_b")
        m.d.comb += [
            self.hold_a.eq(self.clr_a | clr_b_a),
            self.hold_b.eq(self.clr_b | clr_a_b),
        ]
        return m


class CrossingFIFO(wiring.Component):
    """Asynchronous FIFO from ``w_domain`` to ``r_domain``, cleared and held from either side.

    Parameters
    ----------
    shape : ShapeCastable
        Payload shape (a layout such as :class:`~openqlink.gateware.bus.BusCommand`).
    depth : int
        Entries (a power of two, at least 2).
    w_domain, r_domain : str
        Clock domains of the write and read sides.

    Members
    -------
    w : In(stream.Signature(shape))
        Write side, ``w_domain``. ``ready`` is a flip-flop computed from registers alone: low
        from the edge after the RAM holds ``depth - 1`` entries or more (a write at that edge
        may still fill it: written back to back, the RAM takes ``depth`` entries; otherwise its
        last entry may stay unused) or ``w_hold`` rises, until the edge after it has room again
        and ``w_hold`` fell; it does not depend on ``valid``.
    r : Out(stream.Signature(shape))
        Read side, ``r_domain``. ``valid`` is low while empty and from the cycle after
        ``r_hold`` rises until it falls.
    w_clr, w_hold : In(1)
        ``w_domain``: empty the write pointer (at the clock edge) / refuse writes.
    r_clr, r_hold : In(1)
        ``r_domain``: empty the read pointer (at the clock edge) / offer nothing.

    Driven from a :class:`CrossingReset`, a reset of either domain empties the FIFO, and both
    sides refuse transfers until both pointers are empty and known so on the other side.
    Latency: a written entry is offered 4 ``r_domain`` edges after its write edge (1 register,
    2 synchronizer stages, the output register); its slot is free for the writer 3 ``w_domain``
    edges after it moved into the output register. ``r.valid`` and ``r.payload`` are registers,
    the RAM is read at a registered address, and ``r.ready`` reaches only ``r.valid``: the
    output register is loaded only while empty, so the FIFO passes at most one entry every
    two ``r_domain`` cycles (a 64-bit entry per two cycles is 4 Gb/s at 125 MHz, beyond the
    link). ``r.valid`` falls in the cycle after ``r_hold`` rises.
    """

    def __init__(self, shape: ShapeCastable, depth: int, *, w_domain: str, r_domain: str):
        if depth < 2 or depth & (depth - 1):
            raise ValueError(f"depth must be a power of two, at least 2, not {depth}")
        self.depth = depth
        self._shape = shape
        self.w_domain = w_domain
        self.r_domain = r_domain
        super().__init__({
            "w": In(stream.Signature(shape)),
            "r": Out(stream.Signature(shape)),
            "w_clr": In(1),
            "w_hold": In(1),
            "r_clr": In(1),
            "r_hold": In(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        wd, rd = self.w_domain, self.r_domain
        bits = self.depth.bit_length()          # index bits + 1 wrap bit
        width = Shape.cast(self._shape).width

        m.submodules.storage = storage = Memory(shape=width, depth=self.depth, init=[])
        w_port = storage.write_port(domain=wd)
        r_port = storage.read_port(domain="comb")

        # ---- write side ------------------------------------------------------------------
        w_bin = Signal(bits)
        w_gry = Signal(bits)
        r_gry = Signal(bits)
        r_gry_w = Signal(bits)                  # the read pointer, synchronized into wd
        m.submodules.r_gry_sync = FFSynchronizer(r_gry, r_gry_w, o_domain=wd)
        def is_full(w, r):
            return (w[-1] != r[-1]) & (w[-2] != r[-2]) & (w[:-2] == r[:-2])

        # ``w.ready`` is a flip-flop, from registers only (whether a write happens in this
        # cycle does not reach it): low while the RAM is full or one entry from full, or while
        # held; a write in the cycle it is computed may still fill the RAM. A read seen
        # meanwhile shows a cycle late. A write in the cycle ``w_hold`` rises is still taken;
        # ``w_hold`` rises only with ``w_clr`` (see :class:`CrossingReset`), which empties the
        # pointer in that cycle anyway.
        do_write = Signal()
        w_next = Signal(bits)                   # wraps at 2 * depth
        ready = Signal()
        m.d.comb += [
            self.w.ready.eq(ready),
            do_write.eq(self.w.valid & self.w.ready),
            w_port.addr.eq(w_bin[:-1]),
            w_port.data.eq(self.w.payload),
            w_port.en.eq(do_write),
            w_next.eq(w_bin + 1),
        ]
        m.d[wd] += ready.eq(~is_full(w_gry, r_gry_w) & ~is_full(_gray(w_next), r_gry_w) &
                            ~self.w_hold)
        with m.If(self.w_clr):
            m.d[wd] += [w_bin.eq(0), w_gry.eq(0)]
        with m.Elif(do_write):
            m.d[wd] += [w_bin.eq(w_next), w_gry.eq(_gray(w_next))]

        # ---- read side -------------------------------------------------------------------
        # The entry at ``r_bin`` is read from the RAM (an address register, no logic in front
        # of the RAM) into the output register ``out`` whenever that is empty: the consumer's
        # ``ready`` is only an enable of registers, never in front of the RAM.
        r_bin = Signal(bits)
        r_bin_p1 = Signal(bits, init=1)         # r_bin + 1, kept beside it
        w_gry_r = Signal(bits)                  # the write pointer, synchronized into rd
        m.submodules.w_gry_sync = FFSynchronizer(w_gry, w_gry_r, o_domain=rd)
        out = Signal(width)
        # ``out``'s valid flag, twice (copies of one register, kept apart by the build): one
        # enables the wide output register, the other the pointers, so neither enable is one
        # net across both.
        out_valid, ptr_valid = (Signal(name=f"out_valid__rep{k}") for k in range(2))
        take = Signal()
        nonempty = Signal()
        m.d.comb += [
            self.r.valid.eq(out_valid),
            self.r.payload.eq(out),
            take.eq(self.r.valid & self.r.ready),
            nonempty.eq((r_gry != w_gry_r) & ~self.r_hold),
            r_port.addr.eq(r_bin[:-1]),
        ]
        # The output register takes the RAM's entry at ``r_bin`` in every cycle that it is not
        # valid: its enable is one flip-flop (neither the pointers' compare nor ``r_hold``, a
        # synchronizer's output, reaches its hundred-odd bits), and it holds the entry it took
        # in the cycle that it becomes valid (``load_ptr``: ``r_bin`` at a written entry). The
        # consumer's ``ready`` (which may depend on ``valid`` and the payload) reaches the valid
        # flags alone.
        load_out = ~out_valid
        load_ptr = nonempty & ~ptr_valid
        with m.If(self.r_clr | self.r_hold):
            m.d[rd] += [out_valid.eq(0), ptr_valid.eq(0)]
        with m.If(self.r_clr):
            m.d[rd] += [r_bin.eq(0), r_bin_p1.eq(1), r_gry.eq(0)]
        with m.Elif(load_ptr):
            m.d[rd] += [out_valid.eq(1), ptr_valid.eq(1),
                        r_bin.eq(r_bin_p1), r_gry.eq(_gray(r_bin_p1)), r_bin_p1.eq(r_bin_p1 + 1)]
        with m.Elif(take & ~self.r_hold):
            m.d[rd] += [out_valid.eq(0), ptr_valid.eq(0)]
        with m.If(load_out):
            m.d[rd] += out.eq(r_port.data)
        return m
