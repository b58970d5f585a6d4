"""The drive channels' NCO and the readout channels' demodulation, with 1, 2 and 4 lanes.

Each is checked sample for sample against the formulas of its docstring (a Python model kept
here), and against the physics those formulas stand for: the phase of a drive's output advances
by the frequency word per sample, and a demodulated tone integrates to its amplitude at its
phase, rotated by the window's phase.
"""

from __future__ import annotations

import cmath
import math
import random

import pytest
from test_ppu_channels import _push, _run

from openqlink.gateware.ppu.channels import DriveChannel, ReadoutChannel

COS = DriveChannel.cos_table()
TURN = 1 << 32


def _table(theta: int) -> tuple[int, int]:
    i = (theta % TURN) >> 22
    return COS[i], COS[(i - 256) % 1024]


def _s16(x: int) -> int:
    x &= 0xFFFF
    return x - 0x10000 if x & 0x8000 else x


class DriveModel:
    """The documented output of a :class:`DriveChannel`, cycle by cycle (``nco`` on or off)."""

    def __init__(self, env: list[int], lanes: int, nco: bool):
        self.env, self.lanes, self.nco = env, lanes, nco
        self.acc = self.freq = self.phase = 0
        self.pulse = None            # (event, cycles played)

    def step(self, event: dict | None) -> list[tuple[int, int]] | None:
        """One output cycle; ``event`` starts on it. Returns each lane's (I, Q), or None."""
        S = self.lanes
        if event is not None:
            self.freq, self.phase = event.get("freq_word", 0), event.get("phase", 0)
            base = 0 if event.get("phase_reset", 0) else self.acc
            self.pulse = [event, 0]
        else:
            base = self.acc
        self.acc = (base + S * self.freq) % TURN
        if self.pulse is None:
            return None
        ev, j = self.pulse
        if j >= ev["env_len"] // S:
            self.pulse = None
            return None
        self.pulse[1] += 1
        out = []
        for k in range(S):
            e = self.env[(ev["env_addr"] - ev["env_addr"] % S + S * j + k) % len(self.env)]
            amp = ev["amplitude"]
            if not self.nco:
                out.append((min((e * amp) >> 15, 32767), 0))
                continue
            c, s = _table(base + k * self.freq + (self.phase << 16))
            ops = [min((amp * t) >> 16, 32767) for t in (c, s)]
            out.append(tuple(min((e * a) >> 15, 32767) for a in ops))
        return out


def _drive_run(lanes: int, nco: bool, events: list[dict], env: list[int], until: int):
    """Play ``events`` (pushed in order, ahead of time) and return, per active cycle, each
    lane's (I, Q), as the channel gives it and as the model does."""
    dut = DriveChannel(len(env), time_bits=48, samples_per_cycle=lanes, nco=nco)
    got: dict[int, list[tuple[int, int]]] = {}

    async def bench(ctx):
        for ev in events:
            await _push(ctx, dut, **ev)
        while ctx.get(dut.now) < until:
            addr = ctx.get(dut.env_rd_addr)
            word = sum((env[4 * addr + k] & 0xFFFF) << (16 * k) for k in range(4))
            sample = await ctx.tick().sample(dut.now, dut.active, dut.dac, dut.dac_q)
            now, active, dac, dac_q = sample[2:]
            ctx.set(dut.env_rd_data, word)
            ctx.set(dut.env_rd_min, sum(1 << i for i in range(8)
                                        if (word >> 8 * i) & 0xFF == (0x80 if i % 2 else 0)))
            if active:
                got[now] = [(_s16(int(dac[k])), _s16(int(dac_q[k]))) for k in range(lanes)]

    _run(dut, bench)
    model = DriveModel(env, lanes, nco)
    starts = {ev["time"]: ev for ev in events}
    want = {}
    for now in range(until + 1):
        out = model.step(starts.get(now))
        if out is not None:
            want[now] = out
    return got, want


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_drive_nco_matches_its_formula(lanes):
    """Pulses with new frequencies and phases, a phase reset, a pulse cut short by the next,
    full-scale amplitudes of both signs: every lane's I and Q, bit for bit."""
    rng = random.Random(lanes)
    env = [rng.randrange(-32768, 32768) for _ in range(64)]
    env[4:8] = [-32768] * 4                       # the saturating product, -1 * -1
    events = [
        dict(time=40, env_addr=0, env_len=8 * lanes, amplitude=-32768, phase=0,
             freq_word=0, phase_reset=0),
        dict(time=52, env_addr=4 * lanes, env_len=12 * lanes, amplitude=23000, phase=0x4000,
             freq_word=0x0123_4567, phase_reset=0),
        dict(time=60, env_addr=8, env_len=6 * lanes, amplitude=-17000, phase=0x9000,
             freq_word=0xF000_0001, phase_reset=0),           # cuts the one before short
        dict(time=70, env_addr=16, env_len=5 * lanes, amplitude=32767, phase=0,
             freq_word=0x2222_2222, phase_reset=1),
        dict(time=90, env_addr=0, env_len=4 * lanes, amplitude=32767, phase=0x1234,
             freq_word=0x2222_2222, phase_reset=0),           # after a gap: the NCO ran on
    ]
    got, want = _drive_run(lanes, True, events, env, 110)
    assert got == want
    assert len(got) == 8 + 8 + 6 + 5 + 4


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_drive_without_nco_plays_the_envelope_times_the_amplitude(lanes):
    rng = random.Random(10 + lanes)
    env = [rng.randrange(-32768, 32768) for _ in range(32)]
    env[0:4] = [-32768] * 4
    events = [dict(time=30, env_addr=0, env_len=6 * lanes, amplitude=-32768, phase=0x4000,
                   freq_word=0x1000_0000, phase_reset=1)]
    got, want = _drive_run(lanes, False, events, env, 50)
    assert got == want and len(got) == 6
    assert all(q == 0 for row in got.values() for _, q in row)


