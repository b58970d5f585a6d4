"""The reference model of the receive rules (openqlink.sim.rx_model) on its own, with hand-built
UC messages: FIRST/MIDDLE/LAST sequences of RDMA WRITEs and SENDs, their PSN, length and VA
rules, the instruction ring's TAIL, zero-length WRITEs (IBTA C9-88) and the PMTU; several QPs
(an extra QP reaching another PPU, each QP's own keys, peer, PSN and message) and the QP
counters.

# Ref: IBTA Vol 1 Release 1.4 9.2 (UC opcodes), 9.3.2 (RETH), 9.3.4 (ImmDt), 9.4.3 (RDMA WRITE),
# 9.8.3 (UC receive), C9-88; rdma-core rxe ``check_psn`` (UC).
"""

from __future__ import annotations

import pytest

from openqlink.memory_map import (
    MAILBOX_BYTES,
    MAILBOX_OFFSET,
    QP_COUNTERS,
    QSCParams,
    ppu_base,
    ppu_reg,
    regions,
)
from openqlink.roce import UCQueuePair
from openqlink.sim.rx_model import (
    ACCEPTED,
    DROP_REASONS,
    Message,
    RxConfig,
    RxModel,
    Verdict,
    Write,
    pmtu_bytes,
    roce_icrc,
)
from openqlink.wire.packet import build_roce_frame
from openqlink.wire.roce import Opcode

PARAMS = QSCParams()
HOST_MAC = 0x02_00_00_00_00_65
HOST_IP = "192.168.0.101"
QPN = PARAMS.qpn_base
KEYS = {"IMEM_RKEY": (0x1111_0001, True), "ENV_RKEY": (0x2222_0002, True),
        "REGS_RKEY": (0x3333_0003, True)}
REGION = {r.name: r for r in regions(PARAMS, 0)}
IMEM, ENV = REGION["IMEM"], REGION["ENV"]
MAILBOX = ppu_base(0) + MAILBOX_OFFSET
TAIL = ppu_reg(0, "TAIL")
PMTU = 256


def model(*, pmtu: int = PMTU, response_bytes: int = 64) -> RxModel:
    return RxModel(RxConfig(params=PARAMS, host_mac=HOST_MAC,
                            host_ip=int.from_bytes(bytes(map(int, HOST_IP.split("."))), "big"),
                            rx_enable=True, rkeys=[dict(KEYS)], pmtu=[pmtu],
                            response_bytes=[response_bytes]))


def qp(*, pmtu: int = PMTU, psn: int = 0) -> UCQueuePair:
    """The host's QP, sending to PPU 0's."""
    return UCQueuePair(HOST_MAC, HOST_IP, 0x11, PARAMS.mac, PARAMS.ip, QPN, pmtu_bytes=pmtu,
                       tx_psn=psn)


def frame(opcode: Opcode, psn: int, payload: bytes = b"", **ext: int | None) -> bytes:
    """One UC packet of the host's QP to PPU 0's, any opcode, any PSN."""
    return build_roce_frame(dst_mac=PARAMS.mac, src_mac=HOST_MAC, src_ip=HOST_IP,
                            dst_ip=PARAMS.ip, opcode=opcode, dest_qp=QPN, psn=psn,
                            payload=payload, **ext)


def receive_all(m: RxModel, frames: list[bytes]) -> list[Verdict]:
    return [m.receive(f) for f in frames]


def test_drop_psn_ranks_after_drop_peer():
    """DROP_PSN sits in the documented order after PEER, before the length checks."""
    assert DROP_REASONS.index("DROP_PSN") == DROP_REASONS.index("DROP_PEER") + 1
    assert DROP_REASONS.index("DROP_PSN") < DROP_REASONS.index("DROP_LENGTH")


@pytest.mark.parametrize("register,expected", [
    (1, 256), (2, 512), (3, 1024), (4, 2048), (5, 4096), (0, 256), (6, 256), (7, 256)])
def test_pmtu_register_decode(register, expected):
    assert pmtu_bytes(register) == expected


def test_pmtu_default_is_the_register_reset_value():
    assert RxConfig(params=QSCParams(num_ppus=2)).pmtu == [1024] * 4          # four QPs
    assert RxConfig(params=QSCParams(num_ppus=2, num_qps=6)).pmtu == [1024] * 6


def test_three_packet_write_lands_at_consecutive_addresses():
    m = model()
    data = bytes(range(256)) * 2 + bytes(188)
    va = ENV.va + 64
    frames = qp(psn=7).write_frames(va, KEYS["ENV_RKEY"][0], data)
    assert [f[42] for f in frames] == [Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_MIDDLE,
                                       Opcode.RDMA_WRITE_LAST]
    first = m.receive(frames[0])
    assert first.outcome == ACCEPTED and first.psn_gap          # 7, 0 expected: a gap, kept
    assert first.writes == (Write(va, data[:256]),)
    assert m.messages[0] == Message("write", False, va + 256, len(data) - 256)
    assert m.epsn[0] == 8
    middle = m.receive(frames[1])
    assert middle.outcome == ACCEPTED and not middle.psn_gap
    assert middle.writes == (Write(va + 256, data[256:512]),)
    assert m.messages[0] == Message("write", False, va + 512, 188)
    last = m.receive(frames[2])
    assert last.outcome == ACCEPTED
    assert last.writes == (Write(va + 512, data[512:]),)
    assert last.tail is None and last.mailbox_commit is None and not last.rpc_response
    assert m.messages[0] is None and m.epsn[0] == 10


