"""openqlink.roce.UCQueuePair: UC send, receive into a slot ring, drops by reason, PSN rules."""

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openqlink.dispatch import SlotRing
from openqlink.errors import DispatchError, FieldRangeError
from openqlink.roce import PSN_MODULUS, RX_COUNTER_NAMES, SlotRingLike, UCQueuePair, pkey_matches
from openqlink.wire.ipv4 import ones_complement_sum
from openqlink.wire.packet import build_roce_frame, build_udp_frame, parse_frame
from openqlink.wire.roce import Opcode, slot_immediate

HOST_MAC, HOST_IP, HOST_QPN = "02:00:00:00:00:0a", "192.168.0.1", 0x200
QSC_MAC, QSC_IP, QSC_QPN = "02:4e:56:51:00:02", "192.168.0.2", 0x100
RKEY = 0x5249_0000


class Ring(SlotRing):
    """The dispatcher's SlotRing, recording what was published (a consumer takes a request
    with ``take_all``)."""

    def __init__(self, num_slots=4, slot_size=256):
        super().__init__(num_slots, slot_size)
        self.published: list[tuple[int, int]] = []

    def publish(self, slot: int, length: int) -> None:
        super().publish(slot, length)
        self.published.append((slot, length))

    def slot(self, i: int, n: int) -> bytes:
        return bytes(self.memory[i * self.slot_size:i * self.slot_size + n])

    def take_all(self) -> None:
        """The dispatcher took every published request: their slots are free again."""
        while (s := self.oldest()) is not None:
            self.clear(s)


def make(pmtu=1024, ring=None, **kw):
    qsc = UCQueuePair(QSC_MAC, QSC_IP, QSC_QPN, HOST_MAC, HOST_IP, HOST_QPN, pmtu_bytes=pmtu,
                      **kw)
    host = UCQueuePair(HOST_MAC, HOST_IP, HOST_QPN, QSC_MAC, QSC_IP, QSC_QPN, pmtu_bytes=pmtu)
    ring = ring or Ring()
    host.register_ring(ring, RKEY)
    return qsc, host, ring


def test_the_dispatchers_ring_is_what_the_qp_needs():
    """SlotRing has every member the QP uses (ready included: the QP writes no byte into a
    slot whose request is not taken yet); a ring without ``ready`` is not a SlotRingLike."""
    assert isinstance(SlotRing(4, 64), SlotRingLike)

    class NoReady:
        num_slots, slot_size, memory = 1, 64, bytearray(64)

        def publish(self, slot, length):
            pass

    assert not isinstance(NoReady(), SlotRingLike)


def test_write_with_immediate_lands_in_its_slot_and_is_published():
    qsc, host, ring = make()
    req = b"CUQR" + bytes(range(40))
    frame = qsc.write_frame(2 * 256, RKEY, req, imm=slot_immediate(0, 2))
    r = host.handle_frame(frame)
    assert r.accepted and r.reason == "RX_ROCE_ACCEPTED" and (r.slot, r.length_bytes) == (2, 44)
    assert ring.published == [(2, 44)] and ring.slot(2, 44) == req
    assert host.counters["RX_ROCE_ACCEPTED"] == 1 and host.counters["RX_PUBLISHED"] == 1
    assert not r.psn_gap and host.rx_epsn == 1
    # a frame in a bytearray or memoryview is taken as well
    r2 = host.handle_frame(memoryview(bytearray(qsc.write_frame(0, RKEY, b"abcd",
                                                                imm=1 << 12))))
    assert r2.slot == 0 and ring.slot(0, 4) == b"abcd"
    # a plain RDMA WRITE writes without publishing
    host.handle_frame(qsc.write_frame(3 * 256 + 8, RKEY, b"zz"))
    assert ring.slot(3, 10)[8:] == b"zz" and len(ring.published) == 2


def _good(qsc, **kw):
    args = dict(dst_mac=HOST_MAC, src_mac=QSC_MAC, src_ip=QSC_IP, dst_ip=HOST_IP,
                opcode=Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE, dest_qp=HOST_QPN, psn=0,
                va=256, r_key=RKEY, imm=1, payload=b"q" * 32)
    args.update(kw)
    return build_roce_frame(**args)


