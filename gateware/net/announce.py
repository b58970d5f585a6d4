"""BOOTP announcer: the QSC broadcasts itself as Holoscan Sensor Bridge boards do (rti domain).

Every ``config.bootp_interval_ms`` milliseconds (the global register BOOTP_INTERVAL_MS: 1000
from reset, 0 stops it) the announcer sends one BOOTP request from the QSC's current MAC and IP
(:mod:`openqlink.wire.bootp` defines the frame, 342 bytes, and its fields; the headers here are
built from the same field values). The MAC and IP are taken when an announcement starts; the
IPv4 checksum is computed from them in the next cycle; the frame then leaves in 43 beats
without gaps while ``tx.ready`` holds (the frame arbiter grants whole frames). An announcement
that falls due while the previous one is still waiting for the arbiter is not queued twice:
at most one is pending.

# Ref: RFC 951 (BOOTP); RFC 791 3.1 (header checksum); openqlink.wire.bootp (the frame).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ...wire.bootp import (
    ANNOUNCE_FRAME_BYTES,
    BOOTP,
    HSB_VENDOR,
    announcement_fields,
)
from ...wire.ethernet import ETHERNET
from ...wire.ipv4 import IPV4, ipv4_checksum
from ...wire.udp import UDP
from ..logic import named
from ..packet import packet_signature
from .common import NetConfig

__all__ = ["BootpAnnouncer", "ANNOUNCE_BEATS"]

#: Beats of an announcement on the 64-bit stream.
ANNOUNCE_BEATS = -(-ANNOUNCE_FRAME_BYTES // 8)


class BootpAnnouncer(wiring.Component):
    """Sends a BOOTP announcement every ``config.bootp_interval_ms`` milliseconds.

    Parameters
    ----------
    rti_clk_hz : int
        The rti clock (cycles per millisecond: ``rti_clk_hz // 1000``).

    Members
    -------
    config : In(NetConfig)
        ``qsc_mac``, ``qsc_ip`` (taken at each announcement's start) and
        ``bootp_interval_ms`` (16 bits; 0: no announcements).
    tx : Out(packet_signature())
        The announcement frames (no FCS); ``valid`` held, beats back to back while ``ready``.
    sent : Out(1)
        One-cycle strobe as an announcement's last beat is taken.
    """

    config: In(NetConfig)
    tx: Out(packet_signature())
    sent: Out(1)

    def __init__(self, rti_clk_hz: int):
        if rti_clk_hz < 1000:
            raise ValueError(f"rti_clk_hz {rti_clk_hz} is below 1 kHz")
        self.cycles_per_ms = rti_clk_hz // 1000
        super().__init__()

    def elaborate(self, platform) -> Module:
        m = Module()
        cfg = self.config

        # ---- the interval: a millisecond prescaler and a millisecond count ------------------
        pre = Signal(range(self.cycles_per_ms))
        ms_tick = Signal()
        m.d.comb += ms_tick.eq(pre == self.cycles_per_ms - 1)
        m.d.sync += pre.eq(Mux(ms_tick, 0, pre + 1))
        elapsed_ms = Signal(16)
        due = Signal()
        m.d.comb += due.eq(ms_tick & (cfg.bootp_interval_ms != 0) &
                           (elapsed_ms + 1 >= cfg.bootp_interval_ms))
        pending = Signal()
        with m.If(cfg.bootp_interval_ms == 0):
            m.d.sync += [elapsed_ms.eq(0), pending.eq(0)]
        with m.Elif(due):
            m.d.sync += [elapsed_ms.eq(0), pending.eq(1)]
        with m.Elif(ms_tick):
            m.d.sync += elapsed_ms.eq(elapsed_ms + 1)

        # ---- the frame's fields: the addresses taken at the start, the sequence number -----
        mac = Signal(48)
        ip = Signal(32)
        sequence = Signal(16)
        ip_csum = Signal(16)
        # The one's-complement sum of the IPv4 header's words without the source address
        # (RFC 791 3.1): the complement of that header's checksum.
        fields = announcement_fields(0, 0, 0)
        fixed = ~ipv4_checksum(IPV4.pack(**fields["ip"])) & 0xFFFF
        partial = Signal(18)
        m.d.comb += partial.eq(fixed + ip[16:] + ip[:16])
        folded = Signal(17)
        m.d.comb += folded.eq(partial[:16] + partial[16:])
        m.d.sync += ip_csum.eq(~(folded[:16] + folded[16]))

        frame = Cat(
            ETHERNET.build(**{**fields["eth"], "src": mac}),
            IPV4.build(**{**fields["ip"], "src": ip, "checksum": ip_csum}),
            UDP.build(**fields["udp"]),
            BOOTP.build(**{**fields["bootp"], "ciaddr": ip, "chaddr": Cat(Const(0, 80), mac)}),
            HSB_VENDOR.build(**{**fields["vendor"], "serial_number": Cat(Const(0, 8), mac),
                                "sequence": sequence}),
        )
        assert len(frame) == 8 * ANNOUNCE_FRAME_BYTES
        frame = named(m, frame, "frame")
        last_bytes = ANNOUNCE_FRAME_BYTES - 8 * (ANNOUNCE_BEATS - 1)

        # ---- sending ------------------------------------------------------------------------
        beat = Signal(range(ANNOUNCE_BEATS))
        tx = self.tx
        m.d.comb += self.sent.eq(tx.valid & tx.ready & tx.payload.last)
        with m.If(tx.valid & tx.ready):
            m.d.sync += tx.valid.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(pending):
                    m.d.sync += [mac.eq(cfg.qsc_mac), ip.eq(cfg.qsc_ip), pending.eq(0),
                                 beat.eq(0)]
                    m.next = "SUM"
            with m.State("SUM"):
                # ``ip_csum`` takes the sum of the new address at this edge.
                m.next = "SEND"
            with m.State("SEND"):
                with m.If(~tx.valid | tx.ready):
                    with m.Switch(beat):
                        for k in range(ANNOUNCE_BEATS):
                            with m.Case(k):
                                m.d.sync += tx.payload.data.eq(frame[64 * k:64 * k + 64])
                    m.d.sync += [
                        tx.valid.eq(1),
                        tx.payload.first.eq(beat == 0),
                        tx.payload.last.eq(beat == ANNOUNCE_BEATS - 1),
                        tx.payload.keep.eq(Mux(beat == ANNOUNCE_BEATS - 1,
                                               (1 << last_bytes) - 1, 0xFF)),
                        tx.payload.error.eq(0),
                        beat.eq(beat + 1),
                    ]
                    with m.If(beat == ANNOUNCE_BEATS - 1):
                        m.d.sync += sequence.eq(sequence + 1)
                        m.next = "IDLE"
        return m