def test_middle_with_a_wrong_psn_closes_the_message():
    """A MIDDLE whose PSN is not the expected one: DROP_PSN, the message closed, the expected
    PSN unchanged; the LAST after it (no message open) DROP_PSN too, even at the expected PSN."""
    m = model()
    data = bytes(3 * PMTU)
    frames = qp().write_frames(ENV.va, KEYS["ENV_RKEY"][0], data)
    assert m.receive(frames[0]).outcome == ACCEPTED
    skipped = frame(Opcode.RDMA_WRITE_MIDDLE, 2, bytes(PMTU))
    v = m.receive(skipped)
    assert v.outcome == "DROP_PSN" and v.of_qp and v.writes == ()
    assert m.messages[0] is None and m.epsn[0] == 1
    assert m.receive(frames[2]).outcome == "DROP_PSN"                 # PSN 2
    assert m.receive(frame(Opcode.RDMA_WRITE_LAST, 1, bytes(PMTU))).outcome == "DROP_PSN"
    # a MIDDLE with no message open at all
    assert model().receive(frame(Opcode.RDMA_WRITE_MIDDLE, 0, bytes(PMTU))).outcome == "DROP_PSN"


def test_continuation_of_the_other_kind_is_a_psn_drop():
    m = model(response_bytes=1024)
    assert m.receive(frame(Opcode.SEND_FIRST, 0, bytes(PMTU))).outcome == ACCEPTED
    assert m.receive(frame(Opcode.RDMA_WRITE_LAST, 1, bytes(4))).outcome == "DROP_PSN"
    assert m.messages[0] is None


def test_last_with_the_wrong_length():
    """A WRITE LAST must carry exactly the DMALen left: fewer or more bytes, DROP_LENGTH, and
    the message closes (a correct LAST after it finds none)."""
    for short in (True, False):
        m = model()
        frames = qp().write_frames(ENV.va, KEYS["ENV_RKEY"][0], bytes(PMTU + 100))
        assert m.receive(frames[0]).outcome == ACCEPTED
        wrong = frame(Opcode.RDMA_WRITE_LAST, 1, bytes(96 if short else 104))
        v = m.receive(wrong)
        assert v.outcome == "DROP_LENGTH" and v.writes == ()
        assert m.messages[0] is None and m.epsn[0] == 1
        assert m.receive(frames[1]).outcome == "DROP_PSN"


def test_middle_and_last_payload_rules():
    m = model()
    frames = qp().write_frames(ENV.va, KEYS["ENV_RKEY"][0], bytes(2 * PMTU + 8))
    m.receive(frames[0])
    # a MIDDLE shorter than the PMTU
    assert m.receive(frame(Opcode.RDMA_WRITE_MIDDLE, 1, bytes(PMTU - 4))).outcome == "DROP_LENGTH"
    m = model()
    m.receive(frames[0])
    # a MIDDLE that would take every byte left (only a LAST may end the message)
    m.receive(frames[1])
    assert m.receive(frame(Opcode.RDMA_WRITE_MIDDLE, 2, bytes(PMTU))).outcome == "DROP_LENGTH"
    # an empty LAST
    m = model()
    m.receive(qp().write_frames(ENV.va, KEYS["ENV_RKEY"][0], bytes(PMTU + 4))[0])
    m.messages[0] = Message("write", False, ENV.va + PMTU, 0)
    assert m.receive(frame(Opcode.RDMA_WRITE_LAST, 1)).outcome == "DROP_LENGTH"


def test_first_must_carry_the_pmtu_and_less_than_its_dmalen():
    m = model()
    short = frame(Opcode.RDMA_WRITE_FIRST, 0, bytes(PMTU - 4), va=ENV.va,
                  r_key=KEYS["ENV_RKEY"][0], dma_len=2 * PMTU)
    assert m.receive(short).outcome == "DROP_LENGTH"
    whole = frame(Opcode.RDMA_WRITE_FIRST, 0, bytes(PMTU), va=ENV.va,
                  r_key=KEYS["ENV_RKEY"][0], dma_len=PMTU)
    assert m.receive(whole).outcome == "DROP_LENGTH"
    assert m.messages[0] is None


def test_first_whose_dmalen_leaves_the_region():
    """The range check of a FIRST covers the whole message (its DMALen)."""
    m = model()
    va = ENV.va + ENV.length_bytes - 2 * PMTU
    frames = qp().write_frames(va, KEYS["ENV_RKEY"][0], bytes(2 * PMTU + 4))
    v = m.receive(frames[0])
    assert v.outcome == "DROP_VA" and v.writes == ()
    assert m.messages[0] is None and m.epsn[0] == 0
    assert [m.receive(f).outcome for f in frames[1:]] == ["DROP_PSN", "DROP_PSN"]
    # the same message 4 bytes lower fits
    fits = qp().write_frames(va - 4, KEYS["ENV_RKEY"][0], bytes(2 * PMTU + 4))
    assert [model().receive(f).outcome for f in fits[:1]] == [ACCEPTED]