def _bad_icrc(qsc):
    f = bytearray(_good(qsc))
    f[14 + 20 + 8 + 12 + 16 + 4] ^= 1
    return bytes(f)


def _bad_ip_checksum(qsc):
    f = bytearray(_good(qsc))
    f[14 + 10] ^= 0xFF
    return bytes(f)


BAD = {
    "wrong dst mac": (lambda q: _good(q, dst_mac="02:00:00:00:00:0b"), "DROP_ETH"),
    "truncated ethernet": (lambda q: _good(q)[:10], "DROP_ETH"),
    "truncated ipv4": (lambda q: _good(q)[:30], "DROP_IP"),
    "truncated bth": (lambda q: _good(q)[:14 + 20 + 8 + 6], "DROP_IP"),
    "not ipv4": (lambda q: bytes(12) + b"\x08\x06" + bytes(46), "DROP_ETH"),
    "wrong dst ip": (lambda q: _good(q, dst_ip="192.168.0.9"), "DROP_IP"),
    "ip checksum": (_bad_ip_checksum, "DROP_IP"),
    "wrong udp port": (lambda q: build_udp_frame(dst_mac=HOST_MAC, src_mac=QSC_MAC,
                                                 src_ip=QSC_IP, dst_ip=HOST_IP, src_port=1,
                                                 dst_port=4792, payload=bytes(40)), "DROP_UDP"),
    "icrc": (_bad_icrc, "DROP_ICRC"),
    "send opcode": (lambda q: _good(q, opcode=Opcode.SEND_ONLY, va=None, r_key=None, imm=None),
                    "DROP_OPCODE"),
    "rc opcode": (lambda q: _good(q, opcode=0x0B), "DROP_OPCODE"),
    "p_key": (lambda q: _good(q, p_key=0x8001), "DROP_PKEY"),
    "dest qp": (lambda q: _good(q, dest_qp=HOST_QPN + 1), "DROP_QPN"),
    "r_key": (lambda q: _good(q, r_key=RKEY + 1), "DROP_RKEY"),
    "va past ring": (lambda q: _good(q, va=8 * 256 - 16, imm=7), "DROP_VA"),
    "va below ring": (lambda q: _good(q, va=(1 << 64) - 8, imm=0), "DROP_VA"),
    "va not slot start": (lambda q: _good(q, va=256 + 4), "DROP_VA"),
    "va of another slot": (lambda q: _good(q, imm=2), "DROP_VA"),
    "slot past ring": (lambda q: _good(q, va=0, imm=8), "DROP_VA"),
    "longer than slot": (lambda q: _good(q, va=0, imm=0, payload=b"q" * 300,
                                         dma_len=300), "DROP_VA"),
    "dma_len mismatch": (lambda q: _good(q, dma_len=31), "DROP_LENGTH"),
    "payload over pmtu": (lambda q: _good(q, opcode=Opcode.RDMA_WRITE_ONLY, imm=None, va=0,
                                          payload=bytes(1028)), "DROP_LENGTH"),
    "middle without first": (lambda q: _good(q, opcode=Opcode.RDMA_WRITE_MIDDLE, va=None,
                                              r_key=None, imm=None, payload=bytes(1024)),
                             "DROP_PSN"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_packets_write_nothing_and_count_one_reason(case):
    make_frame, reason = BAD[case]
    qsc, host, ring = make(ring=Ring(num_slots=8, slot_size=256))
    before = bytes(ring.memory)
    r = host.handle_frame(make_frame(qsc))
    assert not r.accepted and r.reason == reason
    assert bytes(ring.memory) == before and ring.published == []
    counted = {k: v for k, v in host.counters.items() if v}
    assert counted == {"RX_FRAMES": 1, reason: 1}


def test_pkey_membership_rules():
    assert pkey_matches(0xFFFF, 0xFFFF) and pkey_matches(0x7FFF, 0xFFFF)
    assert not pkey_matches(0x7FFF, 0x7FFF)      # two limited members never match
    assert not pkey_matches(0x8001, 0xFFFF)
    qsc, host, ring = make()
    assert host.handle_frame(_good(qsc, p_key=0x7FFF)).accepted


def test_multi_packet_message_commits_only_at_last():
    qsc, host, ring = make(pmtu=256, ring=Ring(num_slots=2, slot_size=1024))
    data = bytes(i % 251 for i in range(600))
    frames = qsc.write_frames(1024, RKEY, data, imm=slot_immediate(0, 1))
    ops = [parse_frame(f).bth["opcode"] for f in frames]
    assert ops == [Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_MIDDLE,
                   Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE]
    for f in frames[:-1]:
        assert host.handle_frame(f).accepted
        assert not any(ring.memory) and ring.published == []
    r = host.handle_frame(frames[-1])
    assert (r.slot, r.length_bytes) == (1, 600) and ring.slot(1, 600) == data
    plain = qsc.write_frames(0, RKEY, data)
    assert parse_frame(plain[-1]).bth["opcode"] == Opcode.RDMA_WRITE_LAST
    assert all(host.handle_frame(f).accepted for f in plain) and ring.slot(0, 600) == data
    assert len(ring.published) == 1


def test_lost_middle_abandons_the_message_until_the_next_first():
    qsc, host, ring = make(pmtu=256, ring=Ring(num_slots=2, slot_size=1024))
    first, _middle, last = qsc.write_frames(0, RKEY, bytes(600), imm=0)
    assert host.handle_frame(first).accepted
    r = host.handle_frame(last)           # PSN 2 while 1 is expected
    assert r.reason == "DROP_PSN" and ring.published == []
    # a retransmitted-looking MIDDLE is still refused: the message was abandoned
    again = build_roce_frame(dst_mac=HOST_MAC, src_mac=QSC_MAC, src_ip=QSC_IP, dst_ip=HOST_IP,
                             opcode=Opcode.RDMA_WRITE_MIDDLE, dest_qp=HOST_QPN, psn=3,
                             payload=bytes(256))
    assert host.handle_frame(again).reason == "DROP_PSN"
    # the next ONLY (PSN 3, after two lost) is accepted and its PSN jump counted
    r = host.handle_frame(qsc.write_frame(0, RKEY, b"ok", imm=0))
    assert r.accepted and r.psn_gap and host.counters["PSN_GAP"] == 1
    assert ring.published == [(0, 2)]


def test_new_first_abandons_an_open_message_and_length_rules():
    qsc, host, ring = make(pmtu=256, ring=Ring(num_slots=2, slot_size=1024))
    a = qsc.write_frames(0, RKEY, b"a" * 600, imm=0)
    b = qsc.write_frames(1024, RKEY, b"b" * 300, imm=1)
    host.handle_frame(a[0])
    host.handle_frame(b[0])                # FIRST of b: a is abandoned
    assert host.handle_frame(a[1]).reason == "DROP_PSN"
    # b's LAST now comes with an unexpected PSN too: the PSN stream went on past a[1]
    assert host.handle_frame(b[1]).reason == "DROP_PSN"
    assert ring.published == [] and not any(ring.memory)
    # FIRST shorter than the PMTU, and a LAST that overshoots DMALen
    short_first = build_roce_frame(dst_mac=HOST_MAC, src_mac=QSC_MAC, src_ip=QSC_IP,
                                   dst_ip=HOST_IP, opcode=Opcode.RDMA_WRITE_FIRST,
                                   dest_qp=HOST_QPN, psn=10, va=0, r_key=RKEY, dma_len=600,
                                   payload=bytes(100))
    assert host.handle_frame(short_first).reason == "DROP_LENGTH"
    first = build_roce_frame(dst_mac=HOST_MAC, src_mac=QSC_MAC, src_ip=QSC_IP, dst_ip=HOST_IP,
                             opcode=Opcode.RDMA_WRITE_FIRST, dest_qp=HOST_QPN, psn=20, va=0,
                             r_key=RKEY, dma_len=300, payload=bytes(256))
    assert host.handle_frame(first).accepted
    long_last = build_roce_frame(dst_mac=HOST_MAC, src_mac=QSC_MAC, src_ip=QSC_IP,
                                 dst_ip=HOST_IP, opcode=Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE,
                                 dest_qp=HOST_QPN, psn=21, imm=0, payload=bytes(60))
    assert host.handle_frame(long_last).reason == "DROP_LENGTH"
    assert ring.published == []


def test_psn_wraps_on_send_and_receive():
    qsc, host, ring = make(pmtu=256, ring=Ring(num_slots=1, slot_size=1024),
                           tx_psn=PSN_MODULUS - 2)
    frames = qsc.write_frames(0, RKEY, bytes(range(256)) * 3, imm=slot_immediate(0, 0))
    assert [parse_frame(f).bth["psn"] for f in frames] == [PSN_MODULUS - 2, PSN_MODULUS - 1, 0]
    assert qsc.tx_psn == 1
    results = [host.handle_frame(f) for f in frames]
    assert all(r.accepted for r in results) and ring.published == [(0, 768)]
    assert host.rx_epsn == 1


def test_send_and_write_limits():
    qsc, host, _ = make()
    f = parse_frame(qsc.send_frame(b"CUQS" + bytes(20)))
    assert f.bth["opcode"] == Opcode.SEND_ONLY and f.bth["dest_qp"] == HOST_QPN
    assert f.payload == b"CUQS" + bytes(20) and f.icrc_ok
    assert f.eth["src"] == int(QSC_MAC.replace(":", ""), 16) and f.udp["src_port"] == 0xC000
    with pytest.raises(FieldRangeError) as e:
        qsc.write_frame(0, RKEY, bytes(1025))
    assert (e.value.header, e.value.field) == ("RETH", "dma_len")
    with pytest.raises(FieldRangeError) as e:
        qsc.send_frame(bytes(1025))
    assert e.value.field == "payload"
    assert qsc.counters["TX_FRAMES"] == 1 and qsc.tx_psn == 1
    with pytest.raises(ValueError, match="pmtu_bytes"):
        UCQueuePair(HOST_MAC, HOST_IP, 1, QSC_MAC, QSC_IP, 2, pmtu_bytes=1000)
    with pytest.raises(FieldRangeError) as e:
        UCQueuePair(HOST_MAC, HOST_IP, 1 << 24, QSC_MAC, QSC_IP, 2)
    assert e.value.field == "qpn"


def test_register_ring_checks_geometry_and_frames_without_ring_are_dropped():
    qsc = UCQueuePair(QSC_MAC, QSC_IP, QSC_QPN, HOST_MAC, HOST_IP, HOST_QPN)
    host = UCQueuePair(HOST_MAC, HOST_IP, HOST_QPN, QSC_MAC, QSC_IP, QSC_QPN)
    assert host.handle_frame(qsc.write_frame(0, RKEY, b"x", imm=0)).reason == "DROP_RKEY"
    bad = Ring()
    bad.memory = bytearray(10)
    with pytest.raises(ValueError, match="writable buffer of 1024 bytes"):
        host.register_ring(bad, RKEY)
    ro = Ring()
    ro.memory = bytes(1024)
    with pytest.raises(ValueError, match="read-only"):
        host.register_ring(ro, RKEY)
    with pytest.raises(ValueError, match="num_slots"):
        host.register_ring(SimpleNamespace(num_slots=4097, slot_size=1,
                                           memory=bytearray(4097)), RKEY)
    # a ring whose memory is a memoryview of a larger buffer, at a non-zero VA
    ring = Ring(num_slots=2, slot_size=64)
    backing = bytearray(256)
    ring.memory = memoryview(backing)[64:192]
    host.register_ring(ring, RKEY, va=0x1000)
    assert host.handle_frame(qsc.write_frame(0x1040, RKEY, b"hi", imm=1)).slot == 1
    assert backing[128:130] == b"hi"
    assert set(host.counters) == set(RX_COUNTER_NAMES)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 200), st.integers(0, 255)),
                max_size=6), st.binary(min_size=0, max_size=80), st.integers(0, 3))
