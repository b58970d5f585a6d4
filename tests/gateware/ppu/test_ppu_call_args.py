"""CALL with up to four argument registers and a 64-bit result, in the PPU cluster.

The request's argument bytes are each argument's ``ceil(bits / 8)`` bytes, the low ``bits`` of
its register LSB-first, one argument after another (CUDA-Q realtime's layout: each argument its
schema's ``size_bytes``); result bytes 0..3 go to ``rd`` and 4..7 to ``rd_hi``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from ppu_bench import PARAMS, acquire, call, end, read_reg, send_response, set_, wait_state
from test_ppu_cluster import FID, _take_request, run, start

from openqlink.isa.layout import PPUState
from openqlink.wire.rpc import Response


def packed(args: list[tuple[int, int]]) -> bytes:
    """The documented argument bytes of ``(value, bits)`` pairs."""
    out = b""
    for value, bits in args:
        n = -(-bits // 8)
        out += (value & ((1 << bits) - 1)).to_bytes(n, "little") if n else b""
    return out


def signed32(v: int) -> int:
    return v - (1 << 32) if v >> 31 else v


#: (register values of r1..r4, the CALL's (register, bits) per argument).
CASES = {
    "four of 1, 8, 12 and 32 bits": ([0xFFFFFFFF, 0x1234ABCD, 0x76543FED, 0x89ABCDEF],
                                      [(1, 1), (2, 8), (3, 12), (4, 32)]),
    "a 0-bit argument in the middle is skipped": ([0x55, 0x66, 0x77, 0x88],
                                                  [(1, 8), (2, 0), (3, 9), (4, 17)]),
    "one register twice, r0": ([0xA5A5A5A5, 0, 0, 0], [(1, 32), (1, 4), (0, 8), (1, 31)]),
    "no arguments": ([1, 2, 3, 4], []),
    "one argument of 32 bits": ([0xDEADBEEF, 0, 0, 0], [(1, 32)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_arguments_are_packed_one_after_another(case):
    values, args = CASES[case]
    fields = {}
    for k, (reg, bits) in enumerate(args):
        fields["rs" if k == 0 else f"rs{k}"] = reg
        fields["arg_bits" if k == 0 else f"arg{k}_bits"] = bits
    rs, arg_bits = fields.pop("rs", 0), fields.pop("arg_bits", 0)
    regs = [0, *values]
    want = packed([(regs[reg], bits) for reg, bits in args])

    async def tb(ctx, dut):
        prog = [set_(i + 1, signed32(v)) for i, v in enumerate(values)]
        prog += [call(5, rs, arg_bits, FID, **fields), end()]
        await start(ctx, dut, prog, lead=40)
        req, _ = await _take_request(ctx, dut)
        assert req.arg_len == len(want)
        got = int(req.args).to_bytes(16, "little")[:len(want)]
        assert got == want, (got.hex(), want.hex())
        await send_response(ctx, dut, 0, Response(0, req.request_id, 0, b"\x07"))
        await wait_state(ctx, dut, 0, PPUState.DONE)
        assert await read_reg(ctx, dut, 0, "R5") == 7

    run(tb)


def test_an_argument_register_pending_on_a_measurement_is_sent_once_it_lands():
    """The CALL waits for every argument register: r3's measurement (1), not its old 6."""
    async def tb(ctx, dut):
        prog = [set_(1, 0xAB), set_(3, 6), acquire(0, 3, 10, 30, 0),
                call(0, 1, 8, FID, rs1=3, arg1_bits=1), end()]
        await start(ctx, dut, prog, lead=40)
        req, _ = await _take_request(ctx, dut)
        assert (req.arg_len, int(req.args) & 0xFFFF) == (2, 0x01AB)
        await send_response(ctx, dut, 0, Response(0, req.request_id, 0, b""))
        await wait_state(ctx, dut, 0, PPUState.DONE)

    run(tb, adc=lambda now: 5)


@pytest.mark.parametrize("result, lo, hi", [
    (bytes(range(1, 9)), 0x04030201, 0x08070605),
    (b"\x11\x22\x33\x44\x55", 0x44332211, 0x55),        # result_len 5: zero-extended
    (b"\x11\x22", 0x2211, 0),
    (bytes(range(1, 13)), 0x04030201, 0x08070605),      # bytes beyond 8 are not taken
])
def test_a_64_bit_result_lands_in_rd_and_rd_hi(result, lo, hi):
    async def tb(ctx, dut):
        prog = [set_(6, 99), set_(7, 99), call(6, 0, 0, FID, rd_hi=7),
                call(2, 0, 0, FID), end()]
        await start(ctx, dut, prog, lead=40)
        req, _ = await _take_request(ctx, dut)
        await send_response(ctx, dut, 0, Response(0, req.request_id, 0, result))
        # Without rd_hi the high word is dropped.
        req, _ = await _take_request(ctx, dut)
        await send_response(ctx, dut, 0, Response(0, req.request_id, 0, result))
        await wait_state(ctx, dut, 0, PPUState.DONE)
        assert await read_reg(ctx, dut, 0, "R6") == lo
        assert await read_reg(ctx, dut, 0, "R7") == hi
        assert await read_reg(ctx, dut, 0, "R2") == lo

    run(tb)