def test_first_interrupting_an_open_message():
    """A FIRST while a message is open abandons it (its bytes stay written); the new message
    continues, the old one's packets are PSN drops."""
    m = model()
    host = qp()
    a = host.write_frames(ENV.va, KEYS["ENV_RKEY"][0], bytes([1]) * (3 * PMTU))
    b = host.write_frames(ENV.va + 4096, KEYS["ENV_RKEY"][0], bytes([2]) * (2 * PMTU))
    assert m.receive(a[0]).outcome == ACCEPTED                       # PSN 0
    v = m.receive(b[0])                                               # PSN 3: a gap, kept
    assert v.outcome == ACCEPTED and v.psn_gap and v.writes == (Write(ENV.va + 4096,
                                                                      bytes([2]) * PMTU),)
    assert m.messages[0] == Message("write", False, ENV.va + 4096 + PMTU, PMTU)
    assert m.receive(a[1]).outcome == "DROP_PSN"                      # PSN 1: closes b's
    assert m.receive(b[1]).outcome == "DROP_PSN"
    # an ONLY interrupts the same way
    m = model()
    m.receive(a[0])
    only = frame(Opcode.RDMA_WRITE_ONLY, 1, bytes(8), va=ENV.va, r_key=KEYS["ENV_RKEY"][0])
    assert m.receive(only).outcome == ACCEPTED and m.messages[0] is None
    assert m.receive(frame(Opcode.RDMA_WRITE_MIDDLE, 2, bytes(PMTU))).outcome == "DROP_PSN"


def test_send_first_middle_last_into_the_mailbox():
    """SEND FIRST writes its first MAILBOX_BYTES to the mailbox, MIDDLE nothing, LAST commits
    MAILBOX_BYTES; RX_RPC_RESPONSES once, at the end."""
    m = model(response_bytes=700)
    payload = bytes(range(256)) * 2 + bytes(range(100))
    ops = [Opcode.SEND_FIRST, Opcode.SEND_MIDDLE, Opcode.SEND_LAST]
    chunks = [payload[:256], payload[256:512], payload[512:]]
    v = [m.receive(frame(op, psn, c)) for psn, (op, c) in enumerate(zip(ops, chunks, strict=True))]
    assert [x.outcome for x in v] == [ACCEPTED] * 3
    assert v[0].writes == (Write(MAILBOX, payload[:MAILBOX_BYTES]),)
    assert v[0].mailbox_commit is None and not v[0].rpc_response
    assert v[1].writes == () and v[1].mailbox_commit is None and not v[1].rpc_response
    assert v[2].writes == () and v[2].mailbox_commit == (MAILBOX, MAILBOX_BYTES)
    assert v[2].rpc_response and v[2].kind == "send"
    assert m.messages[0] is None and m.epsn[0] == 3


def test_send_message_limited_by_response_bytes():
    # LAST past RESPONSE_BYTES: DROP_LENGTH; with immediate the same rules
    m = model(response_bytes=300)
    assert m.receive(frame(Opcode.SEND_FIRST, 0, bytes(PMTU))).outcome == ACCEPTED
    assert m.messages[0] == Message("send", False, 0, 300 - PMTU)
    assert m.receive(frame(Opcode.SEND_LAST_WITH_IMMEDIATE, 1, bytes(48),
                           imm=5)).outcome == "DROP_LENGTH"
    m = model(response_bytes=300)
    m.receive(frame(Opcode.SEND_FIRST, 0, bytes(PMTU)))
    v = m.receive(frame(Opcode.SEND_LAST_WITH_IMMEDIATE, 1, bytes(44), imm=5))
    assert v.outcome == ACCEPTED and v.mailbox_commit == (MAILBOX, MAILBOX_BYTES)
    assert v.tail is None
    # a FIRST must leave room for a LAST
    assert model(response_bytes=PMTU).receive(
        frame(Opcode.SEND_FIRST, 0, bytes(PMTU))).outcome == "DROP_LENGTH"


def test_send_only_with_immediate():
    m = model()
    v = m.receive(frame(Opcode.SEND_ONLY_WITH_IMMEDIATE, 0, bytes(range(24)), imm=9))
    assert v.outcome == ACCEPTED and v.rpc_response
    assert v.writes == (Write(MAILBOX, bytes(range(24))),)
    assert v.mailbox_commit == (MAILBOX, 24)


