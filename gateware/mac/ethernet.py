"""Ethernet MAC framing at 1 Gb/s, one byte per clock: receive (:class:`MACRx`) and transmit
(:class:`MACTx`) between a GMII-style byte bus and 8-bit packet streams.

# Ref: IEEE 802.3-2018 3.2.1 (preamble, 7 x 0x55), 3.2.2 (SFD, 0xD5), 3.2.9 (FCS: CRC-32,
# complemented, transmitted least significant byte first), 3.2.8 and 4.2.3.3 (PAD to the
# minimum frame size: 60 bytes before the FCS, 64 with it), 4.4.2 (interFrameGap 96 bit times =
# 12 byte times at 1 Gb/s; minFrameSize 512 bits), 4.2.4.2.2 (a frame shorter than minFrameSize
# is a collision fragment and is discarded), 35.2.2 (GMII: TX_EN/TX_ER, RX_DV/RX_ER).

Both blocks are written in ``sync``; :class:`~openqlink.gateware.mac.RGMIIMAC` places
:class:`MACRx` in the PHY's receive clock domain and :class:`MACTx` in ``rti`` (125 MHz).
The CRC-32 is :mod:`amaranth.lib.crc` (``CRC32_ETHERNET``), 8 bits per cycle. Cut-through:
neither block holds a whole frame.

The packet streams follow :mod:`openqlink.gateware.packet` at 8 bits (``keep`` is 1 on every
beat). On the MAC side a frame runs from the destination address to the end of the payload:
no preamble, SFD or FCS.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.crc.catalog import CRC32_ETHERNET
from amaranth.lib.wiring import In, Out

from ..packet import beat_layout, packet_signature

__all__ = [
    "GMIISignature", "MACRx", "MACTx", "PREAMBLE_BYTE", "SFD_BYTE", "PREAMBLE_BYTES",
    "MIN_FRAME_BYTES", "FCS_BYTES", "MIN_IFG_BYTES", "rx_frame_signature",
]

#: Preamble octet (IEEE 802.3 3.2.1), sent 7 times.
PREAMBLE_BYTE = 0x55
#: Start frame delimiter (IEEE 802.3 3.2.2).
SFD_BYTE = 0xD5
#: Preamble and SFD together, in bytes.
PREAMBLE_BYTES = 8
#: Frame check sequence length in bytes (IEEE 802.3 3.2.9).
FCS_BYTES = 4
#: minFrameSize (IEEE 802.3 4.4.2) in bytes, FCS included; shorter frames are padded (TX) or
#: flagged as runts (RX).
MIN_FRAME_BYTES = 64
#: interFrameGap at 1 Gb/s (IEEE 802.3 4.4.2): 96 bit times, 12 byte times.
MIN_IFG_BYTES = 12


class GMIISignature(wiring.Signature):
    """One byte per clock between the MAC and the PHY interface (GMII, IEEE 802.3 35.2.2).

    Members (as seen by the source)
    -------------------------------
    data : Out(8)
        TXD[7:0] / RXD[7:0].
    en : Out(1)
        TX_EN / RX_DV: ``data`` is a byte of a frame (preamble, SFD and FCS included).
    er : Out(1)
        TX_ER / RX_ER: the byte is in error (with ``en``: the frame must be discarded).
    """

    def __init__(self):
        super().__init__({"data": Out(8), "en": Out(1), "er": Out(1)})


def rx_frame_signature() -> stream.Signature:
    """An 8-bit packet stream that cannot be stalled (``always_ready``): frames from the wire."""
    return stream.Signature(beat_layout(8), always_ready=True)


class MACRx(wiring.Component):
    """Receive MAC: strips preamble and SFD, checks and strips the FCS, flags bad frames.

    Cut-through: a byte leaves 6 cycles after it arrived (4 to tell the FCS from the payload, 1
    to know which byte is the last, 1 output register); the last beat, with ``error``, leaves 2
    cycles after the last FCS byte (the cycle ``gmii.en`` falls, plus the output register).
    Bytes before the SFD are ignored (a shortened preamble is accepted); ``gmii.er`` outside a
    frame (false carrier) is ignored. No maximum length is enforced.

    ``error`` is set on the last beat when the FCS does not match (CRC-32 residue check over the
    frame and its FCS), when ``gmii.er`` was seen during the frame (SFD included), or when the
    frame with its FCS is shorter than :data:`MIN_FRAME_BYTES`. A frame of 4 bytes or fewer after
    the SFD delivers nothing (it has no payload byte) but is still counted as a runt.

    Members
    -------
    gmii : In(GMIISignature())
        Bytes from the PHY interface.
    frames : Out(rx_frame_signature())
        The frames, 8 bits a beat, ``keep`` = 1; no back-pressure (``always_ready``).
    frame_end : Out(1)
        One-cycle pulse at the end of every frame that had an SFD.
    fcs_error, phy_error, runt : Out(1)
        One-cycle pulses with ``frame_end``: FCS mismatch, RX_ER seen, shorter than 64 bytes.
    """

    gmii: In(GMIISignature())
    frames: Out(rx_frame_signature())
    frame_end: Out(1)
    fcs_error: Out(1)
    phy_error: Out(1)
    runt: Out(1)

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = crc = CRC32_ETHERNET(data_width=8).create()

        in_frame = Signal()
        delay = Signal(8 * FCS_BYTES)        # the 4 newest bytes, newest in bits [31:24]
        seen = Signal(range(MIN_FRAME_BYTES + 1))   # bytes after the SFD, saturating at 64
        er_seen = Signal()
        hold = Signal(8)                     # the newest payload byte, not yet known not last
        hold_valid = Signal()
        hold_first = Signal()

        out = self.frames.payload
        m.d.sync += [
            self.frames.valid.eq(0),
            self.frame_end.eq(0),
            self.fcs_error.eq(0),
            self.phy_error.eq(0),
            self.runt.eq(0),
        ]
        m.d.comb += [crc.data.eq(self.gmii.data), out.keep.eq(1)]

        with m.If(~in_frame):
            with m.If(self.gmii.en & (self.gmii.data == SFD_BYTE)):
                m.d.comb += crc.start.eq(1)
                m.d.sync += [
                    in_frame.eq(1),
                    seen.eq(0),
                    er_seen.eq(self.gmii.er),
                    hold_valid.eq(0),
                ]
        with m.Elif(self.gmii.en):
            m.d.comb += crc.valid.eq(1)
            m.d.sync += [
                delay.eq(Cat(delay[8:], self.gmii.data)),
                er_seen.eq(er_seen | self.gmii.er),
                seen.eq(Mux(seen == MIN_FRAME_BYTES, seen, seen + 1)),
            ]
            # Once 4 bytes are in the delay line, the oldest one is payload, not FCS.
            with m.If(seen >= FCS_BYTES):
                m.d.sync += [
                    hold.eq(delay[:8]),
                    hold_valid.eq(1),
                    hold_first.eq(seen == FCS_BYTES),
                    self.frames.valid.eq(hold_valid),
                    out.data.eq(hold),
                    out.first.eq(hold_first),
                    out.last.eq(0),
                    out.error.eq(0),
                ]
        with m.Else():
            # RX_DV fell: the frame ended and the CRC register holds the CRC of frame + FCS.
            runt = seen < MIN_FRAME_BYTES
            bad_fcs = ~crc.match_detected
            m.d.sync += [
                in_frame.eq(0),
                hold_valid.eq(0),
                self.frames.valid.eq(hold_valid),
                out.data.eq(hold),
                out.first.eq(hold_first),
                out.last.eq(1),
                out.error.eq(bad_fcs | er_seen | runt),
                self.frame_end.eq(1),
                self.fcs_error.eq(bad_fcs),
                self.phy_error.eq(er_seen),
                self.runt.eq(runt),
            ]
        return m


class MACTx(wiring.Component):
    """Transmit MAC: preamble and SFD, padding to 60 bytes, FCS, inter-frame gap.

    A frame starts when a beat with ``first`` is offered and the gap since the previous frame has
    passed; beats without ``first`` offered between frames are consumed and dropped. The first
    payload byte is taken 8 cycles after the start (while the preamble goes out), then one byte
    per cycle: once a frame has started, ``frames`` must offer a byte on every cycle until
    ``last``. If it does not (underflow), the byte on the wire carries TX_ER and the frame is
    ended there (the receiver discards it), ``underflow`` pulses and the rest of the frame is
    consumed and dropped. A frame whose last beat has ``error`` set goes out with TX_ER on its
    FCS bytes.

    Latency: ``gmii`` is registered; the first preamble byte is on ``gmii`` 2 cycles after
    ``frames.valid`` rises with ``first`` on an idle MAC.

    Parameters
    ----------
    ifg_bytes : int
        Idle bytes (cycles) between the last FCS byte and the next preamble, >= 12.

    Members
    -------
    frames : In(packet_signature(8))
        Frames without FCS.
    gmii : Out(GMIISignature())
        Bytes to the PHY interface.
    frame_sent : Out(1)
        One-cycle pulse when the last FCS byte of a frame is put on ``gmii``.
    underflow : Out(1)
        One-cycle pulse when a started frame had no byte ready.
    """

    frames: In(packet_signature(8))
    gmii: Out(GMIISignature())
    frame_sent: Out(1)
    underflow: Out(1)

    def __init__(self, *, ifg_bytes: int = MIN_IFG_BYTES):
        if not isinstance(ifg_bytes, int) or ifg_bytes < MIN_IFG_BYTES:
            raise ValueError(f"ifg_bytes must be an integer >= {MIN_IFG_BYTES}, not {ifg_bytes!r}")
        self.ifg_bytes = ifg_bytes
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = crc = CRC32_ETHERNET(data_width=8).create()

        data_min = MIN_FRAME_BYTES - FCS_BYTES
        count = Signal(range(max(self.ifg_bytes, data_min) + 1))
        error = Signal()
        short = Signal()     # fewer than 60 bytes taken so far: the frame needs padding
        fcs = crc.crc

        m.d.sync += [
            self.gmii.en.eq(0),
            self.gmii.er.eq(0),
            self.gmii.data.eq(0),
            self.frame_sent.eq(0),
            self.underflow.eq(0),
        ]

        # ``count`` runs 0..ifg-2 in GAP: with the cycle spent in IDLE (or the one that moves
        # straight to PREAMBLE) the wire is idle for exactly ``ifg_bytes`` cycles.
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.frames.ready.eq(self.frames.valid & ~self.frames.payload.first)
                with m.If(self.frames.valid & self.frames.payload.first):
                    m.d.sync += count.eq(0)
                    m.next = "PREAMBLE"
            with m.State("PREAMBLE"):
                m.d.sync += [
                    self.gmii.en.eq(1),
                    self.gmii.data.eq(Mux(count == PREAMBLE_BYTES - 1, SFD_BYTE, PREAMBLE_BYTE)),
                    count.eq(count + 1),
                ]
                with m.If(count == PREAMBLE_BYTES - 1):
                    m.d.comb += crc.start.eq(1)
                    m.d.sync += [count.eq(0), short.eq(1)]
                    m.next = "DATA"
            with m.State("DATA"):
                payload = self.frames.payload
                m.d.comb += [
                    self.frames.ready.eq(1),
                    crc.data.eq(payload.data),
                    crc.valid.eq(self.frames.valid),
                ]
                # ``count`` (bytes taken) wraps on long frames; ``short`` stays set until the
                # 60th byte is taken, so no wide compare sits on this path.
                sixtieth = count == data_min - 1
                with m.If(self.frames.valid):
                    m.d.sync += [
                        self.gmii.en.eq(1),
                        self.gmii.data.eq(payload.data),
                        count.eq(count + 1),
                    ]
                    with m.If(sixtieth):
                        m.d.sync += short.eq(0)
                    with m.If(payload.last):
                        m.d.sync += error.eq(payload.error)
                        with m.If(short & ~sixtieth):
                            m.next = "PAD"
                        with m.Else():
                            m.d.sync += count.eq(0)
                            m.next = "FCS"
                with m.Else():
                    m.d.sync += [
                        self.gmii.en.eq(1),
                        self.gmii.er.eq(1),
                        self.underflow.eq(1),
                    ]
                    m.next = "DISCARD"
            with m.State("PAD"):
                m.d.comb += [crc.data.eq(0), crc.valid.eq(1)]
                m.d.sync += [
                    self.gmii.en.eq(1),
                    self.gmii.data.eq(0),
                    count.eq(count + 1),
                ]
                with m.If(count == data_min - 1):
                    m.d.sync += count.eq(0)
                    m.next = "FCS"
            with m.State("FCS"):
                m.d.sync += [
                    self.gmii.en.eq(1),
                    self.gmii.er.eq(error),
                    self.gmii.data.eq(fcs.word_select(count[:2], 8)),
                    count.eq(count + 1),
                ]
                with m.If(count == FCS_BYTES - 1):
                    m.d.sync += [count.eq(0), self.frame_sent.eq(1)]
                    m.next = "GAP"
            with m.State("DISCARD"):
                m.d.comb += self.frames.ready.eq(1)
                with m.If(self.frames.valid & self.frames.payload.last):
                    m.d.sync += count.eq(0)
                    m.next = "GAP"
            with m.State("GAP"):
                m.d.sync += count.eq(count + 1)
                with m.If(count == self.ifg_bytes - 2):
                    m.next = "IDLE"

        return m