def test_drive_phase_advances_by_the_frequency_word_and_continues_across_pulses():
    """The physics: a square pulse's output turns by ``freq_word / 2**32`` of a turn per
    sample; a later pulse at another frequency starts from the phase the first one's reached
    (phase-continuous), and ``phase_reset`` starts it at its phase operand."""
    lanes = 2
    env = [20000] * 64
    f1, f2 = round(0.013 * TURN), round(-0.031 * TURN) % TURN
    events = [dict(time=30, env_addr=0, env_len=40, amplitude=32767, phase=0, freq_word=f1,
                   phase_reset=1),
              dict(time=70, env_addr=0, env_len=40, amplitude=32767, phase=0, freq_word=f2,
                   phase_reset=0),
              dict(time=120, env_addr=0, env_len=8, amplitude=32767, phase=0x2000,
                   freq_word=f2, phase_reset=1)]
    got, _ = _drive_run(lanes, True, events, env, 140)
    samples = {lanes * now + k: complex(*iq) for now, row in got.items()
               for k, iq in enumerate(row)}
    step = 2 * math.pi / 1024 * 1.5                 # the table's phase resolution, and then some

    def turn(a: complex, b: complex) -> float:
        return cmath.phase(b / a)

    for n in range(60, 99):                         # inside the first pulse
        assert abs(turn(samples[n], samples[n + 1]) - 2 * math.pi * 0.013) < step
    for n in range(140, 179):                       # inside the second
        assert abs(turn(samples[n], samples[n + 1]) + 2 * math.pi * 0.031) < step
    # The first pulse ended at sample 99; the NCO ran on at f1 through samples 100..139, so the
    # second pulse's first sample is where f1 took it (no jump).
    expected = cmath.phase(samples[60]) + 2 * math.pi * 0.013 * (140 - 60)
    assert abs(cmath.phase(samples[140] / cmath.exp(1j * expected))) < step
    assert abs(cmath.phase(samples[240]) - 2 * math.pi * 0x2000 / 65536) < step
    assert all(abs(abs(v) - 20000) < 60 for v in samples.values())


class ReadoutModel:
    """The documented I and Q of a window (``nco`` on)."""

    @staticmethod
    def window(adc: list[int], phase: int, freq_word: int) -> tuple[int, int]:
        i = q = 0
        for n, x in enumerate(adc):
            c, s = _table((phase << 16) + n * freq_word)
            i += (x * c) >> 16
            q += (-x * s) >> 16
        return i, q