def test_write_last_with_immediate_into_imem_gives_a_tail():
    m = model()
    frames = qp().write_frames(IMEM.va, KEYS["IMEM_RKEY"][0], bytes(PMTU + 32), imm=17)
    assert frames[-1][42] == Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE
    first, last = receive_all(m, frames)
    assert first.tail is None and m.messages[0] is None
    assert last.outcome == ACCEPTED and last.tail == (TAIL, 17)
    assert last.writes == (Write(IMEM.va + PMTU, bytes(32)),)
    # into another region ImmDt is not delivered
    m = model()
    v = receive_all(m, qp().write_frames(ENV.va, KEYS["ENV_RKEY"][0], bytes(PMTU + 32),
                                         imm=PARAMS.imem_depth + 5))
    assert [x.outcome for x in v] == [ACCEPTED] * 2 and v[1].tail is None


def test_immdt_past_the_ring_is_dropped():
    m = model()
    frames = qp().write_frames(IMEM.va, KEYS["IMEM_RKEY"][0], bytes(PMTU + 32),
                               imm=PARAMS.imem_depth)
    first, last = receive_all(m, frames)
    assert first.outcome == ACCEPTED
    assert last.outcome == "DROP_IMMDT" and last.writes == () and last.tail is None
    assert m.messages[0] is None and m.epsn[0] == 1
    # IMMDT ranks before the payload length: a LAST_WITH_IMMEDIATE of the wrong length too
    m = model()
    m.receive(frames[0])
    wrong = frame(Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE, 1, bytes(4), imm=PARAMS.imem_depth)
    assert m.receive(wrong).outcome == "DROP_IMMDT"
    # and an ONLY
    only = frame(Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE, 0, bytes(8), va=IMEM.va,
                 r_key=KEYS["IMEM_RKEY"][0], imm=0xFFFF_FFFF)
    assert model().receive(only).outcome == "DROP_IMMDT"


def test_zero_length_write_checks_no_va_or_rkey():
    """IBTA C9-88: a zero-length RDMA WRITE is taken whatever its VA and R_Key; nothing is
    written, no TAIL (no region is known), the expected PSN moves."""
    m = model()
    for psn, (op, va, imm) in enumerate([
            (Opcode.RDMA_WRITE_ONLY, ENV.va, None),
            (Opcode.RDMA_WRITE_ONLY, 0xDEAD_BEEF_0000_0003, None),
            (Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE, IMEM.va, 3),
            (Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE, IMEM.va, 0xFFFF_FFFF)]):
        v = m.receive(frame(op, psn, b"", va=va, r_key=0xBAD0_BAD0, imm=imm))
        assert v.outcome == ACCEPTED, (op, va)
        assert v.writes == () and v.tail is None and v.mailbox_commit is None
        assert m.epsn[0] == psn + 1
    # DMALen 0 with a payload: the length check still applies
    assert m.receive(frame(Opcode.RDMA_WRITE_ONLY, 9, bytes(4), va=0, r_key=0,
                           dma_len=0)).outcome == "DROP_LENGTH"
    # a DMALen with no payload is checked as any other WRITE
    assert m.receive(frame(Opcode.RDMA_WRITE_ONLY, 10, b"", va=ENV.va, r_key=0xBAD0_BAD0,
                           dma_len=4)).outcome == "DROP_RKEY"
    # a zero-length FIRST: nothing to check the VA of, but no message either
    assert m.receive(frame(Opcode.RDMA_WRITE_FIRST, 11, bytes(PMTU), va=0, r_key=0,
                           dma_len=0)).outcome == "DROP_LENGTH"


def test_only_longer_than_the_pmtu():
    for op, ext in [(Opcode.RDMA_WRITE_ONLY, dict(va=ENV.va, r_key=KEYS["ENV_RKEY"][0])),
                    (Opcode.SEND_ONLY, {})]:
        m = model(response_bytes=1000)
        assert m.receive(frame(op, 0, bytes(PMTU), **ext)).outcome == ACCEPTED
        assert m.receive(frame(op, 1, bytes(PMTU + 4), **ext)).outcome == "DROP_LENGTH"
        assert m.epsn[0] == 1
    # the default PMTU, 1024
    m = RxModel(RxConfig(params=PARAMS, host_mac=HOST_MAC, host_ip=model().config.host_ip,
                         rx_enable=True, rkeys=[dict(KEYS)]))
    ext = dict(va=ENV.va, r_key=KEYS["ENV_RKEY"][0])
    assert m.receive(frame(Opcode.RDMA_WRITE_ONLY, 0, bytes(1024), **ext)).outcome == ACCEPTED
    assert m.receive(frame(Opcode.RDMA_WRITE_ONLY, 1, bytes(1028), **ext)).outcome == (
        "DROP_LENGTH")


def test_psn_wraps_inside_a_message():
    m = model()
    frames = qp(psn=0xFFFFFF).write_frames(ENV.va, KEYS["ENV_RKEY"][0], bytes(PMTU + 4))
    assert [m.receive(f).outcome for f in frames] == [ACCEPTED, ACCEPTED]
    assert m.epsn[0] == 1


