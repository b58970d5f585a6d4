"""CALLs in the QSC's UDP transport: openqlink.udpcall.UDPCallPort, and the QSC set up with it
against the software QSC peer (tests/host/conftest.py)."""

from types import SimpleNamespace

import pytest

from openqlink.dispatch import Dispatcher, FunctionTable, SlotRing
from openqlink.errors import FieldRangeError
from openqlink.memory_map import MAILBOX_BYTES, QSCParams, qp_reg
from openqlink.qsc import DEFAULT_HOST_CALL_PORT, QSC
from openqlink.udpcall import UDPCallPort
from openqlink.wire.ipv4 import ip_to_int
from openqlink.wire.packet import build_roce_frame, build_udp_frame, parse_frame
from openqlink.wire.roce import Opcode
from openqlink.wire.rpc import HEADER_BYTES, PayloadType, Request, Response, fnv1a32
from openqlink.wire.udp import UDP_CALL_PORT_BASE, udp_checksum, udp_checksum_ok

HOST_MAC, HOST_IP, HOST_PORT = "02:00:00:00:00:0a", "192.168.0.1", 0xC200
QSC_MAC, QSC_IP = "02:00:00:00:00:02", "192.168.0.2"


class Ring(SlotRing):
    def __init__(self, num_slots=4, slot_size=64):
        super().__init__(num_slots, slot_size)
        self.published: list[tuple[int, int]] = []

    def publish(self, slot: int, length: int) -> None:
        super().publish(slot, length)
        self.published.append((slot, length))


def request(request_id: int, args: bytes = b"\x01\x02\x03\x04") -> bytes:
    return Request(function_id=0xABCD, request_id=request_id, ptp_timestamp=5,
                   payload=args).pack()


def frame(payload: bytes, **kw) -> bytes:
    fields = dict(dst_mac=HOST_MAC, src_mac=QSC_MAC, src_ip=QSC_IP, dst_ip=HOST_IP,
                  src_port=UDP_CALL_PORT_BASE + 1, dst_port=HOST_PORT, payload=payload)
    fields.update(kw)
    return build_udp_frame(**fields)


def with_checksum(f: bytes, good: bool = True) -> bytes:
    """``f`` with its UDP checksum computed (then broken unless ``good``)."""
    udp_len = int.from_bytes(f[38:40], "big")
    datagram = bytearray(f[34:34 + udp_len])
    datagram[6:8] = b"\0\0"
    c = udp_checksum(ip_to_int(QSC_IP), ip_to_int(HOST_IP), datagram)
    c = c if good else c ^ 0x0100
    return f[:40] + c.to_bytes(2, "big") + f[42:]


@pytest.fixture
def port():
    ring = Ring()
    return UDPCallPort(HOST_MAC, HOST_IP, HOST_PORT, QSC_MAC, QSC_IP, UDP_CALL_PORT_BASE + 1,
                       ring), ring


def test_requests_go_into_the_ring_in_arrival_order(port):
    p, ring = port
    for k in range(3):
        got = p.handle_frame(with_checksum(frame(request(k))) if k == 1 else frame(request(k)))
        assert got.accepted and got.slot == k and got.length_bytes == len(request(k))
    assert ring.published == [(k, len(request(k))) for k in range(3)]
    assert Request.unpack(ring.take(1)).request_id == 1
    assert p.counters["RX_PUBLISHED"] == 3 and p.next_slot == 3


# (what, frame, reason)
BAD = [
    ("another destination MAC", frame(request(1), dst_mac="02:00:00:00:00:99"), "DROP_ETH"),
    ("not IPv4", frame(request(1))[:12] + b"\x86\xdd" + frame(request(1))[14:], "DROP_ETH"),
    ("IPv4 checksum", frame(request(1))[:24] + b"\0\0" + frame(request(1))[26:], "DROP_IP"),
    ("another destination IP", frame(request(1), dst_ip="192.168.0.9"), "DROP_IP"),
    ("another destination port", frame(request(1), dst_port=HOST_PORT + 1), "DROP_UDP"),
    ("UDP checksum", with_checksum(frame(request(1)), good=False), "DROP_UDP"),
    ("another source MAC", frame(request(1), src_mac="02:00:00:00:00:77"), "DROP_PEER"),
    ("another source IP", frame(request(1), src_ip="192.168.0.7"), "DROP_PEER"),
    ("another source port (QP 0's)", frame(request(1), src_port=UDP_CALL_PORT_BASE),
     "DROP_PEER"),
    ("shorter than an RPC header", frame(request(1)[:HEADER_BYTES - 1]), "DROP_LENGTH"),
    ("longer than a slot", frame(request(1, bytes(64 - HEADER_BYTES + 1))), "DROP_LENGTH"),
    ("a RoCE packet", build_roce_frame(dst_mac=HOST_MAC, src_mac=QSC_MAC, src_ip=QSC_IP,
                                       dst_ip=HOST_IP, opcode=Opcode.SEND_ONLY, dest_qp=1,
                                       psn=0, payload=request(1)), "DROP_UDP"),
    ("truncated", frame(request(1))[:30], "DROP_IP"),
]


@pytest.mark.parametrize("what,bad,reason", BAD, ids=[b[0] for b in BAD])
def test_a_bad_frame_is_dropped_counted_and_writes_nothing(port, what, bad, reason):
    p, ring = port
    before = bytes(ring.memory)
    got = p.handle_frame(bad)
    assert not got.accepted and got.reason == reason
    assert p.counters[reason] == 1 and p.counters["RX_PUBLISHED"] == 0
    assert bytes(ring.memory) == before and ring.published == [] and p.next_slot == 0


