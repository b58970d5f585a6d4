"""Transmit path of the QSC network core: RPC requests and control-plane replies.

# Ref: IEEE 802.3-2018 3.2 (Ethernet II, 60-byte minimum frame); RFC 791 3.1 (IPv4), RFC 1071
# (header checksum); RFC 768 (UDP; checksum 0 = none); IBTA Vol 1 9.2 (BTH), 9.3.2 (RETH),
# 9.3.4 (ImmDt), 9.8.3 (UC RDMA WRITE), 7.8.1 + Annex A17.4.4 (ICRC); cuda-quantum
# realtime/docs/cudaq_realtime_message_protocol.md (RPCHeader, ring slots, ImmDt {PSN, slot});
# Holoscan Sensor Bridge control bus response (openqlink.wire.control.CONTROL_RESPONSE).

Each :class:`~openqlink.gateware.bus.CallRequest` becomes one RoCEv2 UC
RDMA_WRITE_ONLY_WITH_IMMEDIATE into the host ring of its PPU; each
:class:`~openqlink.gateware.net.common.ControlReply` becomes one UDP datagram from port 8192.
The frame is assembled as one flat register (lane order), its IPv4 header checksum is computed by
:class:`~openqlink.gateware.net.ipv4csum.IPv4Checksum` and its ICRC by
:class:`~openqlink.gateware.net.icrc.ICRC` while the first beats already leave; the ICRC is ready
exactly when the beat that carries it is due, so a frame leaves without gaps whenever ``tx.ready``
stays high.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ...memory_map import QSCParams
from ...wire.control import CONTROL_RESPONSE
from ...wire.ethernet import ETHERNET, MIN_FRAME_BYTES, EtherType
from ...wire.ipv4 import IPV4, IpProtocol
from ...wire.roce import BTH, ICRC_BYTES, IMMDT, RETH, Opcode
from ...wire.rpc import HEADER_BYTES, REQUEST_MAGIC, RPCHeader
from ...wire.udp import CONTROL_PORT, ROCEV2_PORT, UDP
from ..bus import MAX_CALL_ARG_BYTES, CallRequest
from ..packet import packet_signature
from .common import ControlReply, NetConfig, QPContext
from .icrc import ICRC_WORD_MASKS, ICRCEngine, icrc_terms
from .ipv4csum import IPv4Checksum

__all__ = ["TxBuilder", "rpc_frame_bytes", "CONTROL_FRAME_BYTES", "START_LATENCY_CYCLES"]

_ETH_BYTES = ETHERNET.length_bytes
_IP_OFFSET = _ETH_BYTES
_UDP_OFFSET = _IP_OFFSET + IPV4.length_bytes
_L4_OFFSET = _UDP_OFFSET + UDP.length_bytes
#: Offset of the RPC payload (RPCHeader) in a request frame: Eth + IPv4 + UDP + BTH + RETH + ImmDt.
_RPC_OFFSET = _L4_OFFSET + BTH.length_bytes + RETH.length_bytes + IMMDT.length_bytes
_ARG_OFFSET = _RPC_OFFSET + HEADER_BYTES
#: Argument area (args and pad) of the largest call, a multiple of 4 bytes.
_ARG_AREA_BYTES = -(-MAX_CALL_ARG_BYTES // 4) * 4


def _padded(arg_len: int) -> int:
    """Bytes of args plus pad for ``arg_len`` argument bytes (RPCHeader is 24 bytes: 4-aligned)."""
    return -(-arg_len // 4) * 4


def _icrc_offset(arg_len: int) -> int:
    return _ARG_OFFSET + _padded(arg_len)


def rpc_frame_bytes(arg_len: int) -> int:
    """Frame length in bytes (FCS excluded) of an RPC request with ``arg_len`` argument bytes."""
    if not 0 <= arg_len <= MAX_CALL_ARG_BYTES:
        raise ValueError(f"arg_len must be 0..{MAX_CALL_ARG_BYTES}, not {arg_len}")
    return max(_icrc_offset(arg_len) + ICRC_BYTES, MIN_FRAME_BYTES)


_CONTROL_UNPADDED_BYTES = _L4_OFFSET + CONTROL_RESPONSE.length_bytes
#: Frame length in bytes (FCS excluded) of a control reply: 58 bytes padded to 60.
CONTROL_FRAME_BYTES = max(_CONTROL_UNPADDED_BYTES, MIN_FRAME_BYTES)

_FRAME_BYTES = max(rpc_frame_bytes(MAX_CALL_ARG_BYTES), CONTROL_FRAME_BYTES)
_FRAME_WORDS = -(-_FRAME_BYTES // 8)
#: Words of V with masked bytes are among the first ones: a one-hot index of this many.
_V_MASKED_WORDS = max(ICRC_WORD_MASKS) + 1

#: Cycles from the cycle a request or reply is taken to the cycle its first beat is valid.
START_LATENCY_CYCLES = 4


class TxBuilder(wiring.Component):
    """Builds RPC request frames and control-reply frames and sends them on ``tx``.

    Parameters
    ----------
    num_ppus : int
        Number of PPUs (1..16): one QP context, ring-slot counter and PSN each.
    params : QSCParams
        Build parameters; ``params.data_width_bits`` must be 64.

    Members
    -------
    config : In(NetConfig)
        Global network configuration; sampled when a request or reply is taken.
    qp : In(ArrayLayout(QPContext, num_ppus))
        Per-PPU QP contexts (host QPN, ring VA, R_Key, num_slots, slot_size); sampled likewise.
    timestamp : In(64)
        From :class:`~openqlink.gateware.net.timebase.Timebase`, already in the configured
        format; sampled into ``ptp_timestamp`` in the cycle the request is taken.
    call_req : In(stream.Signature(CallRequest))
        RPC requests of the PPUs. A request with ``ppu >= num_ppus`` or
        ``arg_len > MAX_CALL_ARG_BYTES`` is taken, sends nothing, and pulses ``call_dropped``.
    ctrl_reply : In(stream.Signature(ControlReply))
        Control-plane replies; they take priority over requests.
    tx : Out(packet_signature())
        Frames to the MAC, 8 bytes per beat, FCS excluded, padded to 60 bytes. Once a frame's
        first beat is valid, every later beat is valid in the cycle after the previous one was
        taken (no gaps of ours inside a frame). Back-pressure: ``tx.ready`` low stalls the
        beat; nothing is lost, and no new request or reply is taken until the frame has left.
    tx_psn : Out(ArrayLayout(24, num_ppus))
        Next PSN of each PPU's QP (reset 0), incremented modulo 2**24 per request taken.
    sent_frame : Out(1)
        One-cycle strobe when the last beat of any frame is taken (TX_FRAMES).
    sent_rpc : Out(1)
        One-cycle strobe when the last beat of an RPC request is taken (TX_RPC_REQUESTS).
    call_dropped : Out(1)
        One-cycle strobe when a malformed CallRequest is taken and discarded.

    Latency: the first beat is valid :data:`START_LATENCY_CYCLES` cycles after the request or
    reply was taken. A request frame is 102 bytes (13 beats) with no arguments and 106 bytes
    (14 beats) with 1..4; a control reply is 60 bytes (8 beats). The next request or reply is
    taken in the cycle after the last beat of the previous frame was taken.

    RPC request frame: Ethernet (host MAC <- QSC MAC), IPv4 (DF, TTL 64, identification 0, UDP),
    UDP (``config.udp_src_port`` -> 4791, checksum 0), BTH (RDMA_WRITE_ONLY_WITH_IMMEDIATE,
    PadCnt, ``config.p_key``, DestQP = ``host_qpn``, PSN), RETH (VA = ``ring_va + slot *
    slot_size``, ``host_rkey``, DMALen = 24 + arg_len), ImmDt ``{PSN[19:0], slot[11:0]}``,
    RPCHeader (CUQR, function_id, arg_len, request_id, ptp_timestamp), args, zero pad, ICRC.
    Slots of each PPU go round-robin from 0 modulo ``num_slots`` (a slot counter at or beyond a
    reduced ``num_slots`` restarts at 0; ``num_slots`` 0 is taken as 1).
    """

    def __init__(self, num_ppus: int, params: QSCParams):
        if not isinstance(num_ppus, int) or not 1 <= num_ppus <= 16:
            raise ValueError(f"num_ppus must be an int in 1..16, not {num_ppus!r}")
        if params.data_width_bits != 64:
            raise ValueError(f"data_width_bits must be 64, not {params.data_width_bits}")
        self.num_ppus = num_ppus
        self.params = params
        super().__init__({
            "config": In(NetConfig),
            "qp": In(data.ArrayLayout(QPContext, num_ppus)),
            "timestamp": In(64),
            "call_req": In(stream.Signature(CallRequest)),
            "ctrl_reply": In(stream.Signature(ControlReply)),
            "tx": Out(packet_signature(params.data_width_bits)),
            "tx_psn": Out(data.ArrayLayout(24, num_ppus)),
            "sent_frame": Out(1),
            "sent_rpc": Out(1),
            "call_dropped": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.csum = csum = IPv4Checksum()
        m.submodules.icrc = icrc = ICRCEngine(parts=2)

        m.d.sync += self.call_dropped.eq(0)

        # --- per-PPU state -----------------------------------------------------------------------
        slot_ctr = [Signal(12, name=f"slot_ctr_{n}") for n in range(self.num_ppus)]

        # --- fields latched when a request or reply is taken ----------------------------------
        is_ctrl = Signal()
        eth_dst = Signal(48)
        eth_src = Signal(48)
        ip_src = Signal(32)
        ip_dst = Signal(32)
        udp_src = Signal(16)
        udp_dst = Signal(16)
        ip_total = Signal(16)
        reply = Signal(ControlReply)
        req = Signal(CallRequest)
        ppu = Signal(range(self.num_ppus))
        ts = Signal(64)
        p_key = Signal(16)
        dest_qp = Signal(24)
        psn = Signal(24)
        slot = Signal(12)
        num_slots = Signal(13)
        ring_va = Signal(64)
        ring_va_hi_p1 = Signal(32)                  # ring_va[63:32] + 1
        slot_size = Signal(16)
        slot_off = Signal(28)                       # slot * slot_size
        rkey = Signal(32)
        va = Signal(64)

        # Beat markers, loaded with the frame and shifted with it: bit 0 (lane group 0) is the
        # beat on ``tx`` now. Their values per frame kind are elaboration-time constants.
        last_mark = Signal(_FRAME_WORDS)            # the frame's last beat
        crc_wait = Signal(_FRAME_WORDS)             # beats at or after the first ICRC byte
        crc_lanes = Signal(_FRAME_WORDS * 8)        # lanes that carry ICRC bytes
        v_mark = Signal(_FRAME_WORDS)               # beats whose take feeds a word of V
        v_last_mark = Signal(_FRAME_WORDS)          # ... the last word of V
        v_pos = Signal(_V_MASKED_WORDS)             # one-hot index of the beat, for the masks
        marks = Signal(data.StructLayout({
            "last": _FRAME_WORDS, "crc_wait": _FRAME_WORDS, "crc_lanes": _FRAME_WORDS * 8,
            "v": _FRAME_WORDS, "v_last": _FRAME_WORDS, "last_keep": 8, "crc_shift": 3,
            "v_half": 1}))
        last_keep = Signal(8)
        crc_shift = Signal(3)                       # lane of the ICRC's byte 0, modulo 8
        icrc_half = Signal()                        # V ends on a half word
        first_beat = Signal()
        icrc_ready = Signal()                       # the ICRC is ready (done has pulsed)
        sending = Signal()                          # in SEND
        frame = Signal(_FRAME_WORDS * 64)

        def frame_marks(frame_bytes: int, icrc_pos: int | None) -> dict:
            last = (frame_bytes - 1) // 8
            tail = frame_bytes % 8
            out = {"last": 1 << last, "last_keep": (1 << (tail or 8)) - 1,
                   "crc_wait": 0, "crc_lanes": 0, "v": 0, "v_last": 0, "crc_shift": 0,
                   "v_half": 0}
            if icrc_pos is not None:
                v_bytes = 8 + icrc_pos - _IP_OFFSET
                v_last = (v_bytes - 1) // 8
                out.update({
                    "crc_wait": ((1 << _FRAME_WORDS) - 1) & ~((1 << (icrc_pos // 8)) - 1),
                    "crc_lanes": sum(1 << p for p in range(icrc_pos, icrc_pos + ICRC_BYTES)),
                    "v": (1 << (v_last + 1)) - 1,
                    "v_last": 1 << v_last,
                    "crc_shift": icrc_pos % 8,
                    "v_half": int(v_bytes % 8 == 4),
                })
            return out

        # --- selection of the request's PPU state (combinational, used in IDLE) ----------------
        rq = self.call_req.p
        cr = self.ctrl_reply.p
        qp_sel = self.qp[rq.ppu]
        cur_slot = Signal(12)
        sel_slot = Signal(12)
        sel_psn = Signal(24)
        for n in range(self.num_ppus):
            with m.If(rq.ppu == n):
                m.d.comb += [cur_slot.eq(slot_ctr[n]), sel_psn.eq(self.tx_psn[n])]
        m.d.comb += sel_slot.eq(Mux(cur_slot < qp_sel.num_slots, cur_slot, 0))
        req_ok = (rq.ppu < self.num_ppus) & (rq.arg_len <= MAX_CALL_ARG_BYTES)
        arg_lens = range(MAX_CALL_ARG_BYTES + 1)

        # --- headers, from the latched fields (combinational) ----------------------------------
        ip_fields = dict(tos=0, total_length=ip_total, identification=0, fragment_offset=0,
                         protocol=IpProtocol.UDP.value, src=ip_src, dst=ip_dst)
        m.d.comb += csum.header.eq(IPV4.build(checksum=0, **ip_fields))
        ip_header = IPV4.build(checksum=csum.checksum, **ip_fields)
        eth_header = ETHERNET.build(dst=eth_dst, src=eth_src, ethertype=EtherType.IPV4.value)
        udp_header = UDP.build(src_port=udp_src, dst_port=udp_dst,
                               length=ip_total - IPV4.length_bytes, checksum=0)

        pad_cnt = Signal(2)
        m.d.comb += pad_cnt.eq(-req.arg_len)
        bth = BTH.build(opcode=Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE.value, se=0, m=0,
                        pad_cnt=pad_cnt, tver=0, p_key=p_key, fecn=0, becn=0, resv6=0,
                        dest_qp=dest_qp, a=0, resv7=0, psn=psn)
        reth = RETH.build(va=va, r_key=rkey, dma_len=HEADER_BYTES + req.arg_len)
        immdt = IMMDT.build(imm=Cat(slot, psn[:20]))
        rpc = Signal(RPCHeader)
        m.d.comb += [
            rpc.magic.eq(REQUEST_MAGIC),
            rpc.function_id.eq(req.function_id),
            rpc.arg_len.eq(req.arg_len),
            rpc.request_id.eq(req.request_id),
            rpc.ptp_timestamp.eq(ts),
        ]
        args = Signal(8 * _ARG_AREA_BYTES)   # argument bytes beyond arg_len and pad are zero
        for i in range(MAX_CALL_ARG_BYTES):
            m.d.comb += args[8 * i:8 * i + 8].eq(
                Mux(i < req.arg_len, req.args[8 * i:8 * i + 8], 0))
        rpc_l4 = Cat(bth, reth, immdt, rpc.as_value(), args)
        ctrl_l4 = CONTROL_RESPONSE.build(
            cmd=reply.cmd, flags=reply.flags, seq=reply.seq, status=reply.status, reserved=0,
            addr=reply.addr, value=reply.value, latched_seq=reply.latched_seq)
        l4 = Signal(len(frame) - 8 * _L4_OFFSET)   # zero beyond the headers: pad to 60 bytes
        with m.If(is_ctrl):
            m.d.comb += l4.eq(ctrl_l4)
        with m.Else():
            m.d.comb += l4.eq(rpc_l4)
        built = Cat(eth_header, ip_header, udp_header, l4)
        assert len(built) == len(frame)

        # --- the beat on tx: frame word 0, the ICRC bytes laid over their lanes ----------------
        take = Signal()
        m.d.comb += take.eq(self.tx.valid & self.tx.ready)
        shifts = sorted({_icrc_offset(a) % 8 for a in arg_lens})
        out_data = Signal(64)
        for lane in range(8):
            crc_byte = Signal(8, name=f"crc_byte_{lane}")
            with m.Switch(crc_shift):
                for s in shifts:
                    with m.Case(s):
                        k = (lane - s) % 8
                        if k < ICRC_BYTES:
                            m.d.comb += crc_byte.eq(icrc.crc[8 * k:8 * k + 8])
            m.d.comb += out_data[8 * lane:8 * lane + 8].eq(
                Mux(crc_lanes[lane], crc_byte, frame[8 * lane:8 * lane + 8]))
        m.d.comb += [
            self.tx.p.data.eq(out_data),
            self.tx.p.first.eq(first_beat),
            self.tx.p.last.eq(last_mark[0]),
            self.tx.p.keep.eq(Mux(last_mark[0], last_keep, 0xFF)),
        ]

        # --- ICRC over V = 8 x 0xFF, frame bytes [14, icrc_pos), masked ------------------------
        # Word k of V goes in when beat k is taken: word 0 is all ones, word k >= 1 is lanes 6-7
        # of beat k and lanes 0-5 of beat k + 1 (frame words 0 and 1 of the shift register).
        # The last word goes in with the beat before the first ICRC byte's, so the ICRC is
        # ready in the cycle that beat is due.
        # The ICRC data terms (icrc_terms) of the word of V that the head beat feeds, held in
        # registers: at each take, computed from the beat behind the head (its word, masked by
        # the next position) and the head's word. (The terms of word 0, all ones, are unused.)
        term_whole = Signal(64)                     # 2 partial terms each
        term_shifted = Signal(64)
        next_word = Cat(frame[112:128], frame[128:176])
        for vidx, lanes in ICRC_WORD_MASKS.items():
            if vidx:
                next_word = next_word | Mux(v_pos[vidx - 1], Const(lanes, 64), Const(0, 64))
        next_whole, next_shifted = icrc_terms(
            next_word, Mux(v_pos[0], Const(2**32 - 1, 32), frame[80:112]), parts=2)
        m.d.comb += [
            icrc.valid.eq(take & v_mark[0]),
            icrc.first.eq(v_pos[0]),
            icrc.last.eq(v_last_mark[0]),
            icrc.last_half.eq(icrc_half),
            icrc.term_whole.eq(term_whole),
            icrc.term_shifted.eq(term_shifted),
        ]
        # The ICRC is ready from the cycle its ``done`` pulses: set by the take that feeds V's
        # last word (a register, so that ``tx.valid`` does not wait on the ICRC's own logic).
        with m.If(take & v_mark[0] & v_last_mark[0]):
            m.d.sync += icrc_ready.eq(1)

        # --- control ---------------------------------------------------------------------------
        with m.FSM(name="tx_fsm"):
            with m.State("IDLE"):
                m.d.comb += [
                    self.ctrl_reply.ready.eq(1),
                    self.call_req.ready.eq(~self.ctrl_reply.valid),
                ]
                with m.If(self.ctrl_reply.valid):
                    m.d.sync += [
                        is_ctrl.eq(1),
                        reply.eq(cr),
                        eth_dst.eq(cr.dst_mac),
                        eth_src.eq(self.config.qsc_mac),
                        ip_src.eq(self.config.qsc_ip),
                        ip_dst.eq(cr.dst_ip),
                        udp_src.eq(CONTROL_PORT),
                        udp_dst.eq(cr.dst_port),
                        ip_total.eq(_CONTROL_UNPADDED_BYTES - _IP_OFFSET),
                        marks.eq(marks.shape().const(frame_marks(CONTROL_FRAME_BYTES, None))),
                    ]
                    m.next = "PREP"
                with m.Elif(self.call_req.valid & ~req_ok):
                    m.d.sync += self.call_dropped.eq(1)
                with m.Elif(self.call_req.valid):
                    m.d.sync += [
                        is_ctrl.eq(0),
                        req.eq(rq),
                        ppu.eq(rq.ppu),
                        ts.eq(self.timestamp),
                        eth_dst.eq(self.config.host_mac),
                        eth_src.eq(self.config.qsc_mac),
                        ip_src.eq(self.config.qsc_ip),
                        ip_dst.eq(self.config.host_ip),
                        udp_src.eq(self.config.udp_src_port),
                        udp_dst.eq(ROCEV2_PORT),
                        p_key.eq(self.config.p_key),
                        dest_qp.eq(qp_sel.host_qpn),
                        ring_va.eq(qp_sel.ring_va),
                        slot_size.eq(qp_sel.slot_size),
                        num_slots.eq(qp_sel.num_slots),
                        rkey.eq(qp_sel.host_rkey),
                        psn.eq(sel_psn),
                        slot.eq(sel_slot),
                    ]
                    with m.Switch(rq.arg_len):
                        for a in arg_lens:
                            with m.Case(a):
                                m.d.sync += [
                                    ip_total.eq(_icrc_offset(a) + ICRC_BYTES - _IP_OFFSET),
                                    marks.eq(marks.shape().const(
                                        frame_marks(rpc_frame_bytes(a), _icrc_offset(a)))),
                                ]
                    for n in range(self.num_ppus):
                        with m.If(rq.ppu == n):
                            m.d.sync += self.tx_psn[n].eq(self.tx_psn[n] + 1)
                    m.next = "PREP"

            with m.State("PREP"):
                # IPv4 checksum stage 1 runs; the ring slot's offset is multiplied out, the slot
                # counter of the request's PPU advances.
                m.d.comb += csum.valid.eq(1)
                m.d.sync += [
                    slot_off.eq(slot * slot_size),
                    ring_va_hi_p1.eq(ring_va[32:] + 1),
                ]
                with m.If(~is_ctrl):
                    for n in range(self.num_ppus):
                        with m.If(ppu == n):
                            m.d.sync += slot_ctr[n].eq(
                                Mux(slot + 1 >= num_slots, 0, slot + 1))
                m.next = "CSUM"

            with m.State("CSUM"):
                # The VA of the slot (first cycle); the checksum is ready (second cycle): load
                # the frame and its beat markers.
                va_lo = ring_va[:32] + slot_off
                m.d.sync += va.eq(Cat(va_lo[:32], Mux(va_lo[32], ring_va_hi_p1, ring_va[32:])))
                with m.If(csum.done):
                    m.d.sync += [
                        frame.eq(built),
                        last_mark.eq(marks.last),
                        crc_wait.eq(marks.crc_wait),
                        crc_lanes.eq(marks.crc_lanes),
                        v_mark.eq(marks.v),
                        v_last_mark.eq(marks.v_last),
                        v_pos.eq(1),
                        last_keep.eq(marks.last_keep),
                        crc_shift.eq(marks.crc_shift),
                        icrc_half.eq(marks.v_half),
                        first_beat.eq(1),
                        icrc_ready.eq(0),
                    ]
                    m.d.sync += sending.eq(1)
                    m.next = "SEND"

            with m.State("SEND"):
                with m.If(take & last_mark[0]):
                    m.d.sync += sending.eq(0)
                    m.next = "IDLE"

        # SEND, as a register of its own: the beats go out from registers only.
        m.d.comb += self.tx.valid.eq(sending & (~crc_wait[0] | icrc_ready))
        with m.If(take):
            m.d.sync += [
                frame.eq(frame >> 64),
                last_mark.eq(last_mark >> 1),
                crc_wait.eq(crc_wait >> 1),
                crc_lanes.eq(crc_lanes >> 8),
                v_mark.eq(v_mark >> 1),
                v_last_mark.eq(v_last_mark >> 1),
                v_pos.eq(v_pos << 1),
                term_whole.eq(next_whole),
                term_shifted.eq(next_shifted),
                first_beat.eq(0),
            ]
            with m.If(last_mark[0]):
                m.d.comb += [self.sent_frame.eq(1), self.sent_rpc.eq(~is_ctrl)]

        return m
