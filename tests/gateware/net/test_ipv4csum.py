"""Tests of openqlink.gateware.net.ipv4csum against openqlink.wire.ipv4.ipv4_checksum."""

import random

from amaranth.sim import Simulator

from openqlink.gateware.net.ipv4csum import IPv4Checksum
from openqlink.wire.ipv4 import IPV4, ipv4_checksum


def _headers(rng: random.Random, n: int) -> list[bytes]:
    out = [IPV4.pack(total_length=0xFFFF, ttl=0xFF, protocol=0xFF, src=0xFFFFFFFF,
                     dst=0xFFFFFFFF, identification=0xFFFF, tos=0xFF)]
    for _ in range(n):
        out.append(IPV4.pack(tos=rng.getrandbits(8), total_length=rng.getrandbits(16),
                             identification=rng.getrandbits(16), ttl=rng.getrandbits(8),
                             protocol=rng.getrandbits(8), src=rng.getrandbits(32),
                             dst=rng.getrandbits(32)))
    return out


def test_generate_and_verify_pipelined():
    headers = _headers(random.Random(4), 60)
    # generation (checksum field 0), then verification of the completed header
    inputs = []
    for h in headers:
        value = ipv4_checksum(h)
        inputs.append((h, value))
        inputs.append((h[:10] + value.to_bytes(2, "big") + h[12:], 0))
    dut = IPv4Checksum()
    results = []

    async def testbench(ctx):
        for i in range(len(inputs) + 2):
            if i < len(inputs):
                ctx.set(dut.header, int.from_bytes(inputs[i][0], "little"))
            ctx.set(dut.valid, i < len(inputs) and i % 7 != 3)
            *_, done, value = await ctx.tick().sample(dut.done, dut.checksum)
            if done:
                results.append((i - 2, value))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    expected = [(i, v) for i, (_, v) in enumerate(inputs) if i % 7 != 3]
    assert results == expected


def _words_with_sum(rng: random.Random, total: int) -> bytes:
    """Ten random big-endian words that add up to ``total`` (at most 10 * 0xFFFF)."""
    words = []
    left = total
    for i in range(10, 0, -1):
        lo = max(0, left - 0xFFFF * (i - 1))
        w = rng.randint(lo, min(0xFFFF, left))
        words.append(w)
        left -= w
    rng.shuffle(words)
    return b"".join(w.to_bytes(2, "big") for w in words)


def test_end_around_carry_of_every_fold():
    # Totals where the first fold (low 16 bits + the carries above them) itself carries, where
    # it ends on exactly 0xFFFF, and the smallest and largest totals: the second fold's carry
    # and both one's-complement zeros.
    rng = random.Random(7)
    totals = [0, 1, 0xFFFF, 0x10000, 0x1FFFE, 0x1FFFF, 0x20000, 0x9FFF6, 10 * 0xFFFF]
    totals += [(h << 16) | (0x10000 - h + d) for h in range(1, 10) for d in (-1, 0, 1, 5)
               if (h << 16) | (0x10000 - h + d) <= 10 * 0xFFFF and 0x10000 - h + d <= 0xFFFF]
    headers = [_words_with_sum(rng, t) for t in totals]
    dut = IPv4Checksum()
    results = []

    async def testbench(ctx):
        for h in headers:
            ctx.set(dut.header, int.from_bytes(h, "little"))
            ctx.set(dut.valid, 1)
            await ctx.tick()
            ctx.set(dut.valid, 0)
            await ctx.tick().repeat(2)
            results.append(ctx.get(dut.checksum))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    assert results == [ipv4_checksum(h) for h in headers]
