"""Tests of the ARP and ICMP echo responder in the network core (openqlink.gateware.net.responder).

The expected replies are built by scapy (an independent ARP and ICMP implementation; GPL: tests
only) from the request, and compared byte for byte with what the QSC sends.
"""

import pytest
from netbench import HOST_IP, HOST_MAC, PARAMS, QSC_IP, QSC_MAC, drive_frames, pad60
from scapy.layers.inet import ICMP, IP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw
from test_net_core import CoreBench

from openqlink.gateware.net.rx import ECHO_MAX_FRAME_BYTES
from openqlink.wire.ethernet import int_to_mac
from openqlink.wire.ipv4 import int_to_ip

HOST = dict(mac=int_to_mac(HOST_MAC), ip=int_to_ip(HOST_IP))
QSC = dict(mac=int_to_mac(QSC_MAC), ip=int_to_ip(QSC_IP))
OTHER_IP = "192.168.0.99"


def arp_request(pdst: str = QSC["ip"], op: int = 1, dst: str = "ff:ff:ff:ff:ff:ff") -> bytes:
    return pad60(bytes(Ether(dst=dst, src=HOST["mac"]) /
                       ARP(op=op, hwsrc=HOST["mac"], psrc=HOST["ip"], pdst=pdst)))


def arp_reply_expected() -> bytes:
    return pad60(bytes(Ether(dst=HOST["mac"], src=QSC["mac"]) /
                       ARP(op=2, hwsrc=QSC["mac"], psrc=QSC["ip"], hwdst=HOST["mac"],
                           pdst=HOST["ip"])))


def echo_request(data: bytes, *, seq: int = 1, ttl: int = 61, chksum=None,
                 icmp_type: int = 8) -> bytes:
    return pad60(bytes(Ether(dst=QSC["mac"], src=HOST["mac"]) /
                       IP(src=HOST["ip"], dst=QSC["ip"], ttl=ttl, id=0x4242, tos=0x10,
                          flags="DF") /
                       ICMP(type=icmp_type, id=0x77, seq=seq, chksum=chksum) / Raw(data)))


def echo_reply_expected(data: bytes, *, seq: int = 1) -> bytes:
    return pad60(bytes(Ether(dst=HOST["mac"], src=QSC["mac"]) /
                       IP(src=QSC["ip"], dst=HOST["ip"], ttl=64, id=0x4242, tos=0x10,
                          flags="DF") /
                       ICMP(type=0, id=0x77, seq=seq) / Raw(data)))


def payload(n: int) -> bytes:
    return bytes((7 * i + 3) & 0xFF for i in range(n))


def run(frames, *, gap: int = 12, settle: int = 400, counters=(), bench=None, then=()):
    """Drive ``frames`` (``gap`` idle cycles after each), then after ``settle`` cycles the
    frames ``then``, into a NetworkCore; return the frames it sent and the counters named."""
    b = bench or CoreBench(PARAMS)
    out = {}

    async def tb(ctx, b):
        await drive_frames(ctx, b.dut.rx, frames, gap=gap)
        await b.settle(ctx, settle)
        if then:
            await drive_frames(ctx, b.dut.rx, list(then), gap=gap)
            await b.settle(ctx, settle)
        sent = list(b.tx_frames)
        # TX_FRAMES first: each counter read is answered with a frame of its own
        names = sorted(counters, key=lambda n: n != "TX_FRAMES")
        out["counters"] = {name: await b.read_counter(ctx, name) for name in names}
        out["sent"] = sent

    b.run(tb)
    return out["sent"], out["counters"]


def test_arp_request_for_our_ip_is_answered():
    sent, c = run([arp_request()], counters=("RX_ARP_REQUESTS", "TX_FRAMES", "DROP_ARP"))
    assert sent == [arp_reply_expected()]
    assert c == {"RX_ARP_REQUESTS": 1, "TX_FRAMES": 1, "DROP_ARP": 0}


def test_arp_for_another_ip_and_unsolicited_replies_are_not_answered():
    """Nothing is learned from ARP: a reply or an announcement changes nothing, and the QSC
    still answers a request afterwards, to the requester."""
    frames = [arp_request(pdst=OTHER_IP), arp_request(op=2, dst=QSC["mac"]),
              arp_request(op=2, pdst=QSC["ip"]), arp_request()]
    sent, c = run(frames, counters=("RX_ARP_REQUESTS", "DROP_ARP", "REPLIES_SKIPPED"))
    assert sent == [arp_reply_expected()]
    assert c == {"RX_ARP_REQUESTS": 1, "DROP_ARP": 3, "REPLIES_SKIPPED": 0}


