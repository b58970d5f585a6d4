"""The qubit emulator against the bench's model: drive, projection, collapse, noise, seeds."""

from __future__ import annotations

import gc
import math
import statistics
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from openqlink.gateware.ppu.channels import PTDSignature
from openqlink.gateware.qubit import PI_AREA, QubitEmulator, splitmix64, xorshift32
from openqlink.isa.asm import amplitude_to_q15, assemble
from openqlink.sim.qubit import QubitModel

ROOT = Path(__file__).resolve().parents[2]
AMPLITUDE = 2000
SIGMA = 300.0


def _gauss_envelope() -> list[int]:
    """The envelope ``gauss`` of ``firmware/active_reset.s`` (amplitude 1.0, Q1.15)."""
    path = ROOT / "firmware" / "active_reset.s"
    program = assemble(path.read_text(), filename=str(path), dtd_clk_hz=250_000_000)
    return program.envelopes["gauss"].samples


def _play(envelope: list[int], amplitude: float) -> list[int]:
    """The DAC samples a drive channel plays: ``sat16((env * amplitude) >> 15)``."""
    amp = amplitude_to_q15(amplitude)
    return [max(-32768, min(32767, (e * amp) >> 15)) for e in envelope]


PI = _play(_gauss_envelope(), 1.0)
PI_HALF = _play(_gauss_envelope(), 0.5)


@dataclass
class Window:
    """One readout window: the ADC samples on its cycles, summed and thresholded at 0."""

    samples: list[int]

    @property
    def outcome(self) -> int:
        return int(sum(self.samples) > 0)

    @property
    def measured(self) -> list[int]:
        """The samples after the emulator's latency (the ones that carry the readout)."""
        return self.samples[QubitEmulator.ADC_LATENCY:]


def _run(dut: QubitEmulator, script: list[tuple[str, object]]) -> list[Window]:
    """Play ``script`` on the PTD port: ``("drive", samples)``, ``("window", cycles)``,
    ``("idle", cycles)``; one step per cycle, in order. Returns the windows."""
    windows: list[Window] = []

    async def testbench(ctx):
        ptd = dut.ptd
        for kind, arg in script:
            if kind == "drive":
                ctx.set(ptd.dac_active, 1)
                for s in arg:
                    ctx.set(ptd.dac[0], s)
                    await ctx.tick()
                ctx.set(ptd.dac[0], 0)
                ctx.set(ptd.dac_active, 0)
            elif kind == "window":
                ctx.set(ptd.ro_window, 1)
                samples = []
                for _ in range(arg):
                    samples.append(ctx.get(ptd.adc[0]))     # the sample of this cycle
                    await ctx.tick()
                ctx.set(ptd.ro_window, 0)
                windows.append(Window(samples))
            else:
                await ctx.tick().repeat(arg)

    sim = Simulator(dut)
    sim.add_clock(4e-9)
    sim.add_testbench(testbench)
    sim.run()
    return windows


def _model_run(model: QubitModel, script: list[tuple[str, object]]) -> list[Window]:
    """The same script on the bench's model (whole windows of measured samples)."""
    windows = []
    for kind, arg in script:
        if kind == "drive":
            for s in arg:
                model.drive(s)
        elif kind == "window":
            model.begin_readout(0)
            windows.append(Window([0] * QubitEmulator.ADC_LATENCY +
                                  [model.adc_sample() for _ in range(arg -
                                                                     QubitEmulator.ADC_LATENCY)]))
            model.end_readout()
    return windows


def _noise(windows: list[Window]) -> list[int]:
    """Measured samples minus their outcome's mean level."""
    return [s - (AMPLITUDE if w.outcome else -AMPLITUDE) for w in windows for s in w.measured]


# --- elaboration-time parts -------------------------------------------------------------------


