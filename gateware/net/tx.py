"""Transmit path of the QSC network core: RPC requests.

# Ref: IEEE 802.3-2018 3.2 (Ethernet II, 60-byte minimum frame); RFC 791 3.1 (IPv4), RFC 1071
# (header checksum); RFC 768 (UDP; checksum 0 = none); IBTA Vol 1 9.2 (BTH), 9.3.2 (RETH),
# 9.3.4 (ImmDt), 9.8.3 (UC RDMA WRITE), 7.8.1 + Annex A17.4.4 (ICRC); cuda-quantum
# realtime/docs/cudaq_realtime_message_protocol.md (RPCHeader, ring slots, ImmDt {PSN, slot});
# cuda-quantum realtime udp bridge (bridge_impl.cpp, udp_transceiver.cpp: one datagram a slot).

Each :class:`~openqlink.gateware.bus.CallRequest` becomes one RoCEv2 UC
RDMA_WRITE_ONLY_WITH_IMMEDIATE into the host ring of its PPU, or, where the PPU's QP is in UDP
mode (its TRANSPORT register 1), one UDP datagram of the RPC message alone, as CUDA-Q realtime's
udp bridge takes it (control-plane responses have a builder of their own,
:class:`~openqlink.gateware.net.control.ControlReplyBuilder`).
The fields of a request are latched once, when it is taken; the frame is never held
whole. A window of four 64-bit registers (the beat on ``tx`` and the next three frame words)
moves by one word at each take, and the word that enters it is chosen from the fields (an AND-OR
of one-hot selects: most frame bits are constants). The IPv4 header checksum
(:class:`~openqlink.gateware.net.ipv4csum.IPv4Checksum`) and the ICRC bytes are laid over their
lanes on ``tx``. The ICRC runs on one processor of :class:`~openqlink.gateware.net.icrc.ICRCEngine`
(a ``V`` that ends on a half word, 0, 5..8 or 13..16 argument bytes, is fed behind 4 zero
bytes), from the words of ``V`` taken out of the window two beats ahead; it is ready exactly
when the beat that carries it is due, so a frame leaves without gaps whenever ``tx.ready`` stays
high. Where ``V`` ends and the ICRC lies (five request lengths, two lane alignments) is kept in
flip-flops that move with the takes, set from flags latched with the request. The slot's offset
in the ring is counted beside the slot counter (no multiplier).

A UDP-mode request is the same frame with its BTH, RETH and ImmDt (32 bytes, four words) left
out: its RPC message lies in the same lanes as a RoCE request's, four words sooner. The window
loads the same word selects, words 9 up moved four shifts earlier by a one-hot register that
moves with the beat index (``load``), chosen by a flag latched with the request (``udp``); the
lengths, ports and the last beat's keep are constants latched with the request, and the ICRC
flags stay clear (no ICRC; the frame ends at ``udp_end_at``).
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ...memory_map import QSCParams
from ...wire.ethernet import ETHERNET, MIN_FRAME_BYTES, EtherType
from ...wire.ipv4 import IPV4, IpProtocol
from ...wire.roce import BTH, ICRC_BYTES, IMMDT, RETH, Opcode
from ...wire.rpc import HEADER_BYTES, REQUEST_MAGIC, RPCHeader
from ...wire.udp import ROCEV2_PORT, UDP, UDP_CALL_PORT_BASE
from ..bus import MAX_CALL_ARG_BYTES, CallRequest
from ..logic import named
from ..packet import packet_signature
from .common import NetConfig, QPContext
from .icrc import ICRC_WORD_MASKS, ICRCEngine, icrc_terms
from .ipv4csum import IPv4Checksum

__all__ = ["TxBuilder", "rpc_frame_bytes", "udp_call_frame_bytes", "START_LATENCY_CYCLES"]

_ETH_BYTES = ETHERNET.length_bytes
_IP_OFFSET = _ETH_BYTES
_UDP_OFFSET = _IP_OFFSET + IPV4.length_bytes
_L4_OFFSET = _UDP_OFFSET + UDP.length_bytes
#: Offset of the RPC payload (RPCHeader) in a request frame: Eth + IPv4 + UDP + BTH + RETH + ImmDt.
_RPC_OFFSET = _L4_OFFSET + BTH.length_bytes + RETH.length_bytes + IMMDT.length_bytes
_ARG_OFFSET = _RPC_OFFSET + HEADER_BYTES
#: Offset of the RPC payload in a UDP-mode request: Eth + IPv4 + UDP. It lies the BTH, RETH and
#: ImmDt (32 bytes, 4 words) before the RoCE one, in the same lanes: word ``k`` >= 5 of a UDP
#: request is word ``k + 4`` of the RoCE request of the same fields.
_UDP_RPC_OFFSET = _L4_OFFSET
_UDP_SKIP_WORDS = (_RPC_OFFSET - _UDP_RPC_OFFSET) // 8
assert (_RPC_OFFSET - _UDP_RPC_OFFSET) % 8 == 0
#: The first word of a UDP-mode request that follows the UDP header (word 5: the checksum in
#: lanes 0-1, RPCHeader from lane 2).
_UDP_FIRST_MOVED = (_UDP_RPC_OFFSET - 2) // 8
assert _UDP_RPC_OFFSET % 8 == 2


def _or_tree(values: list[Value]) -> Value:
    """The OR of ``values``, as a balanced tree."""
    while len(values) > 1:
        values = [values[k] | values[k + 1] if k + 1 < len(values) else values[k]
                  for k in range(0, len(values), 2)]
    return values[0]


def _padded(arg_len: int) -> int:
    """Bytes of args plus pad for ``arg_len`` argument bytes (RPCHeader is 24 bytes: 4-aligned)."""
    return -(-arg_len // 4) * 4


def _icrc_offset(arg_len: int) -> int:
    """Frame offset in bytes of the ICRC of a request with ``arg_len`` argument bytes."""
    return _ARG_OFFSET + _padded(arg_len)


#: Argument area (args and pad) of the largest call, a multiple of 4 bytes.
_ARG_AREA_BYTES = _padded(MAX_CALL_ARG_BYTES)
#: The argument areas of the requests in bytes (0, 4, 8, 12, 16), one per frame length.
_AREAS = range(0, _ARG_AREA_BYTES + 1, 4)


def _lengths_of(area: int) -> list[int]:
    """The ``arg_len`` values (0..MAX_CALL_ARG_BYTES) whose args and pad take ``area`` bytes."""
    return [a for a in range(MAX_CALL_ARG_BYTES + 1) if _padded(a) == area]


def _v_bytes(area: int) -> int:
    """Length in bytes of the ICRC's ``V`` (8 bytes of ones, IPv4 header to the pad)."""
    return 8 + _ARG_OFFSET + area - _IP_OFFSET


