"""ARP and ICMP echo responder: a board on a LAN answers ``arping`` and ``ping`` (rti domain).

# Ref: RFC 826 (ARP reply); RFC 792 and RFC 1122 3.2.2.6 (Echo Reply: the request's identifier,
# sequence and data, from the address the request was sent to); RFC 1624 eqn. 3 (incremental
# checksum update); IEEE 802.3-2018 3.2 (60-byte minimum frame, without FCS).

The receiver (:class:`~openqlink.gateware.net.rx.RoCEReceiver`) checks every frame; the
responder sees the same frames (it listens on the MAC's stream beside the receiver) and keeps a
copy of the last one that may be a request, an ARP packet or an IPv4 ICMP message, in its echo
buffer (a block RAM of :data:`~openqlink.gateware.net.rx.ECHO_MAX_FRAME_BYTES`, rounded up to
whole words), and its first 48 bytes in registers. The receiver's ``reply`` strobe comes a fixed
:data:`~openqlink.gateware.net.rx.REPLY_LATENCY_CYCLES` after the frame's last beat: when it
comes for the frame held, the responder sends the reply; otherwise it lets the frame go.

* ARP reply: to the requester's hardware address, operation 2, the QSC's MAC and IP as sender,
  the requester's addresses as target; 42 bytes padded with zeros to 60.
* Echo reply: to the request's source MAC and IP, from the QSC's; the IPv4 header as it came
  but TTL 64, the ICMP type 0; both checksums updated from the request's (RFC 1624 eqn. 3, the
  request's were verified by the receiver); the identifier, sequence and data as they came (odd
  lengths included); padded with zeros to 60 bytes.

While a request is held or its reply sent, other frames are not copied: a request among them is
not answered and counted REPLIES_SKIPPED. A reply leaves without gaps once started (its words
are read ahead into a small FIFO).
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ...wire.arp import ARP, ArpOperation
from ...wire.ethernet import ETHERNET, MIN_FRAME_BYTES, EtherType
from ...wire.icmp import ICMP_ECHO, IcmpType
from ...wire.ipv4 import IPV4, IpProtocol
from .. import bram
from ..packet import beat_layout, packet_signature
from .common import COUNTER_INDEX, NetConfig
from .regs import NUM_COUNTERS
from .rx import ECHO_MAX_FRAME_BYTES, REPLY_LATENCY_CYCLES, REPLY_LAYOUT

__all__ = ["Responder", "ECHO_TTL", "REPLY_HEADER_BYTES"]

#: TTL of echo replies (RFC 1700's default, as Linux sends).
ECHO_TTL = 64

_IP_AT = ETHERNET.length_bytes
_ICMP_AT = _IP_AT + IPV4.length_bytes
#: Bytes of a reply that the responder writes itself: Ethernet + IPv4 + ICMP echo header (an ARP
#: reply, Ethernet + ARP, is as long); the rest of an echo reply is the request's data.
REPLY_HEADER_BYTES = _ICMP_AT + ICMP_ECHO.length_bytes
assert REPLY_HEADER_BYTES == _IP_AT + ARP.length_bytes
#: Beats of a request kept in registers (the reply's header is built from them).
_CAP_BEATS = 6
#: Words of the echo buffer.
_DEPTH = 1 << (-(-ECHO_MAX_FRAME_BYTES // 8) - 1).bit_length()
#: Read-ahead FIFO: words read and not yet sent stay below this many (3 more in flight).
_FIFO_DEPTH = 8
_ISSUE_BELOW = _FIFO_DEPTH - 4


def _ones_add(a, b):
    """One's-complement sum of two 16-bit values' carry into bit 16 (the fold of RFC 1071)."""
    s = a + b
    return s[:16] + s[16:]


class Responder(wiring.Component):
    """Answers ARP requests for the QSC's IP and ICMP echo requests to it.

    Members
    -------
    rx : In(packet_signature())
        The MAC's frames, as the receiver sees them (``ready`` is driven high: the receiver
        takes every beat).
    reply : In(REPLY_LAYOUT)
        The receiver's verdict strobe, :data:`REPLY_LATENCY_CYCLES` after a frame's last beat.
    config : In(NetConfig)
        The QSC's MAC and IP.
    tx : Out(packet_signature())
        Reply frames, no FCS, padded to 60 bytes; ``valid`` and ``payload`` come from a FIFO's
        registers; a frame's beats follow one another without gaps while ``ready`` is high.
    count : Out(NUM_COUNTERS)
        TX_FRAMES for each reply sent (at its last beat), REPLIES_SKIPPED for each request that
        came while another was held or being answered.

    Latency: a reply's first beat is valid 5 cycles after the request's verdict strobe (4 for
    the reads ahead, 1 for the FIFO), 9 cycles after the request's last beat.
    """

    def __init__(self):
        super().__init__({
            "rx": In(packet_signature()),
            "reply": In(REPLY_LAYOUT),
            "config": In(NetConfig),
            "tx": Out(packet_signature()),
            "count": Out(NUM_COUNTERS),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        cfg = self.config
        beat = self.rx.payload
        take = Signal()

        m.submodules.buffer = buffer = Memory(shape=64, depth=_DEPTH, init=[],
                                              attrs={"no_rw_check": True})
        wport = buffer.write_port()
        rport = bram.read_port(m, buffer, name="echo_r")
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=beat_layout().size,
                                                    depth=_FIFO_DEPTH)

        # ---- copy: frames that start while idle -----------------------------------------------
        idle = Signal()
        copying = Signal()                    # the frame on ``rx`` is being copied
        in_frame = Signal()
        beat_no = Signal(range(_DEPTH + 1))
        at = Signal(_CAP_BEATS)               # one-hot beat position among the kept beats
        cap = Signal(8 * 8 * _CAP_BEATS)      # the request's first 48 bytes, lane order
        m.d.comb += [
            self.rx.ready.eq(1),
            take.eq(self.rx.valid & (beat.first | in_frame)),
        ]
        first_copy = Signal()
        m.d.comb += first_copy.eq(take & beat.first & idle)
        copy_now = Signal()
        m.d.comb += copy_now.eq(first_copy | (take & ~beat.first & copying))
        # The beat as it came, not masked by ``keep``: the reply's bytes past the request's
        # length are zeroed when it is sent, and no logic is shared with the receiver's own
        # masked copy (which synthesis would otherwise merge and place by this block's RAM).
        data_in = Signal(64)
        m.d.comb += data_in.eq(beat.data)
        index = Signal.like(beat_no)
        m.d.comb += index.eq(Mux(beat.first, 0, beat_no))
        with m.If(take):
            m.d.sync += in_frame.eq(~beat.last)
        with m.If(copy_now):
            m.d.sync += [copying.eq(~beat.last),
                         beat_no.eq(Mux(index == _DEPTH, index, index + 1)),
                         at.eq(Mux(beat.first, 0b10, at << 1))]
            for k in range(_CAP_BEATS):
                with m.If(Mux(beat.first, k == 0, at[k])):
                    m.d.sync += cap[64 * k:64 * k + 64].eq(data_in)
        m.d.comb += [
            wport.addr.eq(index),
            wport.data.eq(data_in),
            wport.en.eq(copy_now & (index < _DEPTH)),
        ]

        def cbytes(start, header):
            return cap[8 * start:8 * (start + header.length_bytes)]

        eth = ETHERNET.view(cbytes(0, ETHERNET))
        ip = IPV4.view(cbytes(_IP_AT, IPV4))
        arp = ARP.view(cbytes(_IP_AT, ARP))
        icmp = ICMP_ECHO.view(cbytes(_ICMP_AT, ICMP_ECHO))
        # A request may be an ARP packet or an IPv4 ICMP message (what the receiver may answer):
        # exact for frames of 4 beats and more, which every request is.
        maybe = Signal()
        m.d.comb += maybe.eq((eth["ethertype"] == EtherType.ARP) |
                             ((eth["ethertype"] == EtherType.IPV4) &
                              (ip["protocol"] == IpProtocol.ICMP)))

        # ---- the checksums of an echo reply, in stages while a request is held ----------------
        # RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m') for a changed word m -> m' (one's complement
        # sums). IPv4: the TTL/protocol word; ICMP: the type/code word (8, 0) -> (0, 0).
        ttl_word = Cat(ip["protocol"], ip["ttl"])
        new_ttl_word = Cat(ip["protocol"], Const(ECHO_TTL, 8))
        ip_s = Signal(18)
        icmp_s = Signal(17)
        ip_f = Signal(17)
        icmp_f = Signal(17)
        m.d.sync += [
            ip_s.eq((~ip["checksum"])[:16] + (~ttl_word)[:16] + new_ttl_word),
            icmp_s.eq((~icmp["checksum"])[:16] + (~Const(IcmpType.ECHO_REQUEST << 8, 16))),
            ip_f.eq(ip_s[:16] + ip_s[16:]),
            icmp_f.eq(icmp_s[:16] + icmp_s[16:]),
        ]
        ip_csum = ~(ip_f[:16] + ip_f[16])[:16]
        icmp_csum = ~(icmp_f[:16] + icmp_f[16])[:16]

        arp_reply = Cat(
            ETHERNET.build(dst=arp["sha"], src=cfg.qsc_mac, ethertype=EtherType.ARP),
            ARP.build(oper=ArpOperation.REPLY, sha=cfg.qsc_mac, spa=cfg.qsc_ip,
                      tha=arp["sha"], tpa=arp["spa"]))
        echo_reply = Cat(
            ETHERNET.build(dst=eth["src"], src=cfg.qsc_mac, ethertype=EtherType.IPV4),
            IPV4.build(**{name: ip[name] for name in ("version", "ihl", "tos", "total_length",
                                                       "identification", "flags",
                                                       "fragment_offset", "protocol")},
                       ttl=ECHO_TTL, checksum=ip_csum, src=cfg.qsc_ip, dst=ip["src"]),
            ICMP_ECHO.build(type=IcmpType.ECHO_REPLY, code=icmp["code"], checksum=icmp_csum,
                            identifier=icmp["identifier"], sequence=icmp["sequence"]))

        # ---- hold, then send --------------------------------------------------------------
        head = Signal(8 * REPLY_HEADER_BYTES)  # the reply's header, lane order
        reply_len = Signal(12)                # bytes of the reply before padding
        wait = Signal(range(REPLY_LATENCY_CYCLES))
        issue = Signal()                      # read the next word this cycle
        rd_k = Signal(range(_DEPTH + 1))      # the next word to read
        n_words = Signal(range(_DEPTH + 1))   # words of the padded reply
        left = Signal(12)                     # reply bytes from word rd_k on
        kpos = Signal(_CAP_BEATS)             # one-hot: rd_k among the header's words
        last_keep = Signal(8)
        sent_last = Signal()
        lanes_below = Array(Const((1 << i) - 1, 8) for i in range(8))
        count = Signal(NUM_COUNTERS)
        m.d.comb += [
            idle.eq(0),
            rport.addr.eq(rd_k),
            rport.en.eq(1),
        ]

        holding = Signal()
        frame_len = Signal(12)
        m.d.comb += frame_len.eq(Mux(reply_len < MIN_FRAME_BYTES, MIN_FRAME_BYTES, reply_len))
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += idle.eq(1)
                with m.If(take & beat.last & copying & maybe):
                    m.d.sync += wait.eq(0)
                    m.next = "HOLD"
            with m.State("HOLD"):
                m.d.comb += holding.eq(1)
                m.d.sync += wait.eq(wait + 1)
                with m.If(wait == REPLY_LATENCY_CYCLES - 1):
                    with m.If(self.reply.valid):
                        m.d.sync += [
                            head.eq(Mux(self.reply.arp, arp_reply, echo_reply)),
                            reply_len.eq(Mux(self.reply.arp, REPLY_HEADER_BYTES,
                                             ip["total_length"] + _IP_AT)),
                            rd_k.eq(0),
                            kpos.eq(1),
                        ]
                        m.next = "SIZE"
                    with m.Else():
                        m.next = "IDLE"
            with m.State("SIZE"):
                m.d.sync += [
                    n_words.eq((frame_len + 7) >> 3),
                    last_keep.eq(Mux(frame_len[:3] == 0, 0xFF, lanes_below[frame_len[:3]])),
                    left.eq(reply_len),
                ]
                m.next = "SEND"
            with m.State("SEND"):
                m.d.comb += issue.eq((rd_k != n_words) & (fifo.level < _ISSUE_BELOW))
                with m.If(sent_last):
                    m.next = "IDLE"

        with m.If(issue):
            m.d.sync += [rd_k.eq(rd_k + 1), kpos.eq(kpos << 1),
                         left.eq(Mux(left >= 8, left - 8, 0))]

        # p1: the word's address was presented (the read port's data follows); p2: the word,
        # registered out of the block RAM; p3: the reply's beat.
        meta = data.StructLayout({"valid": 1, "first": 1, "last": 1, "kpos": _CAP_BEATS,
                                  "lanes": 8, "keep": 8})
        p1 = Signal(meta)
        p2 = Signal(meta)
        word = Signal(64, reset_less=True)
        p3 = Signal(beat_layout())
        p3_valid = Signal()
        m.d.sync += [
            p1.valid.eq(issue),
            p1.first.eq(rd_k == 0),
            p1.last.eq(rd_k == n_words - 1),
            p1.kpos.eq(kpos),
            p1.lanes.eq(Mux(left >= 8, 0xFF, lanes_below[left[:3]])),
            p1.keep.eq(Mux(rd_k == n_words - 1, last_keep, 0xFF)),
            p2.eq(p1),
            word.eq(rport.data),
        ]
        patch = Const(0, 64)
        patch_lanes = Const(0, 8)
        for k in range(_CAP_BEATS):
            lo = 8 * k
            hi = min(lo + 8, REPLY_HEADER_BYTES)
            if hi <= lo:
                continue
            part = head[8 * lo:8 * hi]
            patch = patch | Mux(p2.kpos[k], Cat(part, Const(0, 64 - len(part))), 0)
            patch_lanes = patch_lanes | Mux(p2.kpos[k], Const((1 << (hi - lo)) - 1, 8), 0)
        lane_mask = Cat(*(patch_lanes[i].replicate(8) for i in range(8)))
        data_mask = Cat(*(p2.lanes[i].replicate(8) for i in range(8)))
        m.d.sync += [
            p3_valid.eq(p2.valid),
            p3.data.eq(((patch & lane_mask) | (word & ~lane_mask)) & data_mask),
            p3.keep.eq(p2.keep),
            p3.first.eq(p2.first),
            p3.last.eq(p2.last),
            p3.error.eq(0),
        ]
        m.d.comb += [
            fifo.w_en.eq(p3_valid),
            fifo.w_data.eq(p3),
            self.tx.valid.eq(fifo.r_rdy),
            self.tx.payload.eq(fifo.r_data),
            fifo.r_en.eq(self.tx.ready),
            sent_last.eq(self.tx.valid & self.tx.ready & self.tx.payload.last),
        ]

        # ---- counted -------------------------------------------------------------------------
        # a request's verdict that is not the held frame's (the responder was idle, answering,
        # or holding another frame): not answered
        m.d.comb += [
            count[COUNTER_INDEX["TX_FRAMES"]].eq(sent_last),
            count[COUNTER_INDEX["REPLIES_SKIPPED"]].eq(
                self.reply.valid & ~(holding & (wait == REPLY_LATENCY_CYCLES - 1))),
        ]
        m.d.sync += self.count.eq(count)
        return m