@pytest.mark.parametrize("n", [0, 1, 17, 56, 57, 255, ECHO_MAX_FRAME_BYTES - 42])
def test_echo_request_is_answered_byte_for_byte(n):
    """``ping`` with any payload length (odd ones, the 60-byte padding, a full 1500-byte
    MTU): the reply is the request's data under the QSC's addresses, TTL 64, type 0, both
    checksums right."""
    data = payload(n)
    sent, c = run([echo_request(data)], settle=600,
                  counters=("RX_ECHO_REQUESTS", "DROP_ICMP", "TX_FRAMES"))
    assert sent == [echo_reply_expected(data)]
    assert c == {"RX_ECHO_REQUESTS": 1, "DROP_ICMP": 0, "TX_FRAMES": 1}


def test_bad_icmp_is_dropped_and_counted():
    good = echo_request(payload(56))
    bad_sum = echo_request(payload(56), chksum=0x1234)
    too_long = echo_request(payload(ECHO_MAX_FRAME_BYTES - 41))
    timestamp = echo_request(payload(12), icmp_type=13)
    sent, c = run([bad_sum, too_long, timestamp, good], settle=600,
                  counters=("RX_ECHO_REQUESTS", "DROP_ICMP", "DROP_IP", "TX_FRAMES"))
    assert sent == [echo_reply_expected(payload(56))]
    assert c == {"RX_ECHO_REQUESTS": 1, "DROP_ICMP": 3, "DROP_IP": 0, "TX_FRAMES": 1}


def test_a_request_while_busy_is_skipped_and_counted():
    """Back to back, the second request comes while the first is held: it is not answered and
    counts REPLIES_SKIPPED; a request after the reply is answered again."""
    a, b, c3 = (echo_request(payload(40), seq=s) for s in (1, 2, 3))
    sent, c = run([a, b], gap=0, counters=("RX_ECHO_REQUESTS", "REPLIES_SKIPPED", "TX_FRAMES"),
                  then=[c3])
    assert sent == [echo_reply_expected(payload(40), seq=1),
                    echo_reply_expected(payload(40), seq=3)]
    assert c == {"RX_ECHO_REQUESTS": 3, "REPLIES_SKIPPED": 1, "TX_FRAMES": 2}


class _SlowSink(CoreBench):
    """The MAC takes a beat in 2 cycles of 5; between frames and while ``ready`` is high, a
    frame's beats must come without gaps (a MAC cannot wait inside a frame)."""

    gaps = 0

    async def tx_sink(self, ctx):
        frame = b""
        cycle = 0
        while True:
            ready = cycle % 5 in (1, 3)
            ctx.set(self.dut.tx.ready, ready)
            _, _, valid, beat = await ctx.tick().sample(self.dut.tx.valid, self.dut.tx.payload)
            cycle += 1
            if frame and ready and not valid:
                self.gaps += 1
            if valid and ready:
                nbytes = bin(int(beat.keep)).count("1")
                frame += int(beat.data).to_bytes(8, "little")[:nbytes]
                if beat.last:
                    self.tx_frames.append(frame)
                    frame = b""


def test_replies_and_control_replies_share_the_mac_whole_frames_under_back_pressure():
    from netbench import control_frame

    from openqlink.memory_map import global_reg
    from openqlink.wire.control import Command
    from openqlink.wire.packet import parse_frame

    bench = _SlowSink(PARAMS)
    data = payload(200)
    frames = [echo_request(data), control_frame(Command.RD_DWORD, global_reg("SCRATCH"),
                                                flags=1, seq=9)]
    sent, _ = run(frames, gap=2, settle=1500, bench=bench, then=[arp_request()])
    assert bench.gaps == 0
    assert len(sent) == 3
    assert echo_reply_expected(data) in sent and arp_reply_expected() in sent
    (ctrl,) = [f for f in sent if f not in (echo_reply_expected(data), arp_reply_expected())]
    assert parse_frame(ctrl).control["seq"] == 9


def test_bytes_past_the_frames_end_never_reach_a_reply():
    """A request's Ethernet padding need not be zeros, and a MAC may leave junk in the lanes
    past ``keep`` on the last beat: the reply carries none of it (the request's bytes, then
    zeros up to 60)."""
    from netbench import beats

    data = payload(3)                       # 14 + 20 + 8 + 3 = 45 bytes, then 15 of padding
    request = echo_request(data)
    frame = request[:45] + b"\xee" * 15     # padding that is not zero
    bench = CoreBench(PARAMS)
    out = {}

    async def tb(ctx, b):
        port = b.dut.rx
        for bt in beats(frame):
            if bt["last"]:
                bt = dict(bt, data=bt["data"] | 0xDD << 56)         # junk past ``keep``
            ctx.set(port.valid, 1)
            ctx.set(port.payload, bt)
            await ctx.tick()
        ctx.set(port.valid, 0)
        await b.settle(ctx, 300)
        out["sent"] = list(b.tx_frames)

    bench.run(tb)
    assert out["sent"] == [echo_reply_expected(data)]