def _behind_zeros(area: int) -> bool:
    """Whether ``V`` ends on a half word (8k + 4 bytes) and is fed behind 4 zero bytes."""
    return _v_bytes(area) % 8 == 4


def _v_last(area: int) -> int:
    """Index of the last 64-bit word of ``V`` as fed (behind 4 zero bytes or not): the take of
    beat ``_v_last`` feeds it."""
    return (_v_bytes(area) + 4 * _behind_zeros(area)) // 8 - 1


def udp_call_frame_bytes(arg_len: int) -> int:
    """Frame length in bytes (FCS excluded) of a UDP-mode request with ``arg_len`` argument
    bytes: Eth + IPv4 + UDP + RPCHeader + args (66..82 bytes, above the 60-byte minimum)."""
    if not 0 <= arg_len <= MAX_CALL_ARG_BYTES:
        raise ValueError(f"arg_len must be 0..{MAX_CALL_ARG_BYTES}, not {arg_len}")
    return max(_UDP_RPC_OFFSET + HEADER_BYTES + arg_len, MIN_FRAME_BYTES)


def rpc_frame_bytes(arg_len: int) -> int:
    """Frame length in bytes (FCS excluded) of an RPC request with ``arg_len`` argument bytes."""
    if not 0 <= arg_len <= MAX_CALL_ARG_BYTES:
        raise ValueError(f"arg_len must be 0..{MAX_CALL_ARG_BYTES}, not {arg_len}")
    return max(_icrc_offset(arg_len) + ICRC_BYTES, MIN_FRAME_BYTES)