def test_drops_before_the_qp_leave_the_message_open():
    """Only packets of the QP (past PEER) close its message: a bad ICRC, another QPN or another
    peer do not."""
    m = model()
    frames = qp().write_frames(ENV.va, KEYS["ENV_RKEY"][0], bytes(PMTU + 8))
    m.receive(frames[0])
    bad_icrc = bytearray(frames[1])
    bad_icrc[-5] ^= 1
    other_peer = build_roce_frame(dst_mac=PARAMS.mac, src_mac=HOST_MAC + 1, src_ip=HOST_IP,
                                  dst_ip=PARAMS.ip, opcode=Opcode.RDMA_WRITE_LAST, dest_qp=QPN,
                                  psn=1, payload=bytes(8))
    other_qpn = build_roce_frame(dst_mac=PARAMS.mac, src_mac=HOST_MAC, src_ip=HOST_IP,
                                 dst_ip=PARAMS.ip, opcode=Opcode.RDMA_WRITE_LAST,
                                 dest_qp=QPN + PARAMS.num_qps, psn=1, payload=bytes(8))
    assert [m.receive(bytes(f)).outcome for f in (bad_icrc, other_peer, other_qpn)] == [
        "DROP_ICRC", "DROP_PEER", "DROP_QPN"]
    assert m.receive(frames[1]).outcome == ACCEPTED


def test_overflow_and_restart_close_the_message():
    m = model()
    frames = qp().write_frames(ENV.va, KEYS["ENV_RKEY"][0], bytes(2 * PMTU + 8))
    m.receive(frames[0])
    v = m.judge(frames[1])
    assert v.outcome == ACCEPTED
    m.apply_dropped(v)                    # the receiver counted DROP_OVERFLOW
    assert m.messages[0] is None and m.epsn[0] == 1
    assert m.receive(frames[1]).outcome == "DROP_PSN"
    m = model()
    m.receive(frames[0])
    m.restart_qp(0)
    assert m.messages[0] is None and m.epsn[0] == 0


def test_a_frame_longer_than_the_buffer_closes_the_message():
    """A packet the rules take but whose frame is longer than the whole receive buffer: dropped
    for overflow, a packet of the QP all the same (its open message closes)."""
    config = model(pmtu=4096).config
    config.buffer_bytes = 4096
    m = RxModel(config)
    m.messages[0] = Message("write", False, ENV.va, 8)
    big = frame(Opcode.RDMA_WRITE_ONLY, 5, bytes(4096), va=ENV.va, r_key=KEYS["ENV_RKEY"][0])
    v = m.receive(big)
    assert v.outcome == "DROP_OVERFLOW" and v.of_qp
    assert m.messages[0] is None and m.epsn[0] == 0


# ---- several QPs -----------------------------------------------------------------------------

PARAMS2 = QSCParams(num_ppus=2)                   # four QPs: 0 and 1 the PPUs' own, 2 and 3 extra
OTHER_MAC = 0x02_00_00_00_00_66
OTHER_IP = "192.168.0.102"


def ip_int(ip: str) -> int:
    return int.from_bytes(bytes(map(int, ip.split("."))), "big")


def qp_keys(q: int, names=("IMEM_RKEY", "ENV_RKEY", "REGS_RKEY")) -> dict:
    """QP ``q``'s own keys of the regions ``names`` (its map)."""
    return {name: (0x5100_0000 | q << 8 | k, True) for k, name in enumerate(names)}


def qps_model(params: QSCParams = PARAMS2, **kw) -> RxModel:
    kw.setdefault("rkeys", [qp_keys(q) for q in range(params.num_qps)])
    return RxModel(RxConfig(params=params, host_mac=HOST_MAC, host_ip=ip_int(HOST_IP),
                            rx_enable=True, **kw))


def to_qp(q: int, opcode: Opcode, psn: int, payload: bytes = b"", *,
          params: QSCParams = PARAMS2, src=(HOST_MAC, HOST_IP), **ext) -> bytes:
    """A UC packet to QP ``q`` (DestQP ``qpn_base + q``) from ``src`` (MAC, IP)."""
    return build_roce_frame(dst_mac=params.mac, src_mac=src[0], src_ip=src[1],
                            dst_ip=params.ip, opcode=opcode, dest_qp=params.qpn_base + q,
                            psn=psn, payload=payload, **ext)


def region(params: QSCParams, ppu: int, name: str):
    return next(r for r in regions(params, ppu) if r.name == name)


def test_qp_lists_are_sized_by_the_qps_and_ppus_default_to_own_or_zero():
    c = RxConfig(params=QSCParams(num_ppus=2, num_qps=5))
    assert c.qp_ppus == [0, 1, 0, 0, 0]
    assert c.qsc_qpns == [c.params.qpn_base + q for q in range(5)]
    assert len(c.rkeys) == len(c.response_bytes) == len(c.peers) == 5
    assert RxModel(c).epsn == [0] * 5
    c = RxConfig(params=PARAMS, host_mac=HOST_MAC, host_ip=HOST_IP)
    assert c.peers == [(HOST_MAC, ip_int(HOST_IP))] * 4       # every QP: the host's
    for bad in ([1, 1, 0, 0], [0, 1, 2, 0], [0, 1, 0, -1]):
        with pytest.raises(ValueError, match="cannot reach PPU"):
            RxConfig(params=PARAMS2, qp_ppus=bad)
    with pytest.raises(ValueError, match="one entry per QP"):
        RxConfig(params=PARAMS2, pmtu=[1024] * 5)