def _readout_run(lanes: int, nco: bool, events: list[dict], adc_of, until: int):
    dut = ReadoutChannel(time_bits=48, samples_per_cycle=lanes, nco=nco)
    results, iqs, windows = [], [], []

    async def bench(ctx):
        for ev in events:
            await _push(ctx, dut, **ev)
        while ctx.get(dut.now) < until:
            now = ctx.get(dut.now)                          # the cycle about to be sampled
            for k in range(lanes):
                ctx.set(dut.adc[k], adc_of(lanes * now + k))
            sample = await ctx.tick().sample(dut.now, dut.window, dut.result_valid,
                                             dut.result_rd, dut.result_bit, dut.iq_valid,
                                             dut.iq_i, dut.iq_q, dut.late)
            now, win, valid, rd, bit, iq_valid, iq_i, iq_q, late = sample[2:]
            assert not late
            if win:
                windows.append(now)
            if valid:
                results.append((now, rd, bit))
            if iq_valid:
                iqs.append((iq_i, iq_q))

    _run(dut, bench)
    return results, iqs, windows


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_readout_demodulation_matches_its_formula(lanes):
    """Back-to-back windows with their own frequency, phase and threshold on a noisy tone: the
    integrals bit for bit, the result bits, and the result a cycle after the window."""
    rng = random.Random(lanes)
    adc = [rng.randrange(-30000, 30000) for _ in range(4 * 200)]
    f = round(0.07 * TURN)
    events = [dict(time=40, window_cycles=10, threshold=-5, rd=3, phase=0, freq_word=f),
              dict(time=50, window_cycles=1, threshold=0, rd=4, phase=0x5000, freq_word=f),
              dict(time=51, window_cycles=25, threshold=1000, rd=5, phase=0xC000,
                   freq_word=0x9000_0000)]
    results, iqs, windows = _readout_run(lanes, True, events, lambda n: adc[n], 90)
    want_iq = []
    for ev in events:
        first = lanes * ev["time"]
        want_iq.append(ReadoutModel.window(adc[first:first + lanes * ev["window_cycles"]],
                                           ev["phase"], ev["freq_word"]))
    assert iqs == want_iq
    assert results == [(ev["time"] + ev["window_cycles"], ev["rd"], int(iq[0] > ev["threshold"]))
                       for ev, iq in zip(events, want_iq, strict=True)]
    assert windows == list(range(40, 76))


def test_readout_demodulates_a_tone_to_its_amplitude_and_phase():
    """The physics: a tone ``A cos(2 pi f n + phi)`` integrated over a window at ``f`` gives
    ``N A / 2`` at the angle ``phi - psi`` (``psi``: the window's phase), for each lane count."""
    A, f, phi = 12000, 0.0625, 1.1
    for lanes in (1, 2, 4):
        psi = 0.3
        cycles = 64 // lanes
        events = [dict(time=40, window_cycles=cycles, threshold=0, rd=1,
                       phase=round(psi / (2 * math.pi) * 65536), freq_word=round(f * TURN))]

        def tone(n, lanes=lanes):
            return round(A * math.cos(2 * math.pi * f * (n - 40 * lanes) + phi))
        _, iqs, _ = _readout_run(lanes, True, events, tone, 45 + cycles)
        (i, q), = iqs
        v = complex(i, q)
        assert abs(abs(v) - 64 * A / 2) < 0.01 * 64 * A / 2
        assert abs(cmath.phase(v) - (phi - psi)) < 0.01


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_readout_without_nco_sums_every_lane(lanes):
    adc = [(-1) ** n * (n % 7) * 100 + 50 for n in range(4 * 100)]
    events = [dict(time=30, window_cycles=6, threshold=100, rd=2),
              dict(time=36, window_cycles=3, threshold=-100000, rd=3)]
    results, iqs, _ = _readout_run(lanes, False, events, lambda n: adc[n], 50)
    sums = [sum(adc[lanes * 30:lanes * 36]), sum(adc[lanes * 36:lanes * 39])]
    assert iqs == [(sums[0], 0), (sums[1], 0)]
    assert results == [(35, 2, int(sums[0] > 100)), (38, 3, 1)]