def test_mutated_frames_never_raise_and_publish_only_good_requests(flips, data, slot):
    qsc, host, ring = make()
    frame = bytearray(qsc.write_frame(slot * 256, RKEY, data, imm=slot))
    for _, pos, val in flips:
        frame[pos % len(frame)] ^= val
    r = host.handle_frame(bytes(frame))
    if r.accepted:
        # only an intact (or ICRC-invisible) packet may be published, with its exact data
        assert ring.published and ring.slot(ring.published[0][0], ring.published[0][1]) == \
            parse_frame(bytes(frame)).payload
    else:
        assert ring.published == []


# --- faults of the receive and send paths, each with the test that found it -------------------


def test_a_zero_length_write_with_immediate_into_the_ring_is_dropped_not_raised():
    """IBTA C9-88 leaves a zero-length WRITE's VA and R_Key unchecked; it carries no request,
    so nothing is published (publishing 0 bytes used to raise out of handle_frame)."""
    qsc, host, ring = make()
    r = host.handle_frame(qsc.write_frame(256, RKEY, b"", imm=slot_immediate(0, 1)))
    assert (r.accepted, r.reason) == (False, "DROP_LENGTH")
    assert ring.published == [] and not any(ring.memory)
    # the QP goes on: the next request lands
    assert host.handle_frame(qsc.write_frame(256, RKEY, b"CUQR", imm=1)).slot == 1


