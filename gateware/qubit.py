"""An on-FPGA qubit emulator: the PTD side of a PPU for a board with no analog front end.

It answers a PPU's drive and readout as the seeded one-qubit reference model
(:class:`openqlink.sim.qubit.QubitModel`) does, in a few hundred LUTs, one ``DP16KD`` and one
``MULT18X18D``: the two agree in
distribution, not bit for bit. The physics, as in the model: the qubit is driven on resonance
about X, so its state is the rotation angle ``theta`` from ``|0>``; each DAC sample ``s`` (signed
Q1.15) rotates it by ``pi * s / pi_area``; a readout window projects it (outcome 1 with
probability ``P(1) = sin^2(theta / 2)``, the state collapses to ``|outcome>``) and for the rest of
the window the ADC carries ``+readout_amplitude`` (outcome 1) or ``-readout_amplitude``
(outcome 0) plus approximately Gaussian noise of ``noise_sigma``, saturated to 16 bits.

Arithmetic (all sizes fixed at elaboration):

* **Rotation.** ``phase`` (unsigned, ``phase_bits`` wide, ``2**phase_bits`` = one turn; 38
  bits for the default ``pi_area``) accumulates ``dac * phase_step`` on every cycle, with
  ``phase_step = round(2**(phase_bits - 1) / pi_area)`` (a 16 x 17-bit product in one
  ``MULT18X18D``; ``phase_step`` is in 2**16 .. 2**17, so its rounding error is below 1e-5 of the
  angle). The wrap modulo one turn is the counter's own.
* **P(1).** A 512-entry table over ``[0, pi)`` (the angle folded by ``P(2 pi - theta) =
  P(theta)``, entry ``i`` holding ``round(65536 * sin^2(theta_i / 2))`` at the centre ``theta_i``
  of its step of ``pi / 512``; at most 0.0016 from the exact P(1)), built when the design is
  elaborated.
* **Outcome.** 1 when a 16-bit uniform draw is below the table's P(1) (so P(1) is resolved to
  2**-16).
* **Noise.** The sum of two draws from a 512-entry table of the quantiles of
  ``N(0, noise_sigma**2 / 2)`` at ``(k + 0.5) / 512``, each indexed by 9 uniform bits, so 262144
  equally likely sums; the table is antisymmetric (mean exactly 0) and scaled so that the sum's
  standard deviation, rounding included, is ``noise_sigma`` to 0.5% or better for
  ``noise_sigma >= 10`` (:attr:`QubitEmulator.noise_std` gives the exact value). Its tails end
  at about 4.4 sigma and its excess kurtosis is about -0.02 (a Gaussian's is 0). Both tables
  share one 1024 x 18-bit block RAM read through its two ports (the P(1) lookup takes port A for
  one cycle per window, when the ADC output is not used).
* **Uniform bits.** One 32-bit xorshift generator (Marsaglia's 13/17/5) steps on every cycle:
  its low 18 bits index the noise table twice, and on the cycle a window's P(1) is read its top
  16 bits are kept as the outcome's draw (the noise sample made from that step is never output).
  One generator serves the outcomes and the noise, as one ``random.Random`` does in the model.

Seed semantics: ``seed`` (any integer) sets the generator's reset value through SplitMix64, so
an emulator with the same seed, reset at the same cycle and given the same DAC samples and
windows on the same cycles, produces the same outcomes and ADC samples; another seed gives a
different sequence. Reset (``sync``) restores the seed's state and ``|0>``.

Timing (cycles of the domain, ``dtd`` in a board top). The drive samples of cycles up to ``w - 1``
count for a window whose ``ro_window`` rises on cycle ``w`` (the PPU may start a window on the
cycle after a pulse's last sample). The ADC output is 0 until cycle ``w + ADC_LATENCY``, then
carries the measured samples up to and including the cycle after the window's last one (as the
bench's model does, whose ADC answer follows the window by one cycle): a window of ``W`` cycles
integrates ``W - ADC_LATENCY`` samples. Drive samples played on the cycle before a window and on its
first two cycles are lost, later ones rotate the collapsed state (a drive during a readout is not
a meaningful experiment). Pipeline: the DAC sample is registered (1 cycle), its product
registered (1), added to ``phase`` (1), P(1) is read from the block RAM on cycle ``w + 1`` and
registered (2), the outcome is drawn on cycle ``w + 3``, the noise takes 4 cycles from the
generator to ``adc``. Two windows back to back (``ro_window`` never low between them) are one
measurement, as in the model.

Only drive channel 0 and readout channel 0 are used; the other ``adc`` lanes are 0, the other
drive channels and the markers are ignored.

# Ref: openqlink.sim.qubit (the model); G. Marsaglia, "Xorshift RNGs", J. Stat. Softw. 8 (2003);
# SplitMix64 (Steele, Lea, Flood, OOPSLA 2014); Lattice TN1264 (ECP5 sysMEM, DP16KD).
"""

