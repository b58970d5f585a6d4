"""openqlink.wire.header: the one place of network byte order, on the host and in gateware."""

from __future__ import annotations

import struct

import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st

from openqlink.errors import FieldRangeError, TruncatedError
from openqlink.wire.control import CONTROL_REQUEST
from openqlink.wire.ethernet import ETHERNET
from openqlink.wire.ipv4 import IPV4
from openqlink.wire.packet import (
    IMMDT_CODEC,
    RETH_CODEC,
    ROCE_HEADER_FIELDS,
    ROCE_HEADERS,
    ROCE_HEADERS_BYTES,
)
from openqlink.wire.roce import BTH, IMMDT, RETH
from openqlink.wire.udp import UDP


def test_pack_is_network_byte_order():
    assert UDP.pack(src_port=0x1234, dst_port=4791, length=8, checksum=0) == \
        struct.pack(">HHHH", 0x1234, 4791, 8, 0)
    assert RETH.pack(va=0x0102030405060708, r_key=0xAABBCCDD, dma_len=25) == \
        struct.pack(">QII", 0x0102030405060708, 0xAABBCCDD, 25)


def test_bth_bit_fields_sit_where_ibta_draws_them():
    raw = BTH.pack(opcode=0x2B, se=1, m=0, pad_cnt=3, tver=0, p_key=0xFFFF, fecn=1, becn=0,
                   dest_qp=0x000123, a=1, psn=0xABCDEF)
    assert raw[0] == 0x2B
    assert raw[1] == 0b1_0_11_0000          # SE, M, PadCnt, TVer
    assert raw[2:4] == b"\xff\xff"
    assert raw[4] == 0b1000_0000            # FECN, BECN, resv6
    assert raw[5:8] == b"\x00\x01\x23"
    assert raw[8] == 0x80                   # A, resv7
    assert raw[9:12] == b"\xab\xcd\xef"
    assert BTH.unpack(raw)["psn"] == 0xABCDEF


def test_defaults_apply_when_fields_are_left_out():
    assert IPV4.unpack(IPV4.pack())["version"] == 4
    assert IPV4.unpack(IPV4.pack())["ihl"] == 5
    assert BTH.unpack(BTH.pack())["p_key"] == 0xFFFF


def test_out_of_range_value_names_the_field():
    with pytest.raises(FieldRangeError) as info:
        BTH.pack(psn=1 << 24)
    assert info.value.header == "BTH" and info.value.field == "psn"
    with pytest.raises(KeyError):
        BTH.pack(qpn=1)


def test_truncated_buffer_raises():
    with pytest.raises(TruncatedError) as info:
        RETH.unpack(b"\0" * 15)
    assert info.value.header == "RETH"


def test_widths_must_make_whole_bytes():
    from openqlink.wire.header import Header

    with pytest.raises(ValueError, match="not whole bytes"):
        Header("Bad", [("a", 3)], ref="-")


def _field_values(header):
    return st.fixed_dictionaries({f.name: st.integers(0, (1 << f.width) - 1)
                                  for f in header.fields})


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([BTH, RETH, IPV4, CONTROL_REQUEST]).flatmap(
    lambda h: st.tuples(st.just(h), _field_values(h))))
def test_gateware_view_and_build_agree_with_pack(case):
    """Header.view() parses and Header.build() builds the same bytes pack() does, in Amaranth."""
    header, values = case
    raw = header.pack(**values)
    m = Module()
    flat_in = Signal(8 * header.length_bytes)
    view = header.view(flat_in)
    field_sigs = {name: Signal(header.field_width(name), name=f"f_{name}") for name in values}
    m.d.comb += [field_sigs[name].eq(view[name]) for name in values]
    built = Signal(8 * header.length_bytes)
    m.d.comb += built.eq(header.build(**field_sigs))

    sim = Simulator(m)

    async def bench(ctx):
        ctx.set(flat_in, int.from_bytes(raw, "little"))   # lane order: byte 0 in bits [7:0]
        for name, value in values.items():
            assert ctx.get(field_sigs[name]) == value, name
        assert ctx.get(built).to_bytes(header.length_bytes, "little") == raw

    sim.add_testbench(bench)
    sim.run()


@given(st.binary(min_size=54, max_size=54))
def test_roce_headers_struct_agrees_with_the_header_definitions(raw):
    """The per-packet struct of Ethernet+IPv4+UDP+BTH reads every field as the Headers do."""
    headers, at = {}, 0
    for h in (ETHERNET, IPV4, UDP, BTH):
        headers[h.name] = h.unpack(raw, at)
        at += h.length_bytes
    assert at == ROCE_HEADERS_BYTES
    items = ROCE_HEADERS.unpack(raw)
    want = {(n, f): v for n, fields in headers.items() for f, v in fields.items()}
    assert set(ROCE_HEADER_FIELDS) == set(want)
    for key, (index, shift, width) in ROCE_HEADER_FIELDS.items():
        item = items[index]
        value = int.from_bytes(item, "big") if isinstance(item, bytes) else item
        assert (value >> shift) & ((1 << width) - 1) == want[key], key
    assert RETH_CODEC.unpack(raw[:16]) == tuple(RETH.unpack(raw).values())
    assert IMMDT_CODEC.unpack(raw[:4]) == tuple(IMMDT.unpack(raw).values())
