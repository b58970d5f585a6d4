"""openqlink.wire.packet against scapy (an independent encoder, ICRC included) and bad input."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.compat import raw
from scapy.contrib.roce import BTH as ScapyBTH
from scapy.fields import IntField, XIntField, XLongField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw

from openqlink.errors import FieldRangeError, TruncatedError, WireFormatError
from openqlink.wire.control import CONTROL_REQUEST, CONTROL_RESPONSE, Command
from openqlink.wire.ethernet import int_to_mac
from openqlink.wire.ipv4 import int_to_ip
from openqlink.wire.packet import build_roce_frame, build_udp_frame, parse_frame
from openqlink.wire.roce import Opcode


class ScapyRETH(Packet):
    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("r_key", 0), IntField("dma_len", 0)]


class ScapyImmDt(Packet):
    name = "ImmDt"
    fields_desc = [XIntField("imm", 0)]


MAC_A, MAC_B = "02:00:00:00:00:0a", "02:4e:56:51:00:02"
IP_A, IP_B = "192.168.0.1", "192.168.0.2"


def pad60(b: bytes) -> bytes:
    return b + bytes(max(0, 60 - len(b)))


def scapy_roce(*, dst_mac, src_mac, src_ip, dst_ip, src_port, opcode, dest_qp, psn, p_key,
               va=None, r_key=None, dma_len=None, imm=None, payload=b"", se=0, ack_req=0,
               ttl=64, tos=0, identification=0) -> bytes:
    pad = (-len(payload)) % 4
    pkt = (Ether(dst=dst_mac, src=src_mac)
           / IP(src=src_ip, dst=dst_ip, ttl=ttl, tos=tos, id=identification, flags="DF")
           / UDP(sport=src_port, dport=4791, chksum=0)
           / ScapyBTH(opcode=int(opcode), solicited=se, padcount=pad, pkey=p_key, dqpn=dest_qp,
                      ackreq=ack_req, psn=psn))
    if va is not None:
        pkt = pkt / ScapyRETH(va=va, r_key=r_key,
                              dma_len=len(payload) if dma_len is None else dma_len)
    if imm is not None:
        pkt = pkt / ScapyImmDt(imm=imm)
    pkt = pkt / Raw(payload + bytes(pad))
    return pad60(raw(pkt))


macs = st.integers(0, (1 << 48) - 1).map(int_to_mac)
ips = st.integers(0, (1 << 32) - 1).map(int_to_ip)


@st.composite
def roce_args(draw):
    op = draw(st.sampled_from(list(Opcode)))
    args = dict(
        dst_mac=draw(macs), src_mac=draw(macs), src_ip=draw(ips), dst_ip=draw(ips),
        src_port=draw(st.integers(1, 0xFFFF)), opcode=op,
        dest_qp=draw(st.integers(0, (1 << 24) - 1)), psn=draw(st.integers(0, (1 << 24) - 1)),
        p_key=draw(st.integers(0, 0xFFFF)), payload=draw(st.binary(max_size=300)),
        se=draw(st.integers(0, 1)), ack_req=draw(st.integers(0, 1)),
        ttl=draw(st.integers(0, 255)), tos=draw(st.integers(0, 255)),
        identification=draw(st.integers(0, 0xFFFF)),
    )
    if op.has_reth:
        args["va"] = draw(st.integers(0, (1 << 64) - 1))
        args["r_key"] = draw(st.integers(0, (1 << 32) - 1))
        if draw(st.booleans()):
            args["dma_len"] = draw(st.integers(0, (1 << 32) - 1))
    if op.has_immdt:
        args["imm"] = draw(st.integers(0, (1 << 32) - 1))
    return args


@settings(max_examples=150, deadline=None)
@given(roce_args())
def test_roce_frame_matches_scapy(args):
    ours = build_roce_frame(**args)
    assert ours == scapy_roce(**args)
    f = parse_frame(ours)
    assert f.icrc_ok and f.ip_checksum_ok and f.is_roce
    assert f.payload == args["payload"]
    assert f.bth["opcode"] == args["opcode"]
    assert f.bth["dest_qp"] == args["dest_qp"] and f.bth["psn"] == args["psn"]
    assert f.bth["p_key"] == args["p_key"] and f.bth["pad_cnt"] == (-len(args["payload"])) % 4
    op = args["opcode"]
    if op.has_reth:
        assert f.reth == {"va": args["va"], "r_key": args["r_key"],
                          "dma_len": args.get("dma_len", len(args["payload"]))}
    else:
        assert f.reth is None
    assert f.immdt == ({"imm": args["imm"]} if op.has_immdt else None)
    # scapy dissects our frame the same way and recomputes the same ICRC
    unpadded = ours[:14 + f.ip["total_length"]]   # scapy's ICRC would cover Ethernet padding
    sp = Ether(unpadded)
    bth = sp[ScapyBTH]
    assert bth.dqpn == args["dest_qp"] and bth.psn == args["psn"]
    assert bth.icrc.to_bytes(4, "big") == f.icrc   # FCSField reads the wire bytes as "!I"
    bth.icrc = None   # scapy recomputes the ICRC from the fields it dissected
    assert raw(sp) == unpadded


@settings(max_examples=60, deadline=None)
@given(roce_args(), st.data())
def test_any_corrupted_byte_fails_the_icrc(args, data):
    frame = bytearray(build_roce_frame(**args))
    f = parse_frame(bytes(frame))
    end = 14 + f.ip["total_length"]
    # bytes the ICRC covers: the IPv4 header except TOS, TTL and checksum, UDP except checksum,
    # BTH except byte 4, and the rest through the pad
    masked = {14 + 1, 14 + 8, 14 + 10, 14 + 11, 14 + 26, 14 + 27, 14 + 32}
    # total_length/UDP length changes are structural: keep them so the frame still parses
    structural = {14 + 0, 14 + 2, 14 + 3, 14 + 9, 14 + 22, 14 + 23, 14 + 24, 14 + 25}
    covered = [i for i in range(14, end - 4) if i not in masked | structural]
    i = data.draw(st.sampled_from(covered))
    frame[i] ^= data.draw(st.integers(1, 255))
    try:
        g = parse_frame(bytes(frame))
    except WireFormatError:
        return  # e.g. the flipped bits made pad_cnt or the opcode inconsistent
    assert g.icrc_ok is False


@settings(max_examples=50, deadline=None)
@given(macs, macs, ips, ips, st.integers(1, 0xFFFF), st.integers(1, 0xFFFF),
       st.binary(max_size=200))
def test_udp_frame_matches_scapy(dst_mac, src_mac, src_ip, dst_ip, sport, dport, payload):
    if dport == 4791:
        dport = 4790
    ours = build_udp_frame(dst_mac=dst_mac, src_mac=src_mac, src_ip=src_ip, dst_ip=dst_ip,
                           src_port=sport, dst_port=dport, payload=payload)
    ref = (Ether(dst=dst_mac, src=src_mac) / IP(src=src_ip, dst=dst_ip, id=0, flags="DF")
           / UDP(sport=sport, dport=dport, chksum=0) / Raw(payload))
    assert ours == pad60(raw(ref))
    assert len(ours) >= 60
    control = 8192 in (dport, sport) and len(payload) > 0
    needed = (CONTROL_RESPONSE if control and payload[0] & 0x80 else CONTROL_REQUEST).length_bytes
    if control and len(payload) < needed:
        # Port 8192 carries control messages: a shorter payload is a truncated one.
        with pytest.raises(TruncatedError):
            parse_frame(ours)
        return
    f = parse_frame(ours)
    assert f.ip_checksum_ok and f.udp["dst_port"] == dport
    if not control:
        assert f.payload == payload and f.control is None


def test_short_frames_are_padded_to_60():
    f = build_roce_frame(dst_mac=MAC_A, src_mac=MAC_B, src_ip=IP_B, dst_ip=IP_A,
                         opcode=Opcode.SEND_ONLY, dest_qp=1, psn=0)
    assert len(f) == 60 and f[-2:] == b"\0\0"
    p = parse_frame(f)
    assert p.payload == b"" and p.icrc_ok


def test_control_request_and_response_are_decoded():
    req = CONTROL_REQUEST.pack(cmd=Command.RD_DWORD, flags=3, seq=7, addr=0x1000_0004, data=0)
    f = parse_frame(build_udp_frame(dst_mac=MAC_B, src_mac=MAC_A, src_ip=IP_A, dst_ip=IP_B,
                                    src_port=0xC100, dst_port=8192, payload=req))
    assert f.is_control and not f.is_control_response
    assert f.control["cmd"] == Command.RD_DWORD and f.control["seq"] == 7
    assert f.control["addr"] == 0x1000_0004
    resp = CONTROL_RESPONSE.pack(cmd=0x94, seq=7, status=0, addr=4, value=0xDEADBEEF,
                                 latched_seq=7)
    g = parse_frame(build_udp_frame(dst_mac=MAC_A, src_mac=MAC_B, src_ip=IP_B, dst_ip=IP_A,
                                    src_port=8192, dst_port=0xC100, payload=resp))
    assert g.is_control_response and g.control["value"] == 0xDEADBEEF


def test_non_ipv4_and_non_udp_frames_parse_without_upper_headers():
    arp = bytes.fromhex("ffffffffffff020000000001" "0806") + bytes(46)
    f = parse_frame(arp)
    assert f.ip is None and f.eth["ethertype"] == 0x0806 and len(f.payload) == 46
    icmp = bytearray(build_udp_frame(dst_mac=MAC_A, src_mac=MAC_B, src_ip=IP_B, dst_ip=IP_A,
                                     src_port=1, dst_port=2, payload=b"abcd"))
    icmp[14 + 9] = 1   # protocol ICMP (checksum now wrong: reported, not raised)
    g = parse_frame(bytes(icmp))
    assert g.udp is None and g.ip_checksum_ok is False and g.payload[8:12] == b"abcd"


def _roce(**kw):
    args = dict(dst_mac=MAC_A, src_mac=MAC_B, src_ip=IP_B, dst_ip=IP_A,
                opcode=Opcode.RDMA_WRITE_ONLY, dest_qp=1, psn=0, va=0, r_key=1,
                payload=b"x" * 40)
    args.update(kw)
    return build_roce_frame(**args)


@pytest.mark.parametrize(("mutate", "exc", "header", "field"), [
    (lambda b: b[:10], TruncatedError, "Ethernet", "dst"),
    (lambda b: b[:14 + 12], TruncatedError, "IPv4", "version"),
    (lambda b: b[:14 + 20 + 30], TruncatedError, "IPv4", "total_length"),
    (lambda b: b[:14] + bytes([0x46]) + b[15:], WireFormatError, "IPv4", "ihl"),
    (lambda b: b[:14] + bytes([0x65]) + b[15:], WireFormatError, "IPv4", "version"),
    (lambda b: b[:14 + 6] + b"\x20\x00" + b[14 + 8:], WireFormatError, "IPv4", "flags"),
    (lambda b: b[:14 + 24] + b"\x00\x04" + b[14 + 26:], WireFormatError, "UDP", "length"),
    (lambda b: b[:14 + 24] + b"\x10\x00" + b[14 + 26:], TruncatedError, "UDP", "length"),
])
def test_malformed_frames_raise_naming_the_field(mutate, exc, header, field):
    with pytest.raises(exc) as e:
        parse_frame(mutate(_roce()))
    assert (e.value.header, e.value.field) == (header, field)


def test_roce_structure_errors():
    # WRITE_ONLY whose UDP payload ends inside the RETH
    f = bytearray(build_udp_frame(dst_mac=MAC_A, src_mac=MAC_B, src_ip=IP_B, dst_ip=IP_A,
                                  src_port=1, dst_port=4791,
                                  payload=bytes([0x2A]) + bytes(11) + bytes(10)))
    with pytest.raises(TruncatedError) as e:
        parse_frame(bytes(f))
    assert (e.value.header, e.value.field) == ("RETH", "va")
    # fewer bytes than BTH + ICRC
    g = build_udp_frame(dst_mac=MAC_A, src_mac=MAC_B, src_ip=IP_B, dst_ip=IP_A, src_port=1,
                        dst_port=4791, payload=bytes([0x24]) + bytes(13))
    with pytest.raises(TruncatedError) as e:
        parse_frame(g)
    assert e.value.header == "ICRC"
    # pad count larger than the payload
    h = build_roce_frame(dst_mac=MAC_A, src_mac=MAC_B, src_ip=IP_B, dst_ip=IP_A,
                         opcode=Opcode.SEND_ONLY, dest_qp=1, psn=0, payload=b"ab")
    bad = bytearray(h)
    bad[14 + 28 + 1] |= 0x30     # pad_cnt = 3, the payload plus pad is 4 bytes: fine
    parse_frame(bytes(bad))
    h0 = build_roce_frame(dst_mac=MAC_A, src_mac=MAC_B, src_ip=IP_B, dst_ip=IP_A,
                          opcode=Opcode.SEND_ONLY, dest_qp=1, psn=0)
    bad0 = bytearray(h0)
    bad0[14 + 28 + 1] |= 0x30    # pad_cnt = 3 with no payload at all
    with pytest.raises(WireFormatError) as e:
        parse_frame(bytes(bad0))
    assert (e.value.header, e.value.field) == ("BTH", "pad_cnt")


def test_builder_checks_extension_headers_and_ranges():
    with pytest.raises(WireFormatError) as e:
        _roce(va=None, r_key=None)
    assert e.value.header == "RETH"
    with pytest.raises(WireFormatError) as e:
        _roce(opcode=Opcode.SEND_ONLY)
    assert (e.value.header, e.value.field) == ("RETH", "va")
    with pytest.raises(WireFormatError) as e:
        _roce(imm=5)
    assert e.value.header == "ImmDt"
    with pytest.raises(WireFormatError) as e:
        _roce(opcode=Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE)
    assert (e.value.header, e.value.field) == ("ImmDt", "imm")
    with pytest.raises(FieldRangeError) as e:
        _roce(dest_qp=1 << 24)
    assert (e.value.header, e.value.field) == ("BTH", "dest_qp")
    with pytest.raises(FieldRangeError) as e:
        _roce(r_key=1 << 32)
    assert (e.value.header, e.value.field) == ("RETH", "r_key")
    with pytest.raises(WireFormatError) as e:
        _roce(payload=bytes(70000))
    assert (e.value.header, e.value.field) == ("IPv4", "total_length")
    # a non-UC opcode (RC SEND_ONLY) is built with what is given and parsed as BTH + payload
    rc = _roce(opcode=0x04, va=None, r_key=None, payload=b"hello")
    p = parse_frame(rc)
    assert p.bth["opcode"] == 0x04 and p.reth is None and p.payload == b"hello" and p.icrc_ok
