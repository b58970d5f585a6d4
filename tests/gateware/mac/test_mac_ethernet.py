"""openqlink.gateware.mac.ethernet: the receive and transmit MACs, byte for byte, in amaranth.sim.

The FCS oracle is zlib's CRC-32 (independent of amaranth.lib.crc)."""

import random

import pytest
from amaranth.sim import Simulator
from macbench import (
    PREAMBLE,
    PacketCollector,
    fcs,
    padded,
    random_frame,
    split_gmii,
    to_beats,
    wire,
)

from openqlink.gateware.mac.ethernet import MIN_IFG_BYTES, MACRx, MACTx

# ---------------------------------------------------------------------------------------------
# Receive


def run_rx(symbols: list[tuple[int, int, int]], tail: int = 20):
    """Drive ``(data, en, er)`` per cycle into MACRx; return packets, pulses and beat cycles."""
    dut = MACRx()
    got = PacketCollector(8)
    pulses = {"frame_end": 0, "fcs_error": 0, "phy_error": 0, "runt": 0}

    async def bench(ctx):
        for cycle, (data, en, er) in enumerate(symbols + [(0, 0, 0)] * tail):
            ctx.set(dut.gmii.data, data)
            ctx.set(dut.gmii.en, en)
            ctx.set(dut.gmii.er, er)
            await ctx.tick()
            if ctx.get(dut.frames.valid):
                got.beat(ctx.get(dut.frames.payload), cycle)
            for name in pulses:
                pulses[name] += ctx.get(getattr(dut, name))

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()
    return got.packets, pulses


def symbols_of(raw: bytes, *, er_at: int | None = None, gap: int = MIN_IFG_BYTES):
    out = [(b, 1, int(i == er_at)) for i, b in enumerate(raw)]
    return out + [(0, 0, 0)] * gap


@pytest.mark.parametrize("length", [60, 61, 64, 100, 1514])
def test_rx_good_frame_bytes_and_flags(length):
    frame = random_frame(random.Random(length), length)
    packets, pulses = run_rx(symbols_of(wire(frame)))
    assert len(packets) == 1
    assert packets[0].data == frame
    assert packets[0].error == 0
    assert pulses == {"frame_end": 1, "fcs_error": 0, "phy_error": 0, "runt": 0}


def test_rx_bad_fcs_sets_error_on_last_beat():
    frame = random_frame(random.Random(1), 80)
    packets, pulses = run_rx(symbols_of(wire(frame, bad_fcs=True)))
    assert [p.error for p in packets] == [1]
    assert packets[0].data == frame
    assert pulses["fcs_error"] == 1 and pulses["runt"] == 0


def test_rx_bit_error_in_payload_is_caught():
    frame = random_frame(random.Random(2), 200)
    raw = bytearray(wire(frame))
    raw[8 + 123] ^= 0x04
    packets, pulses = run_rx(symbols_of(bytes(raw)))
    assert [p.error for p in packets] == [1] and pulses["fcs_error"] == 1


@pytest.mark.parametrize("where", [0, 8, 40, 8 + 70 + 3])   # SFD, first byte, payload, FCS
def test_rx_er_during_frame_sets_error(where):
    frame = random_frame(random.Random(3), 70)
    raw = wire(frame)
    where = min(where, len(raw) - 1)
    packets, pulses = run_rx(symbols_of(raw, er_at=where))
    if where < 7:       # RX_ER on a preamble byte is before the frame: ignored
        assert [p.error for p in packets] == [0]
    else:
        assert [p.error for p in packets] == [1]
        assert pulses["phy_error"] == 1 and pulses["fcs_error"] == 0


def test_rx_false_carrier_outside_frame_is_ignored():
    frame = random_frame(random.Random(4), 64)
    symbols = [(0x0E, 0, 1)] * 5 + symbols_of(wire(frame))
    packets, pulses = run_rx(symbols)
    assert [(p.data, p.error) for p in packets] == [(frame, 0)]


def test_rx_runt_with_good_fcs_is_flagged():
    frame = random_frame(random.Random(5), 40)
    packets, pulses = run_rx(symbols_of(wire(frame)))
    assert [(p.data, p.error) for p in packets] == [(frame, 1)]
    assert pulses["runt"] == 1 and pulses["fcs_error"] == 0