def test_the_ppu_register_takes_only_a_ppu_of_the_build_and_not_for_an_own_qp():
    c = RxConfig(params=QSCParams(num_ppus=3, num_qps=6))
    c.write_ppu(4, 2)
    c.write_ppu(5, 3)                     # no PPU 3: ignored
    c.write_ppu(3, 16)                    # wider than the register: ignored too
    c.write_ppu(1, 0)                     # PPU 1's own QP: ignored
    assert c.qp_ppus == [0, 1, 2, 0, 2, 0]


def test_an_extra_qp_writes_the_regions_mailbox_and_tail_of_its_ppu():
    """QP 2 reaching PPU 1: its WRITE lands in PPU 1's regions (one into PPU 0's window is
    DROP_VA), its SEND in PPU 1's mailbox, its ImmDt in PPU 1's TAIL; moved to PPU 0 it writes
    there. The verdicts name the QP and the PPU."""
    m = qps_model(qp_ppus=[0, 1, 1, 0])
    keys = m.config.rkeys[2]
    env1, env0 = region(PARAMS2, 1, "ENV"), region(PARAMS2, 0, "ENV")
    imem1 = region(PARAMS2, 1, "IMEM")
    v = m.receive(to_qp(2, Opcode.RDMA_WRITE_ONLY, 0, b"to-ppu-1", va=env1.va + 8,
                        r_key=keys["ENV_RKEY"][0]))
    assert (v.outcome, v.qp, v.ppu) == (ACCEPTED, 2, 1)
    assert v.writes == (Write(env1.va + 8, b"to-ppu-1"),)
    v = m.receive(to_qp(2, Opcode.RDMA_WRITE_ONLY, 1, b"to-ppu-0", va=env0.va + 8,
                        r_key=keys["ENV_RKEY"][0]))
    assert (v.outcome, v.qp, v.ppu) == ("DROP_VA", 2, 1)
    v = m.receive(to_qp(2, Opcode.SEND_ONLY, 1, b"R" * 24))
    assert v.outcome == ACCEPTED
    mailbox1 = ppu_base(1) + MAILBOX_OFFSET
    assert v.writes == (Write(mailbox1, b"R" * 24),) and v.mailbox_commit == (mailbox1, 24)
    v = m.receive(to_qp(2, Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE, 2, bytes(8), va=imem1.va,
                        r_key=keys["IMEM_RKEY"][0], imm=5))
    assert v.outcome == ACCEPTED and v.tail == (ppu_reg(1, "TAIL"), 5)
    # PPU 1's own QP is not QP 2: its keys are its own, its PSN too
    assert m.epsn == [0, 0, 3, 0]
    m.config.write_ppu(2, 0)
    v = m.receive(to_qp(2, Opcode.RDMA_WRITE_ONLY, 3, b"to-ppu-0", va=env0.va + 8,
                        r_key=keys["ENV_RKEY"][0]))
    assert (v.outcome, v.qp, v.ppu) == (ACCEPTED, 2, 0)
    assert v.writes == (Write(env0.va + 8, b"to-ppu-0"),)


def test_each_qp_has_its_own_keys_its_map_of_regions():
    """QP 0 opened every region of PPU 0, QP 2 (reaching PPU 0 too) the envelope memory alone,
    with keys of its own: a key is good on its own QP only, a region outside a QP's map takes
    no WRITE of it whatever key comes, and a restart closes that QP's map alone."""
    keys = [qp_keys(0), {}, qp_keys(2, ("ENV_RKEY",)), {}]
    m = qps_model(rkeys=keys)
    imem, env = region(PARAMS2, 0, "IMEM"), region(PARAMS2, 0, "ENV")
    k0, k2 = keys[0], keys[2]

    def write(q: int, psn: int, va: int, key: int) -> str:
        return m.receive(to_qp(q, Opcode.RDMA_WRITE_ONLY, psn, bytes(8), va=va,
                               r_key=key)).outcome

    assert write(2, 0, env.va, k2["ENV_RKEY"][0]) == ACCEPTED
    assert write(2, 1, env.va, k0["ENV_RKEY"][0]) == "DROP_RKEY"       # QP 0's key
    assert write(2, 1, imem.va, k0["IMEM_RKEY"][0]) == "DROP_RKEY"     # outside its map
    assert write(2, 1, imem.va, 0) == "DROP_RKEY"                       # its reset value
    assert write(0, 0, env.va, k2["ENV_RKEY"][0]) == "DROP_RKEY"       # QP 2's key
    assert write(0, 0, imem.va, k0["IMEM_RKEY"][0]) == ACCEPTED
    m.restart_qp(2)
    assert write(2, 0, env.va, k2["ENV_RKEY"][0]) == "DROP_RKEY"
    assert write(0, 1, env.va, k0["ENV_RKEY"][0]) == ACCEPTED


