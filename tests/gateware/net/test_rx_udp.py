"""UDP-mode responses (a QP's TRANSPORT = 1, CUDA-Q realtime's udp bridge format) in the receive
path (openqlink.gateware.net.rx): a datagram from the QP's peer MAC, IP and PEER_UDP_PORT to
UDP_CALL_PORT_BASE + q lands its first 64 bytes in the PPU's mailbox, as a SEND ONLY would;
anything else is dropped by reason and writes nothing. Frames are built by scapy (its own UDP
checksum, as a Linux socket sends it)."""

from netbench import (
    HOST_IP,
    HOST_MAC,
    QSC_IP,
    QSC_MAC,
    expected_writes,
    mailbox_commit,
    send_frame,
    write_frame,
)
from test_rx import IMEM0, IMEM_RKEY, nonzero, reg_read, reg_write, run_rx

from openqlink.memory_map import MAILBOX_OFFSET, QSCParams, ppu_base, qp_reg
from openqlink.wire.ipv4 import ip_to_int
from openqlink.wire.rpc import Response
from openqlink.wire.udp import UDP_CALL_PORT_BASE, udp_checksum_ok

PEER_PORT = 47001                       # the bridge's socket
SLOT_BYTES = 256                        # the bridge's slot_size: RESPONSE_BYTES
MAILBOX0 = ppu_base(0) + MAILBOX_OFFSET


def _ip(value: int) -> str:
    return ".".join(str(b) for b in value.to_bytes(4, "big"))


def _mac(value: int) -> str:
    return value.to_bytes(6, "big").hex(":")


