"""Receive path: MAC frames -> checks -> commit engine -> internal bus commands (rti domain).

# Ref: IEEE 802.3-2018 3.2 (Ethernet II); RFC 791 3.1 and RFC 1071/1624 (IPv4 header and
# checksum); RFC 768 (UDP); IBTA Vol 1 Release 1.4 9.2 (BTH), 9.3.2 (RETH), 9.3.4 (ImmDt), 9.7.6
# and 9.8.3 (UC receive rules, PSN), 10.9.3 (P_Key check), 7.8.1 (ICRC); IBTA Annex A17 (RoCEv2)
# A17.4; rdma-core rxe ``check_psn`` (UC), ``check_rkey`` (R_Key and range).

Store and forward. Every frame is written into a ring buffer of 64-bit words while its first
:data:`HEADER_BYTES` bytes are captured in registers and its ICRC is computed
(:class:`~openqlink.gateware.net.icrc.ICRC`). Header fields are read only through the shared
:class:`~openqlink.wire.header.Header` views. Three cycles after the last beat (the checks are
registered in two stages, c1 and s2, and decided from s2) the frame is either accepted or dropped
and counted under exactly one :class:`~openqlink.gateware.net.common.DropReason`, checked in this
order (the first failing check names the reason); the counter strobes show one cycle later:

1. MAC: the MAC flagged the frame bad (``error`` on its last beat).
2. ETH: shorter than 14 bytes, destination neither the QSC MAC nor broadcast, EtherType neither
   IPv4 nor ARP.
   ARP (RFC 826): not a request (hardware Ethernet, protocol IPv4, lengths 6 and 4, operation 1)
   for the QSC's IP: counted ARP. A request passes to the responder (``reply``); no ARP packet
   teaches the QSC an address.
3. IP: version not 4, IHL not 5, bad header checksum (0x0000 or 0xFFFF folded sum accepted),
   ``total_length`` < 20 or > frame length - 14 (padding allowed), fragment (MF or offset), dst
   not the QSC IP, protocol neither UDP nor ICMP.
   ICMP (RFC 792): not an echo request (type 8, code 0, at least 8 bytes), a checksum that does
   not verify, or a frame longer than :data:`ECHO_MAX_FRAME_BYTES`: counted ICMP. An echo request
   passes to the responder.
4. UDP: ``length`` != ``total_length`` - 20, destination port neither 4791 (with RX_ENABLE set:
   off from reset) nor 8192 nor the UDP port ``UDP_CALL_PORT_BASE + q`` of a PPU's own QP ``q``
   in UDP mode (TRANSPORT 1), a RoCEv2 datagram shorter than BTH + ICRC or not a multiple of 4
   bytes, a control datagram shorter than the 14-byte request (10 bytes for a RD_DWORD, the
   form without a data word that the Holoscan Sensor Bridge host sends), a WR_BLOCK or
   RD_BLOCK of more than BLOCK_MAX_PAIRS (183) pairs; then a non-zero UDP
   checksum that does not verify (RFC 1122 4.1.3.4).
5. ICRC (RoCEv2 from here on): the received ICRC differs from the computed one.
6. OPCODE: not a UC SEND or RDMA WRITE (0x20-0x2B, IBTA Vol 1 table 38), or TVer != 0.
7. PKEY: P_Key low 15 bits differ from the configured P_Key, or neither has the full-member bit.
8. QPN: DestQP is no QP's QSC_QPN (``qpn_base + q`` for QP ``q`` from reset; the lowest QP
   whose QSC_QPN matches takes the packet). The QP reaches one PPU, ``n`` below: PPU ``q`` for
   a PPU's own QP, the one its PPU register names for the others.
9. PEER: the source MAC or IP is not the QP's peer (its PEER_MAC, PEER_IP), as rxe checks a
   connected QP's addresses.
10. PSN: a MIDDLE or LAST while the QP has no message open, or of the other kind (a SEND inside
    a WRITE message or the reverse), or whose PSN is not the expected one (``epsn``).
11. LENGTH: the datagram is too short for its extension headers and PadCnt.
12. VA (a WRITE ONLY or FIRST, DMALen != 0): VA[63:32] != 0, VA not 4-byte aligned, VA not in
    an RDMA region of PPU ``n`` (:func:`openqlink.memory_map.regions`; the response mailbox is
    SEND-only).
13. RKEY (same): R_Key differs from the region's R_Key in PPU ``n``'s QP context, or that key
    is not valid: not written since reset or since the QP's HOST_QPN was (closed by default).
14. VA (same): [VA, VA + DMALen) leaves the region: a FIRST is checked once for its whole
    message, so no byte of a message lands outside its region. A zero-length WRITE's VA and
    R_Key are not checked (IBTA Vol 1 C9-88): it writes nothing, and its ImmDt reaches no TAIL.
15. IMMDT: an RDMA WRITE_WITH_IMMEDIATE (ONLY, or the LAST of a message) into the instruction
    ring whose ImmDt, the ring's new TAIL, is not an index of the ring (>= ``imem_depth``): the
    whole packet is dropped (its payload too), where the TAIL register would otherwise take
    ImmDt's low bits.
16. LENGTH (payload: UDP payload - BTH - RETH - ImmDt - pad - ICRC; PMTU: the QP's PMTU
    register, 1024 bytes from reset): a payload over the PMTU; a FIRST or MIDDLE not of exactly
    a PMTU; an empty LAST; a WRITE whose payloads do not add up to its DMALen (an ONLY's
    payload is its DMALen; a FIRST's is less; a MIDDLE's leaves some; a LAST's is what was
    left); a SEND message over the QP's RESPONSE_BYTES (64 from reset). Of a SEND longer than
    the mailbox (CUDA-Q's GPU bridge SENDs 24 + its payload size whatever ``result_len`` says)
    the first MAILBOX_BYTES are committed, and the MAILBOX_COMMIT carries that count.
17. OVERFLOW: the frame did not fit the receive buffer, or the descriptor / control request queue
    is full, or a block's pairs after its first did not fit the pair ring (only frames that
    pass every other check count here).

UDP mode (CUDA-Q realtime's udp bridge; cuda-quantum realtime bridge_impl.cpp,
udp_transceiver.cpp): a datagram to QP ``q``'s UDP port is checked after the UDP checks as a
SEND ONLY of QP ``q`` whose payload is the UDP payload: PEER (9) also compares the source UDP
port with the QP's PEER_UDP_PORT; LENGTH: a payload shorter than an RPCResponse (24 bytes) or
longer than the QP's RESPONSE_BYTES (no PMTU); the checks of RoCEv2 alone (ICRC, OPCODE, PKEY,
PSN, VA, RKEY, IMMDT) do not apply. It is committed as a SEND ONLY (its first MAILBOX_BYTES into
the mailbox, a MAILBOX_COMMIT), counts RX_RPC_RESPONSES and the QP's counters (not
RX_ROCE_ACCEPTED, not PSN_GAP) and leaves the QP's ``epsn`` and open message alone.

PSN and messages (UC, IBTA Vol 1 9.8.3; rxe ``check_psn``, ``check_op_seq``): a FIRST or ONLY is
accepted whatever its PSN and resynchronises the expected PSN (``epsn``; a PSN other than the
expected one counts PSN_GAP and the packet is kept); a FIRST opens a message, and abandons one
left open (its bytes already written stay). MIDDLE and LAST must follow in sequence (check 10).
A packet of the QP (it passed checks 1-9) that is not taken, for any reason, overflow included,
closes the QP's open message: the rest of it is dropped (DROP_PSN) up to the next FIRST or ONLY.
Every packet taken moves ``epsn`` to its PSN + 1 (24 bits, wrapping). A write of the QP's
HOST_QPN (a host configuring it) closes its message and sets ``epsn`` to 0.

Accepted RDMA WRITEs and SENDs go to the descriptor queue of the :class:`CommitEngine`, which
reads the payload back from the buffer, realigns it to the destination and emits
``BusCommand`` WRITEs: a WRITE ONLY or FIRST lands at its VA, a MIDDLE or LAST behind the bytes
before it. A WRITE_WITH_IMMEDIATE (ONLY or LAST) into a PPU's instruction region ends with a
WRITE of ImmDt to that PPU's TAIL register (into other regions ImmDt is ignored). A SEND ONLY or
FIRST lands its first MAILBOX_BYTES in the mailbox (a FIRST carries a PMTU, more than that), a
MIDDLE lands nothing, a SEND ONLY or LAST ends with a MAILBOX_COMMIT; a SEND's ImmDt is not
delivered (the mailbox has no place for it). Nothing of a packet reaches the bus before its ICRC
checked good (commit rule).
Accepted control-plane requests go to ``ctrl_req``; a block's pairs after its first to the pair
ring (``pairs``), written from beat 7 on as the frame arrives and committed at the decision.

``rx.ready`` is always high: a MAC cannot be back-pressured; a full buffer drops frames instead.
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ...memory_map import (
    MAILBOX_BYTES,
    MAILBOX_OFFSET,
    PPU_BASE,
    PPU_STRIDE,
    QP_COUNTERS,
    QSCParams,
    ppu_base,
    ppu_reg,
    regions,
)
from ...wire.arp import ARP, ARP_HTYPE_ETHERNET, ArpOperation
from ...wire.control import (
    BLOCK_MAX_PAIRS,
    CONTROL_BLOCK_HEADER,
    CONTROL_PAIR,
    CONTROL_REQUEST,
    RD_DWORD_SHORT_BYTES,
    Command,
)
from ...wire.ethernet import ETHERNET, EtherType
from ...wire.header import Header
from ...wire.icmp import ICMP_ECHO, IcmpType
from ...wire.ipv4 import IPV4, IpProtocol
from ...wire.roce import BTH, ICRC_BYTES, IMMDT, PATH_MTU_BYTES, RETH, Opcode
from ...wire.rpc import HEADER_BYTES as RPC_RESPONSE_BYTES
from ...wire.udp import CONTROL_PORT, ROCEV2_PORT, UDP, UDP_CALL_PORT_BASE
from .. import bram
from ..bus import BusCommand, BusOp
from ..logic import kept, named
from ..packet import PingPongSlice, packet_signature
from .common import COUNTER_INDEX, DropReason, NetConfig, QPContext
from .control import PAIR_RING_DEPTH, ControlRequest, PairPortSignature
from .icrc import ICRC_WORD_MASKS, ICRCEngine, icrc_terms
from .regs import NUM_COUNTERS, NUM_QP_COUNTERS

__all__ = ["RoCEReceiver", "CommitEngine", "commit_descriptor_layout", "HEADER_BYTES",
           "COMMIT_LATENCY_CYCLES", "REPLY_LAYOUT", "REPLY_LATENCY_CYCLES",
           "ECHO_MAX_FRAME_BYTES"]

# Byte offsets of the headers in a frame (IPv4 without options).
_ETH_AT = 0
_IP_AT = _ETH_AT + ETHERNET.length_bytes
_UDP_AT = _IP_AT + IPV4.length_bytes
_L4_AT = _UDP_AT + UDP.length_bytes          # BTH, or the control request
_RETH_AT = _L4_AT + BTH.length_bytes
_IMM_AT = _RETH_AT + RETH.length_bytes

#: UDP lengths of a block request: its header, then 1..BLOCK_MAX_PAIRS pairs.
_BLOCK_FIXED_UDP = UDP.length_bytes + CONTROL_BLOCK_HEADER.length_bytes
_BLOCK_MIN_UDP = _BLOCK_FIXED_UDP + CONTROL_PAIR.length_bytes
_BLOCK_MAX_UDP = _BLOCK_FIXED_UDP + BLOCK_MAX_PAIRS * CONTROL_PAIR.length_bytes

#: The IPv4 header seen as ten big-endian 16-bit words, for its checksum (RFC 1071).
_IPV4_WORDS = Header("IPv4Words", [(f"w{i}", 16) for i in range(IPV4.length_bytes // 2)],
                     ref="RFC 1071")

#: Bytes of each frame captured in registers: Ethernet + IPv4 + UDP + BTH + RETH + ImmDt, rounded
#: up to whole 64-bit beats.
HEADER_BYTES = -(-(_IMM_AT + IMMDT.length_bytes) // 8) * 8
_HEADER_BEATS = HEADER_BYTES // 8

#: What the receiver tells the responder about a frame it should answer: ``valid`` for one
#: cycle, :data:`REPLY_LATENCY_CYCLES` after the frame's last beat; ``arp``: an ARP request for
#: the QSC's IP (else an ICMP echo request to it), every check passed.
REPLY_LAYOUT = data.StructLayout({"valid": 1, "arp": 1})

#: Cycles from a frame's last beat to its ``reply`` strobe (the decision 3, registered 1).
REPLY_LATENCY_CYCLES = 4

#: Bytes of the longest frame (FCS stripped) whose echo request is answered: the responder's
#: buffer holds one such frame (a standard 1500-byte MTU's).
ECHO_MAX_FRAME_BYTES = 1514

#: A QP's open message (see the receiver's ``msg_*`` state), as the decision writes it.
#: ``left``: bytes, at most a region's length (within a PPU window) or RESPONSE_BYTES (13 bits).
_LEFT_BITS = max(PPU_STRIDE.bit_length(), 13)
_MSG_LAYOUT = data.StructLayout({"open": 1, "send": 1, "imem": 1, "addr": 32,
                                 "left": _LEFT_BITS})

#: Cycles from a frame's last beat to its first bus command (commit engine idle, bus ready):
#: decision 3 (header checks 2, the decision 1), descriptor queue 1, commit engine 4.
COMMIT_LATENCY_CYCLES = 8

_BROADCAST = (1 << 48) - 1
#: UDP bytes of a RoCEv2 datagram besides the extension headers, payload and pad bytes.
_ROCE_FIXED_BYTES = UDP.length_bytes + BTH.length_bytes + ICRC_BYTES


def commit_descriptor_layout(ptr_bits: int) -> data.StructLayout:
    """What the receiver tells the :class:`CommitEngine` about one accepted packet.

    ``ptr_bits`` is log2 of the buffer depth in 64-bit words. Output word ``j``
    (``0 <= j < nwords``) goes to bus word ``dst_word + j`` and holds bytes
    ``[8*shift, 8*shift + 8)`` of buffer words ``src_word + j`` and ``src_word + j + 1``
    (concatenated, lane order), under byte enables ``first_be`` (j = 0) and ``last_be``
    (j = nwords - 1); ``has_words`` is ``nwords != 0``. ``trailer`` follows when
    ``has_trailer``. ``end`` is the buffer pointer
    (with its wrap bit) one past the packet's last word, released when the packet is done.
    """
    return data.StructLayout({
        "src_word": ptr_bits,
        "shift": 3,
        "nwords": ptr_bits + 1,
        "has_words": 1,
        "last_word": 1,
        "dst_word": 29,
        "first_be": 8,
        "last_be": 8,
        "has_trailer": 1,
        "trailer": BusCommand,
        "end": ptr_bits + 1,
    })


class HeadFIFO(wiring.Component):
    """A synchronous FIFO whose oldest entry is held in a register.

    Same behaviour as :class:`amaranth.lib.fifo.SyncFIFO` of the same depth (an entry written
    is readable in the next cycle; ``w_rdy`` is low while ``depth`` entries are held, even in
    a cycle that reads; ``w_en`` may only be high with ``w_rdy``, which is not checked again
    here), but ``r_data`` and ``r_rdy`` come straight from registers: an entry
    written while the head is free (or leaving) goes to the head, others wait in a store of
    ``depth - 1`` entries that refills the head. ``w_rdy`` is a register too.

    Members
    -------
    w_data : In(width), w_en : In(1), w_rdy : Out(1)
        Write side.
    r_data : Out(width), r_en : In(1), r_rdy : Out(1)
        Read side (first-word fall-through).
    """

    def __init__(self, width: int, depth: int):
        if depth < 1:
            raise ValueError(f"depth must be at least 1, not {depth}")
        self.width = width
        self.depth = depth
        super().__init__({
            "w_data": In(width), "w_en": In(1), "w_rdy": Out(1),
            "r_data": Out(width), "r_en": In(1), "r_rdy": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        inner_depth = self.depth - 1
        inner_level = Signal(range(inner_depth + 1))
        level = Signal(range(self.depth + 1))
        full = Signal()

        def incr(ptr):
            return Mux(ptr == inner_depth - 1, 0, ptr + 1)

        do_write = Signal()
        do_read = Signal()
        m.d.comb += [
            self.w_rdy.eq(~full),
            do_write.eq(self.w_en),
            do_read.eq(self.r_en & self.r_rdy),
        ]
        refill = Signal()                     # the head is free at the next edge
        inner_read = Signal()
        inner_empty = Signal()
        m.d.comb += [
            refill.eq(~self.r_rdy | self.r_en),
            inner_empty.eq(inner_level == 0),
        ]
        inner_data = Signal(self.width)
        # A free head takes ``w_data`` whether or not it is written (``r_rdy`` says): no write
        # strobe in front of the head's data.
        with m.If(refill):
            with m.If(~inner_empty):
                m.d.comb += inner_read.eq(1)
                m.d.sync += [self.r_data.eq(inner_data), self.r_rdy.eq(1)]
            with m.Else():
                m.d.sync += [self.r_data.eq(self.w_data), self.r_rdy.eq(do_write)]
        # ``w_en`` comes last (its strobe is the slowest input): each register the write side
        # updates takes the value for a write or for none, both ready from the read side's
        # registers and kept apart, chosen by ``w_en`` in one LUT.
        head_takes = kept(m, refill & inner_empty, "head_takes")
        to_inner = Signal()
        m.d.comb += to_inner.eq(do_write & ~head_takes)
        if inner_depth:
            m.submodules.storage = storage = Memory(shape=self.width, depth=inner_depth,
                                                    init=[])
            wport = storage.write_port()
            rport = storage.read_port(domain="comb")
            produce = Signal(range(inner_depth))
            consume = Signal(range(inner_depth))
            m.d.comb += [
                rport.addr.eq(consume),
                inner_data.eq(rport.data),
                wport.addr.eq(produce),
                wport.data.eq(self.w_data),
                # Every write lands in the store, whether or not it goes to the head instead
                # (then ``produce`` stays and the next write overwrites it): a write is only
                # allowed while fewer than ``depth`` entries are held, and the store holds
                # entries only while the head does, so the store is not full and the slot at
                # ``produce`` holds no entry. The write enable is ``w_en`` alone, not the
                # read side's ``r_en``.
                wport.en.eq(do_write),
            ]
            with m.If(to_inner):
                m.d.sync += produce.eq(incr(produce))
            with m.If(inner_read):
                m.d.sync += consume.eq(incr(consume))
            inner_none = kept(m, inner_level - inner_read, "inner_none")
            inner_write = kept(m, Mux(head_takes, inner_level - inner_read,
                                      inner_level + 1 - inner_read), "inner_write")
            m.d.sync += inner_level.eq(Mux(do_write, inner_write, inner_none))
        level_write = kept(m, Mux(do_read, level, level + 1), "level_write")
        level_none = kept(m, Mux(do_read, level - 1, level), "level_none")
        full_write = kept(m, Mux(do_read, full, level == self.depth - 1), "full_write")
        full_none = kept(m, ~do_read & full, "full_none")
        m.d.sync += [level.eq(Mux(do_write, level_write, level_none)),
                     full.eq(Mux(do_write, full_write, full_none))]
        return m


def _csa4(words: list[Value], width: int) -> tuple[Value, Value]:
    """Four words reduced to two (sum and carry words, ``width`` bits, their sum is the words'
    sum): two levels of 3:2 carry-save LUTs, no carry chain."""
    def csa(a: Value, b: Value, c: Value) -> tuple[Value, Value]:
        a, b, c = (x.as_unsigned() for x in (a, b, c))
        return (a ^ b ^ c)[:width], Cat(Const(0, 1), (a & b) | (a & c) | (b & c))[:width]

    s, k = csa(*words[:3])
    return csa(s, k, words[3])


def _sum4(words: list[Value], width: int) -> Value:
    """The sum of four words, ``width`` bits wide: :func:`_csa4` and one carry chain (three
    chains in series when added one after another)."""
    s, k = _csa4(words, width)
    return (s + k)[:width]


def _byte_mask(be: Value) -> Value:
    """The 64-bit mask with byte lane ``i`` all ones where ``be[i]`` is set."""
    return Cat(*(be[i].replicate(8) for i in range(8)))


class CommitEngine(wiring.Component):
    """Reads accepted packets back from the receive buffer and emits their bus commands.

    Parameters
    ----------
    ptr_bits : int
        log2 of the receive buffer depth in 64-bit words.

    Members
    -------
    desc : In(stream.Signature(commit_descriptor_layout(ptr_bits)))
        One descriptor per accepted packet, taken while idle.
    rd_addr, rd_en : Out(ptr_bits), Out(1)
        Synchronous read port of the buffer (data one cycle after the address). ``rd_en`` is
        always high: to hold the port's output the engine presents the same address again (no
        enable logic between the block RAM's output and ``rd_word``, the register the engine
        takes it into).
    rd_data : In(64)
        Buffer word read.
    free_ptr : Out(ptr_bits + 1)
        Buffer words before this pointer (with wrap bit) are no longer needed; advanced to the
        descriptor's ``end`` once the packet's last word has been read.
    bus_cmd : Out(stream.Signature(BusCommand))
        WRITEs of the payload, then the trailer. ``valid`` is a register and ``payload`` one of
        two registers (:class:`~openqlink.gateware.packet.PingPongSlice`); while ``ready`` is
        low the engine produces one more command (into the second register) and then stalls,
        so a packet's commands are contiguous and ``ready`` only reaches three flip-flops.
    busy : Out(1)
        A packet is in progress or a command is pending: the bus arbiter must not switch.

    Latency: the first command is valid 4 cycles after the descriptor is taken (the first
    buffer read is issued in the cycle the descriptor is taken; buffer read 1 cycle, its output
    register 1, realignment register 1); then one command per cycle while ``ready`` is high.
    Data lanes whose byte enable is low are zero.
    """

    def __init__(self, ptr_bits: int):
        self.ptr_bits = ptr_bits
        super().__init__({
            "desc": In(stream.Signature(commit_descriptor_layout(ptr_bits))),
            "rd_addr": Out(ptr_bits),
            "rd_en": Out(1),
            "rd_data": In(64),
            "free_ptr": Out(ptr_bits + 1),
            "bus_cmd": Out(stream.Signature(BusCommand)),
            "busy": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        d = Signal(commit_descriptor_layout(self.ptr_bits))
        rd = Signal(self.ptr_bits)            # next buffer word to read
        # The buffer's output, registered (reset-less: the board build makes it the block
        # RAM's output register).
        rd_word = Signal(64, reset_less=True)
        lo = Signal(64)                       # the word before rd_word
        dst = Signal(29)                      # bus word of the next command
        left = Signal(self.ptr_bits + 1)      # commands of the payload still to emit
        first_word = Signal()                 # the next command is the payload's first
        last_word = Signal()                  # the next command is the payload's last
        out = self.bus_cmd

        # Commands leave through a two-entry buffer; the engine steps while the buffer takes
        # (``step`` is then a flip-flop). The consumer's ``ready`` comes from the crossing into
        # ``dtd``, through the top's guard and the bus arbiter: it reaches the buffer's read
        # pointer and flags alone, not the enables of its hundred-odd payload registers.
        m.submodules.out_slice = out_slice = PingPongSlice(BusCommand)
        wiring.connect(m, out_slice.o, wiring.flipped(out))
        made = out_slice.i.valid                # a command is produced this cycle ...
        made_cmd = out_slice.i.payload          # ... this one
        step = out_slice.i.ready

        be = Signal(8)
        m.d.comb += be.eq(Mux(first_word, d.first_be, 0xFF) & Mux(last_word, d.last_be, 0xFF))
        word = Signal(64)
        m.d.comb += word.eq(Cat(lo, rd_word).bit_select(d.shift * 8, 64))

        # The read pipeline (address -> buffer -> rd_word -> lo) advances with ``advance``; in
        # other cycles the address of the cycle before is presented again.
        advance = Signal()
        held = Signal(self.ptr_bits)
        m.d.comb += [
            self.rd_addr.eq(Mux(advance, rd, held)),
            self.rd_en.eq(1),
        ]
        m.d.sync += held.eq(self.rd_addr)
        with m.If(advance):
            m.d.sync += [rd.eq(rd + 1), rd_word.eq(self.rd_data), lo.eq(rd_word)]

        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.comb += self.desc.ready.eq(1)
                p = self.desc.payload
                with m.If(self.desc.valid):
                    m.d.sync += [
                        d.eq(p),
                        dst.eq(p.dst_word),
                        left.eq(p.nwords),
                        first_word.eq(1),
                        last_word.eq(p.last_word),
                    ]
                    with m.If(p.has_words):
                        # the first read goes out now, from the descriptor's own address
                        m.d.comb += self.rd_addr.eq(p.src_word)
                        m.d.sync += rd.eq(p.src_word + 1)
                        m.next = "PRIME0"
                    with m.Elif(p.has_trailer):
                        m.next = "TRAILER"
                    with m.Else():
                        m.d.sync += self.free_ptr.eq(p.end)

            with m.State("PRIME0"):
                m.d.comb += advance.eq(1)
                m.next = "PRIME1"

            with m.State("PRIME1"):
                m.d.comb += advance.eq(1)
                m.next = "DATA"

            with m.State("DATA"):
                with m.If(step):
                    m.d.comb += advance.eq(1)
                    m.d.sync += [
                        left.eq(left - 1),
                        dst.eq(dst + 1),
                        first_word.eq(0),
                        last_word.eq(left == 2),
                    ]
                    m.d.comb += [
                        made.eq(1),
                        made_cmd.op.eq(BusOp.WRITE),
                        made_cmd.word_addr.eq(dst),
                        made_cmd.be.eq(be),
                        made_cmd.data.eq(word & _byte_mask(be)),
                    ]
                    with m.If(last_word):
                        with m.If(d.has_trailer):
                            m.next = "TRAILER"
                        with m.Else():
                            m.d.sync += self.free_ptr.eq(d.end)
                            m.next = "IDLE"

            with m.State("TRAILER"):
                with m.If(step):
                    m.d.comb += [made.eq(1), made_cmd.eq(d.trailer)]
                    m.d.sync += self.free_ptr.eq(d.end)
                    m.next = "IDLE"

        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE") | out.valid | ~out_slice.i.ready)
        return m


def _opcode_info(opcode) -> dict:
    """Decode of the BTH opcode (IBTA Vol 1 table 38, UC 0x20-0x2B): ``supported`` (a UC SEND or
    RDMA WRITE), ``has_reth``, ``has_immdt``, ``send``, ``start`` (FIRST or ONLY: a message
    begins), ``end`` (LAST or ONLY: it ends)."""
    def any_of(flag: str) -> Value:
        return Cat(*(opcode == code for code in Opcode if getattr(code, flag))).any()

    return {
        "supported": Cat(*(opcode == code for code in Opcode)).any(),
        "has_reth": any_of("has_reth"),
        "has_immdt": any_of("has_immdt"),
        "send": any_of("is_send"),
        "start": any_of("starts_message"),
        "end": any_of("ends_message"),
    }


class RoCEReceiver(wiring.Component):
    """The receive path: frame buffer, header checks, ICRC, commit engine.

    Parameters
    ----------
    params : QSCParams
        ``num_qps`` (each QP's DestQP comes from its context, ``qp[q].qsc_qpn``), the region
        sizes (``imem_depth``, ``env_depth``).
    buffer_bytes : int
        Receive buffer size in bytes (a power of two, at least 2 KiB): a ring of 64-bit words.
        Whole frames are stored; frames that do not fit the free space are dropped (OVERFLOW).
        The default, 16 KiB, holds two frames of the largest PMTU (4096 bytes: a 4154-byte
        frame) and more.
    desc_depth : int
        Accepted packets that may wait for the commit engine.
    ctrl_depth : int
        Control requests that may wait for the control plane.

    Members
    -------
    rx : In(packet_signature())
        Frames from the MAC, FCS stripped. ``ready`` is always 1.
    config : In(NetConfig)
        QSC MAC and IP, P_Key, RX_ENABLE.
    qp : In(ArrayLayout(QPContext, num_qps))
        Each QP's context: its QSC_QPN, peer, PPU, R_Keys of the PPU's regions,
        RESPONSE_BYTES, path MTU.
    bus_cmd : Out(stream.Signature(BusCommand))
        The commands of accepted packets, one packet at a time (see :class:`CommitEngine`).
    busy : Out(1)
        The commit engine is inside a packet: the bus arbiter must not switch away.
    ctrl_req : Out(stream.Signature(ControlRequest))
        Accepted control-plane requests, in arrival order.
    pairs : In(PairPortSignature())
        The pair ring (:data:`~.control.PAIR_RING_DEPTH` entries): an accepted block request's
        pairs after its first, in order, for the control plane, which reads them and frees them
        (``rp``). A block whose pairs do not fit the free entries is dropped (OVERFLOW).
    epsn : Out(ArrayLayout(24, num_qps))
        Next PSN expected on each QP (RX_EPSN), updated 1 cycle after an accepted
        packet's decision.
    qp_reset : In(num_qps)
        Bit ``q`` restarts QP ``q`` (a host configured it): its ``epsn`` returns to 0 and
        its open message closes, over an update in the same cycle.
    count : Out(NUM_COUNTERS)
        Counter increment strobes (RX_FRAMES, RX_ROCE_ACCEPTED, RX_RPC_RESPONSES, PSN_GAP,
        RX_ARP_REQUESTS, RX_ECHO_REQUESTS and the DROP_* counters), at most one frame decided
        per cycle.
    qp_count : Out(NUM_QP_COUNTERS * num_qps)
        QP counter strobes (bit ``NUM_QP_COUNTERS * q + k``: QP ``q``'s counter ``k`` of
        :data:`~openqlink.memory_map.QP_COUNTERS`; RX_PACKETS, RX_DROPS, RX_DROPS_PSN), in the
        cycle ``count``'s show.
    reply : Out(REPLY_LAYOUT)
        A frame the responder should answer (an ARP request for our IP, an ICMP echo request
        that passed every check, its checksum included): ``valid`` for one cycle,
        :data:`REPLY_LATENCY_CYCLES` after the frame's last beat.

    Latency: a frame is decided 2 cycles after its last beat; with the commit engine idle and
    ``bus_cmd.ready`` high, the first bus command of an accepted packet is valid 8 cycles after
    the last beat (descriptor queue 2, commit engine 4), then one command per cycle. Frames may
    arrive back to back (one decision per cycle at most).
    """

    def __init__(self, params: QSCParams, *, buffer_bytes: int = 16384, desc_depth: int = 8,
                 ctrl_depth: int = 4):
        if buffer_bytes < 2048 or buffer_bytes & (buffer_bytes - 1):
            raise ValueError(f"buffer_bytes must be a power of two of at least 2048, "
                             f"not {buffer_bytes}")
        if desc_depth < 1 or ctrl_depth < 1:
            raise ValueError(f"desc_depth and ctrl_depth must be at least 1, "
                             f"not {desc_depth} and {ctrl_depth}")
        if PPU_STRIDE & (PPU_STRIDE - 1) or PPU_BASE % PPU_STRIDE:
            raise ValueError("the PPU windows must be aligned powers of two")
        self.params = params
        self.buffer_words = buffer_bytes // 8
        self.ptr_bits = self.buffer_words.bit_length() - 1
        self.desc_depth = desc_depth
        self.ctrl_depth = ctrl_depth
        #: The pair ring's block RAM (a simulation bench may read its entries).
        self.pair_ring = Memory(shape=64, depth=PAIR_RING_DEPTH, init=[],
                                attrs={"no_rw_check": True})
        n = params.num_qps
        super().__init__({
            "rx": In(packet_signature()),
            "config": In(NetConfig),
            "qp": In(data.ArrayLayout(QPContext, n)),
            "bus_cmd": Out(stream.Signature(BusCommand)),
            "busy": Out(1),
            "ctrl_req": Out(stream.Signature(ControlRequest)),
            "pairs": In(PairPortSignature()),
            "epsn": Out(data.ArrayLayout(24, n)),
            "qp_reset": In(n),
            "count": Out(NUM_COUNTERS),
            "qp_count": Out(NUM_QP_COUNTERS * n),
            "reply": Out(REPLY_LAYOUT),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        params = self.params
        num_ppus = params.num_ppus
        num_qps = params.num_qps
        ptr_bits = self.ptr_bits
        depth = self.buffer_words
        cfg = self.config
        beat = self.rx.payload

        # no_rw_check: the commit engine reads only words of accepted packets and the words
        # after them that it prefetches (masked out), the write port only free words: a read
        # of a word being written is never used, so no collision logic follows the block RAM.
        m.submodules.buffer = buffer = Memory(shape=64, depth=depth, init=[],
                                              attrs={"no_rw_check": True})
        wport = buffer.write_port()
        rport = bram.read_port(m, buffer, name="buffer_r")
        m.submodules.icrc = icrc = ICRCEngine(parts=2)
        m.submodules.commit = commit = CommitEngine(ptr_bits)
        desc_layout = commit_descriptor_layout(ptr_bits)
        m.submodules.desc_fifo = desc_fifo = HeadFIFO(desc_layout.size, self.desc_depth)
        m.submodules.ctrl_fifo = ctrl_fifo = SyncFIFOBuffered(
            width=ControlRequest.as_shape().size, depth=self.ctrl_depth)

        # ---- arrival: header capture, ICRC feed ---------------------------------------------
        m.d.comb += self.rx.ready.eq(1)
        in_frame = Signal()
        beat_cnt = Signal(16)
        b = Signal(16)            # index of the current beat in its frame
        take = Signal()           # the current beat belongs to a frame
        m.d.comb += [
            b.eq(Mux(beat.first, 0, beat_cnt)),
            take.eq(self.rx.valid & (beat.first | in_frame)),
        ]
        # One-hot position of the current beat among the header beats (all zero beyond them),
        # from a register: no counter compare sits in front of the captures and the ICRC.
        pos_next = Signal(_HEADER_BEATS)
        at = Signal(_HEADER_BEATS)
        m.d.comb += at.eq(Mux(beat.first, 1, pos_next))
        data_in = Signal(64)
        m.d.comb += data_in.eq(beat.data & _byte_mask(beat.keep))
        nkeep = Signal(4)
        m.d.comb += nkeep.eq(sum(beat.keep[i] for i in range(8)))

        hdr = Signal(8 * HEADER_BYTES)
        prev_hi = Signal(16)                  # lanes 6-7 of the previous beat
        f_beats = Signal(16)                  # beats of the last complete frame
        f_len = Signal(19)                    # bytes of the last complete frame
        f_error = Signal()                    # the MAC flagged the last complete frame bad
        s1_valid = Signal()                   # the frame that just ended

        m.d.sync += s1_valid.eq(0)
        with m.If(take):
            m.d.sync += [
                in_frame.eq(~beat.last),
                beat_cnt.eq(Mux(b == 0xFFFF, b, b + 1)),
                prev_hi.eq(data_in[48:]),
                pos_next.eq(at << 1),
            ]
            for k in range(_HEADER_BEATS):
                with m.If(at[k]):
                    m.d.sync += hdr[64 * k:64 * k + 64].eq(data_in)
            with m.If(beat.last):
                m.d.sync += [
                    f_beats.eq(Mux(b == 0xFFFF, b, b + 1)),
                    f_len.eq(Cat(Const(0, 3), b) + nkeep),
                    f_error.eq(beat.error),
                    s1_valid.eq(1),
                ]

        # ---- the pair ring: a block request's pairs after the first ---------------------------
        # Pair j of a control datagram is frame bytes [48 + 8j, 56 + 8j): beat 6 + j. Pair 0 is
        # in the captured header; from beat 7 on every frame's beats are written behind the
        # committed pairs (``pair_wp``) while there is room, and counted (``pair_n``); an
        # accepted block's pair count commits its pairs at its decision, anything else leaves
        # them to be written over. The next frame's writes start at its beat 7, after that
        # decision (3 cycles after the last beat).
        assert _L4_AT + CONTROL_BLOCK_HEADER.length_bytes == 8 * 6
        assert CONTROL_PAIR.length_bytes == 8
        m.submodules.pair_ring = pair_ring = self.pair_ring
        pair_w = pair_ring.write_port()
        pair_r = bram.read_port(m, pair_ring, name="pair_r")
        ring_bits = exact_log2(PAIR_RING_DEPTH)
        pair_wp = Signal(ring_bits + 1)           # committed entries end here
        pair_free = Signal(ring_bits + 1)         # free entries (registered from the pointers)
        pair_n = Signal(ring_bits + 1)            # entries written of the current frame
        f_pair_n = Signal(ring_bits + 1)          # ... of the last complete frame
        pair_we = Signal()
        m.d.sync += pair_free.eq(PAIR_RING_DEPTH - (pair_wp - self.pairs.rp))
        m.d.comb += [
            pair_we.eq(take & ~beat.first & ~pos_next[:7].any() & (pair_n < pair_free)),
            pair_w.en.eq(pair_we),
            pair_w.addr.eq(pair_wp + pair_n),
            pair_w.data.eq(beat.data),
            pair_r.addr.eq(self.pairs.addr),
            self.pairs.data.eq(pair_r.data),
        ]
        with m.If(take):
            m.d.sync += pair_n.eq(Mux(beat.first, 0, pair_n + pair_we))
            with m.If(beat.last):
                m.d.sync += f_pair_n.eq(Mux(beat.first, 0, pair_n + pair_we))

        def hbytes(start: int, header: Header) -> Value:
            return hdr[8 * start:8 * (start + header.length_bytes)]

        eth = ETHERNET.view(hbytes(_ETH_AT, ETHERNET))
        ip = IPV4.view(hbytes(_IP_AT, IPV4))
        udp = UDP.view(hbytes(_UDP_AT, UDP))
        bth = BTH.view(hbytes(_L4_AT, BTH))
        reth = RETH.view(hbytes(_RETH_AT, RETH))
        # ImmDt follows the RETH (ONLY_WITH_IMMEDIATE) or the BTH (LAST_WITH_IMMEDIATE)
        immdt = IMMDT.view(hbytes(_IMM_AT, IMMDT))
        immdt_no_reth = IMMDT.view(hbytes(_RETH_AT, IMMDT))
        ctl = CONTROL_REQUEST.view(hbytes(_L4_AT, CONTROL_REQUEST))

        # IPv4 header sum (RFC 1071) in parts while the header streams in: words 1-4 are beat 2,
        # words 5-8 beat 3; words 0 and 9 are added after the frame (see ``hdr_chk``).
        ip_words = list(_IPV4_WORDS.view(hbytes(_IP_AT, IPV4)).values())
        # Beats 2 and 3 are full in any frame whose IP check counts (see below), so their
        # words are taken from the beat unmasked.
        beat_words = [Cat(beat.data[16 * i + 8:16 * i + 16], beat.data[16 * i:16 * i + 8])
                      for i in range(4)]
        # Each beat's words are reduced to two (carry-save, no carry chain) and registered with
        # no enable (``beat_s``, ``beat_k``); their sum is registered for beats 2 and 3 in the
        # next cycle, so that neither a handshake term nor the keep mask sits in front of the
        # carry chain. ``hdr_chk`` reads the sums a cycle after the last beat: in time for any
        # frame that reaches beat 4; shorter ones (at most 32 bytes, the only frames whose
        # beat 2 or 3 may be partial) fail the IP check on their length whatever the sum.
        beat_s = Signal(18, reset_less=True)
        beat_k = Signal(18, reset_less=True)
        sum_at = Signal(2)
        csa_s, csa_k = _csa4(beat_words, 18)
        m.d.sync += [beat_s.eq(csa_s), beat_k.eq(csa_k), sum_at.eq(Mux(take, at[2:4], 0))]
        ip_sum_b2 = Signal(18)
        ip_sum_b3 = Signal(18)
        with m.If(sum_at[0]):
            m.d.sync += ip_sum_b2.eq(beat_s + beat_k)
        with m.If(sum_at[1]):
            m.d.sync += ip_sum_b3.eq(beat_s + beat_k)

        # ICRC message V: word 0 is all ones, word k >= 1 is frame bytes [8k+6, 8k+14), i.e.
        # lanes 6-7 of beat k and lanes 0-5 of beat k+1; V ends where the ICRC (the last 4 bytes
        # of the IP packet) begins. Word k is fed with beat k+1. Words 0-2 (beats 1-3) always
        # belong to V (a V shorter than that only comes with a total_length that fails the IP or
        # UDP checks); from beat 4 on, ``v_in``/``v_last_next`` say whether the next beat carries
        # a word of V / its last word, set at beat 3 from total_length (captured at beat 2) and
        # counted down by ``v_left``.
        total_length = ip["total_length"]
        v_in = Signal()                       # the next beat (>= 4) carries a word of V
        v_last_next = Signal()                # ... and it is V's last word
        v_left = Signal(14)                   # words of V after the next beat's
        v_half = Signal()                     # V is 8k + 4 bytes: its last word is half used
        v_post = Signal()                     # the next beat follows V's last word
        realigned = Signal(64)
        m.d.comb += realigned.eq(Cat(prev_hi, data_in[:48]))
        beyond3 = Signal()                    # the current beat is beat 4 or later
        m.d.comb += beyond3.eq(~at[:4].any())
        # (total_length + 3) // 8, registered from the beat that carries total_length (beat 2,
        # lanes 0-1, big-endian) and used from beat 3 on.
        assert _IP_AT + 2 == 16
        v_last = Signal(14)
        with m.If(take & at[2]):
            m.d.sync += v_last.eq((Cat(data_in[8:16], data_in[:8]) + 3) >> 3)
        with m.If(take):
            m.d.sync += v_post.eq(0)
            with m.If(at[3]):
                m.d.sync += [
                    v_in.eq(v_last >= 3),
                    v_last_next.eq(v_last == 3),
                    v_left.eq(v_last - 4),
                    v_half.eq(total_length[:3] == 0),
                ]
            with m.Elif(beyond3 & v_in):
                m.d.sync += [
                    v_in.eq(~v_last_next),
                    v_last_next.eq(v_left == 0),
                    v_left.eq(v_left - 1),
                    v_post.eq(v_last_next),
                ]

        # ICRC input stage: the data terms of the masked word of V (icrc_terms) and its flags,
        # registered. The terms are taken from the beat as it came (no keep mask: a V byte
        # beyond the frame's end only comes with a total_length that fails the IP checks), the
        # masks from ``pos_next``: where it differs from ``at`` (a frame's first beat) no word of
        # V is fed. The terms of V's first word (all ones) are not used.
        crc_in = Signal(data.StructLayout({"valid": 1, "first": 1, "last": 1,
                                           "term_whole": 64, "term_shifted": 64}))
        word_mask = Const(0, 64)
        for vidx, lanes in ICRC_WORD_MASKS.items():
            if vidx:
                word_mask = word_mask | Mux(pos_next[vidx + 1], Const(lanes, 64), Const(0, 64))
        crc_prev_hi = Signal(32)              # lanes 4-7 of the previous word of V
        with m.If(take):
            m.d.sync += crc_prev_hi.eq(Mux(at[1], Const(2**32 - 1, 32), beat.data[16:48]))
        term_whole, term_shifted = icrc_terms(
            named(m, Cat(prev_hi, beat.data[:48]) | word_mask, "crc_word"), crc_prev_hi, parts=2)
        m.d.sync += [
            crc_in.valid.eq(take & (at[1] | at[2] | at[3] | (beyond3 & v_in))),
            crc_in.first.eq(at[1]),
            crc_in.last.eq(beyond3 & v_last_next),
            crc_in.term_whole.eq(term_whole),
            crc_in.term_shifted.eq(term_shifted),
        ]
        m.d.comb += [
            icrc.valid.eq(crc_in.valid),
            icrc.first.eq(crc_in.first),
            icrc.last.eq(crc_in.last),
            icrc.last_half.eq(v_half),
            icrc.term_whole.eq(crc_in.term_whole),
            icrc.term_shifted.eq(crc_in.term_shifted),
        ]
        icrc_rx = Signal(32)                  # the ICRC bytes as received, lane order
        with m.If(take & beyond3):
            with m.If(v_in & v_last_next & v_half):
                m.d.sync += icrc_rx.eq(realigned[32:])
            with m.If(v_post & ~v_half):
                m.d.sync += icrc_rx.eq(realigned[:32])
        # The ICRC holds its result from ``done`` until the next frame's first word of V, which
        # is fed 2 cycles after that frame's first beat at the earliest: at the verdict (2 cycles
        # after the last beat) it is this frame's, or, for a frame whose V never ended, the
        # frame fails the IP checks (ranked before ICRC) anyway.
        crc_now = icrc.crc

        # UDP checksum (RFC 768; RFC 1071 sum; RFC 1122 4.1.3.4: a non-zero checksum is
        # verified, for control datagrams and RoCEv2 alike, as a host stack does before rxe sees
        # a packet): the one's-complement sum of the pseudo-header and the datagram. The
        # pseudo-header's addresses and the datagram are frame bytes [26, 14 + total_length):
        # beat 3 lanes 2-7, then beats 4 on up to the IP packet's end (padding left out); its
        # protocol and UDP length (17 and total_length - 20, the UDP length being checked equal
        # to that) start the sum. Each beat's masked words are reduced to two and registered,
        # then added to ``l4_acc`` (32 bits: no overflow below 2**16 words), which holds the
        # whole sum 2 cycles after the last beat, when the verdict stage reads it.
        l4_init = Signal(16)                  # 17 + total_length - 20 (beat 2)
        l4_end = Signal(17)                   # 14 + total_length: the IP packet's end (beat 2)
        l4_on = Signal()                      # the next beat (>= 4) carries datagram bytes
        l4_last = Signal()                    # ... and it is the last that does
        l4_left = Signal(14)                  # beats after the next before the last
        l4_lanes = Signal(3)                  # datagram lanes of the last beat (0: none)
        # ICMP (RFC 792): the same sum over the ICMP message alone, frame bytes
        # [34, 14 + total_length), with no pseudo-header (the protocol is beat 2's lane 7).
        l4_icmp = Signal()
        assert _IP_AT + 9 == 8 * 2 + 7
        with m.If(take & at[2]):
            tl_now = Cat(data_in[8:16], data_in[:8])
            icmp_now = data_in[56:64] == IpProtocol.ICMP
            m.d.sync += [l4_init.eq(Mux(icmp_now, 0, tl_now - 3)),
                         l4_end.eq(tl_now + _IP_AT), l4_icmp.eq(icmp_now)]
        with m.If(take & at[3]):
            m.d.sync += [
                l4_on.eq(1),
                l4_left.eq(l4_end[3:] - 5),
                l4_last.eq(l4_end[3:] == 4),
                l4_lanes.eq(l4_end[:3]),
            ]
        with m.Elif(take & beyond3 & l4_on):
            m.d.sync += [l4_left.eq(l4_left - 1), l4_last.eq(l4_left == 0)]
            with m.If(l4_last):
                m.d.sync += l4_on.eq(0)
        lanes_below = Array(Const((1 << i) - 1, 8) for i in range(8))
        l4_be = Signal(8)
        m.d.comb += l4_be.eq(Mux(at[3], Mux(l4_icmp, 0, 0xFC),
                                 Mux(beyond3 & l4_on,
                                     Mux(l4_last, lanes_below[l4_lanes], 0xFF) &
                                     Mux(at[4] & l4_icmp, 0xFC, 0xFF), 0)))
        l4_data = Signal(64)
        m.d.comb += l4_data.eq(data_in & _byte_mask(l4_be))
        l4_words = [Cat(l4_data[16 * i + 8:16 * i + 16], l4_data[16 * i:16 * i + 8])
                    for i in range(4)]
        l4_s = Signal(18, reset_less=True)
        l4_k = Signal(18, reset_less=True)
        l4_first = Signal()                   # l4_s/l4_k are beat 3's
        l4_add = Signal()                     # ... or a later datagram beat's
        s_now, k_now = _csa4(l4_words, 18)
        m.d.sync += [l4_s.eq(s_now), l4_k.eq(k_now),
                     l4_first.eq(take & at[3]), l4_add.eq(take & (at[3] | (beyond3 & l4_on)))]
        l4_acc = Signal(32)
        with m.If(l4_add):
            m.d.sync += l4_acc.eq(_sum4([Mux(l4_first, l4_init, l4_acc), l4_s, l4_k,
                                         Const(0, 32)], 32))
        # RFC 1071: the datagram checks when its sum is 0 mod 0xFFFF (never 0 itself: the
        # protocol number is in it; an echo request's type is 8); sum[15:0] + sum[31:16] is then
        # 0xFFFF or 0x1FFFE.
        l4_fold = Signal(17)
        m.d.comb += l4_fold.eq(l4_acc[:16] + l4_acc[16:])
        l4_sum_bad = Signal()
        m.d.comb += l4_sum_bad.eq((l4_fold != 0xFFFF) & (l4_fold != 0x1FFFE))

        # ---- buffer write, three cycles behind the arrival ----------------------------------
        # The delay lets the decision of the previous frame (3 cycles after its last beat) move
        # wr_base before the next frame's first word is written. Whether a word fits is found
        # one stage ahead (``nofit``), from the free pointer of that cycle (it only grows, so
        # the answer is safe), except for a frame's first word, which needs the new wr_base.
        w_layout = data.StructLayout({"valid": 1, "first": 1, "beat": 16, "big": 1,
                                      "addr": ptr_bits + 1, "nofit": 1, "data": 64})
        w1 = Signal(w_layout)
        w2 = Signal(w_layout)
        w3 = Signal(w_layout)
        wr_base = Signal(ptr_bits + 1)        # first word of the frame being received
        free_ptr = commit.free_ptr
        w2_addr = Signal(ptr_bits + 1)
        m.d.comb += w2_addr.eq(wr_base + w2.beat[:ptr_bits + 1])
        m.d.sync += [
            w1.valid.eq(take), w1.first.eq(beat.first), w1.beat.eq(b), w1.data.eq(data_in),
            w1.big.eq(b[ptr_bits:] != 0),
            w2.eq(w1),
            w3.eq(w2),
            w3.addr.eq(w2_addr),
            w3.nofit.eq(~w2.first & (w2.big | ((w2_addr[:ptr_bits] == free_ptr[:ptr_bits]) &
                                                (w2_addr[ptr_bits] != free_ptr[ptr_bits])))),
        ]
        first_nofit = Signal()                # the buffer is full at the frame's first word
        m.d.comb += first_nofit.eq((wr_base[:ptr_bits] == free_ptr[:ptr_bits]) &
                                   (wr_base[ptr_bits] != free_ptr[ptr_bits]))
        ovf = Signal()                        # a word of the frame at w3 did not fit
        ovf_frame = Signal()                  # ... counting the word at w3 now
        m.d.comb += ovf_frame.eq(Mux(w3.first, first_nofit, ovf | w3.nofit))
        m.d.comb += [
            wport.addr.eq(Mux(w3.first, wr_base, w3.addr)[:ptr_bits]),
            wport.data.eq(w3.data),
            wport.en.eq(w3.valid & ~ovf_frame),
        ]
        with m.If(w3.valid):
            m.d.sync += ovf.eq(ovf_frame)

        # ---- hdr_chk: the header checks' parts, registered 1 cycle after the last beat -------
        n_bits = max(1, (num_ppus - 1).bit_length())
        q_bits = max(1, (num_qps - 1).bit_length())
        # The opcode's decode and the header bytes it implies, registered from ``hdr`` every
        # cycle like ``tl_p14`` below: exact for a frame whose last beat comes after beat 5
        # (the BTH's first bytes); shorter frames fail the IP or UDP checks (a RoCEv2 datagram
        # has at least 24 bytes) before any check that uses them.
        # A UDP-mode response (CUDA-Q realtime's udp bridge): a datagram to the port
        # UDP_CALL_PORT_BASE + q of a PPU's own QP q whose TRANSPORT is 1, registered from
        # ``hdr`` every cycle (the port is in beat 4; a frame that reaches the UDP check has at
        # least 6 beats). It is taken as a SEND ONLY of that QP whose payload is the UDP
        # payload: the opcode's decode says so, and ``qpn_hit`` names the QP.
        ucall_now = Cat(*((udp["dst_port"] == UDP_CALL_PORT_BASE + n) & self.qp[n].transport
                          for n in range(num_ppus)))
        ucall = Signal()                      # registered: the frame is a UDP-mode response
        m.d.sync += ucall.eq(ucall_now.any())
        op_now = _opcode_info(bth["opcode"])
        op = {name: Signal(name=f"op_{name}") for name in op_now}
        as_send = {"has_reth": 0, "has_immdt": 0, "send": 1, "start": 1, "end": 1}
        m.d.sync += [op[name].eq(Mux(ucall_now.any(), as_send[name], value)
                                 if name in as_send else value)
                     for name, value in op_now.items()]
        win_bits = PPU_STRIDE.bit_length() - 1
        region_list = regions(params, 0)
        va = reth["va"]
        win_off = va[:win_bits]
        udp_len = udp["length"]

        # DestQP against each QP's QSC_QPN, registered from ``hdr`` every cycle like
        # ``src_mac_peer`` below: DestQP ends in beat 6, and a frame that reaches the QPN check
        # has at least 8 beats. The packet goes to the lowest QP whose QPN matches; a UDP-mode
        # response to the QP its port names.
        qpn_hit = Signal(num_qps)
        m.d.sync += qpn_hit.eq(Mux(ucall_now.any(), ucall_now,
                                   Cat(*(bth["dest_qp"] == self.qp[n].qsc_qpn
                                         for n in range(num_qps)))))
        qp_now = Signal(q_bits)
        for n in reversed(range(num_qps)):
            with m.If(qpn_hit[n]):
                m.d.comb += qp_now.eq(n)
        qpc_now = self.qp[qp_now]
        # the PPU the QP reaches (its regions, mailbox and TAIL): a PPU's own QP its own, fixed
        # here whatever its context says; another QP the one its context names
        ppu_now = Signal(n_bits)
        m.d.comb += ppu_now.eq(Array([Const(n, n_bits) for n in range(num_ppus)] +
                                     [self.qp[n].ppu[:n_bits]
                                      for n in range(num_ppus, num_qps)])[qp_now])
        # The payload's frame offset, and the datagram's bytes besides the payload (a UDP-mode
        # response: the UDP payload, behind the UDP header).
        payload_at = Signal(7)
        m.d.sync += payload_at.eq(Mux(ucall_now.any(), _L4_AT,
                                      _RETH_AT + Mux(op_now["has_reth"], RETH.length_bytes, 0) +
                                      Mux(op_now["has_immdt"], IMMDT.length_bytes, 0)))
        overhead = Signal(6)
        m.d.sync += overhead.eq(Mux(ucall_now.any(), UDP.length_bytes,
                                    _ROCE_FIXED_BYTES +
                                    Mux(op_now["has_reth"], RETH.length_bytes, 0) +
                                    Mux(op_now["has_immdt"], IMMDT.length_bytes, 0) +
                                    bth["pad_cnt"]))
        # The open message of each QP (UC, IBTA Vol 1 9.8.3): whether one is open, its kind
        # (SEND or WRITE), whether a WRITE goes to the instruction ring, the bus address of its
        # next byte, the bytes it may still bring (a WRITE's DMALen left, a SEND's
        # RESPONSE_BYTES left: a FIRST's range check covered the whole DMALen). Written a cycle
        # after a decision, like ``epsn``; read at c1, a frame later.
        msg_open = Signal(num_qps)
        msg_send = Signal(num_qps)
        msg_imem = Signal(num_qps)
        msg_addr = Array(Signal(32, name=f"msg_addr_{n}") for n in range(num_qps))
        msg_left = Array(Signal(_LEFT_BITS, name=f"msg_left_{n}") for n in range(num_qps))
        mailbox_addr = Signal(32)
        m.d.comb += mailbox_addr.eq(PPU_BASE + MAILBOX_OFFSET + (ppu_now << win_bits))
        # A SEND's bytes go to the mailbox, a WRITE's to its VA (ONLY, FIRST) or behind the
        # message's bytes so far (MIDDLE, LAST).
        dst_addr = Signal(32)
        m.d.comb += dst_addr.eq(Mux(op["has_reth"], va[:32],
                                    Mux(op["send"], mailbox_addr, msg_addr[qp_now])))

        c1_layout = data.StructLayout({
            "valid": 1,
            "mac_fail": 1,
            "eth_fail": 1,
            "ip_fields_fail": 1,
            "ip_dst_fail": 1,
            "ip_len_fail": 1,
            "ip_sum": 20,
            "udp_fail": 1,
            "udp_len_fail": 1,
            "is_roce": 1,
            "is_ucall": 1,                    # a UDP-mode response (to a QP's UDP port)
            "ucall_short": 1,                 # ... of less than an RPCResponse (24 bytes)
            "is_ctrl": 1,
            "is_udp": 1,                      # IPv4 carrying UDP
            "is_arp": 1,
            "is_icmp": 1,                     # IPv4 carrying ICMP
            "arp_fail": 1,                    # not an ARP request for our IP
            "icmp_fail": 1,                   # not an echo request we can answer (not its sum)
            "opcode_fail": 1,
            "pkey_fail": 1,
            "qpn_fail": 1,
            "response_bytes": 13,             # the QP's largest SEND payload
            "udp_sum_on": 1,                  # the UDP checksum is not 0: verify it
            "peer_fail": 1,                   # source MAC or IP is not the QP's peer
            "has_reth": 1,
            "has_immdt": 1,
            "send": 1,
            "start": 1,                       # FIRST or ONLY
            "end": 1,                         # LAST or ONLY
            "pmtu": 13,                       # the QP's path MTU in bytes
            "room": 32,                       # bytes the message may bring (see below)
            "dma_zero": 1,                    # DMALen is 0 (IBTA C9-88)
            "msg_open": 1,                    # the QP's message state
            "msg_send": 1,
            "msg_imem": 1,
            "qp": q_bits,
            "ppu": n_bits,
            "psn": 24,
            "payload_bytes": 17,              # udp_len - overhead; bit 16: the header is short
            "send_long": 1,                   # a SEND of more than MAILBOX_BYTES
            "va_fail": 1,                     # VA[63:32], alignment, PPU window
            "region_hit": len(region_list),
            "rkey_ok": len(region_list),
            "dma_len": 32,
            "dma_end": 33,
            "dst_addr": 32,
            "dst_lo_p7": 4,                   # dst_addr[2:0] + 7
            "src_delta": 7,
            "imm": 32,
            "imm_fail": 1,                  # ImmDt >= imem_depth: not a TAIL of the ring
            "beats": 16,
            "ctrl": ControlRequest,
            "pairs_short": 1,                 # a block's pairs did not fit the pair ring
        })
        c1 = Signal(c1_layout)
        # Sums and compares of header fields, registered from ``hdr`` every cycle: in c1 they
        # are those of the header as it stood at the last beat, exact for the fields of earlier
        # beats. Later fields (frames of at most 5 beats) only come with frames that fail the
        # ETH check on their length (1 beat), the IP check or the UDP check on total_length.
        tl_p14 = Signal(17)                   # total_length + 14 (beat 2)
        dst_mine = Signal()                   # the destination MAC is ours (beat 0)
        dst_bcast = Signal()                  # ... or broadcast
        m.d.sync += [dst_mine.eq(eth["dst"] == cfg.qsc_mac),
                     dst_bcast.eq(eth["dst"] == _BROADCAST)]
        udp_p20 = Signal(17)                  # udp length + 20 (beat 4)
        # The source MAC (beat 1) and IP (beat 3) against each QP's peer, the QP's taken below
        # like ``qpn_hit``'s; of a UDP-mode response also the source port (beat 4).
        src_is_peer = Signal(num_qps)
        m.d.sync += src_is_peer.eq(Cat(*(
            (eth["src"] == self.qp[n].peer_mac) & (ip["src"] == self.qp[n].peer_ip) &
            ((udp["src_port"] == self.qp[n].peer_udp_port) | ~ucall_now.any()
             if n < num_ppus else 1)
            for n in range(num_qps))))
        m.d.sync += [tl_p14.eq(total_length + _IP_AT),
                     udp_p20.eq(udp_len + IPV4.length_bytes)]
        is_arp = eth["ethertype"] == EtherType.ARP
        proto_udp = ip["protocol"] == IpProtocol.UDP
        proto_icmp = ip["protocol"] == IpProtocol.ICMP
        ip_ok_fields = ((ip["version"] == 4) & (ip["ihl"] == 5) & ~ip["flags"][0] &
                        (ip["fragment_offset"] == 0) & (proto_udp | proto_icmp))
        is_roce = (udp["dst_port"] == ROCEV2_PORT) & cfg.rx_enable & proto_udp & ~is_arp
        is_ctrl = (udp["dst_port"] == CONTROL_PORT) & proto_udp & ~is_arp
        is_ucall = ucall & proto_udp & ~is_arp
        arp = ARP.view(hbytes(_IP_AT, ARP))
        icmp = ICMP_ECHO.view(hbytes(_UDP_AT, ICMP_ECHO))
        # An ARP packet's target IP is ours (bytes 38-41, beats 4-5), compared as the header
        # stands at the decision like ``ip_dst_fail``: an unpadded 42-byte ARP frame ends with
        # beat 5, which a compare registered a cycle earlier would not have seen.
        arp_tpa_mine = Signal()
        m.d.comb += arp_tpa_mine.eq(arp["tpa"] == cfg.qsc_ip)
        rx_pkey = bth["p_key"]
        # A block request (WR_BLOCK, RD_BLOCK): its whole pairs, 1..BLOCK_MAX_PAIRS (a shorter
        # or longer one fails the UDP check); trailing bytes that make no pair are ignored.
        ctl_block = Signal()
        m.d.comb += ctl_block.eq((ctl["cmd"] == Command.WR_BLOCK) |
                                 (ctl["cmd"] == Command.RD_BLOCK))
        imm_now = Signal(32)
        m.d.comb += imm_now.eq(Mux(op["has_reth"], immdt["imm"], immdt_no_reth["imm"]))
        block_pairs = Signal(8)
        m.d.comb += block_pairs.eq((udp_len - _BLOCK_FIXED_UDP) >> 3)
        m.d.sync += [
            c1.valid.eq(s1_valid),
            c1.mac_fail.eq(f_error),
            c1.eth_fail.eq((f_len < _IP_AT) | ~(dst_mine | dst_bcast) |
                           ((eth["ethertype"] != EtherType.IPV4) & ~is_arp)),
            c1.is_arp.eq(is_arp),
            c1.is_udp.eq(proto_udp & ~is_arp),
            c1.is_icmp.eq(proto_icmp & ~is_arp),
            c1.is_ctrl.eq(is_ctrl),
            c1.arp_fail.eq((f_len < _IP_AT + ARP.length_bytes) |
                           (arp["htype"] != ARP_HTYPE_ETHERNET) |
                           (arp["ptype"] != EtherType.IPV4) | (arp["hlen"] != 6) |
                           (arp["plen"] != 4) | (arp["oper"] != ArpOperation.REQUEST) |
                           ~arp_tpa_mine),
            c1.icmp_fail.eq((icmp["type"] != IcmpType.ECHO_REQUEST) | (icmp["code"] != 0) |
                            (total_length < IPV4.length_bytes + ICMP_ECHO.length_bytes) |
                            (tl_p14 > ECHO_MAX_FRAME_BYTES)),
            c1.ip_dst_fail.eq(ip["dst"] != cfg.qsc_ip),
            c1.ip_fields_fail.eq((f_len < _UDP_AT) | ~ip_ok_fields |
                                 (total_length < IPV4.length_bytes)),
            c1.ip_len_fail.eq(tl_p14 > f_len),
            c1.ip_sum.eq(_sum4([ip_sum_b2, ip_sum_b3, ip_words[0], ip_words[9]], 20)),
            c1.udp_len_fail.eq(udp_p20 != total_length),
            c1.udp_fail.eq(
                (total_length < IPV4.length_bytes + UDP.length_bytes) |
                ~(is_roce | is_ctrl | is_ucall) |
                (is_roce & ((udp_len < _ROCE_FIXED_BYTES) | (udp_len[:2] != 0))) |
                (is_ctrl & ((udp_len < UDP.length_bytes + RD_DWORD_SHORT_BYTES) |
                            ((udp_len < UDP.length_bytes + CONTROL_REQUEST.length_bytes) &
                             (ctl["cmd"] != Command.RD_DWORD)) |
                            (ctl_block & ((udp_len < _BLOCK_MIN_UDP) |
                                          (udp_len > _BLOCK_MAX_UDP)))))),
            c1.is_roce.eq(is_roce),
            c1.is_ucall.eq(is_ucall),
            c1.ucall_short.eq(udp_len < UDP.length_bytes + RPC_RESPONSE_BYTES),
            c1.opcode_fail.eq(~op["supported"] | (bth["tver"] != 0)),
            c1.pkey_fail.eq((rx_pkey[:15] != cfg.p_key[:15]) | ~(rx_pkey[15] | cfg.p_key[15])),
            c1.qpn_fail.eq(qpn_hit == 0),
            c1.response_bytes.eq(qpc_now.response_bytes),
            c1.peer_fail.eq(~src_is_peer.bit_select(qp_now, 1)),
            c1.udp_sum_on.eq(udp["checksum"] != 0),
            c1.has_reth.eq(op["has_reth"]),
            c1.has_immdt.eq(op["has_immdt"]),
            c1.send.eq(op["send"]),
            c1.start.eq(op["start"]),
            c1.end.eq(op["end"]),
            # (a UDP-mode response: no PMTU, RESPONSE_BYTES alone bounds it)
            c1.pmtu.eq(Mux(ucall, 2**13 - 1, qpc_now.pmtu_bytes)),
            # A WRITE ONLY or FIRST may bring its DMALen, a SEND ONLY or FIRST the QP's
            # RESPONSE_BYTES, a MIDDLE or LAST what its message has left.
            c1.room.eq(Mux(op["has_reth"], reth["dma_len"],
                           Mux(op["send"] & op["start"], qpc_now.response_bytes,
                               msg_left[qp_now]))),
            c1.dma_zero.eq(reth["dma_len"] == 0),
            c1.msg_open.eq(msg_open.bit_select(qp_now, 1)),
            c1.msg_send.eq(msg_send.bit_select(qp_now, 1)),
            c1.msg_imem.eq(msg_imem.bit_select(qp_now, 1)),
            c1.qp.eq(qp_now),
            c1.ppu.eq(ppu_now),
            c1.psn.eq(bth["psn"]),
            c1.payload_bytes.eq(udp_len - overhead),
            # a SEND longer than the mailbox (commits its first MAILBOX_BYTES), compared beside
            # the subtraction so that the commit length below is one multiplexer
            c1.send_long.eq(op["send"] & (udp_len > overhead + MAILBOX_BYTES)),
            c1.va_fail.eq((va[32:] != 0) | (va[:2] != 0) |
                          (va[win_bits:32] != (PPU_BASE >> win_bits) + ppu_now)),
            c1.dma_len.eq(reth["dma_len"]),
            c1.dma_end.eq(win_off + reth["dma_len"]),
            c1.dst_addr.eq(dst_addr),
            c1.dst_lo_p7.eq(dst_addr[:3] + 7),
            c1.src_delta.eq(payload_at - dst_addr[:3]),
            c1.imm.eq(imm_now),
            c1.imm_fail.eq(imm_now[exact_log2(params.imem_depth):] != 0),
            c1.beats.eq(f_beats),
            c1.ctrl.src_mac.eq(eth["src"]),
            c1.ctrl.src_ip.eq(ip["src"]),
            c1.ctrl.src_port.eq(udp["src_port"]),
            c1.ctrl.cmd.eq(ctl["cmd"]),
            c1.ctrl.flags.eq(ctl["flags"]),
            c1.ctrl.seq.eq(ctl["seq"]),
            c1.ctrl.addr.eq(ctl["addr"]),
            c1.ctrl.data.eq(ctl["data"]),
            c1.ctrl.pairs.eq(Mux(ctl_block, block_pairs, 1)),
            # the block's pairs after the first did not all find room in the pair ring
            c1.pairs_short.eq(ctl_block & (f_pair_n < block_pairs - 1)),
        ]
        for r, region in enumerate(region_list):
            lo = region.va - ppu_base(0)
            hi = lo + region.length_bytes
            m.d.sync += [
                c1.region_hit[r].eq((win_off >= lo) & (win_off < hi)),
                c1.rkey_ok[r].eq(
                    (reth["r_key"] == getattr(qpc_now, region.rkey_register.lower())) &
                    getattr(qpc_now, region.rkey_register.lower() + "_valid")),
            ]

        # ---- verdict: the checks, registered 2 cycles after the last beat --------------------
        # RFC 1071: the folded sum is 0xFFFF or 0x0000 exactly when the sum is 0 mod 0xFFFF;
        # the sum of ten 16-bit words is below 2**20, so sum[15:0] + sum[19:16] is 0 or 0xFFFF.
        sum_lo = c1.ip_sum[:16]
        sum_hi = c1.ip_sum[16:]
        csum_fail = Signal()
        m.d.comb += csum_fail.eq(~(((sum_lo == 0) & (sum_hi == 0)) |
                                   ((sum_lo[4:] == 0xFFF) & (sum_lo[:4] == ~sum_hi))))
        region_hit = Signal()
        m.d.comb += region_hit.eq(c1.region_hit.any())
        # The regions are disjoint: at most one ``region_hit`` bit is set.
        range_fail = Signal()
        rkey_fail = Signal()
        is_imem = Signal()
        m.d.comb += [
            range_fail.eq(Cat(*(c1.region_hit[r] &
                                (c1.dma_end > region.va - ppu_base(0) + region.length_bytes)
                                for r, region in enumerate(region_list))).any()),
            rkey_fail.eq((c1.region_hit & ~c1.rkey_ok).any()),
            is_imem.eq(Cat(*(c1.region_hit[r] for r, region in enumerate(region_list)
                             if region.name == "IMEM")).any()),
        ]
        payload_bytes = c1.payload_bytes[:16]
        hdrlen_fail = c1.payload_bytes[16]
        # Lengths (rxe ``check_length``, IBTA Vol 1 9.7.6): at most a PMTU per packet, exactly
        # one for FIRST and MIDDLE, at least a byte for LAST; a WRITE's payloads add up to its
        # DMALen, a SEND's to at most RESPONSE_BYTES (``room``: what is left before the packet).
        len_fail = Signal()
        m.d.comb += len_fail.eq(
            (payload_bytes > c1.pmtu) | (~c1.end & (payload_bytes != c1.pmtu)) |
            (~c1.start & (payload_bytes == 0)) |
            Mux(~c1.end, payload_bytes >= c1.room,
                Mux(c1.send, payload_bytes > c1.room, payload_bytes != c1.room)))
        # A MIDDLE or LAST with no message of its kind open on the QP, or out of sequence
        # (rxe's UC ``check_psn`` and ``check_op_seq``): DROP_PSN.
        epsn = self.epsn
        psn_fail = Signal()
        m.d.comb += psn_fail.eq(~c1.start & (~c1.msg_open | (c1.msg_send != c1.send) |
                                             (c1.psn != epsn[c1.qp])))
        # The bytes committed: a WRITE's payload; of a SEND ONLY or FIRST, the first
        # MAILBOX_BYTES (a longer SEND, up to the QP's RESPONSE_BYTES, carries a response in its
        # first bytes); of a SEND MIDDLE or LAST, none (a FIRST brought a PMTU, more than that).
        assert MAILBOX_BYTES < min(PATH_MTU_BYTES.values())
        commit_bytes = Signal(16)
        m.d.comb += commit_bytes.eq(Mux(c1.send, Mux(c1.start, Mux(c1.send_long, MAILBOX_BYTES,
                                                                    payload_bytes), 0),
                                        payload_bytes))
        icrc_fail = Signal()
        m.d.comb += icrc_fail.eq(crc_now != icrc_rx)

        roce = c1.is_roce
        # the QP's packets: RoCEv2, or a UDP-mode response (checked as a SEND ONLY of its QP)
        of_a_qp = c1.is_roce | c1.is_ucall
        # The VA and R_Key checks of an ONLY or FIRST WRITE, but not of a zero-length one (IBTA
        # Vol 1 C9-88: it writes nothing and its ImmDt reaches no TAIL)
        write = c1.has_reth & ~c1.dma_zero
        # A WRITE_WITH_IMMEDIATE that ends a message in the instruction ring: its ImmDt is the
        # new TAIL
        imm_tail = Signal()
        m.d.comb += imm_tail.eq(c1.has_immdt & c1.end & ~c1.send &
                                Mux(c1.start, write & is_imem, c1.msg_imem))
        udp_sum_fail = Signal()
        m.d.comb += udp_sum_fail.eq(c1.udp_sum_on & l4_sum_bad)
        # (fail, reason, early): the checks in rank order. The early ones are single bits of
        # c1 (and ``roce``), ORed in the verdict stage: at the decision ``dropped`` is that OR
        # and the other checks' fail bits.
        ranked = [
            (c1.mac_fail, DropReason.MAC, True),
            (c1.eth_fail, DropReason.ETH, True),
            (c1.is_arp & c1.arp_fail, DropReason.ARP, True),
            (~c1.is_arp & (c1.ip_fields_fail | c1.ip_dst_fail | c1.ip_len_fail | csum_fail),
             DropReason.IP, False),
            (c1.is_icmp & (c1.icmp_fail | l4_sum_bad), DropReason.ICMP, False),
            (c1.is_udp & (c1.udp_fail | c1.udp_len_fail), DropReason.UDP, True),
            (c1.is_udp & udp_sum_fail, DropReason.UDP, False),
            (roce & icrc_fail, DropReason.ICRC, False),
            (roce & c1.opcode_fail, DropReason.OPCODE, True),
            (roce & c1.pkey_fail, DropReason.PKEY, True),
            (roce & c1.qpn_fail, DropReason.QPN, True),
            (of_a_qp & c1.peer_fail, DropReason.PEER, True),
            (roce & psn_fail, DropReason.PSN, False),
            (roce & hdrlen_fail, DropReason.LENGTH, True),
            (c1.is_ucall & c1.ucall_short, DropReason.LENGTH, True),
            (roce & write & (c1.va_fail | ~region_hit), DropReason.VA, False),
            (roce & write & rkey_fail, DropReason.RKEY, False),
            (roce & write & range_fail, DropReason.VA, False),
            (roce & imm_tail & c1.imm_fail, DropReason.IMMDT, False),
            (of_a_qp & len_fail, DropReason.LENGTH, False),
        ]
        checks = [(cond, why) for cond, why, _ in ranked]
        early = [i for i, (_, _, is_early) in enumerate(ranked) if is_early]
        early_fail = Cat(*(cond for cond, _, is_early in ranked if is_early)).any()

        # Descriptor fields that depend only on the header (the buffer position comes at the
        # decision).
        last_be_table = Array(Const((1 << (i + 1)) - 1, 8) for i in range(8))
        first_be_table = Array(Const((0xFF << i) & 0xFF, 8) for i in range(8))
        tail_addr = ppu_reg(0, "TAIL") - ppu_base(0)
        trailer = Signal(BusCommand)
        with m.If(c1.send):
            m.d.comb += [
                trailer.op.eq(BusOp.MAILBOX_COMMIT),
                trailer.word_addr.eq(c1.dst_addr[3:]),
                trailer.be.eq(0),
                # a SEND LAST: the FIRST's MAILBOX_BYTES
                trailer.data.eq(Mux(c1.start, commit_bytes, MAILBOX_BYTES)),
            ]
        with m.Else():
            m.d.comb += [
                trailer.op.eq(BusOp.WRITE),
                trailer.word_addr.eq((PPU_BASE + tail_addr + (c1.ppu << win_bits)) >> 3),
                trailer.be.eq(0xF0 if tail_addr & 4 else 0x0F),
                trailer.data.eq(Cat(c1.imm, c1.imm)),
            ]

        s2_layout = data.StructLayout({
            "valid": 1,
            "fail": len(checks),
            "early_fail": 1,
            "roce_ok": 1,
            "roce": 1,
            "qp_pkt": 1,                      # RoCEv2 or a UDP-mode response
            "is_ctrl": 1,
            "arp": 1,
            "icmp": 1,
            "send": 1,
            "end": 1,
            "msg": _MSG_LAYOUT,               # the QP's message state if the packet is taken
            "qp": q_bits,
            "psn": 24,
            "psn_next": 24,
            "psn_gap": 1,
            "beats": 16,
            "src_off": 4,
            "desc": desc_layout,
            "ctrl": ControlRequest,
            "pairs_short": 1,
        })
        s2 = Signal(s2_layout)
        nwords = Signal(ptr_bits + 1)
        m.d.comb += nwords.eq(Mux(commit_bytes == 0, 0, (commit_bytes + c1.dst_lo_p7) >> 3))
        m.d.sync += [
            s2.valid.eq(c1.valid),
            s2.fail.eq(Cat(*(cond for cond, _ in checks))),
            s2.early_fail.eq(early_fail),
            s2.roce_ok.eq(c1.valid & of_a_qp & ~early_fail),
            s2.roce.eq(roce),
            s2.qp_pkt.eq(of_a_qp),
            s2.is_ctrl.eq(c1.is_ctrl),
            s2.arp.eq(c1.is_arp),
            s2.icmp.eq(c1.is_icmp),
            s2.send.eq(c1.send),
            s2.end.eq(c1.end),
            s2.msg.open.eq(~c1.end),
            s2.msg.send.eq(c1.send),
            s2.msg.imem.eq(Mux(c1.start, is_imem, c1.msg_imem)),
            s2.msg.addr.eq(c1.dst_addr + payload_bytes),
            s2.msg.left.eq(c1.room - payload_bytes),
            s2.qp.eq(c1.qp),
            s2.psn.eq(c1.psn),
            s2.psn_next.eq(c1.psn + 1),
            s2.psn_gap.eq(c1.psn != epsn[c1.qp]),
            s2.beats.eq(c1.beats),
            s2.src_off.eq(c1.src_delta[3:]),
            s2.desc.shift.eq(c1.src_delta[:3]),
            s2.desc.nwords.eq(nwords),
            s2.desc.has_words.eq(commit_bytes != 0),
            s2.desc.last_word.eq(nwords == 1),
            s2.desc.dst_word.eq(c1.dst_addr[3:]),
            s2.desc.first_be.eq(first_be_table[c1.dst_addr[:3]]),
            s2.desc.last_be.eq(last_be_table[(c1.dst_addr[:3] + commit_bytes - 1)[:3]]),
            s2.desc.has_trailer.eq((c1.send & c1.end) | imm_tail),
            s2.desc.trailer.eq(trailer),
            s2.ctrl.eq(c1.ctrl),
            s2.pairs_short.eq(c1.pairs_short),
        ]

        # ---- the decision, 3 cycles after the last beat --------------------------------------
        desc = Signal(desc_layout)
        m.d.comb += [
            desc.eq(s2.desc),
            desc.src_word.eq(wr_base[:ptr_bits] + s2.src_off),
            desc.end.eq(wr_base + s2.beats),
            desc_fifo.w_data.eq(desc),
        ]
        dropped = Signal()                    # s2.fail.any()
        m.d.comb += dropped.eq(s2.early_fail |
                               Cat(*(s2.fail[i] for i in range(len(checks))
                                     if i not in early)).any())
        # A RoCE frame that passes the checks is at least 8 beats long, so w3 holds its last
        # beat and not its first: ``ovf_frame`` is ``ovf | w3.nofit``, two registers (for
        # other frames ``overflow`` is not used).
        overflow = Signal()
        m.d.comb += overflow.eq(Mux(s2.qp_pkt, ovf | w3.nofit | ~desc_fifo.w_rdy,
                                    s2.is_ctrl & (~ctrl_fifo.w_rdy | s2.pairs_short)))
        # The RoCE write strobe from few registered bits: ``s2.roce_ok`` (valid, RoCE, no early
        # check failed), the other checks' fail bits, the overflow registers, the queue's flag.
        roce_write = Signal()
        m.d.comb += roce_write.eq(
            s2.roce_ok & ~Cat(*(s2.fail[i] for i in range(len(checks)) if i not in early)).any() &
            ~ovf & ~w3.nofit & desc_fifo.w_rdy)
        m.d.comb += desc_fifo.w_en.eq(roce_write)
        with m.If(roce_write):
            m.d.sync += wr_base.eq(desc.end)
        # The expected PSN is written a cycle after the decision, from registers (the QP's
        # one-hot strobe and the PSN): the next decision that reads it is a frame away.
        epsn_we = Signal(num_qps)
        epsn_next = Signal(24)
        # (a UDP-mode response has no PSN: it leaves ``epsn`` and the QP's message alone)
        m.d.sync += [epsn_we.eq(Mux(roce_write & s2.roce, 1 << s2.qp, 0)),
                     epsn_next.eq(s2.psn_next)]
        # The message state likewise, for a packet of the QP (it passed the checks up to PEER):
        # taken, the packet opens, advances or closes its message; dropped (overflow included),
        # it closes it (IBTA Vol 1 9.8.3: the rest of the message is dropped up to a FIRST or
        # ONLY).
        peer_rank = next(i for i, (_, why) in enumerate(checks) if why is DropReason.PEER)
        owned = Signal()
        m.d.comb += owned.eq(s2.valid & s2.roce & ~s2.fail[:peer_rank + 1].any())
        msg_we = Signal(num_qps)
        msg_next = Signal(_MSG_LAYOUT)
        m.d.sync += [msg_we.eq(Mux(owned, 1 << s2.qp, 0)), msg_next.eq(s2.msg),
                     msg_next.open.eq(roce_write & s2.msg.open)]
        for n in range(num_qps):
            with m.If(epsn_we[n]):
                m.d.sync += epsn[n].eq(epsn_next)
            with m.If(msg_we[n]):
                m.d.sync += [msg_open[n].eq(msg_next.open), msg_send[n].eq(msg_next.send),
                             msg_imem[n].eq(msg_next.imem), msg_addr[n].eq(msg_next.addr),
                             msg_left[n].eq(msg_next.left)]
            with m.If(self.qp_reset[n]):
                m.d.sync += [epsn[n].eq(0), msg_open[n].eq(0)]
        # A control request is written in the cycle after the decision, from registers: the
        # queue's level logic sits between this stage and the control plane, and no path joins
        # the two through it. ``w_rdy`` read at the decision still holds a cycle later (only a
        # read can happen in between: decisions are at least a frame, 8 beats, apart).
        ctrl_w_en = Signal()
        ctrl_w_data = Signal.like(s2.ctrl)
        m.d.sync += [ctrl_w_en.eq(s2.valid & s2.is_ctrl & ~dropped & ctrl_fifo.w_rdy &
                                  ~s2.pairs_short),
                     ctrl_w_data.eq(s2.ctrl)]
        m.d.comb += [ctrl_fifo.w_en.eq(ctrl_w_en), ctrl_fifo.w_data.eq(ctrl_w_data)]
        # the request's pairs after the first are committed with it
        with m.If(ctrl_w_en):
            m.d.sync += pair_wp.eq(pair_wp + ctrl_w_data.pairs - 1)

        # ---- counted: the counter strobes, registered at the decision ------------------------
        # Each check's strobe is its fail bit with no earlier check failing (the first failing
        # check names the reason); the strobes show 1 cycle after the decision.
        count = self.count
        fail = s2.fail
        strobes: dict[int, list] = {}
        for i, (_, why) in enumerate(checks):
            first = fail[i] if i == 0 else fail[i] & ~fail[:i].any()
            strobes.setdefault(why.value, []).append(first)
        count_next = Signal(NUM_COUNTERS)
        for index, firsts in strobes.items():
            m.d.comb += count_next[index].eq(s2.valid & Cat(*firsts).any())
        accept = Signal()
        m.d.comb += accept.eq(s2.valid & ~dropped & ~overflow & s2.qp_pkt)
        m.d.comb += [
            count_next[COUNTER_INDEX["RX_FRAMES"]].eq(s2.valid),
            count_next[COUNTER_INDEX["DROP_OVERFLOW"]].eq(s2.valid & ~dropped & overflow),
            count_next[COUNTER_INDEX["RX_ROCE_ACCEPTED"]].eq(accept & s2.roce),
            count_next[COUNTER_INDEX["RX_RPC_RESPONSES"]].eq(accept & s2.send & s2.end),
            count_next[COUNTER_INDEX["PSN_GAP"]].eq(accept & s2.roce & s2.psn_gap),
            count_next[COUNTER_INDEX["RX_ARP_REQUESTS"]].eq(s2.valid & s2.arp & ~dropped),
            count_next[COUNTER_INDEX["RX_ECHO_REQUESTS"]].eq(s2.valid & s2.icmp & ~dropped),
        ]
        # The QP counters: a packet is its QP's once it passed the QPN check.
        qpn_rank = next(i for i, (_, why) in enumerate(checks) if why is DropReason.QPN)
        psn_rank = next(i for i, (_, why) in enumerate(checks) if why is DropReason.PSN)
        of_qp = Signal()
        m.d.comb += of_qp.eq(s2.valid & s2.qp_pkt & ~fail[:qpn_rank + 1].any())
        qp_count_next = Signal.like(self.qp_count)
        k_packets, k_drops, k_drops_psn = (
            [name for name, _ in QP_COUNTERS].index(name)
            for name in ("RX_PACKETS", "RX_DROPS", "RX_DROPS_PSN"))
        for n in range(num_qps):
            this = of_qp & (s2.qp == n)
            m.d.comb += [
                qp_count_next[NUM_QP_COUNTERS * n + k_packets].eq(this & accept),
                qp_count_next[NUM_QP_COUNTERS * n + k_drops].eq(this & ~accept),
                qp_count_next[NUM_QP_COUNTERS * n + k_drops_psn].eq(
                    this & fail[psn_rank] & ~fail[:psn_rank].any()),
            ]
        m.d.sync += [
            count.eq(count_next),
            self.qp_count.eq(qp_count_next),
            self.reply.valid.eq(s2.valid & (s2.arp | s2.icmp) & ~dropped),
            self.reply.arp.eq(s2.arp),
        ]

        # ---- commit engine and outputs -----------------------------------------------------
        m.d.comb += [
            commit.desc.valid.eq(desc_fifo.r_rdy),
            commit.desc.payload.eq(desc_fifo.r_data),
            desc_fifo.r_en.eq(commit.desc.ready),
            rport.addr.eq(commit.rd_addr),
            rport.en.eq(commit.rd_en),
            commit.rd_data.eq(rport.data),
            self.ctrl_req.valid.eq(ctrl_fifo.r_rdy),
            self.ctrl_req.payload.eq(ctrl_fifo.r_data),
            ctrl_fifo.r_en.eq(self.ctrl_req.ready),
            self.busy.eq(commit.busy),
        ]
        wiring.connect(m, commit.bus_cmd, wiring.flipped(self.bus_cmd))
        return m
