"""The host's struct codecs of the RPC headers agree with their amaranth.lib.data layouts."""

import pytest
from amaranth.hdl import signed, unsigned
from amaranth.lib import data
from hypothesis import given
from hypothesis import strategies as st

from openqlink.wire.rpc import (
    HEADER_BYTES,
    REQUEST_CODEC,
    RESPONSE_CODEC,
    Request,
    Response,
    RPCHeader,
    RPCResponse,
    struct_codec,
)

u32 = st.integers(0, (1 << 32) - 1)
u64 = st.integers(0, (1 << 64) - 1)
i32 = st.integers(-(1 << 31), (1 << 31) - 1)


@given(u32, u32, u32, u32, u64)
def test_request_codec_packs_as_the_layout(magic, function_id, arg_len, request_id, ts):
    fields = dict(magic=magic, function_id=function_id, arg_len=arg_len, request_id=request_id,
                  ptp_timestamp=ts)
    want = RPCHeader.const(fields).as_bits().to_bytes(HEADER_BYTES, "little")
    assert REQUEST_CODEC.size == HEADER_BYTES
    assert REQUEST_CODEC.pack(*fields.values()) == want
    assert REQUEST_CODEC.unpack(want) == tuple(fields.values())


@given(u32, i32, u32, u32, u64)
def test_response_codec_packs_as_the_layout(magic, status, result_len, request_id, ts):
    fields = dict(magic=magic, status=status, result_len=result_len, request_id=request_id,
                  ptp_timestamp=ts)
    want = RPCResponse.const(fields).as_bits().to_bytes(HEADER_BYTES, "little")
    assert RESPONSE_CODEC.pack(*fields.values()) == want
    assert RESPONSE_CODEC.unpack(want) == tuple(fields.values())


@given(u32, u32, u64, st.binary(max_size=64), i32)
def test_request_and_response_round_trip(function_id, request_id, ts, payload, status):
    assert Request.unpack(Request(function_id, request_id, ts, payload).pack()) == \
        Request(function_id, request_id, ts, payload)
    assert Response.unpack(Response(status, request_id, ts, payload).pack()) == \
        Response(status, request_id, ts, payload)


def test_struct_codec_refuses_fields_struct_cannot_hold():
    class Odd(data.Struct):
        flag: unsigned(1)
        rest: unsigned(31)

    with pytest.raises(ValueError, match="'flag'"):
        struct_codec(Odd)

    class Signed(data.Struct):
        a: signed(16)
        b: unsigned(8)
        c: unsigned(8)

    assert struct_codec(Signed).format == "<hBB"