@pytest.mark.parametrize("after_sfd", [0, 1, 4, 5])
def test_rx_fragments(after_sfd):
    """A frame of 4 bytes or fewer after the SFD delivers nothing; 5 bytes deliver one, bad."""
    raw = PREAMBLE + bytes(range(1, after_sfd + 1))
    packets, pulses = run_rx(symbols_of(raw))
    assert pulses["frame_end"] == 1 and pulses["runt"] == 1
    if after_sfd <= 4:
        assert packets == []
    else:
        assert [(p.data, p.error) for p in packets] == [(b"\x01", 1)]


def test_rx_short_preamble_and_back_to_back_frames():
    rng = random.Random(6)
    frames = [random_frame(rng, n) for n in (64, 60, 333, 61, 1500, 64)]
    bad = {2}
    symbols = []
    for k, f in enumerate(frames):
        pre = PREAMBLE[k % 4:]       # 8, 7, 6, 5 preamble bytes
        symbols += symbols_of(wire(f, bad_fcs=k in bad, preamble=pre), gap=MIN_IFG_BYTES)
    packets, pulses = run_rx(symbols)
    assert [p.data for p in packets] == frames
    assert [p.error for p in packets] == [int(k in bad) for k in range(len(frames))]
    assert pulses["frame_end"] == len(frames) and pulses["fcs_error"] == 1


def test_rx_latency_cycles():
    """Each payload byte leaves 6 cycles after it arrived; the last beat 2 after the FCS."""
    frame = random_frame(random.Random(7), 64)
    packets, _ = run_rx(symbols_of(wire(frame)))
    cycles = packets[0].cycles
    # Byte k of the frame is driven in cycle 8 + k (after preamble and SFD), sampled at the
    # end of it; a beat recorded after the tick of cycle c is on the output in cycle c + 1.
    assert cycles[0] + 1 - 8 == 6
    assert cycles[-2] + 1 - (8 + len(frame) - 2) == 6
    last_fcs_cycle = 8 + len(frame) + 3
    assert cycles[-1] + 1 - last_fcs_cycle == 2


# ---------------------------------------------------------------------------------------------
# Transmit


def run_tx(frames: list[bytes], *, gaps: list[int] | None = None, stall_at: dict | None = None,
           errors: list[int] | None = None, cycles: int | None = None):
    """Offer ``frames`` to MACTx (``gaps[k]`` idle cycles before frame k; ``stall_at[k] = j``:
    frame k's source has no byte for one cycle before byte j); return the GMII samples, the
    cycle each frame's first beat was offered, and pulse counts."""
    dut = MACTx()
    gaps = gaps or [0] * len(frames)
    errors = errors or [0] * len(frames)
    stall_at = stall_at or {}
    samples: list[tuple[int, int, int]] = []
    offered: list[int] = []
    pulses = {"frame_sent": 0, "underflow": 0}
    total = cycles or sum(len(f) + 100 + g for f, g in zip(frames, gaps, strict=True)) + 100

    async def bench(ctx):
        k, j, wait, stalled = 0, 0, gaps[0] if gaps else 0, False
        beats = [to_beats(f, 8, error=e) for f, e in zip(frames, errors, strict=True)]
        for cycle in range(total):
            valid = 0
            if k < len(frames) and wait == 0:
                if stall_at.get(k) == j and j and not stalled:
                    stalled = True
                else:
                    valid = 1
                    ctx.set(dut.frames.payload, beats[k][j])
                    if j == 0 and (not offered or len(offered) == k):
                        offered.append(cycle)
            ctx.set(dut.frames.valid, valid)
            ready = ctx.get(dut.frames.ready)
            samples.append((ctx.get(dut.gmii.data), ctx.get(dut.gmii.en), ctx.get(dut.gmii.er)))
            for name in pulses:
                pulses[name] += ctx.get(getattr(dut, name))
            await ctx.tick()
            if wait:
                wait -= 1
            elif valid and ready:
                j += 1
                if j == len(beats[k]):
                    k, j, stalled = k + 1, 0, False
                    wait = gaps[k] if k < len(frames) else 0

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()
    return split_gmii(samples), offered, pulses


