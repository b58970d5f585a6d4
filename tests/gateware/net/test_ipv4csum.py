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