def udp_datagram(payload: bytes, *, q: int = 0, src_port: int = PEER_PORT,
                 src_mac: int = HOST_MAC, src_ip: int = HOST_IP, dst_port: int | None = None,
                 checksum: str = "linux") -> bytes:
    """An Ethernet frame of one UDP datagram to QP ``q``'s UDP port, built by scapy:
    ``checksum`` "linux" (computed, as a Linux socket sends it), "none" (0) or "bad" (the
    computed one with a bit flipped)."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    udp = UDP(sport=src_port, dport=UDP_CALL_PORT_BASE + q if dst_port is None else dst_port)
    if checksum == "none":
        udp.chksum = 0
    frame = bytearray(bytes(Ether(dst=_mac(QSC_MAC), src=_mac(src_mac)) /
                            IP(src=_ip(src_ip), dst=_ip(QSC_IP), id=0x4321, flags="DF") /
                            udp / payload))
    if checksum == "linux":
        assert frame[40:42] != bytes(2)
        assert udp_checksum_ok(src_ip, QSC_IP, frame[34:])
    if checksum == "bad":
        frame[41] ^= 0x04
    return bytes(frame.ljust(60, b"\0"))


def response_slot(request_id: int, result: bytes, slot_bytes: int = SLOT_BYTES) -> bytes:
    """What the udp bridge sends for a request: the whole slot, RPCResponse, result, zeros."""
    return Response(0, request_id, 0x1122_3344_5566_7788, result).pack().ljust(slot_bytes, b"\0")


def udp_mode(*qps: int, peer_port: int = PEER_PORT, response_bytes: int = SLOT_BYTES):
    """Setup: QPs ``qps`` in UDP mode, their peer's port, RESPONSE_BYTES the bridge's slot."""
    async def setup(ctx, regs):
        for q in qps:
            await reg_write(ctx, regs, qp_reg(q, "TRANSPORT"), 1)
            await reg_write(ctx, regs, qp_reg(q, "PEER_UDP_PORT"), peer_port + q)
            await reg_write(ctx, regs, qp_reg(q, "RESPONSE_BYTES"), response_bytes)
    return setup


def qp_counts(store: dict, qps=range(1)):
    async def after(ctx, regs):
        for q in qps:
            store[q] = {name: await reg_read(ctx, regs, qp_reg(q, name))
                        for name in ("RX_PACKETS", "RX_DROPS", "RX_DROPS_PSN")}
    return after


def test_a_full_slot_response_lands_in_the_mailbox():
    """CUDA-Q's udp bridge answers with a full 256-byte slot and a Linux UDP checksum: its first
    64 bytes reach the mailbox with one MAILBOX_COMMIT of 64; RX_EPSN stays."""
    slot = response_slot(7, bytes(range(1, 41)) + b"tail")
    short = response_slot(8, b"\x2a" * 8, slot_bytes=40)     # a shorter datagram, no checksum
    counts: dict = {}
    cmds, _, counters, epsn = run_rx(
        [udp_datagram(slot), udp_datagram(short, checksum="none")],
        setup=udp_mode(0), after=qp_counts(counts))
    assert cmds == (expected_writes(MAILBOX0, slot[:64]) + [mailbox_commit(MAILBOX0, 64)] +
                    expected_writes(MAILBOX0, short) + [mailbox_commit(MAILBOX0, 40)])
    assert nonzero(counters) == {"RX_FRAMES": 2, "RX_RPC_RESPONSES": 2}
    assert counts[0] == {"RX_PACKETS": 2, "RX_DROPS": 0, "RX_DROPS_PSN": 0}
    assert epsn == [0]


def test_bad_datagrams_are_dropped_by_reason_and_write_nothing():
    slot = response_slot(9, b"\x01" * 8)
    other_ip = ip_to_int("192.168.0.102")
    frames = {
        "DROP_UDP": [udp_datagram(slot, checksum="bad"),
                     # the port of a QP in RoCE mode (QP 1), of a QP beyond the PPUs (QP 3)
                     udp_datagram(slot, q=1, src_port=PEER_PORT + 1),
                     udp_datagram(slot, q=3, src_port=PEER_PORT + 3)],
        "DROP_PEER": [udp_datagram(slot, src_port=PEER_PORT + 1),
                      udp_datagram(slot, src_ip=other_ip),
                      udp_datagram(slot, src_mac=HOST_MAC + 1)],
        "DROP_LENGTH": [udp_datagram(slot[:23]),
                        udp_datagram(slot + b"\0"),
                        udp_datagram(slot[:23], checksum="none")],
    }
    params = QSCParams(num_ppus=2)
    all_frames = [f for group in frames.values() for f in group]
    counts: dict = {}
    cmds, _, counters, epsn = run_rx(all_frames + [udp_datagram(slot[:24])], params=params,
                                     setup=udp_mode(0), after=qp_counts(counts, range(2)))
    # only the last, a bare 24-byte RPCResponse, is taken
    assert cmds == expected_writes(MAILBOX0, slot[:24]) + [mailbox_commit(MAILBOX0, 24)]
    assert nonzero(counters) == {"RX_FRAMES": len(all_frames) + 1, "RX_RPC_RESPONSES": 1,
                                 **{name: len(group) for name, group in frames.items()}}
    # the QP's own: those that reached it (peer and length drops), not the UDP ones
    assert counts[0] == {"RX_PACKETS": 1, "RX_DROPS": 6, "RX_DROPS_PSN": 0}
    assert counts[1] == {"RX_PACKETS": 0, "RX_DROPS": 0, "RX_DROPS_PSN": 0}
    assert epsn == [0, 0]


def test_roce_mode_ignores_the_datagrams():
    """TRANSPORT = 0 (from reset): a response datagram to the QP's UDP port is no QP's
    (DROP_UDP, like any port not handled)."""
    slot = response_slot(3, b"\x05" * 8)
    cmds, _, counters, _ = run_rx([udp_datagram(slot)])
    assert cmds == []
    assert nonzero(counters) == {"RX_FRAMES": 1, "DROP_UDP": 1}


def test_a_udp_mode_qp_still_takes_roce_packets():
    """UDP mode changes only the CALL path: RDMA WRITEs and SENDs for the QP's QSC_QPN are taken
    as before, interleaved with UDP responses, and keep the QP's PSN."""
    slot = response_slot(4, b"\x06" * 16)
    frames = [write_frame(IMEM0, b"instr-01", IMEM_RKEY, psn=5),
              udp_datagram(slot),
              write_frame(IMEM0 + 8, b"instr-02", IMEM_RKEY, psn=6),
              send_frame(b"S" * 24, psn=7)]
    counts: dict = {}
    cmds, _, counters, epsn = run_rx(frames, setup=udp_mode(0), after=qp_counts(counts))
    assert cmds == (expected_writes(IMEM0, b"instr-01") +
                    expected_writes(MAILBOX0, slot[:64]) + [mailbox_commit(MAILBOX0, 64)] +
                    expected_writes(IMEM0 + 8, b"instr-02") +
                    expected_writes(MAILBOX0, b"S" * 24) + [mailbox_commit(MAILBOX0, 24)])
    assert nonzero(counters) == {"RX_FRAMES": 4, "RX_ROCE_ACCEPTED": 3, "RX_RPC_RESPONSES": 2,
                                 "PSN_GAP": 1}
    assert counts[0] == {"RX_PACKETS": 4, "RX_DROPS": 0, "RX_DROPS_PSN": 0}
    assert epsn == [8]


def test_each_ppu_qp_its_own_port_and_mailbox():
    """Two PPUs in UDP mode: a response to UDP_CALL_PORT_BASE + 1 from QP 1's peer port lands in
    PPU 1's mailbox; one from QP 0's peer port to it is QP 1's DROP_PEER."""
    params = QSCParams(num_ppus=2)
    a, b = response_slot(1, b"\x0a" * 8), response_slot(2, b"\x0b" * 8)
    counts: dict = {}
    cmds, _, counters, _ = run_rx(
        [udp_datagram(b, q=1, src_port=PEER_PORT + 1), udp_datagram(a),
         udp_datagram(b, q=1, src_port=PEER_PORT)],
        params=params, setup=udp_mode(0, 1), after=qp_counts(counts, range(2)))
    mailbox1 = ppu_base(1) + MAILBOX_OFFSET
    assert cmds == (expected_writes(mailbox1, b[:64]) + [mailbox_commit(mailbox1, 64)] +
                    expected_writes(MAILBOX0, a[:64]) + [mailbox_commit(MAILBOX0, 64)])
    assert nonzero(counters) == {"RX_FRAMES": 3, "RX_RPC_RESPONSES": 2, "DROP_PEER": 1}
    assert counts == {0: {"RX_PACKETS": 1, "RX_DROPS": 0, "RX_DROPS_PSN": 0},
                      1: {"RX_PACKETS": 1, "RX_DROPS": 1, "RX_DROPS_PSN": 0}}