@pytest.mark.parametrize("length", [1, 14, 59, 60, 61, 64, 1514])
def test_tx_preamble_padding_and_fcs(length):
    frame = random_frame(random.Random(length), length)
    on_wire, offered, pulses = run_tx([frame])
    assert len(on_wire) == 1
    body = padded(frame)
    assert on_wire[0].data == PREAMBLE + body + fcs(body)
    assert on_wire[0].errors == []
    assert pulses == {"frame_sent": 1, "underflow": 0}
    assert on_wire[0].start - offered[0] == 2


def test_tx_back_to_back_at_line_rate_with_minimum_gap():
    rng = random.Random(11)
    frames = [random_frame(rng, n) for n in (64, 20, 1500, 60, 61, 100)]
    on_wire, _, pulses = run_tx(frames)
    assert [w.data for w in on_wire] == [PREAMBLE + padded(f) + fcs(padded(f)) for f in frames]
    gaps = [b.start - a.end for a, b in zip(on_wire, on_wire[1:], strict=False)]
    assert gaps == [MIN_IFG_BYTES] * (len(frames) - 1)
    assert pulses["frame_sent"] == len(frames)


def test_tx_gap_is_kept_when_the_next_frame_comes_late():
    rng = random.Random(12)
    frames = [random_frame(rng, 64) for _ in range(3)]
    on_wire, offered, _ = run_tx(frames, gaps=[0, 5, 40])
    gaps = [b.start - a.end for a, b in zip(on_wire, on_wire[1:], strict=False)]
    assert gaps[0] == MIN_IFG_BYTES
    assert gaps[1] > MIN_IFG_BYTES and on_wire[2].start - offered[2] == 2


def test_tx_underflow_ends_frame_with_tx_er_and_drops_the_rest():
    rng = random.Random(13)
    frames = [random_frame(rng, 100), random_frame(rng, 70)]
    on_wire, _, pulses = run_tx(frames, stall_at={0: 30})
    assert pulses == {"frame_sent": 1, "underflow": 1}
    assert len(on_wire) == 2
    first = on_wire[0]
    assert first.data[:8 + 30] == PREAMBLE + frames[0][:30]
    assert first.errors == [8 + 30] and len(first.data) == 8 + 31
    assert on_wire[1].data == PREAMBLE + frames[1] + fcs(frames[1])
    assert on_wire[1].start - first.end >= MIN_IFG_BYTES


def test_tx_error_flag_sends_tx_er_on_fcs():
    frame = random_frame(random.Random(14), 64)
    on_wire, _, _ = run_tx([frame], errors=[1])
    n = len(on_wire[0].data)
    assert on_wire[0].errors == [n - 4, n - 3, n - 2, n - 1]


@pytest.mark.filterwarnings("ignore:.*created but never used")
def test_tx_ifg_parameter_is_checked():
    with pytest.raises(ValueError, match=r"ifg_bytes must be an integer >= 12, not 11"):
        MACTx(ifg_bytes=11)


def test_tx_beats_without_first_between_frames_are_dropped():
    """Stray beats (no ``first``) offered to an idle MAC are consumed and never sent; the frame
    after them goes out whole."""
    dut = MACTx()
    frame = random_frame(random.Random(15), 64)
    stray = [{"data": 0xEE, "keep": 1, "first": 0, "last": int(k == 2), "error": 0}
             for k in range(3)]
    beats = stray + to_beats(frame, 8)
    samples = []
    taken = [0]

    async def bench(ctx):
        n = 0
        for _ in range(200):
            valid = n < len(beats)
            if valid:
                ctx.set(dut.frames.payload, beats[n])
            ctx.set(dut.frames.valid, valid)
            ready = ctx.get(dut.frames.ready)
            samples.append((ctx.get(dut.gmii.data), ctx.get(dut.gmii.en), ctx.get(dut.gmii.er)))
            await ctx.tick()
            if valid and ready:
                n += 1
        taken[0] = n

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()
    assert taken[0] == len(beats)
    assert [w.data for w in split_gmii(samples)] == [PREAMBLE + frame + fcs(frame)]
