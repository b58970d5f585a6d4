"""Tests of openqlink.gateware.net.icrc against the software ICRC and scapy's RoCE layer."""

import random
import zlib

from amaranth.hdl import Module
from amaranth.lib import crc, wiring
from amaranth.lib.crc.catalog import CRC32_ETHERNET
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openqlink.gateware.net.icrc import (
    ICRC,
    ICRC_WORD_MASKS,
    icrc_mask,
    shifted_initial_crc,
)
from openqlink.wire.roce import icrc, icrc_masked_bytes


class _MaskedICRC(wiring.Component):
    """ICRC fed through icrc_mask with a run-time word index, as RX and TX use it."""

    valid: In(1)
    first: In(1)
    last: In(1)
    last_half: In(1)
    word_index: In(8)
    raw: In(64)
    crc: Out(32)
    done: Out(1)

    def elaborate(self, platform):
        m = Module()
        m.submodules.icrc = engine = ICRC()
        m.d.comb += [
            engine.valid.eq(self.valid), engine.first.eq(self.first),
            engine.last.eq(self.last), engine.last_half.eq(self.last_half),
            engine.word.eq(icrc_mask(self.word_index, self.raw)),
            self.crc.eq(engine.crc), self.done.eq(engine.done),
        ]
        return m


def _words(v: bytes) -> list[int]:
    padded = v + bytes(-len(v) % 8)
    return [int.from_bytes(padded[i:i + 8], "little") for i in range(0, len(padded), 8)]


def _run(dut, messages: list[bytes], *, masked_input: bool, seed: int = 0) -> list[int]:
    """Feed each message (V, unmasked if masked_input is False) with random idle gaps."""
    rng = random.Random(seed)
    results: list[int] = []

    async def testbench(ctx):
        for v in messages:
            words = _words(v)
            for k, w in enumerate(words):
                while rng.random() < 0.3:
                    ctx.set(dut.valid, 0)
                    await ctx.tick()
                    assert not ctx.get(dut.done)
                ctx.set(dut.valid, 1)
                ctx.set(dut.first, k == 0)
                ctx.set(dut.last, k == len(words) - 1)
                ctx.set(dut.last_half, len(v) % 8 == 4)
                if masked_input:
                    ctx.set(dut.word, w)
                else:
                    ctx.set(dut.word_index, k)
                    # garbage in the lanes past the end of V must not matter
                    if len(v) % 8 == 4 and k == len(words) - 1:
                        w |= rng.getrandbits(32) << 32
                    ctx.set(dut.raw, w)
                await ctx.tick()
                assert bool(ctx.get(dut.done)) == (k == len(words) - 1)
            ctx.set(dut.valid, 0)
            results.append(ctx.get(dut.crc))
            # crc holds until the next first, even if stray words arrive
            ctx.set(dut.valid, 1)
            ctx.set(dut.first, 0)
            ctx.set(dut.word if masked_input else dut.raw, 0x1234)
            await ctx.tick()
            assert ctx.get(dut.crc) == results[-1]
            assert not ctx.get(dut.done)
            ctx.set(dut.valid, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return results


def _random_packet(rng: random.Random, body_len: int) -> bytes:
    """IPv4 header through pad bytes: random content, length a multiple of 4."""
    return bytes(rng.getrandbits(8) for _ in range(body_len))


def test_shifted_initial_value():
    s = shifted_initial_crc()
    algo = CRC32_ETHERNET
    probe = crc.Algorithm(crc_width=32, polynomial=algo.polynomial, initial_crc=s,
                          reflect_input=False, reflect_output=False, xor_output=0)
    assert probe(8).compute([0, 0, 0, 0]) == algo.initial_crc


def test_mask_offsets_match_software_reference():
    rng = random.Random(1)
    body = bytes(rng.getrandbits(8) for _ in range(60))
    masked = icrc_masked_bytes(body)
    raw = b"\0" * 8 + body
    for k, (w_raw, w_masked) in enumerate(zip(_words(raw), _words(masked), strict=True)):
        assert w_raw | ICRC_WORD_MASKS.get(k, 0) == w_masked, k
    # also with a body of all ones / zeros the masks are exactly the listed bytes
    zeros = icrc_masked_bytes(bytes(40))
    ones_at = {i for i, b in enumerate(zeros) if b == 0xFF}
    assert ones_at == set(range(8)) | {9, 16, 18, 19, 34, 35, 40}


def test_icrc_random_packets_both_length_classes():
    rng = random.Random(7)
    bodies = []
    for i in range(80):
        n = 40 + 4 * rng.randrange(0, 60)
        if i % 2:   # force both classes: V = 8 + n bytes
            n += 4 if (8 + n) % 8 == 0 else 0
        bodies.append(_random_packet(rng, n))
    assert {(8 + len(b)) % 8 for b in bodies} == {0, 4}
    messages = [icrc_masked_bytes(b) for b in bodies]
    got = _run(ICRC(), messages, masked_input=True, seed=3)
    for body, value in zip(bodies, got, strict=True):
        assert value.to_bytes(4, "little") == icrc(body)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=6),
       st.integers(min_value=0, max_value=2**32 - 1))
def test_icrc_masked_path_hypothesis(lengths, seed):
    rng = random.Random(seed)
    bodies = [_random_packet(rng, 40 + 4 * n) for n in lengths]
    raws = [b"\0" * 8 + b for b in bodies]   # word 0 is masked to ones by icrc_mask
    got = _run(_MaskedICRC(), raws, masked_input=False, seed=seed)
    for body, value in zip(bodies, got, strict=True):
        assert value == zlib.crc32(icrc_masked_bytes(body))
        assert value.to_bytes(4, "little") == icrc(body)


def test_icrc_against_scapy_vectors():
    from scapy.contrib.roce import BTH as ScapyBTH
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    frames = []
    for i, payload_len in enumerate((0, 4, 8, 12, 28, 32, 64, 100)):
        pkt = (Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02")
               / IP(src="192.168.0.2", dst="192.168.0.101", tos=0x12, ttl=17, id=i)
               / UDP(sport=0xC000 + i, dport=4791)
               / ScapyBTH(opcode=0x2A, dqpn=0x123 + i, psn=0xABCDE + i, fecn=i & 1)
               / Raw(bytes((j * 7 + i) & 0xFF for j in range(payload_len))))
        frames.append(bytes(pkt))
    bodies = [f[14:-4] for f in frames]
    assert {(8 + len(b)) % 8 for b in bodies} == {0, 4}
    got = _run(ICRC(), [icrc_masked_bytes(b) for b in bodies], masked_input=True)
    for frame, value in zip(frames, got, strict=True):
        assert value.to_bytes(4, "little") == frame[-4:]