def test_each_qp_takes_packets_from_its_own_peer():
    """QP 1 is a second host's, QP 0 and the extra QPs this host's (``host_mac``/``host_ip``
    where ``peers`` leaves a QP out): a host's packets on the other's QP are DROP_PEER, of
    that QP (named in the verdict, its message left open)."""
    peers = [(HOST_MAC, HOST_IP), (OTHER_MAC, OTHER_IP)]
    m = qps_model(peers=peers)
    assert m.config.peers[1] == (OTHER_MAC, ip_int(OTHER_IP))
    assert m.config.peers[2:] == [(HOST_MAC, ip_int(HOST_IP))] * 2
    other = (OTHER_MAC, OTHER_IP)
    first = to_qp(1, Opcode.SEND_ONLY, 0, bytes(24), src=other)
    assert m.receive(first).outcome == ACCEPTED
    v = m.receive(to_qp(1, Opcode.SEND_ONLY, 1, bytes(24)))
    assert (v.outcome, v.qp, v.ppu, v.of_qp) == ("DROP_PEER", 1, 1, False)
    v = m.receive(to_qp(0, Opcode.SEND_ONLY, 0, bytes(24), src=other))
    assert (v.outcome, v.qp) == ("DROP_PEER", 0)
    assert m.receive(to_qp(3, Opcode.SEND_ONLY, 0, bytes(24), src=other)).outcome == (
        "DROP_PEER")
    assert m.receive(to_qp(3, Opcode.SEND_ONLY, 0, bytes(24))).outcome == ACCEPTED
    # the same MAC with the other's IP is not the peer either
    assert m.receive(to_qp(1, Opcode.SEND_ONLY, 1, bytes(24),
                           src=(OTHER_MAC, HOST_IP))).outcome == "DROP_PEER"
    # a peer that changes: the QP takes the new one's packets only
    m.config.peers[1] = (HOST_MAC, ip_int(HOST_IP))
    assert m.receive(to_qp(1, Opcode.SEND_ONLY, 1, bytes(24))).outcome == ACCEPTED
    assert m.receive(first).outcome == "DROP_PEER"


def test_each_qp_keeps_its_own_psn_and_message():
    """Messages on QP 0 and QP 3 (both reaching PPU 0), packet by packet interleaved, land whole;
    each QP's expected PSN is its own (a FIRST at another QP's PSN is a gap of its own QP); a lost
    MIDDLE breaks QP 3's message alone; a continuation sent to the wrong QP finds no message."""
    m = qps_model(pmtu=[PMTU] * 4)
    env = region(PARAMS2, 0, "ENV")
    a = UCQueuePair(HOST_MAC, HOST_IP, 0x11, PARAMS2.mac, PARAMS2.ip, PARAMS2.qpn_base,
                    pmtu_bytes=PMTU, tx_psn=100).write_frames(
        env.va, m.config.rkeys[0]["ENV_RKEY"][0], bytes([1]) * (3 * PMTU))
    b = UCQueuePair(HOST_MAC, HOST_IP, 0x12, PARAMS2.mac, PARAMS2.ip, PARAMS2.qpn_base + 3,
                    pmtu_bytes=PMTU, tx_psn=0xFFFFFF).write_frames(
        env.va + 4096, m.config.rkeys[3]["ENV_RKEY"][0], bytes([2]) * (3 * PMTU))
    v = [m.receive(f) for f in (a[0], b[0], a[1], b[1])]
    assert [x.outcome for x in v] == [ACCEPTED] * 4
    assert [(x.qp, x.ppu, x.psn_gap) for x in v] == [(0, 0, True), (3, 0, True),
                                                      (0, 0, False), (3, 0, False)]
    assert m.epsn == [102, 0, 0, 1]
    assert m.messages[0] == Message("write", False, env.va + 2 * PMTU, PMTU)
    assert m.messages[3] == Message("write", False, env.va + 4096 + 2 * PMTU, PMTU)
    # QP 0's LAST sent to QP 3 (its PSN is not QP 3's): QP 3's message closes, QP 0's stays
    wrong = bytearray(a[2])
    wrong[47:50] = (PARAMS2.qpn_base + 3).to_bytes(3, "big")
    wrong[-4:] = roce_icrc(bytes(wrong[14:-4]))
    v = m.receive(bytes(wrong))
    assert (v.outcome, v.qp) == ("DROP_PSN", 3)
    assert m.messages[3] is None and m.messages[0] is not None
    assert m.receive(a[2]).writes == (Write(env.va + 2 * PMTU, bytes([1]) * PMTU),)
    assert m.receive(b[2]).outcome == "DROP_PSN"
    assert m.epsn == [103, 0, 0, 1]


def test_the_lowest_qp_of_a_shared_qpn_takes_the_packet():
    """QP 1 and QP 3 share a QSC_QPN: QP 1 takes the packet (QP 3's peer, keys and PSN play no
    part), as the lowest QP with the QPN does."""
    qpns = [PARAMS2.qpn_base, 0x2, PARAMS2.qpn_base + 2, 0x2]
    m = qps_model(qsc_qpns=qpns, qp_ppus=[0, 1, 0, 0],
                  peers=[(HOST_MAC, HOST_IP), (HOST_MAC, HOST_IP), (HOST_MAC, HOST_IP),
                         (OTHER_MAC, OTHER_IP)])
    send = build_roce_frame(dst_mac=PARAMS2.mac, src_mac=HOST_MAC, src_ip=HOST_IP,
                            dst_ip=PARAMS2.ip, opcode=Opcode.SEND_ONLY, dest_qp=0x2, psn=0,
                            payload=bytes(8))
    v = m.receive(send)
    assert (v.outcome, v.qp, v.ppu) == (ACCEPTED, 1, 1)
    assert v.mailbox_commit == (ppu_base(1) + MAILBOX_OFFSET, 8)
    assert m.epsn == [0, 1, 0, 0]