@pytest.mark.parametrize("imm", [1, None], ids=["with_immediate", "plain_write"])
def test_a_slot_still_holding_a_request_is_not_overwritten(imm):
    qsc, host, ring = make()
    assert host.handle_frame(qsc.write_frame(256, RKEY, b"first", imm=1)).slot == 1
    va = 256 if imm is not None else 256 + 2   # a request, or a plain write into the slot
    r = host.handle_frame(qsc.write_frame(va, RKEY, b"second", imm=imm))
    assert (r.accepted, r.reason) == (False, "DROP_OVERFLOW")
    assert ring.slot(1, 8) == b"first\0\0\0" and ring.published == [(1, 5)]
    # once the dispatcher has taken it, the slot takes the next request
    ring.take_all()
    assert host.handle_frame(qsc.write_frame(256, RKEY, b"second", imm=imm)).accepted
    assert ring.slot(1, 6) == b"second"


def test_a_multi_packet_message_into_a_busy_slot_writes_nothing():
    qsc, host, ring = make(pmtu=256, ring=Ring(num_slots=2, slot_size=1024))
    assert host.handle_frame(qsc.write_frame(1024, RKEY, b"pending", imm=1)).slot == 1
    frames = qsc.write_frames(1024, RKEY, bytes(range(200)) * 3, imm=1)
    results = [host.handle_frame(f) for f in frames]
    assert [r.reason for r in results] == ["RX_ROCE_ACCEPTED"] * 2 + ["DROP_OVERFLOW"]
    assert ring.slot(1, 8) == b"pending\0" and ring.published == [(1, 7)]
    assert host.counters["DROP_OVERFLOW"] == 1