def test_a_full_slot_takes_nothing_until_the_dispatcher_frees_it(port):
    p, ring = port
    for k in range(4):
        assert p.handle_frame(frame(request(k))).accepted
    before = bytes(ring.memory)
    got = p.handle_frame(frame(request(9)))
    assert got.reason == "DROP_OVERFLOW" and bytes(ring.memory) == before
    ring.clear(0)
    got = p.handle_frame(frame(request(9)))
    assert got.accepted and got.slot == 0 and Request.unpack(ring.take(0)).request_id == 9


def test_the_response_is_one_datagram_to_the_qps_port_with_both_checksums(port):
    p, _ = port
    resp = Response(status=0, request_id=3, ptp_timestamp=5, result=b"\x2a\0\0\0").pack()
    f = p.response_frame(resp)
    parsed = parse_frame(f)       # raises on a bad IPv4 checksum or lengths
    assert parsed.eth["dst"] == int.from_bytes(bytes.fromhex("020000000002"), "big")
    assert (parsed.ip["src"], parsed.ip["dst"]) == (ip_to_int(HOST_IP), ip_to_int(QSC_IP))
    assert (parsed.udp["src_port"], parsed.udp["dst_port"]) == (HOST_PORT,
                                                                UDP_CALL_PORT_BASE + 1)
    assert parsed.payload == resp and parsed.udp["checksum"] != 0
    assert udp_checksum_ok(parsed.ip["src"], parsed.ip["dst"],
                           f[34:34 + parsed.udp["length"]])
    assert p.counters["TX_FRAMES"] == 1


def test_bad_ports_and_a_slot_too_small_are_refused():
    with pytest.raises(FieldRangeError, match="local_port"):
        UDPCallPort(HOST_MAC, HOST_IP, 0, QSC_MAC, QSC_IP, 1, Ring())
    small = SimpleNamespace(num_slots=4, slot_size=16, memory=bytearray(64))
    with pytest.raises(FieldRangeError, match="slot_size"):
        UDPCallPort(HOST_MAC, HOST_IP, 1, QSC_MAC, QSC_IP, 1, small)


# --- the QSC with its CALLs over UDP ------------------------------------------------------------

@pytest.fixture
def udp_qsc(virtual_qsc):
    link, peer = virtual_qsc(QSCParams(num_ppus=2))
    qsc = QSC(link, host_mac=HOST_MAC, host_ip=HOST_IP, timeout_s=0.05)
    qsc.connect()
    return qsc, peer


def test_configure_sets_the_udp_transport_and_the_call_is_answered_by_datagram(udp_qsc):
    qsc, peer = udp_qsc
    ring = Ring(num_slots=4, slot_size=256)
    qsc.configure(1, ring, call_transport="udp")
    assert peer.regs[qp_reg(1, "TRANSPORT")] == 1
    assert peer.regs[qp_reg(1, "PEER_UDP_PORT")] == DEFAULT_HOST_CALL_PORT + 1
    table = FunctionTable()

    @table.host_call("add", args=(PayloadType.INT32, PayloadType.INT32),
                     results=(PayloadType.INT32,))
    def add(a, b):
        return a + b

    sent: list[tuple[int, bytes]] = []

    def send_response(slot: int, data: bytes) -> None:
        sent.append((slot, data))
        qsc.send_response(1, slot, data)

    d = Dispatcher(table, ring, send_response)
    req = Request(function_id=fnv1a32("add"), request_id=11, ptp_timestamp=7,
                  payload=(40).to_bytes(4, "little") + (2).to_bytes(4, "little")).pack()
    peer.t.send_frame(peer.udp_request_frame(1, req))
    assert qsc.poll_rx() == 1 and qsc.rx_counts["udp_call"] == 1
    assert d.poll() == 1          # the virtual link runs the peer as the frame is sent
    (ppu, got), = peer.mailbox
    resp = Response.unpack(got)
    assert ppu == 1 and resp.status == 0 and resp.request_id == 11
    assert int.from_bytes(resp.result, "little", signed=True) == 42
    assert peer.udp_drops == [] and len(got) <= MAILBOX_BYTES
    # the QP's RoCE path carried nothing but the configuration's writes
    assert all(r.opcode != Opcode.SEND_ONLY for r in peer.rdma)


def test_a_roce_configure_clears_the_udp_transport(udp_qsc):
    qsc, peer = udp_qsc
    qsc.configure(0, Ring(slot_size=256), call_transport="udp")
    assert peer.regs[qp_reg(0, "TRANSPORT")] == 1
    qsc.configure(0, Ring(slot_size=256))
    assert peer.regs[qp_reg(0, "TRANSPORT")] == 0
    req = request(4)
    peer.t.send_frame(peer.udp_request_frame(0, req))      # the old port is gone
    qsc.poll_rx()
    assert qsc.rx_counts["udp_call"] == 0 and qsc.rx_counts["other"] == 1


def test_udp_calls_need_a_ring_and_a_known_transport(udp_qsc):
    qsc, _ = udp_qsc
    with pytest.raises(FieldRangeError, match="ring"):
        qsc.configure(0, None, call_transport="udp")
    with pytest.raises(FieldRangeError, match="call_transport"):
        qsc.configure(0, Ring(), call_transport="tcp")
    with pytest.raises(FieldRangeError, match="host_call_port"):
        qsc.configure(0, Ring(), call_transport="udp", host_call_port=70000)