def test_qp_counters():
    """RX_PACKETS counts a QP's packets taken, RX_DROPS its packets dropped after the QPN check
    for any reason (PEER and OVERFLOW included), RX_DROPS_PSN the DROP_PSN ones among them;
    frames dropped before the QPN check (or of no QP) count in no QP; TX_PACKETS never moves."""
    config = qps_model(peers=[(HOST_MAC, HOST_IP), (OTHER_MAC, OTHER_IP)],
                       pmtu=[PMTU] * 4).config
    config.buffer_bytes = 2048
    m = RxModel(config)
    env = region(PARAMS2, 0, "ENV")
    key0 = config.rkeys[0]["ENV_RKEY"][0]
    bad_icrc = bytearray(to_qp(0, Opcode.SEND_ONLY, 0, bytes(8)))
    bad_icrc[-1] ^= 1
    bad_pkey = bytearray(to_qp(0, Opcode.SEND_ONLY, 0, bytes(8), p_key=0x7FF0))
    frames = [
        to_qp(0, Opcode.SEND_ONLY, 0, bytes(8)),                            # QP 0 taken
        to_qp(0, Opcode.RDMA_WRITE_ONLY, 1, bytes(8), va=env.va, r_key=key0),  # taken
        to_qp(0, Opcode.RDMA_WRITE_MIDDLE, 2, bytes(PMTU)),                  # PSN
        to_qp(0, Opcode.RDMA_WRITE_ONLY, 2, bytes(8), va=env.va, r_key=1),   # RKEY
        to_qp(1, Opcode.SEND_ONLY, 0, bytes(8)),                            # PEER (QP 1)
        to_qp(1, Opcode.SEND_ONLY, 0, bytes(8), src=(OTHER_MAC, OTHER_IP)),  # QP 1 taken
        to_qp(3, Opcode.SEND_LAST, 0, bytes(8)),                            # PSN (QP 3)
        to_qp(3, Opcode.RDMA_WRITE_ONLY, 0, bytes(2200), va=env.va,
              r_key=config.rkeys[3]["ENV_RKEY"][0]),                 # over the PMTU
        to_qp(PARAMS2.num_qps, Opcode.SEND_ONLY, 0, bytes(8)),              # QPN: no QP's
        bytes(bad_icrc), bytes(bad_pkey),                                   # before the QPN
    ]
    outcomes = [m.receive(f).outcome for f in frames]
    assert outcomes == [ACCEPTED, ACCEPTED, "DROP_PSN", "DROP_RKEY", "DROP_PEER", ACCEPTED,
                        "DROP_PSN", "DROP_LENGTH", "DROP_QPN", "DROP_ICRC", "DROP_PKEY"]
    # the 2200-byte ONLY is over the PMTU (DROP_LENGTH): with PMTU 4096 it passes every check
    # and, longer than the buffer, is DROP_OVERFLOW
    m.config.pmtu[3] = 4096
    assert m.receive(frames[7]).outcome == "DROP_OVERFLOW"
    # a packet taken by the rules but dropped by the receiver for overflow
    v = m.judge(to_qp(2, Opcode.SEND_ONLY, 0, bytes(8)))
    assert v.outcome == ACCEPTED
    m.apply_dropped(v)
    assert [list(c) for c in m.qp_counters] == [[name for name, _ in QP_COUNTERS]] * 4
    assert m.qp_counters == [
        {"RX_PACKETS": 2, "RX_DROPS": 2, "RX_DROPS_PSN": 1, "TX_PACKETS": 0},
        {"RX_PACKETS": 1, "RX_DROPS": 1, "RX_DROPS_PSN": 0, "TX_PACKETS": 0},
        {"RX_PACKETS": 0, "RX_DROPS": 1, "RX_DROPS_PSN": 0, "TX_PACKETS": 0},
        {"RX_PACKETS": 0, "RX_DROPS": 3, "RX_DROPS_PSN": 1, "TX_PACKETS": 0},
    ]
    # judge alone counts nothing; a restart leaves the counters
    m.judge(frames[0])
    m.restart_qp(0)
    assert m.qp_counters[0]["RX_PACKETS"] == 2


def test_qp_counters_wrap_at_32_bits():
    m = qps_model()
    m.qp_counters[0]["RX_PACKETS"] = (1 << 32) - 1
    assert m.receive(to_qp(0, Opcode.SEND_ONLY, 0, bytes(8))).outcome == ACCEPTED
    assert m.qp_counters[0]["RX_PACKETS"] == 0