@pytest.mark.parametrize("who", ["mac", "ip"])
def test_packets_from_anyone_but_the_peer_are_dropped(who):
    qsc, host, ring = make()
    other = {"mac": {"src_mac": "02:00:00:00:00:66"}, "ip": {"src_ip": "192.168.0.66"}}[who]
    r = host.handle_frame(_good(qsc, **other))
    assert (r.accepted, r.reason) == (False, "DROP_PEER")
    assert ring.published == [] and not any(ring.memory)


def test_tver_other_than_zero_is_dropped():
    qsc, host, ring = make()
    r = host.handle_frame(_good(qsc, tver=1))
    assert (r.reason, ring.published) == ("DROP_OPCODE", [])


def _with_udp_checksum(frame: bytes, fix: int = 0) -> bytes:
    """``frame`` with its UDP checksum computed (RFC 768), plus ``fix`` (0: right)."""
    f = bytearray(frame)
    udp_len = int.from_bytes(f[38:40], "big")
    pseudo = f[26:34] + bytes([0, 17]) + f[38:40]
    f[40:42] = b"\0\0"
    total = ones_complement_sum(bytes(pseudo) + bytes(f[34:34 + udp_len]))
    f[40:42] = (((~total & 0xFFFF) or 0xFFFF) ^ fix).to_bytes(2, "big")
    # the ICRC masks the UDP checksum: it stays right
    return bytes(f)