_FRAME_BYTES = rpc_frame_bytes(MAX_CALL_ARG_BYTES)
_FRAME_WORDS = -(-_FRAME_BYTES // 8)
#: Shifts of the beat window from the cycle a request is taken to its first beat: the take and
#: the three cycles after it.
_FILL_SHIFTS = 4

#: Cycles from the cycle a request is taken to the cycle its first beat is valid.
START_LATENCY_CYCLES = _FILL_SHIFTS

#: Copies of the builder's ``idle`` flip-flop: one for its control, one per group of field
#: registers and one per group of window registers (each copy enables one group).
_FIELD_GROUPS = 3
_SHIFT_GROUPS = 3
_IDLE_COPIES = 1 + _FIELD_GROUPS + _SHIFT_GROUPS


class TxBuilder(wiring.Component):
    """Builds RPC request frames and sends them on ``tx``.

    Parameters
    ----------
    num_ppus : int
        Number of PPUs (1..16): one QP context, ring-slot counter and PSN each.
    params : QSCParams
        Build parameters; ``params.data_width_bits`` must be 64.

    Members
    -------
    config : In(NetConfig)
        Global network configuration; sampled when a request is taken.
    qp : In(ArrayLayout(QPContext, num_ppus))
        The contexts of the PPUs' own QPs (QP n of PPU n: host QPN, ring VA, R_Key,
        num_slots, slot_size, transport, peer UDP port); sampled likewise.
    timestamp : In(64)
        From :class:`~openqlink.gateware.net.timebase.Timebase`, already in the configured
        format; sampled into ``ptp_timestamp`` in the cycle the request is taken.
    qp_reset : In(num_ppus)
        Bit ``n`` restarts PPU ``n``'s QP (a host configured it): its next request goes with
        PSN 0 into slot 0. A request taken before keeps the PSN and slot it was given.
    call_req : In(stream.Signature(CallRequest))
        RPC requests of the PPUs: ``arg_len`` 0..16 argument bytes from ``args`` (128 bits,
        byte i at bits [8i+7:8i]; the bytes from ``arg_len`` up are sent as zeros). A request
        with ``ppu >= num_ppus`` or ``arg_len > MAX_CALL_ARG_BYTES`` is taken, sends nothing,
        and pulses ``call_dropped``; the next request is taken 2 cycles after it.
    tx : Out(packet_signature())
        Frames to the MAC, 8 bytes per beat, FCS excluded, padded to 60 bytes. Once a frame's
        first beat is valid, every later beat is valid in the cycle after the previous one was
        taken (no gaps of ours inside a frame). Back-pressure: ``tx.ready`` low stalls the
        beat; nothing is lost, and no new request is taken until the frame has left.
    tx_psn : Out(ArrayLayout(24, num_ppus))
        Next PSN of each PPU's QP (reset 0), incremented modulo 2**24 per RoCE request taken.
    sent_frame : Out(1)
        One-cycle strobe when the last beat of a frame is taken (TX_FRAMES).
    sent_rpc : Out(1)
        The same strobe (TX_RPC_REQUESTS): every frame of this builder is an RPC request.
    sent_ppu : Out(range(num_ppus))
        The PPU (the index of its own QP) of the frame ``sent_rpc`` strobes for.
    call_dropped : Out(1)
        One-cycle strobe when a malformed CallRequest is taken and discarded.

    Latency: the first beat is valid :data:`START_LATENCY_CYCLES` cycles after the request was
    taken (4 cycles, whatever the length). A request frame is 102 bytes (13
    beats) with no arguments, 106 bytes (14 beats) with 1..4, 110 bytes (14 beats) with 5..8,
    114 bytes (15 beats) with 9..12 and 118 bytes (15 beats) with 13..16, its ICRC at byte 98,
    102, 106, 110 or 114. The next request is taken in the cycle after the last beat of the
    previous frame was taken.

    UDP-mode request (the QP's ``transport`` 1; CUDA-Q realtime's udp bridge): Ethernet and IPv4
    as below, UDP (``UDP_CALL_PORT_BASE + ppu`` -> ``peer_udp_port``, checksum 0), RPCHeader and
    the ``arg_len`` argument bytes (no pad, no ICRC): 66..82 bytes (9..11 beats), first beat
    after the same :data:`START_LATENCY_CYCLES`. It takes no PSN and no ring slot (``tx_psn``
    and the slot counter stay).

    RPC request frame: Ethernet (host MAC <- QSC MAC), IPv4 (DF, TTL 64, identification 0, UDP),
    UDP (``config.udp_src_port`` -> 4791, checksum 0), BTH (RDMA_WRITE_ONLY_WITH_IMMEDIATE,
    PadCnt, ``config.p_key``, DestQP = ``host_qpn``, PSN), RETH (VA = ``ring_va + slot *
    slot_size``, ``host_rkey``, DMALen = 24 + arg_len), ImmDt ``{PSN[19:0], slot[11:0]}``,
    RPCHeader (CUQR, function_id, arg_len, request_id, ptp_timestamp), args, zero pad to a
    multiple of 4 bytes (PadCnt = -arg_len mod 4), ICRC.
    Slots of each PPU go round-robin from 0 modulo ``num_slots`` (a slot counter at or beyond a
    reduced ``num_slots`` restarts at 0; ``num_slots`` 0 is taken as 1). The slot's offset
    ``slot * slot_size`` is kept beside the slot counter and advanced by ``slot_size`` with it
    (no multiplier): a change of a QP's ``slot_size`` restarts its slot counter at 0.
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
            "qp_reset": In(num_ppus),
            "call_req": In(stream.Signature(CallRequest)),
            "tx": Out(packet_signature(params.data_width_bits)),
            "tx_psn": Out(data.ArrayLayout(24, num_ppus)),
            "sent_frame": Out(1),
            "sent_rpc": Out(1),
            "sent_ppu": Out(range(num_ppus)),
            "call_dropped": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.csum = csum = IPv4Checksum()
        m.submodules.icrc = icrc = ICRCEngine(parts=2)

        m.d.sync += self.call_dropped.eq(0)

        # --- per-PPU state -----------------------------------------------------------------------
        slot_ctr = [Signal(12, name=f"slot_ctr_{n}") for n in range(self.num_ppus)]
        # ``slot_ctr * slot_size``, and the ``slot_size`` it was counted with.
        off_ctr = [Signal(28, name=f"off_ctr_{n}") for n in range(self.num_ppus)]
        size_seen = [Signal(16, name=f"size_seen_{n}") for n in range(self.num_ppus)]

        # --- fields latched when a request is taken (one copy each) ----------------------------
        arg_len = Signal(range(MAX_CALL_ARG_BYTES + 1))
        # ``udp``: the request goes in UDP mode (its QP's TRANSPORT register was 1).
        udp = Signal()
        # The request's length as flags and constants, so that nothing downstream decodes
        # ``arg_len``: ``half`` for a ``V`` fed behind 4 zero bytes, ``v_end_at[w]`` for a RoCE
        # request whose ``V`` ends with word w, ``udp_end_at[w]`` for a UDP request whose last
        # beat is w; ``ip_len`` and ``udp_len`` (the IPv4 total length and UDP length, below 128)
        # and ``last_keep`` (the keep of the frame's last beat).
        half = Signal()
        v_end_at = {w: Signal(name=f"v_end_at_{w}") for w in sorted({_v_last(a) for a in _AREAS})}
        udp_lasts = {(udp_call_frame_bytes(a) - 1) // 8 for a in range(MAX_CALL_ARG_BYTES + 1)}
        udp_end_at = {w: Signal(name=f"udp_end_at_{w}") for w in sorted(udp_lasts)}
        ip_len = Signal(7)
        udp_len = Signal(7)
        last_keep = Signal(8)
        dst_port = Signal(16)                       # UDP destination port
        eth_src = Signal(48)
        ip_src = Signal(32)
        ip_dst = Signal(32)                         # host IP
        port = Signal(16)                           # UDP source port
        p_key = Signal(16)
        dest_qp = Signal(24)
        psn = Signal(24)
        slot = Signal(12)
        ppu = Signal(range(self.num_ppus))
        num_slots = Signal(13)
        rkey = Signal(32)
        function_id = Signal(32)
        request_id = Signal(32)
        args = Signal(8 * _ARG_AREA_BYTES)          # argument bytes beyond arg_len are zero
        ts = Signal(64)
        ring_va = Signal(64)
        # The slot's offset (``slot * slot_size``, from the PPU's offset counter) and the slot
        # size, latched with the request; the offset is added to the ring's VA in two cycles, a
        # half in each.
        slot_off = Signal(28)
        slot_size = Signal(16)
        va_carry = Signal()
        va = Signal(64)

        # --- the beats: a window of four frame words ------------------------------------------
        # ``beat`` is on ``tx``; ``ahead1`` to ``ahead3`` are the next three frame words. A
        # shift moves the window by one word and loads the next word behind it: in IDLE (every
        # cycle) word 0 from the inputs, then word n at shift n from the fields. The shifts
        # 0-3 (the take and the three cycles after it) fill the window; shift 4 + b is the
        # take of beat b. ``ahead3`` is two registers, each loaded with half of the selection
        # of the word (their OR is the word), so that the logic in front of each is small.
        beat = Signal(64)
        ahead1 = Signal(64)
        ahead2 = Signal(64)
        ahead3_parts = [Signal(64, name=f"ahead3_{i}") for i in range(2)]
        ahead3 = ahead3_parts[0] | ahead3_parts[1]
        # ``idle`` enables every field register (about 700 flip-flops) and, with ``fill`` and
        # the take, the window's shift (about 450): copies of it (``__rep``, kept apart by the
        # build), each enabling one group, so that no one enable net spans the whole builder.
        idle_reps = [Signal(init=1, name=f"idle__rep{k}") for k in range(_IDLE_COPIES)]
        idle = idle_reps[0]
        field_idle = idle_reps[1:1 + _FIELD_GROUPS]     # one per group of field registers
        shift_idle = idle_reps[1 + _FIELD_GROUPS:]      # one per group of window registers
        fill = Signal(3)                            # the cycles after the take, one-hot
        pos = Signal(_FRAME_WORDS)                  # one-hot index of the beat on tx
        phase = Cat(idle, fill, pos)                # bit n is set before shift n
        last = Signal()                             # the beat on tx is the frame's last
        sending = Signal()
        icrc_ready = Signal()                       # the ICRC is ready (done has pulsed)

        # --- taking a request ------------------------------------------------------------------
        rq = self.call_req.p
        req_ok = (rq.ppu < self.num_ppus) & (rq.arg_len <= MAX_CALL_ARG_BYTES)
        # Any request is taken (so that ``start`` is one LUT of the valids); a malformed one is
        # dropped in the cycle after (``bad``): nothing after that cycle sees it, and the next
        # request is taken in the cycle after that.
        start = Signal()
        bad = Signal()
        m.d.comb += [
            self.call_req.ready.eq(idle),
            start.eq(idle & self.call_req.valid),
        ]
        with m.If(idle & self.call_req.valid & ~req_ok):
            m.d.sync += self.call_dropped.eq(1)

        # The request's PPU state (combinational).
        qp_sel = self.qp[rq.ppu]
        udp_now = Signal()
        m.d.comb += udp_now.eq(qp_sel.transport)
        cur_slot = Signal(12)
        cur_off = Signal(28)
        sel_slot = Signal(12)
        sel_psn = Signal(24)
        in_ring = Signal()
        for n in range(self.num_ppus):
            with m.If(rq.ppu == n):
                m.d.comb += [cur_slot.eq(slot_ctr[n]), cur_off.eq(off_ctr[n]),
                             sel_psn.eq(self.tx_psn[n])]
        m.d.comb += [in_ring.eq(cur_slot < qp_sel.num_slots),
                     sel_slot.eq(Mux(in_ring, cur_slot, 0))]

        def has_len(lengths: list[int]) -> Value:
            """The request's ``arg_len`` is one of ``lengths`` (a function of its 5 bits)."""
            return Cat(*(rq.arg_len == n for n in lengths)).any()

        def by_len(roce, udp_mode, width: int) -> Value:
            """A constant of ``width`` bits chosen by ``arg_len`` and the mode: ``roce(a)`` or
            ``udp_mode(a)`` for a length ``a`` <= MAX_CALL_ARG_BYTES (0 beyond: dropped)."""
            n = 1 << len(rq.arg_len)
            table = [Const(f(a) if a <= MAX_CALL_ARG_BYTES else 0, width)
                     for f in (roce, udp_mode) for a in range(n)]
            return Array(table)[Cat(rq.arg_len, udp_now)]

        def last_keep_of(frame_bytes: int) -> int:
            return (1 << (frame_bytes % 8 or 8)) - 1

        # The fields load in every IDLE cycle (the last one takes the request): their enables do
        # not wait on the valid.
        fields = [
            bad.eq(~req_ok),
            eth_src.eq(self.config.qsc_mac),
            ip_src.eq(self.config.qsc_ip),
            ip_dst.eq(qp_sel.peer_ip),
            port.eq(Mux(udp_now, UDP_CALL_PORT_BASE + rq.ppu, self.config.udp_src_port)),
            dst_port.eq(Mux(udp_now, qp_sel.peer_udp_port, ROCEV2_PORT)),
            udp.eq(udp_now),
            arg_len.eq(rq.arg_len),
            ip_len.eq(by_len(lambda a: _icrc_offset(a) + ICRC_BYTES - _IP_OFFSET,
                             lambda a: _UDP_RPC_OFFSET + HEADER_BYTES + a - _IP_OFFSET, 7)),
            udp_len.eq(by_len(lambda a: _icrc_offset(a) + ICRC_BYTES - _UDP_OFFSET,
                              lambda a: _UDP_RPC_OFFSET + HEADER_BYTES + a - _UDP_OFFSET, 7)),
            last_keep.eq(by_len(lambda a: last_keep_of(rpc_frame_bytes(a)),
                                lambda a: last_keep_of(udp_call_frame_bytes(a)), 8)),
            half.eq(has_len([n for a in _AREAS if _behind_zeros(a) for n in _lengths_of(a)])),
            *(flag.eq(~udp_now & has_len([n for a in _AREAS if _v_last(a) == w
                                          for n in _lengths_of(a)]))
              for w, flag in v_end_at.items()),
            *(flag.eq(udp_now & has_len([a for a in range(MAX_CALL_ARG_BYTES + 1)
                                         if (udp_call_frame_bytes(a) - 1) // 8 == w]))
              for w, flag in udp_end_at.items()),
            ppu.eq(rq.ppu),
            ts.eq(self.timestamp),
            p_key.eq(self.config.p_key),
            dest_qp.eq(qp_sel.host_qpn),
            ring_va.eq(qp_sel.ring_va),
            num_slots.eq(qp_sel.num_slots),
            rkey.eq(qp_sel.host_rkey),
            # (UDP mode: no PSN nor slot; ImmDt's low bytes, which a UDP request's word 5
            # takes the place of, are zero there: its UDP checksum)
            psn.eq(Cat(Mux(udp_now, 0, sel_psn[:4]), sel_psn[4:])),
            slot.eq(Mux(udp_now, 0, sel_slot)),
            slot_off.eq(Mux(in_ring, cur_off, 0)),
            slot_size.eq(qp_sel.slot_size),
            function_id.eq(rq.function_id),
            request_id.eq(rq.request_id),
            args.eq(Cat(*(Mux(i < rq.arg_len, rq.args[8 * i:8 * i + 8], 0)
                          for i in range(MAX_CALL_ARG_BYTES)))),
        ]
        for k, en in enumerate(field_idle):
            with m.If(en):
                m.d.sync += fields[k::len(field_idle)]
        with m.If(idle & self.call_req.valid & req_ok & ~udp_now):
            for n in range(self.num_ppus):
                with m.If(rq.ppu == n):
                    m.d.sync += self.tx_psn[n].eq(self.tx_psn[n] + 1)

        # --- the three cycles after the take ---------------------------------------------------
        # 1: IPv4 checksum stage 1 (the checksum is ready in cycle 3, long before beat 3 is due);
        # the next slot's wrap and offset are computed, or a malformed request is dropped. 2:
        # the slot counter and offset of the request's PPU advance to them (the next take is a
        # frame away) unless its slot size changed since the take. 2 and 3: the VA of the slot
        # (words 6-7, loaded from shift 6 on), a half in each.
        m.d.comb += csum.valid.eq(phase[1])
        next_wrap = Signal()
        next_off = Signal(28)
        advance = Signal()
        with m.If(phase[1]):
            m.d.sync += [next_wrap.eq(slot + 1 >= num_slots), next_off.eq(slot_off + slot_size),
                         advance.eq(~bad & ~udp)]
        with m.If(phase[2] & advance):
            for n in range(self.num_ppus):
                with m.If(ppu == n):
                    m.d.sync += [slot_ctr[n].eq(Mux(next_wrap, 0, slot + 1)),
                                 off_ctr[n].eq(Mux(next_wrap, 0, next_off))]
        with m.If(phase[2]):
            m.d.sync += Cat(va[:32], va_carry).eq(ring_va[:32] + slot_off)
        with m.If(phase[3]):
            m.d.sync += [va[32:].eq(ring_va[32:] + va_carry), sending.eq(1)]
        # A QP whose slot size changed starts again from slot 0 (its offsets were counted in the
        # old size), and so does a QP restarted by its host, whose PSN also starts again from 0
        # (over the take's increment); this wins over an advance in the same cycle and cancels
        # one to come.
        for n in range(self.num_ppus):
            with m.If((self.qp[n].slot_size != size_seen[n]) | self.qp_reset[n]):
                m.d.sync += [slot_ctr[n].eq(0), off_ctr[n].eq(0),
                             size_seen[n].eq(self.qp[n].slot_size)]
                with m.If(ppu == n):
                    m.d.sync += advance.eq(0)
            with m.If(self.qp_reset[n]):
                m.d.sync += self.tx_psn[n].eq(0)

        # --- the frame words, from the latched fields (combinational) --------------------------
        def ip_header(checksum) -> Value:
            return IPV4.build(tos=0, total_length=ip_len, identification=0,
                              fragment_offset=0, protocol=IpProtocol.UDP.value, src=ip_src,
                              dst=ip_dst, checksum=checksum)

        m.d.comb += csum.header.eq(ip_header(0))
        pad_cnt = Signal(2)
        m.d.comb += pad_cnt.eq(-arg_len)
        bth = BTH.build(opcode=Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE.value, se=0, m=0,
                        pad_cnt=pad_cnt, tver=0, p_key=p_key, fecn=0, becn=0, resv6=0,
                        dest_qp=dest_qp, a=0, resv7=0, psn=psn)
        reth = RETH.build(va=va, r_key=rkey, dma_len=HEADER_BYTES + arg_len)
        immdt = IMMDT.build(imm=Cat(slot, psn[:20]))
        rpc = Signal(RPCHeader)
        m.d.comb += [
            rpc.magic.eq(REQUEST_MAGIC),
            rpc.function_id.eq(function_id),
            rpc.arg_len.eq(arg_len),
            rpc.request_id.eq(request_id),
            rpc.ptp_timestamp.eq(ts),
        ]

        eth = ETHERNET.build(dst=0, src=eth_src, ethertype=EtherType.IPV4.value)
        udp_hdr = UDP.build(src_port=port, dst_port=dst_port, length=udp_len, checksum=0)
        out = Cat(eth, ip_header(0), udp_hdr, bth, reth, immdt, rpc.as_value(), args)
        assert len(out) <= 64 * _FRAME_WORDS      # the checksum: laid over on tx
        rpc_frame = named(m, Cat(out, Const(0, 64 * _FRAME_WORDS - len(out))), "rpc_frame")
        # Words 1 and up (word 0 comes from the inputs in IDLE): the word loaded is an AND-OR of
        # the one-hot phase (many of a word's bits are constants). Word 0 in IDLE, chosen by the
        # copy of ``idle`` that shifts ``ahead3`` (below).
        terms = [Mux(shift_idle[1], ETHERNET.build(dst=qp_sel.peer_mac,
                                                   src=self.config.qsc_mac, ethertype=0)[:64],
                     0)]
        # Words 1-4 are loaded at shifts 1-4 in both modes (a UDP request differs there only in
        # latched fields: lengths and ports); word k >= 5 under ``load[k]``: at shift k in RoCE
        # mode, at shift k - 4 in UDP mode (word k of the RoCE layout is word k - 4 of the UDP
        # one; ImmDt's low bytes, zero in UDP mode, are its UDP checksum), never for words 5-8
        # in UDP mode. ``load`` is a one-hot register (words 5 up) that moves with ``pos``.
        load = Signal(_FRAME_WORDS - _UDP_FIRST_MOVED)
        for k in range(1, _FRAME_WORDS):
            sel = phase[k] if k < _UDP_FIRST_MOVED else load[k - _UDP_FIRST_MOVED]
            terms.append(Mux(sel, rpc_frame[64 * k:64 * k + 64], 0))

        take = Signal()
        m.d.comb += take.eq(self.tx.valid & self.tx.ready)
        # The shift, once per group of window registers, each from its own copy of ``idle``.
        shifts = [Signal(name=f"shift_{k}") for k in range(_SHIFT_GROUPS)]
        for sh, sh_idle in zip(shifts, shift_idle, strict=True):
            m.d.comb += sh.eq(sh_idle | fill.any() | take)
        with m.If(shifts[0]):
            m.d.sync += [beat.eq(ahead1), ahead1.eq(ahead2)]
        with m.If(shifts[1]):
            m.d.sync += [
                ahead2.eq(ahead3),
                *(part.eq(_or_tree(terms[i::len(ahead3_parts)]))
                  for i, part in enumerate(ahead3_parts)),
            ]
        # The cycles after the take follow it unconditionally (a malformed request stops after
        # the first); the beat index moves with the takes.
        m.d.sync += fill.eq(Cat(start, fill[0] & ~bad, fill[1]))
        with m.If(fill[-1]):
            m.d.sync += pos.eq(1)
        with m.Elif(take):
            m.d.sync += pos.eq(Mux(last, 0, pos << 1))
        # ``load[j]`` (word 5 + j) is ``phase[5 + j] & ~udp`` | ``phase[1 + j] & udp`` (words 9
        # up): set from ``pos`` at the take that moves ``pos`` to its shift.
        first_load = pos[_UDP_FIRST_MOVED - 1 - _FILL_SHIFTS]
        load_next = [Const(0, 1)] * len(load)
        load_next[0] = first_load & ~udp
        for j in range(1, len(load)):
            load_next[j] = load[j - 1]
        load_next[_UDP_SKIP_WORDS] = load[_UDP_SKIP_WORDS - 1] | (first_load & udp)
        with m.If(fill[-1]):
            m.d.sync += load.eq(0)
        with m.Elif(take):
            m.d.sync += load.eq(Mux(last, 0, Cat(*load_next)))
        with m.If(start):
            m.d.sync += [r.eq(0) for r in idle_reps]
        with m.If(phase[1] & bad):
            m.d.sync += [r.eq(1) for r in idle_reps]

        # --- where V ends and where the ICRC lies: flip-flops that move with the takes --------
        # The take of beat ``_v_last`` (11, 12 or 13 by the area) feeds V's last word, and the
        # ICRC begins in the next beat. Behind zeros (the ICRC at 8k + 2: bytes 98, 106, 114) it
        # is lanes 2-5 of that beat, the frame's last; else (8k + 6: bytes 102, 110) lanes 6-7
        # of that beat and lanes 0-1 of the next, the last. Each flag is loaded at a take from
        # the beat index and the flags latched with the request (at most 6 inputs), so that
        # ``tx.valid``, the ICRC's ``last``, the lanes' selects and ``last`` read flip-flops.
        v_end = Signal()        # the beat on tx is beat _v_last: its take feeds V's last word
        crc_first = Signal()    # the beat on tx carries the ICRC's first byte
        crc_sel = {"half": Signal(name="crc_half"),    # ICRC bytes 0-3 in lanes 2-5
                   "hi": Signal(name="crc_hi"),        # ICRC bytes 0-1 in lanes 6-7
                   "lo": Signal(name="crc_lo")}        # ICRC bytes 2-3 in lanes 0-1
        crc_lanes = {}          # lane -> (ICRC byte, its select), the same for every area
        keep_last = {}          # behind zeros -> the last beat's keep, the same for every area
        for a in _AREAS:
            off = _icrc_offset(a)
            assert off // 8 == _v_last(a) + 1 and off % 8 == (2 if _behind_zeros(a) else 6)
            assert (rpc_frame_bytes(a) - 1) // 8 == off // 8 + (not _behind_zeros(a))
            for k in range(ICRC_BYTES):
                word, lane = divmod(off + k, 8)
                role = "half" if _behind_zeros(a) else ("hi" if word == off // 8 else "lo")
                assert crc_lanes.setdefault(lane, (k, role)) == (k, role)
            keep = (1 << (rpc_frame_bytes(a) % 8)) - 1
            assert keep_last.setdefault(_behind_zeros(a), keep) == keep
        assert sorted(crc_lanes) == list(range(8))

        # --- the beat on tx, the checksum and the ICRC bytes laid over their lanes -------------
        # Each lane has one ICRC byte it can carry, under one select (``crc_sel``). The IPv4
        # checksum is at bytes 24-25 (beat 3, lanes 0-1); in the window those are zero (V has
        # them masked), so that the checksum needs to be ready only when beat 3 is due.
        csum_word, csum_lane = divmod(_IP_OFFSET + IPV4.byte_offset("checksum"), 8)
        csum_bytes = {csum_lane: csum.checksum[8:16], csum_lane + 1: csum.checksum[:8]}
        out_data = Signal(64)
        for lane, (k, role) in crc_lanes.items():
            data = beat[8 * lane:8 * lane + 8]
            if lane in csum_bytes:
                data = Mux(pos[csum_word], csum_bytes[lane], data)
            m.d.comb += out_data[8 * lane:8 * lane + 8].eq(
                Mux(crc_sel[role], icrc.crc[8 * k:8 * k + 8], data))
        for a in range(MAX_CALL_ARG_BYTES + 1):
            assert last_keep_of(rpc_frame_bytes(a)) == keep_last[_behind_zeros(_padded(a))]
        m.d.comb += [
            self.tx.p.data.eq(out_data),
            self.tx.p.first.eq(pos[0]),
            self.tx.p.last.eq(last),
            self.tx.p.keep.eq(Mux(last, last_keep, 0xFF)),
        ]

        # --- ICRC over V = 8 x 0xFF, frame bytes [14, icrc_pos), masked ------------------------
        # V is 92..108 bytes (``_v_bytes``). With 1..4 or 9..12 argument bytes it is 96 or 104
        # bytes (12 or 13 words); with 0, 5..8 or 13..16, 92, 100 or 108 bytes, fed behind 4
        # zero bytes (the words of ICRCEngine's shifted processor, in its whole one:
        # ``first_half``), 12, 13 or 14 words. Word k >= 1 is frame bytes [8k + 6, 8k + 14)
        # (lanes 6-7 of beat k, lanes 0-5 of beat k + 1), or [8k + 2, 8k + 10) behind the
        # zeros. It is taken from the window into ``v_word`` (masked) at shift k + 2, its data
        # terms are computed from there at the next shift, and it goes in when beat k is taken
        # (shift k + 4). The last word (``_v_last``) goes in with the beat before the first ICRC
        # byte's, so the ICRC is ready in the cycle that beat is due; the beats after it are not
        # fed (``icrc_ready``). (The terms of word 0, all ones, are unused.)
        masked = [8 * w + lane for w, lanes in ICRC_WORD_MASKS.items() for lane in range(8)
                  if (lanes >> 8 * lane) & 0xFF]
        v_mask = Const(0, 64)
        for zeros in (0, 1):
            for w in {(b + 4 * zeros) // 8 for b in masked} - {0}:
                lanes = sum(0xFF << 8 * ((b + 4 * zeros) % 8) for b in masked
                            if (b + 4 * zeros) // 8 == w)
                hit = phase[w + 2] & (half if zeros else ~half)
                v_mask = v_mask | Mux(hit, Const(lanes, 64), Const(0, 64))
        v_word = Signal(64)
        v_term = Signal(64)                         # 2 partial terms
        with m.If(shifts[2]):
            m.d.sync += [
                v_word.eq(Mux(half, Cat(ahead2[16:64], ahead3[0:16]),
                              Cat(ahead2[48:64], ahead3[0:48])) | v_mask),
                v_term.eq(icrc_terms(v_word, Const(0, 32), parts=2)[0]),
            ]
        m.d.comb += [
            icrc.valid.eq(take & ~icrc_ready),
            icrc.first.eq(pos[0]),
            icrc.first_half.eq(half),
            icrc.last.eq(v_end),
            icrc.term_whole.eq(v_term),
        ]
        # The ICRC is ready from the cycle its ``done`` pulses: set by the take that feeds V's
        # last word (a register, so that ``tx.valid`` does not wait on the ICRC's own logic).
        with m.If(take & v_end):
            m.d.sync += icrc_ready.eq(1)
        m.d.comb += self.tx.valid.eq(sending & ~(crc_first & ~icrc_ready))

        # --- the flags of the next beat, and the frame's end -----------------------------------
        with m.If(take):
            m.d.sync += [
                v_end.eq(_or_tree([pos[w - 1] & flag for w, flag in v_end_at.items()])),
                crc_first.eq(v_end),
                crc_sel["half"].eq(v_end & half),
                crc_sel["hi"].eq(v_end & ~half),
                crc_sel["lo"].eq(crc_sel["hi"]),
                # A request ends with its ICRC's first beat behind zeros, else with the beat
                # after it.
                # A UDP request (no ICRC) ends with beat ``udp_end_at``.
                last.eq((v_end & half) | crc_sel["hi"] |
                        _or_tree([pos[w - 1] & flag for w, flag in udp_end_at.items()])),
            ]
            with m.If(last):
                m.d.comb += [self.sent_frame.eq(1), self.sent_rpc.eq(1)]
                m.d.sync += [*(r.eq(1) for r in idle_reps), sending.eq(0), icrc_ready.eq(0)]
        m.d.comb += self.sent_ppu.eq(ppu)

        return m