@pytest.fixture
def unelaborated():
    """For tests that build emulators only to read their tables: no "never used" warnings."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*created but never used")
        yield
        gc.collect()


def test_defaults_match_the_model_and_the_firmware_pulse(unelaborated):
    # The samples a PPU plays for that pulse at amplitude 1.0 (Q1.15 32767) add up to pi_area.
    assert PI_AREA == QubitModel().pi_area == sum(PI)
    dut = QubitEmulator()
    assert (dut.readout_amplitude, dut.noise_sigma) == (QubitModel().readout_amplitude,
                                                        QubitModel().noise_sigma)
    # phase_step: the angle of one DAC unit, within 1e-5 of pi / pi_area.
    assert 1 << 16 <= dut.phase_step < 1 << 17
    exact = (1 << (dut.phase_bits - 1)) / PI_AREA
    assert abs(dut.phase_step - exact) / exact < 1e-5


def test_p1_table_is_within_its_bound_of_sin_squared(unelaborated):
    dut = QubitEmulator()
    for k in range(4096):
        theta = 2 * math.pi * (k + 0.37) / 4096
        folded = theta if theta < math.pi else 2 * math.pi - theta
        entry = dut.p1_table[min(int(folded / math.pi * 512), 511)] / 65536
        assert abs(entry - math.sin(theta / 2) ** 2) < 0.0016


@pytest.mark.parametrize("sigma", [10.0, 300.0, 1234.5, 16384])
def test_noise_table_sigma_and_symmetry(sigma, unelaborated):
    dut = QubitEmulator(noise_sigma=sigma)
    t = dut.noise_table
    assert t == [-v for v in reversed(t)]                 # mean exactly 0
    assert abs(dut.noise_std / sigma - 1) < 0.005
    assert max(t) < 1 << 17                               # fits the 18-bit table word


def test_seed_sets_the_generator_state(unelaborated):
    assert QubitEmulator(seed=7)._rng_reset == splitmix64(7) & 0xFFFF_FFFF
    assert xorshift32(1) == 270369                        # Marsaglia's 13/17/5
    assert QubitEmulator(seed=1)._rng_reset != QubitEmulator(seed=2)._rng_reset


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"pi_area": 0}, "pi_area must be an integer in 1..2**32-1, not 0"),
    ({"pi_area": 1.5}, "pi_area must be an integer in 1..2**32-1, not 1.5"),
    ({"readout_amplitude": 40000},
     "readout_amplitude must be an integer in 0..32767, not 40000"),
    ({"noise_sigma": -1.0}, "noise_sigma must be a number in 0..16384, not -1.0"),
    ({"n_drive": 0}, "n_drive must be an integer in 1..16, not 0"),
])
def test_parameter_errors(kwargs, message, unelaborated):
    with pytest.raises(ValueError, match=f"^{message}$".replace("*", r"\*").replace(".", r"\.")):
        QubitEmulator(**kwargs)


def test_connects_to_a_ppu_ptd_port_and_answers_on_lane_0():
    m = Module()
    ppu_side = PTDSignature(2, 3, 4).create()
    m.submodules.dut = dut = QubitEmulator(n_drive=2, n_readout=3, n_marker=4)
    wiring.connect(m, ppu_side, dut.ptd)
    lanes = []

    async def testbench(ctx):
        ctx.set(ppu_side.ro_window, 0b111)
        for _ in range(12):
            await ctx.tick()
            lanes.append([ctx.get(ppu_side.adc[i]) for i in range(3)])

    sim = Simulator(m)
    sim.add_clock(4e-9)
    sim.add_testbench(testbench)
    sim.run()
    assert all(a < 0 for a, _, _ in lanes[QubitEmulator.ADC_LATENCY - 1:])
    assert all(b == c == 0 for _, b, c in lanes)


# --- behaviour in simulation ------------------------------------------------------------------


def test_no_drive_measures_zero_with_the_models_noise():
    dut = QubitEmulator(seed=3)
    windows = _run(dut, [("idle", 4)] + [("window", 200), ("idle", 3)] * 20)
    assert [w.outcome for w in windows] == [0] * 20
    for w in windows:
        assert w.samples[:QubitEmulator.ADC_LATENCY] == [0] * QubitEmulator.ADC_LATENCY
    measured = [s for w in windows for s in w.measured]
    n = len(measured)
    mean, sigma = statistics.fmean(measured), statistics.pstdev(measured)
    assert abs(mean + AMPLITUDE) < 5 * SIGMA / math.sqrt(n)
    assert abs(sigma / SIGMA - 1) < 5 / math.sqrt(2 * n) + 0.005


def test_pi_pulse_flips_the_qubit():
    # From |0>, each pi pulse flips the state: outcomes alternate 1, 0, 1, ...
    dut = QubitEmulator(seed=5)
    windows = _run(dut, [("idle", 2)] + [("drive", PI), ("window", 12), ("idle", 2)] * 12)
    assert [w.outcome for w in windows] == [1, 0] * 6
    # Every measured sample is on the outcome's side: the levels are 6.7 sigma apart from 0.
    assert all((s > 0) == bool(w.outcome) for w in windows for s in w.measured)


@pytest.mark.parametrize("gap, flipped", [(1, 1), (0, 0)])
def test_a_drive_sample_on_the_cycle_before_a_window_is_lost(gap, flipped):
    # A pi pulse of one sample (pi_area 30000), ``gap`` cycles before the window opens: on the
    # cycle before it (gap 0) the sample is lost (the emulator's pipeline, in its docstring).
    dut = QubitEmulator(seed=5, pi_area=30000)
    windows = _run(dut, [("idle", 2), ("drive", [30000] + [0] * gap), ("window", 12)])
    assert [w.outcome for w in windows] == [flipped]


@pytest.fixture(scope="module")
def pi_half_shots() -> tuple[list[Window], list[Window]]:
    """1200 shots of: pi/2 pulse, window, gap, second window (gateware, model)."""
    shot = [("drive", PI_HALF), ("window", 16), ("idle", 2), ("window", 10), ("idle", 2)]
    script = [("idle", 2)] + shot * 1200
    return _run(QubitEmulator(seed=11), script), _model_run(QubitModel(seed=11), script)


def test_pi_half_pulse_gives_even_odds_like_the_model(pi_half_shots):
    gate, model = pi_half_shots
    first_g, first_m = gate[0::2], model[0::2]
    n = len(first_g)
    f_g = sum(w.outcome for w in first_g) / n
    f_m = sum(w.outcome for w in first_m) / n
    # P(1) = 0.5 from |0> or |1> (the pulse rotates by pi/2 either way): a binomial bound...
    bound = 4 * math.sqrt(0.25 / n)
    assert abs(f_g - 0.5) < bound
    assert abs(f_m - 0.5) < bound
    # ...and a two-sample test against the model (4 sigma of the difference).
    assert abs(f_g - f_m) < 4 * math.sqrt(2 * 0.25 / n)
    # Shots are independent: as many changes of outcome as repeats (Wald-Wolfowitz runs).
    outcomes = [w.outcome for w in first_g]
    changes = sum(a != b for a, b in zip(outcomes, outcomes[1:], strict=False))
    assert abs(changes / (n - 1) - 0.5) < 4 * math.sqrt(0.25 / (n - 1))


def test_readout_histogram_matches_the_model(pi_half_shots):
    gate, model = pi_half_shots
    noise_g, noise_m = _noise(gate), _noise(model)
    n = len(noise_g)
    assert n == len(noise_m) >= 4000
    mean_g, mean_m = statistics.fmean(noise_g), statistics.fmean(noise_m)
    sd_g, sd_m = statistics.pstdev(noise_g), statistics.pstdev(noise_m)
    # Means within 4.5 standard errors of each other and of 0; sigmas within 5 standard
    # errors of each other and of noise_sigma.
    assert abs(mean_g) < 4.5 * SIGMA / math.sqrt(n)
    assert abs(mean_g - mean_m) < 4.5 * SIGMA * math.sqrt(2 / n)
    se_sd = SIGMA / math.sqrt(2 * n)
    assert abs(sd_g - SIGMA) < 5 * se_sd + 0.005 * SIGMA
    assert abs(sd_g - sd_m) < 5 * math.sqrt(2) * se_sd + 0.005 * SIGMA
    # The shape: the fractions within 1 and 2 sigma, and beyond 3, as the model's (chi-square
    # over 4 bins of |x| / sigma, 3 degrees of freedom, 99.9% point 16.3).
    edges = (1.0, 2.0, 3.0)

    def bins(xs):
        counts = [0] * 4
        for x in xs:
            counts[sum(abs(x) > e * SIGMA for e in edges)] += 1
        return counts

    b_g, b_m = bins(noise_g), bins(noise_m)
    chi2 = sum((g - m) ** 2 / (g + m) for g, m in zip(b_g, b_m, strict=True) if g + m)
    assert chi2 < 16.3, (b_g, b_m)


def test_measurement_collapses_the_state(pi_half_shots):
    gate, _ = pi_half_shots
    first, second = gate[0::2], gate[1::2]
    assert [w.outcome for w in first] == [w.outcome for w in second]
    assert {w.outcome for w in first} == {0, 1}


def test_same_seed_same_sequence_other_seed_another():
    script = [("idle", 2)] + [("drive", PI_HALF), ("window", 12), ("idle", 2)] * 16

    def samples(seed):
        return [w.samples for w in _run(QubitEmulator(seed=seed), script)]

    a, b, c = samples(21), samples(21), samples(22)
    assert a == b
    assert a != c
    assert [s[-1] for s in a] != [s[-1] for s in c]