def test_a_nonzero_udp_checksum_must_verify():
    qsc, host, ring = make()
    bad = host.handle_frame(_with_udp_checksum(_good(qsc), fix=0x0100))
    assert (bad.accepted, bad.reason) == (False, "DROP_UDP") and ring.published == []
    good = host.handle_frame(_with_udp_checksum(_good(qsc)))
    assert good.accepted and ring.published == [(1, 32)]


def test_messages_sent_from_two_threads_keep_their_psns_consecutive(monkeypatch):
    """A multi-packet message takes all its PSNs at once: another message sent while it is
    being built (here: from inside the build of its first packet, standing for a thread
    switch) comes after it, never between its packets."""
    qsc, _host, _ring = make(pmtu=256)
    real = UCQueuePair._frame
    inner: list[bytes] = []

    def frame(self, opcode, psn, payload, ext=b""):
        if not inner and opcode == Opcode.RDMA_WRITE_FIRST:
            inner.extend(qsc.send_frames(bytes(600)))      # the other thread's message
        return real(self, opcode, psn, payload, ext)

    monkeypatch.setattr(UCQueuePair, "_frame", frame)
    outer = qsc.write_frames(0, RKEY, bytes(600), imm=0)
    psns = [parse_frame(f).bth["psn"] for f in outer]
    assert psns == [0, 1, 2]
    assert [parse_frame(f).bth["psn"] for f in inner] == [3, 4, 5]


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=1100), st.integers(0, PSN_MODULUS - 1), st.integers(0, (1 << 32) - 1),
       st.sampled_from(["send", "write", "write_imm"]))
def test_frames_from_the_template_equal_the_general_builder(payload, psn, imm, kind):
    """The per-packet template path builds byte for byte what build_roce_frame builds."""
    qsc, _host, _ring = make(pmtu=4096, tx_psn=psn)
    common = dict(dst_mac=HOST_MAC, src_mac=QSC_MAC, src_ip=QSC_IP, dst_ip=HOST_IP,
                  dest_qp=HOST_QPN, psn=psn, payload=payload)
    if kind == "send":
        got, want = qsc.send_frame(payload), build_roce_frame(opcode=Opcode.SEND_ONLY, **common)
    else:
        i = imm if kind == "write_imm" else None
        got = qsc.write_frame(0x1000, RKEY, payload, imm=i)
        op = Opcode.RDMA_WRITE_ONLY if i is None else Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE
        want = build_roce_frame(opcode=op, va=0x1000, r_key=RKEY, imm=i, **common)
    assert got == want


@pytest.mark.parametrize("send", [
    lambda qp: qp.send_frame(b"r"),
    lambda qp: qp.send_frames(bytes(3000)),
    lambda qp: qp.write_frame(0, RKEY, b"w"),
    lambda qp: qp.write_frames(0, RKEY, bytes(3000), imm=1),
], ids=["send_frame", "send_frames", "write_frame", "write_frames"])
def test_a_qp_whose_psns_are_lent_sends_nothing_until_they_come_back(send):
    """While another sender (the GPU RoCE endpoint) holds the QP's PSNs, a host send would
    reuse one of them: it raises naming the holder, and the QP continues from the PSNs given
    back."""
    _, host, _ = make()
    host.tx_psn, host.rx_epsn = 7, 3
    assert host.lend_psns("the GPU RoCE endpoint") == (7, 3)
    assert host.psns_held_by == "the GPU RoCE endpoint"
    with pytest.raises(DispatchError, match="held by the GPU RoCE endpoint"):
        send(host)
    assert host.counters["TX_FRAMES"] == 0 and host.tx_psn == 7
    with pytest.raises(DispatchError, match="held by the GPU RoCE endpoint"):
        host.lend_psns("another holder")
    host.take_back_psns(PSN_MODULUS + 12, 5)     # 24 bits each
    assert (host.tx_psn, host.rx_epsn, host.psns_held_by) == (12, 5, None)
    assert parse_frame(host.send_frame(b"r")).bth["psn"] == 12
