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
from .icrc import ICRC, icrc_mask
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
        m.submodules.icrc = icrc = ICRC()

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
        ts = Signal(64)
        p_key = Signal(16)
        dest_qp = Signal(24)
        psn = Signal(24)
        slot = Signal(12)
        ring_va = Signal(64)
        slot_size = Signal(16)
        rkey = Signal(32)
        frame_len = Signal(range(_FRAME_BYTES + 1))
        icrc_pos = Signal(range(_FRAME_BYTES))      # byte offset of the ICRC in the frame
        icrc_last = Signal(range(_FRAME_WORDS))     # index of the last word of V
        icrc_half = Signal()                        # V ends on a half word
        va = Signal(64)

        frame = Signal(_FRAME_WORDS * 64)
        beat = Signal(range(_FRAME_WORDS))
        last_beat = Signal(range(_FRAME_WORDS))
        last_keep = Signal(8)
        icrc_beat = Signal(range(_FRAME_WORDS + 1))  # first beat that carries ICRC bytes
        icrc_idx = Signal(range(_FRAME_WORDS))
        icrc_run = Signal()
        icrc_ready = Signal()

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
        next_slot = Mux(sel_slot + 1 >= qp_sel.num_slots, 0, sel_slot + 1)
        req_ok = (rq.ppu < self.num_ppus) & (rq.arg_len <= MAX_CALL_ARG_BYTES)

        # Elaboration-time tables indexed by arg_len.
        arg_lens = range(MAX_CALL_ARG_BYTES + 1)
        v_bytes_of = {a: 8 + _icrc_offset(a) - _IP_OFFSET for a in arg_lens}

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

        # --- ICRC over V = 8 x 0xFF, frame bytes [14, icrc_pos), masked ------------------------
        v_flat = Cat(Const(0, 64), frame[8 * _IP_OFFSET:])   # word 0 is masked to all ones
        v_flat = Cat(v_flat, Const(0, -len(v_flat) % 64))
        m.d.comb += [
            icrc.valid.eq(icrc_run),
            icrc.first.eq(icrc_idx == 0),
            icrc.last.eq(icrc_idx == icrc_last),
            icrc.last_half.eq(icrc_half),
            icrc.word.eq(icrc_mask(icrc_idx, v_flat.word_select(icrc_idx, 64))),
        ]
        with m.If(icrc_run):
            m.d.sync += icrc_idx.eq(icrc_idx + 1)
            with m.If(icrc_idx == icrc_last):
                m.d.sync += icrc_run.eq(0)
        with m.If(icrc.done):
            m.d.sync += icrc_ready.eq(1)

        # --- beats: the frame register with the ICRC bytes laid over it ------------------------
        frame_out = Signal(len(frame))
        m.d.comb += frame_out.eq(frame)
        with m.If(~is_ctrl):
            with m.Switch(icrc_pos):
                for a in arg_lens:
                    pos = _icrc_offset(a)
                    with m.Case(pos):
                        m.d.comb += frame_out[8 * pos:8 * (pos + ICRC_BYTES)].eq(icrc.crc)
        m.d.comb += [
            self.tx.p.data.eq(frame_out.word_select(beat, 64)),
            self.tx.p.first.eq(beat == 0),
            self.tx.p.last.eq(beat == last_beat),
            self.tx.p.keep.eq(Mux(beat == last_beat, last_keep, 0xFF)),
        ]

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
                        frame_len.eq(CONTROL_FRAME_BYTES),
                    ]
                    m.next = "PREP"
                with m.Elif(self.call_req.valid & ~req_ok):
                    m.d.sync += self.call_dropped.eq(1)
                with m.Elif(self.call_req.valid):
                    m.d.sync += [
                        is_ctrl.eq(0),
                        req.eq(rq),
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
                        rkey.eq(qp_sel.host_rkey),
                        psn.eq(sel_psn),
                        slot.eq(sel_slot),
                    ]
                    with m.Switch(rq.arg_len):
                        for a in arg_lens:
                            with m.Case(a):
                                m.d.sync += [
                                    ip_total.eq(_icrc_offset(a) + ICRC_BYTES - _IP_OFFSET),
                                    frame_len.eq(rpc_frame_bytes(a)),
                                    icrc_pos.eq(_icrc_offset(a)),
                                    icrc_last.eq((v_bytes_of[a] - 1) // 8),
                                    icrc_half.eq(v_bytes_of[a] % 8 == 4),
                                ]
                    for n in range(self.num_ppus):
                        with m.If(rq.ppu == n):
                            m.d.sync += [
                                slot_ctr[n].eq(next_slot),
                                self.tx_psn[n].eq(self.tx_psn[n] + 1),
                            ]
                    m.next = "PREP"

            with m.State("PREP"):
                # IPv4 checksum stage 1 runs; the ring slot's VA is computed.
                m.d.comb += csum.valid.eq(1)
                m.d.sync += va.eq(ring_va + slot * slot_size)
                m.next = "CSUM"

            with m.State("CSUM"):
                # The checksum is ready: load the whole frame.
                with m.If(csum.done):
                    m.d.sync += [
                        frame.eq(built),
                        beat.eq(0),
                        last_beat.eq((frame_len - 1) >> 3),
                        last_keep.eq(Mux(frame_len[:3] == 0, 0xFF,
                                         (Const(1, 9) << frame_len[:3]) - 1)),
                        icrc_beat.eq(Mux(is_ctrl, _FRAME_WORDS, icrc_pos >> 3)),
                        icrc_idx.eq(0),
                        icrc_run.eq(~is_ctrl),
                        icrc_ready.eq(0),
                    ]
                    m.next = "SEND"

            with m.State("SEND"):
                m.d.comb += self.tx.valid.eq((beat < icrc_beat) | icrc_ready | icrc.done)
                with m.If(self.tx.valid & self.tx.ready):
                    m.d.sync += beat.eq(beat + 1)
                    with m.If(beat == last_beat):
                        m.d.comb += [self.sent_frame.eq(1), self.sent_rpc.eq(~is_ctrl)]
                        m.next = "IDLE"

        return m
