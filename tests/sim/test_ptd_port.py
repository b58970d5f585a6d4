"""The bench's PTD port (``TB._ptd_port``) against stand-in signals, without a simulator: which
lane of which channel reaches which qubit, in what order, and where the ADC samples go."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from openqlink.sim.bench import TB
from openqlink.sim.channel_map import make_system, sim_params
from openqlink.sim.runner import SimConfig

S = 2          # samples per cycle
Q = 2          # qubits: drives 0, 1; coupler on drive 2; readouts 0, 1
IDEAL = {"qubits": {"t1_ns": None, "t2_ns": None}}


class Signal:
    """A stand-in for a cocotb handle: ``value`` (an int) and a width."""

    def __init__(self, width: int):
        self.width = width
        self.value = 0

    def __len__(self) -> int:
        return self.width


class Top:
    """The PTD ports of PPU 0 of a build with ``Q`` qubits and ``S`` samples per cycle."""

    def __init__(self, params):
        drives, readouts = params.drives_per_ppu, params.readouts_per_ppu
        for name, width in (("dac", 16 * drives * S), ("dac_q", 16 * drives * S),
                            ("dac_active", drives), ("ro_window", readouts),
                            ("adc", 16 * readouts * S), ("marker", params.markers_per_ppu)):
            setattr(self, f"ptd__0__{name}", Signal(width))


def _pack(lanes: dict[tuple[int, int], int]) -> int:
    """``{(channel, lane): code}`` as the port's packed word (index ``S * channel + lane``)."""
    return sum((code & 0xFFFF) << (16 * (S * ch + k)) for (ch, k), code in lanes.items())


def _unpack(word: int, channel: int) -> list[int]:
    out = []
    for k in range(S):
        v = word >> (16 * (S * channel + k)) & 0xFFFF
        out.append(v - 0x10000 if v & 0x8000 else v)
    return out


@pytest.fixture
def bench():
    params = sim_params(1, Q, S)
    cfg = SimConfig(params=asdict(params), qubits=Q, model=IDEAL, program="p.s", pcap=None)
    top = Top(params)
    tb = TB(top, cfg)
    return tb, top, tb._ptd_port(0)


def _cycle(tb, top, step, cycle: int, *, active=0, window=0, i=None, q=None) -> bool:
    tb.dtd_cycle = cycle
    top.ptd__0__dac_active.value = active
    top.ptd__0__ro_window.value = window
    top.ptd__0__dac.value = _pack(i or {})
    top.ptd__0__dac_q.value = _pack(q or {})
    return step()


def test_lanes_reach_their_qubits_in_sample_order_with_the_coupler_between(bench):
    """Drive 1 (qubit 1) and the coupler (drive 2, qubits 0 and 1) play in the same cycles at
    two lanes: the bench feeds lane by lane across channels, so qubit 1 sees its events in
    sample order, and the model ends where one fed the same samples directly does."""
    tb, top, step = bench
    ref = make_system(IDEAL, Q, seed=1, sample_rate_hz=tb.params.sample_rate_hz)
    code = 9000
    assert not _cycle(tb, top, step, 10)
    for c in range(10, 20):
        i = {(0, 0): code, (0, 1): code, (1, 0): code // 2, (1, 1): -code // 2,
             (2, 0): 3000, (2, 1): 3000}
        q = {(1, 0): 1000, (1, 1): -1000}
        assert _cycle(tb, top, step, c, active=0b111, i=i, q=q)
        for k in range(S):
            n = S * c + k
            ref.drive(0, n, i[(0, k)], 0)
            ref.drive(1, n, i[(1, k)], q[(1, k)])
            ref.couple(0, n, i[(2, k)], 0)
    assert not _cycle(tb, top, step, 20)
    model = tb.qubits[0]
    for qubit in range(Q):
        assert model.bloch_vector(qubit) == pytest.approx(ref.bloch_vector(qubit), abs=1e-12)
    assert model.p1(0) > 0.01         # something was played
    events = [(e["channel"], e["kind"], e["dtd_cycle"]) for e in tb.events]
    assert events == [("drive0.0", "play_start", 10), ("drive0.1", "play_start", 10),
                      ("drive0.2", "play_start", 10), ("drive0.0", "play_end", 20),
                      ("drive0.1", "play_end", 20), ("drive0.2", "play_end", 20)]
    assert tb.events[2]["qubits"] == [0, 1] and tb.events[0]["qubit"] == 0


def test_a_readout_projects_at_the_windows_first_sample_and_fills_its_adc_lanes(bench):
    """A window on readout 1 opening at cycle 30: its qubit is projected at sample 60, the ADC
    lanes of readout 1 carry the model's samples from the next cycle on (counted from the
    window's first sample), readout 0's lanes stay 0, and the port is 0 again once it
    closes."""
    tb, top, step = bench
    ref = make_system(IDEAL, Q, seed=1, sample_rate_hz=tb.params.sample_rate_hz)
    adc = top.ptd__0__adc
    assert _cycle(tb, top, step, 30, window=0b10)
    assert ref.begin_readout(1, 60) == tb.qubits[0].measurements[0].outcome
    for c in range(31, 34):
        assert _unpack(adc.value, 1) == [ref.adc_sample(1, S * (c - 30) + k) for k in range(S)]
        assert _unpack(adc.value, 0) == [0] * S
        assert _cycle(tb, top, step, c, window=0b10)
    assert not _cycle(tb, top, step, 34)
    assert adc.value == 0
    assert [(e["channel"], e["kind"], e["dtd_cycle"]) for e in tb.events] == [
        ("readout0.1", "acquire_start", 30), ("readout0.1", "acquire_end", 34)]
    (m,) = tb.qubits[0].measurements
    assert (m.qubit, m.channel, m.sample, m.outcome) == (1, 1, 60, 0)


def test_a_top_of_another_build_is_named():
    """``qlink sim --verilog`` with a Verilog file of another build: the port's width says so."""
    params = sim_params(1, Q, S)
    cfg = SimConfig(params=asdict(params), qubits=Q, model=IDEAL, program="p.s", pcap=None)
    tb = TB(Top(sim_params()), cfg)
    with pytest.raises(ValueError, match="ptd__0__dac has 32 bits, not the 96 of 3 drive and 2 "
                                         "readout channel\\(s\\) of 2 sample\\(s\\) per cycle"):
        tb._ptd_port(0)