# No ``from __future__ import annotations``: wiring reads annotations of the signature members.
import math
from statistics import NormalDist

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from openqlink.gateware.ppu.channels import SAMPLE_BITS, PTDSignature

__all__ = ["PI_AREA", "QubitEmulator", "xorshift32", "splitmix64"]

#: Default ``pi_area``: the area (sum of Q1.15 samples) of the 64-sample gaussian (sigma 16) of
#: ``firmware/active_reset.s`` at amplitude 1.0, that program's pi pulse; the bench model's
#: default too.
PI_AREA = 1_254_378

_TABLE_BITS = 9                      # each table: 512 entries
_TABLE = 1 << _TABLE_BITS
_P_BITS = 16                         # P(1) in units of 2**-16 (65536 = certainly 1)
_WORD_BITS = 18                      # DP16KD in its 1024 x 18 configuration
_STEP_BITS = 17                      # phase_step is in [2**16, 2**17)
_MASK32 = (1 << 32) - 1
_MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """One output of SplitMix64 for state ``x`` (used to spread a seed over the state bits)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def xorshift32(x: int) -> int:
    """One step of Marsaglia's xorshift32 (shifts 13, 17, 5), the gateware's generator."""
    x ^= (x << 13) & _MASK32
    x ^= x >> 17
    x ^= (x << 5) & _MASK32
    return x


def _p1_table() -> list[int]:
    """P(1) at the centre of each of the 512 steps of ``[0, pi)``, in units of 2**-16."""
    out = []
    for i in range(_TABLE):
        theta = math.pi * (i + 0.5) / _TABLE
        out.append(round(math.sin(theta / 2) ** 2 * (1 << _P_BITS)))
    return out


def _noise_table(sigma: float) -> list[int]:
    """Antisymmetric quantiles of N(0, sigma**2 / 2), scaled so two draws sum to ``sigma``.

    The quantiles' own variance is a little below the normal's (the tails are cut at 1/1024);
    the scale is searched so that the rounded table's variance is closest to ``sigma**2 / 2``.
    """
    if sigma == 0:
        return [0] * _TABLE
    z = [NormalDist().inv_cdf((k + 0.5) / _TABLE) for k in range(_TABLE // 2, _TABLE)]
    target = sigma * sigma / 2

    def table(scale: float) -> list[int]:
        half = [round(scale * v) for v in z]
        return [-v for v in reversed(half)] + half

    def var(t: list[int]) -> float:
        return sum(v * v for v in t) / _TABLE

    base = sigma / math.sqrt(2 * sum(v * v for v in z) / len(z))
    best = min((base * (1 + k / 4096) for k in range(-64, 65)),
               key=lambda s: abs(var(table(s)) - target))
    return table(best)


class QubitEmulator(wiring.Component):
    """A seeded single-qubit emulator on a PPU's PTD port; see the module docstring.

    Written in ``sync`` (a board top renames it to ``dtd``); connect with
    ``wiring.connect(m, cluster.ptd[n], emulator.ptd)``.

    Parameters
    ----------
    seed : int
        Seed of the uniform generator (see the module docstring: same seed, same sequence).
    pi_area : int
        Sum of DAC samples (Q1.15, full scale 32767) that rotates the qubit by pi;
        1 .. 2**32 - 1. The default, :data:`PI_AREA`, makes the 64-sample gaussian of
        ``firmware/active_reset.s`` at amplitude 1.0 a pi pulse.
    readout_amplitude : int
        Mean ADC sample of a window, ADC codes, 0 .. 32767; its sign is the outcome's
        (``+`` for 1).
    noise_sigma : float
        Standard deviation of the ADC noise, ADC codes, 0 .. 16384.
    n_drive, n_readout, n_marker : int
        The channel counts of the PPU's :class:`~openqlink.gateware.ppu.channels.PTDSignature`.

    Members
    -------
    ptd : ``In(PTDSignature(n_drive, n_readout, n_marker))``
        The PPU's PTD port: ``dac[0]`` (signed 16, taken while ``dac_active[0]``) rotates the
        qubit, a rising edge of ``ro_window[0]`` measures it, ``adc[0]`` (signed 16, registered)
        carries the readout.

    Attributes
    ----------
    phase_bits : int
        Width of the rotation-angle accumulator (one turn = ``2**phase_bits``).
    phase_step : int
        Angle added per unit of DAC sample, in ``2**-phase_bits`` turns.
    noise_std : float
        The exact standard deviation of the emitted noise (before saturation), ADC codes.
    p1_table : list[int]
        The P(1) table, units of 2**-16 (entry ``i`` for angles in ``[i, i+1) * pi / 512``).
    noise_table : list[int]
        The noise table, ADC codes (the noise is the sum of two uniform picks from it).
    """

    #: Cycles from the rising edge of ``ro_window`` to the first measured ADC sample.
    ADC_LATENCY = 6

    def __init__(self, *, seed: int = 1, pi_area: int = PI_AREA, readout_amplitude: int = 2000,
                 noise_sigma: float = 300.0, n_drive: int = 1, n_readout: int = 1,
                 n_marker: int = 4):
        if not isinstance(seed, int):
            raise TypeError(f"seed must be an integer, not {seed!r}")
        if not isinstance(pi_area, int) or not 1 <= pi_area < 1 << 32:
            raise ValueError(f"pi_area must be an integer in 1..2**32-1, not {pi_area!r}")
        if not isinstance(readout_amplitude, int) or not 0 <= readout_amplitude <= 32767:
            raise ValueError("readout_amplitude must be an integer in 0..32767, not "
                             f"{readout_amplitude!r}")
        if (not isinstance(noise_sigma, (int, float)) or math.isnan(noise_sigma) or
                not 0 <= noise_sigma <= 16384):
            raise ValueError(f"noise_sigma must be a number in 0..16384, not {noise_sigma!r}")
        self.seed = seed
        self.pi_area = pi_area
        self.readout_amplitude = readout_amplitude
        self.noise_sigma = float(noise_sigma)
        # phase_step = round(2**(phase_bits - 1) / pi_area) in [2**16, 2**17).
        self.phase_bits = pi_area.bit_length() + _STEP_BITS
        while round((1 << (self.phase_bits - 1)) / pi_area) >= 1 << _STEP_BITS:
            self.phase_bits -= 1
        self.phase_step = round((1 << (self.phase_bits - 1)) / pi_area)
        self.p1_table = _p1_table()
        self.noise_table = _noise_table(self.noise_sigma)
        self.noise_std = math.sqrt(2 * sum(v * v for v in self.noise_table) / _TABLE)
        state = splitmix64(seed & _MASK64) & _MASK32
        self._rng_reset = state or 0x6D2B79F5
        super().__init__({"ptd": In(PTDSignature(n_drive, n_readout, n_marker))})

    def elaborate(self, platform):
        m = Module()
        ptd = self.ptd
        dac = ptd.dac[0]
        window = ptd.ro_window[0]

        # --- uniform bits: xorshift32, one step per cycle --------------------------------------
        rng = Signal(32, init=self._rng_reset)
        x1 = rng ^ (rng << 13)[:32]
        x2 = x1 ^ (x1 >> 17)
        x3 = x2 ^ (x2 << 5)[:32]
        m.d.sync += rng.eq(x3)
        noise_a = rng[0:_TABLE_BITS]
        noise_b = rng[_TABLE_BITS:2 * _TABLE_BITS]
        draw_bits = rng[32 - _P_BITS:]

        # --- window edges: rise[k] is high k cycles after ro_window rose ---------------------
        window_prev = Signal()
        m.d.sync += window_prev.eq(window)
        rise = [window & ~window_prev]
        for k in range(1, 5):
            r = Signal(name=f"rise_{k}")
            m.d.sync += r.eq(rise[-1])
            rise.append(r)
        read_p1 = rise[1]                               # port A reads P(1) on this cycle
        project = rise[3]                               # the outcome is drawn on this cycle

        # --- rotation: phase += dac * phase_step (the sample registered, 0 when idle, in front
        # of the multiplier; the product registered with nothing between, reset-less, so that
        # the board build makes it the multiplier's output register: a reset holds ``dac_r``
        # at 0, and the product is 0 from the reset's second clock edge) -------------------
        pb = self.phase_bits
        dac_r = Signal(signed(SAMPLE_BITS))
        m.d.sync += dac_r.eq(Mux(ptd.dac_active[0], dac, 0))
        step = Signal(signed(SAMPLE_BITS + _STEP_BITS + 1), reset_less=True)
        m.d.sync += step.eq(dac_r * Const(self.phase_step, unsigned(_STEP_BITS)))
        phase = Signal(pb)
        step_turn = step[:pb] if len(step) >= pb else step.as_signed()   # modulo one turn

        # --- the tables: one 1024 x 18 ROM, P(1) at 0..511, noise at 512..1023 ----------------
        init = self.p1_table + [v & ((1 << _WORD_BITS) - 1) for v in self.noise_table]
        m.submodules.rom = rom = Memory(shape=unsigned(_WORD_BITS), depth=2 * _TABLE, init=init)
        port_a = rom.read_port(domain="sync")
        port_b = rom.read_port(domain="sync")
        folded = (phase ^ phase[-1].replicate(pb))[pb - 1 - _TABLE_BITS:pb - 1]
        m.d.comb += [
            port_a.addr.eq(Mux(read_p1, Cat(folded, Const(0, 1)), Cat(noise_a, Const(1, 1)))),
            port_b.addr.eq(Cat(noise_b, Const(1, 1))),
        ]
        # The block RAM's outputs are slow (about 6 ns from the clock): registered first, in
        # reset-less registers that the board build makes the block RAM's output registers.
        data_a = Signal(_WORD_BITS, reset_less=True)
        data_b = Signal(_WORD_BITS, reset_less=True)
        m.d.sync += [data_a.eq(port_a.data), data_b.eq(port_b.data)]

        # P(1) of the state at the window's start, and the draw kept from that cycle's step.
        draw = Signal(_P_BITS)
        with m.If(read_p1):
            m.d.sync += draw.eq(draw_bits)
        p1 = data_a[:_P_BITS + 1]
        # A window that starts 2 cycles after the previous one projects before that collapse
        # has reached ``phase``: its P(1) is the previous outcome.
        # ``draw < P(1)`` with P(1) the previous outcome's 0 or 1 is that outcome: the compare's
        # carry chain starts at the block RAM's output register, the choice after it.
        outcome = Signal()
        outcome_now = Mux(_after_two(m, project), outcome, draw < p1)

        # Collapse: ``|1>`` is half a turn, ``|0>`` is 0; the sample arriving now still counts.
        with m.If(project):
            m.d.sync += [
                outcome.eq(outcome_now),
                phase.eq(step_turn ^ (outcome_now << (pb - 1))),
            ]
        with m.Else():
            m.d.sync += phase.eq(phase + step_turn)

        # --- ADC ------------------------------------------------------------------------------
        noise = Signal(signed(_WORD_BITS + 1))
        m.d.sync += noise.eq(data_a.as_signed() + data_b.as_signed())
        amp = self.readout_amplitude
        level = Signal(signed(SAMPLE_BITS + 1))
        with m.If(project):
            m.d.sync += level.eq(Mux(outcome_now, amp, -amp))
        measuring = Signal()
        m.d.sync += measuring.eq(project | (measuring & window))
        pending = rise[0] | rise[1] | rise[2] | rise[3] | rise[4]
        value = Signal(signed(_WORD_BITS + 2))
        m.d.comb += value.eq(level + noise)
        # Saturation from the bits above the sample's sign (no second carry chain).
        top = value[SAMPLE_BITS - 1:]
        hi, lo = (1 << (SAMPLE_BITS - 1)) - 1, -(1 << (SAMPLE_BITS - 1))
        sat = Mux(top.all() | ~top.any(), value[:SAMPLE_BITS], Mux(value[-1], lo, hi))
        adc = Signal(signed(SAMPLE_BITS))
        m.d.sync += adc.eq(Mux(window & measuring & ~pending, sat, 0))
        m.d.comb += ptd.adc[0].eq(adc)
        for lane in range(1, len(ptd.ro_window)):
            m.d.comb += ptd.adc[lane].eq(0)
        return m


def _after_two(m: Module, project) -> Signal:
    """High on a cycle when ``project`` was high two cycles before."""
    d1, d2 = Signal(name="project_1"), Signal(name="project_2")
    m.d.sync += [d1.eq(project), d2.eq(d1)]
    return d2