@pytest.mark.parametrize("field", ["arg1_bits", "arg2_bits", "arg3_bits"])
def test_more_than_32_bits_for_any_argument_is_illegal(field):
    async def tb(ctx, dut):
        await start(ctx, dut, [set_(1, 1), call(0, 1, 8, FID, **{field: 33}), end()])
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.illegal_instruction
        assert await read_reg(ctx, dut, 0, "PC") == 1

    run(tb)


def test_each_argument_byte_costs_one_cycle():
    """The request leaves n + 2 cycles later with n >= 1 argument bytes than with none (the
    bytes are gathered one per cycle, after a first cycle that starts the gathering, through a
    two-stage read)."""
    offered = {}

    async def tb(ctx, dut):
        for n, more in ((0, {}), (1, {}), (4, {}), (9, {"rs1": 2, "arg1_bits": 32,
                                                        "rs2": 3, "arg2_bits": 1})):
            bits = {0: 0, 1: 8, 4: 32, 9: 32}[n]
            prog = [set_(1, 1), set_(2, 2), set_(3, 3), call(0, 1, bits, FID, **more), end()]
            s = await start(ctx, dut, prog, lead=200)
            req, h = await _take_request(ctx, dut)
            assert req.arg_len == n
            offered[n] = h - s
            await send_response(ctx, dut, 0, Response(0, req.request_id, 0, b""))
            await wait_state(ctx, dut, 0, PPUState.DONE)

    run(tb)
    assert {n: offered[n] - offered[0] for n in (1, 4, 9)} == {1: 3, 4: 6, 9: 11}, offered


@pytest.mark.parametrize("arg_bytes", [0, 4, 5])
def test_a_build_with_fewer_argument_bytes_sends_as_many_and_refuses_more(arg_bytes):
    """``call_arg_bytes``: a CALL of that many bytes is sent whole; one byte more is an illegal
    instruction that sends nothing (found as the gathering reaches the byte past them)."""
    params = replace(PARAMS, call_arg_bytes=arg_bytes)
    values = [0x11223344, 0x55667788, 0x99AABBCC]
    # Arguments of ``arg_bytes`` bytes in all (8 bits of r1, then 24 or 32 of r2) ...
    fits = {0: {}, 4: {"rs1": 2, "arg1_bits": 24}, 5: {"rs1": 2, "arg1_bits": 32}}[arg_bytes]
    fits_bits = 0 if arg_bytes == 0 else 8
    # ... and a 1-bit argument after them.
    over = {**fits, "rs2": 3, "arg2_bits": 1} if arg_bytes else {}
    over_bits = fits_bits if arg_bytes else 1
    regs = [0, *values]
    want = packed([(regs[1], fits_bits), (regs[2], fits.get("arg1_bits", 0))])
    assert len(want) == arg_bytes

    async def tb(ctx, dut):
        setup = [set_(i + 1, signed32(v)) for i, v in enumerate(values)]
        await start(ctx, dut, [*setup, call(5, 1, fits_bits, FID, **fits), end()], lead=40)
        assert await read_reg(ctx, dut, 0, "CALL_ARG_BYTES") == arg_bytes
        req, _ = await _take_request(ctx, dut)
        assert req.arg_len == arg_bytes
        got = int(req.args).to_bytes(16, "little")[:arg_bytes]
        assert got == want, (got.hex(), want.hex())
        await send_response(ctx, dut, 0, Response(0, req.request_id, 0, b"\x07"))
        await wait_state(ctx, dut, 0, PPUState.DONE)
        assert await read_reg(ctx, dut, 0, "CALL_COUNT") == 1

        await start(ctx, dut, [*setup, call(5, 1, over_bits, FID, **over), end()], lead=40)
        st = await wait_state(ctx, dut, 0, PPUState.ERROR)
        assert st.illegal_instruction
        assert await read_reg(ctx, dut, 0, "PC") == len(setup)
        for _ in range(20):
            assert not ctx.get(dut.call_req.valid)
            await ctx.tick()
        assert await read_reg(ctx, dut, 0, "CALL_COUNT") == 1

    run(tb, params=params)
