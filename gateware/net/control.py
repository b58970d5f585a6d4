"""Control plane: Holoscan Sensor Bridge compatible register access over UDP port 8192.

# Ref: Holoscan Sensor Bridge control bus (ECB) request/response (openqlink.wire.control);
# openqlink.memory_map (address space).

:class:`ControlPlane` takes the requests the receiver extracted (:class:`ControlRequest`), one at
a time and in order, executes their (addr, value) pairs in order (one for WR_DWORD / RD_DWORD,
1..183 for WR_BLOCK / RD_BLOCK, the pairs after the first from the receiver's pair ring,
:class:`PairPortSignature`) and gives one :class:`~openqlink.gateware.net.common.ControlReply`
per pair executed (``last`` on the final one) to the :class:`ControlReplyBuilder`, which sends
the response. The request's checks (command, flags, sequence, claim) are made once; each pair
checks its address, and the first pair that fails ends the request (its reply is the last).

Checks in Holoscan Sensor Bridge's order (its RTL's priority), the first failing one answering:

* a command byte that is none of WR_DWORD, RD_DWORD, WR_BLOCK, RD_BLOCK: BAD_COMMAND, the reply's
  ``cmd`` the byte as it came (no response bit);
* flags other than ACK_REQUEST | SEQUENCE_CHECK: status BAD_FLAGS, nothing done;
* SEQUENCE_CHECK set and ``seq`` equal to the latched ``seq``: a *retransmission* of the last
  accepted request, whose reply was lost (an openqlink extension; Holoscan Sensor Bridge's RTL
  answers SEQUENCE_ERROR): it is answered as the original was, OK, without executing its writes
  again (a TRIGGER retried runs once); its reads are done again. The latch stays;
* SEQUENCE_CHECK set and ``seq`` neither the latched ``seq`` nor the latched ``seq`` + 1 (mod
  2**16): SEQUENCE_ERROR, nothing done (the first request after reset is always accepted). None
  of these three latches ``seq``. Every other request is *accepted*: its ``seq`` becomes
  ``latched_seq``, except that an address error (BAD_ADDRESS, found here or by the PPU side's
  READ) leaves the latch as it was;
* the claim (an openqlink extension, the global CLAIM register): while the QSC is claimed, a
  request whose source MAC or IP is not the owner's is *foreign*: a write command (WR_DWORD,
  WR_BLOCK) is answered CLAIMED and not done; a read is done. Foreign requests neither check
  nor latch the sequence number (the owner's session keeps its own). An accepted write from a
  non-foreign source claims the QSC for that source (MAC and IP); its write of 0 to CLAIM
  releases it, as does a reset. A read of CLAIM gives the owner's IPv4 address, 0 when
  unclaimed;
* a pair (of any of the four commands) at a 4-byte aligned address of the rti register block
  (:class:`~openqlink.gateware.net.regs.NetRegisters`): done locally in one cycle;
* a pair inside PPU ``n``'s window (``n < num_ppus``): one ``BusCommand`` WRITE (the
  32-bit value in both halves of ``data``, byte enables 0x0F or 0xF0 by ``addr[2]``) or READ
  (``word_addr = addr >> 3``, the same byte enables naming the half wanted, ``data`` the READ's
  tag; the answer's half selected by ``addr[2]``; ``BusReadData.error`` gives BAD_ADDRESS);
* any other address (or an unaligned one): BAD_ADDRESS (the latch restored to its value before
  the request, whichever pair failed).

A reply is sent when ``flags`` has ACK_REQUEST or the command is a read (RD_DWORD, RD_BLOCK). Its
``value`` is the register read; 0 for a write and on error (as HSB's RTL answers).

The PPU side never holds a request up for long. A PPU access that the bus has not taken, or a
READ whose answer has not come, :data:`PPU_TIMEOUT_CYCLES` cycles after the request was taken is
answered with status PPU_TIMEOUT (an openqlink extension of the control-bus status set, see
:class:`openqlink.wire.control.Status`): the untaken command is withdrawn (``bus_cmd.valid``
falls without a transfer, so a WRITE answered PPU_TIMEOUT was never executed). A command that
the crossing dropped (``bus_drop`` in its transfer cycle) is answered PPU_TIMEOUT at once. Every
READ carries a new tag (:data:`~openqlink.gateware.bus.READ_TAG_BITS` bits, not reset, so that
tags do not repeat across an ``rti`` reset either); answers whose tag is not the awaited one are
late answers to READs given up on, and are taken and discarded in any state.

Bound: the reply is valid at most ``PPU_TIMEOUT_CYCLES + 2`` cycles after the request was taken
(whatever the PPU side does); it then waits only for ``reply.ready``.
"""

# No ``from __future__ import annotations``: data.Struct reads its annotations as shapes.
from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ...memory_map import PPU_BASE, PPU_STRIDE, QSCParams, global_reg
from ...wire.control import (
    BLOCK_MAX_PAIRS,
    CONTROL_PAIR,
    CONTROL_RESPONSE_HEADER,
    RESPONSE_BIT,
    RESPONSE_MIN_BYTES,
    Command,
    Flags,
    Status,
)
from ...wire.ethernet import ETHERNET, EtherType
from ...wire.ipv4 import IPV4, IpProtocol
from ...wire.udp import CONTROL_PORT, UDP
from .. import bram
from ..bus import READ_TAG_BITS, BusCommand, BusOp, BusReadData
from ..logic import named
from ..packet import packet_signature
from .common import COUNTER_INDEX, ControlReply, NetConfig
from .ipv4csum import IPv4Checksum
from .regs import NUM_COUNTERS, READ_LATENCY_CYCLES, RegisterPortSignature

__all__ = ["ControlRequest", "ControlPlane", "ControlReplyBuilder", "PairPortSignature",
           "PPU_TIMEOUT_CYCLES", "PAIR_RING_DEPTH"]

#: Cycles (``rti``) after taking a request at which a PPU access still waiting for the bus or for
#: its READ's answer is given up and answered PPU_TIMEOUT (8.2 us at 125 MHz). A power of two:
#: the time-out is the top bit of a counter, not a compare. The PPU side normally answers a READ
#: in about 20 cycles; a queue of receive-path commands ahead of it can add a few hundred.
PPU_TIMEOUT_CYCLES = 1024


#: Entries (64-bit (addr, value) pairs) of the receiver's pair ring: a block request's pairs
#: after its first wait there for the control plane. Two block RAMs of an ECP5 (512 x 36 each);
#: holds the largest block (BLOCK_MAX_PAIRS - 1 entries) twice over.
PAIR_RING_DEPTH = 512


class ControlRequest(data.Struct):
    """A control-plane request as the receiver extracted it, with where it came from.

    ``addr``/``data`` are the first (addr, value) pair; a block request's other ``pairs - 1``
    pairs wait in the receiver's pair ring (:class:`PairPortSignature`), in order."""

    src_mac: unsigned(48)
    src_ip: unsigned(32)
    src_port: unsigned(16)
    cmd: unsigned(8)
    flags: unsigned(8)
    seq: unsigned(16)
    addr: unsigned(32)
    data: unsigned(32)
    pairs: unsigned(8)      #: 1 for a DWORD command; 1..BLOCK_MAX_PAIRS for a block


class PairPortSignature(wiring.Signature):
    """The control plane's access to the receiver's pair ring (from the control plane's side).

    Members
    -------
    addr : Out(range(PAIR_RING_DEPTH))
        Entry to read; ``data`` shows it one cycle later.
    data : In(64)
        The entry: the pair's 8 bytes as they came, in lane order (byte ``i`` at bits
        ``[8*i+7 : 8*i]``: the address big-endian in bytes 0-3, the value in bytes 4-7).
    rp : Out(range(2 * PAIR_RING_DEPTH))
        The read pointer (one bit wider than an index): every entry before it is free. Advanced
        past a request's entries when the request is done.
    """

    def __init__(self):
        super().__init__({
            "addr": Out(range(PAIR_RING_DEPTH)),
            "data": In(64),
            "rp": Out(range(2 * PAIR_RING_DEPTH)),
        })


_KNOWN_FLAGS = int(Flags.ACK_REQUEST | Flags.SEQUENCE_CHECK)


class ControlPlane(wiring.Component):
    """Executes control-plane requests in order, one at a time.

    Parameters
    ----------
    params : QSCParams
        ``num_ppus`` bounds the PPU windows reachable through the bus.

    Members
    -------
    req : In(stream.Signature(ControlRequest))
        Requests from the receiver; taken one at a time (``ready`` only while idle).
    reply : Out(stream.Signature(ControlReply))
        Replies for the TX builder; ``valid`` is a register and holds until ``ready``.
    bus_cmd : Out(stream.Signature(BusCommand))
        At most one READ or WRITE per request; ``valid`` is a register (stream rules hold).
    bus_rdata : In(stream.Signature(BusReadData))
        Answers to READs; ``ready`` is always high: an answer whose ``tag`` is not the awaited
        READ's is discarded.
    bus_drop : In(1)
        The crossing drops the command offered on the bus this cycle instead of delivering it
        (``bus_cmd.ready`` high but nothing reaches the PPU). Counted as DROP_BUS; this block's
        own command so dropped is answered PPU_TIMEOUT.
    regs : Out(RegisterPortSignature())
        Access to the rti register block.
    count : Out(NUM_COUNTERS)
        Counter increment strobes: RX_CONTROL for every accepted request (flags and sequence
        checks passed), DROP_BUS for every ``bus_drop``.
    busy : Out(1)
        A bus command is pending (``bus_cmd.valid``), for the bus arbiter.

    Latency: a local register access replies 4 cycles after the request is taken (the request's
    checks and the register block's read are registered on the way); a PPU access
    waits for ``bus_cmd.ready`` and, for a READ, for its answer, at most
    :data:`PPU_TIMEOUT_CYCLES` cycles in all (the reply is valid at most
    ``PPU_TIMEOUT_CYCLES + 2`` cycles after the request was taken).
    """

    def __init__(self, params: QSCParams):
        self.params = params
        super().__init__({
            "req": In(stream.Signature(ControlRequest)),
            "reply": Out(stream.Signature(ControlReply)),
            "bus_cmd": Out(stream.Signature(BusCommand)),
            "bus_rdata": In(stream.Signature(BusReadData)),
            "bus_drop": In(1),
            "regs": Out(RegisterPortSignature()),
            "pairs": Out(PairPortSignature()),
            "count": Out(NUM_COUNTERS),
            "busy": Out(1),
        })

    def elaborate(self, platform) -> Module:
        m = Module()
        num_ppus = self.params.num_ppus

        req = Signal(ControlRequest)
        status = Signal(8)
        value = Signal(32)
        want_reply = Signal()
        # ``reply.valid``, a flip-flop of its own (set with the move into REPLY, from what
        # ``want_reply`` is then), so that the TX builder's many selects on it follow a
        # register, not this FSM's state decode.
        reply_valid = Signal()
        have_seq = Signal()
        last_seq = Signal(16)
        # the latch before the request in progress, restored if its bus READ finds no register
        prev_have_seq = Signal()
        prev_seq = Signal(16)
        # The claim (global CLAIM register): the source MAC and IP of the host that owns the
        # control plane while ``claimed``.
        claimed = Signal()
        owner_mac = Signal(48)
        owner_ip = Signal(32)
        # A request's pairs: the first came with it; ``left`` more wait in the pair ring from
        # ``ring_at`` on. ``first``: the pair in ``req`` is the request's first (its checks of
        # the header count; later pairs only check their address).
        first = Signal()
        left = Signal(8)
        ring_at = Signal(len(self.pairs.rp))
        rp = Signal(len(self.pairs.rp))
        m.d.comb += [self.pairs.addr.eq(ring_at), self.pairs.rp.eq(rp)]

        # The request is taken into ``req`` (IDLE), its checks are registered as single bits
        # (CHECK) while the register block decodes ``req.addr`` (READ_LATENCY_CYCLES), and DECODE
        # only combines registered bits.
        assert READ_LATENCY_CYCLES == 2
        is_read = Signal()
        seq_next = Signal(16, init=1)       # last_seq + 1
        seq_bad = Signal()
        retransmit = Signal()               # the latched seq again: writes not executed
        flags_bad = Signal()
        in_ppu = Signal()
        aligned = Signal()
        cmd_bad = Signal()                  # not one of the four commands: echoed raw
        ack = Signal()
        foreign = Signal()                  # claimed, and not by the requester
        is_write = Signal()
        claim_reg = Signal()                # the address is the CLAIM register
        num_windows = Const(PPU_BASE // PPU_STRIDE, 8)
        assert PPU_BASE % PPU_STRIDE == 0 and PPU_STRIDE == 1 << 24
        w_en = Signal()                     # a local register write, the cycle after DECODE
        access = Signal()                   # checks passed, aligned, not CLAIM (WAIT)
        m.d.sync += w_en.eq(0)

        accepted = Signal()     # a request passed the flags and sequence checks (RX_CONTROL)
        stop = Signal()         # the pair in ``req`` is the request's last to execute
        m.d.comb += stop.eq((status != Status.OK) | (left == 0))
        m.d.comb += [
            self.regs.addr.eq(req.addr),
            self.regs.w_data.eq(req.data),
            self.regs.w_en.eq(w_en),
            self.busy.eq(self.bus_cmd.valid),
            # One assignment of the whole vector (a continuous assign in Verilog: Icarus never
            # runs an ``always @*`` block whose inputs keep their initial values).
            self.count.eq((accepted << COUNTER_INDEX["RX_CONTROL"]) |
                          (self.bus_drop << COUNTER_INDEX["DROP_BUS"])),
        ]

        # Time since the request was taken; the time-out is its top bit (no wide compare).
        elapsed = Signal(range(2 * PPU_TIMEOUT_CYCLES))
        timed_out = elapsed[-1]
        assert PPU_TIMEOUT_CYCLES & (PPU_TIMEOUT_CYCLES - 1) == 0

        # Tag of the READ awaited. Not reset: after an rti reset a late answer to a READ issued
        # before it must not match the first READ issued after it.
        tag = Signal(READ_TAG_BITS, reset_less=True)
        in_read = Signal()
        next_tag = Signal(READ_TAG_BITS)
        m.d.comb += [
            next_tag.eq(tag + 1),
            # Answers are always taken; only the awaited one is used (READ state below).
            self.bus_rdata.ready.eq(1),
        ]

        # The awaited READ's answer, registered (the tag compare and the half select in front
        # of the register): taken in READ one cycle after it came.
        answer = Signal(data.StructLayout({"valid": 1, "error": 1, "value": 32}))
        rdata = self.bus_rdata.payload
        m.d.sync += [
            answer.valid.eq(self.bus_rdata.valid & (rdata.tag == tag) & in_read),
            answer.error.eq(rdata.error),
            answer.value.eq(Mux(req.addr[2], rdata.data[32:], rdata.data[:32])),
        ]

        def to_reply():
            # The move into REPLY from BUS or READ (``want_reply`` is known there).
            m.d.sync += reply_valid.eq(want_reply)
            m.next = "REPLY"

        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.comb += self.req.ready.eq(1)
                with m.If(self.req.valid):
                    m.d.sync += [req.eq(self.req.payload), first.eq(1),
                                 left.eq(self.req.payload.pairs - 1)]
                    m.next = "CHECK"

            with m.State("CHECK"):
                foreign_now = claimed & ((req.src_ip != owner_ip) | (req.src_mac != owner_mac))
                seq_checked = (req.flags & Flags.SEQUENCE_CHECK).any() & have_seq & ~foreign_now
                with m.If(first):   # the first pair's verdict holds for the whole request
                    m.d.sync += retransmit.eq(seq_checked & (req.seq == last_seq))
                m.d.sync += [
                    foreign.eq(foreign_now),
                    is_write.eq((req.cmd == Command.WR_DWORD) | (req.cmd == Command.WR_BLOCK)),
                    claim_reg.eq(req.addr == global_reg("CLAIM")),
                    is_read.eq((req.cmd == Command.RD_DWORD) | (req.cmd == Command.RD_BLOCK)),
                    cmd_bad.eq((req.cmd != Command.WR_DWORD) & (req.cmd != Command.RD_DWORD) &
                               (req.cmd != Command.WR_BLOCK) & (req.cmd != Command.RD_BLOCK)),
                    aligned.eq(req.addr[:2] == 0),
                    ack.eq((req.flags & Flags.ACK_REQUEST).any()),
                    flags_bad.eq((req.flags & ~Const(_KNOWN_FLAGS, 8)).any()),
                    # another host's requests neither check nor latch the owner's sequence
                    seq_bad.eq(seq_checked & (req.seq != seq_next) & (req.seq != last_seq) &
                               first),
                    in_ppu.eq((req.addr[24:] >= num_windows) &
                              (req.addr[24:] < num_windows + num_ppus)),
                ]
                m.next = "WAIT"

            with m.State("WAIT"):
                m.d.sync += access.eq(~cmd_bad & ~flags_bad & ~seq_bad & ~(foreign & is_write) &
                                      ~(retransmit & is_write) & aligned & ~claim_reg)
                m.next = "DECODE"

            with m.State("DECODE"):
                m.d.sync += [
                    want_reply.eq(ack | is_read),
                    reply_valid.eq(ack | is_read),      # to REPLY, unless to BUS (below)
                    value.eq(0),
                ]
                # Holoscan Sensor Bridge's priority: command, flags, sequence, (claim), address
                with m.If(cmd_bad):
                    m.d.sync += status.eq(Status.BAD_COMMAND)
                    m.next = "REPLY"
                with m.Elif(flags_bad):
                    m.d.sync += status.eq(Status.BAD_FLAGS)
                    m.next = "REPLY"
                with m.Elif(seq_bad):
                    m.d.sync += status.eq(Status.SEQUENCE_ERROR)
                    m.next = "REPLY"
                with m.Elif(foreign & is_write):
                    m.d.sync += status.eq(Status.CLAIMED)
                    m.next = "REPLY"
                with m.Else():
                    # the sequence number is latched by the first pair, but not on its address
                    # error (nor by another host's request); an address error of a later pair,
                    # or a bus READ's error, restores the latch from before the request (HSB's
                    # RTL reverts it the same way)
                    addr_bad = ~aligned | (~claim_reg & ~in_ppu & ~self.regs.hit)
                    with m.If(first):
                        m.d.sync += [prev_seq.eq(last_seq), prev_have_seq.eq(have_seq)]
                        with m.If(~foreign & ~addr_bad):
                            m.d.sync += [last_seq.eq(req.seq), seq_next.eq(req.seq + 1),
                                         have_seq.eq(1)]
                    with m.Elif(addr_bad):
                        m.d.sync += [last_seq.eq(prev_seq), seq_next.eq(prev_seq + 1),
                                     have_seq.eq(prev_have_seq)]
                    m.d.comb += accepted.eq(first)
                    m.next = "REPLY"
                    # an accepted write claims the QSC for its source (it is the owner's, or
                    # the QSC is unclaimed); the owner's write of 0 to CLAIM releases it
                    with m.If(is_write & ~retransmit):
                        m.d.sync += [claimed.eq(1), owner_mac.eq(req.src_mac),
                                     owner_ip.eq(req.src_ip)]
                        with m.If(claim_reg & (req.data == 0)):
                            m.d.sync += claimed.eq(0)
                    with m.If(~aligned):
                        m.d.sync += status.eq(Status.BAD_ADDRESS)
                    with m.Elif(claim_reg):
                        m.d.sync += [status.eq(Status.OK),
                                     value.eq(Mux(is_read, Mux(claimed, owner_ip, 0),
                                                  req.data))]
                    with m.Elif(~in_ppu | self.regs.hit):
                        m.d.sync += status.eq(Status.BAD_ADDRESS)
                        with m.If(self.regs.hit):
                            m.d.sync += status.eq(Status.OK)
                    with m.Else():
                        m.d.sync += status.eq(Status.OK)
                with m.If(access & self.regs.hit):
                    with m.If(is_read):
                        m.d.sync += value.eq(self.regs.r_data)
                    with m.Else():
                        m.d.sync += [w_en.eq(1), value.eq(req.data)]
                with m.If(access & ~self.regs.hit & in_ppu):
                    m.d.sync += [
                        reply_valid.eq(0),
                        self.bus_cmd.valid.eq(1),
                        self.bus_cmd.payload.word_addr.eq(req.addr[3:]),
                        self.bus_cmd.payload.op.eq(Mux(is_read, BusOp.READ, BusOp.WRITE)),
                        self.bus_cmd.payload.be.eq(Mux(req.addr[2], 0xF0, 0x0F)),
                        self.bus_cmd.payload.data.eq(
                            Mux(is_read, next_tag, Cat(req.data, req.data))),
                    ]
                    with m.If(is_read):
                        m.d.sync += tag.eq(next_tag)
                    with m.Else():
                        m.d.sync += value.eq(req.data)
                    m.next = "BUS"

            with m.State("BUS"):
                with m.If(self.bus_cmd.ready):
                    m.d.sync += self.bus_cmd.valid.eq(0)
                    with m.If(self.bus_drop):
                        m.d.sync += status.eq(Status.PPU_TIMEOUT)
                        to_reply()
                    with m.Elif(is_read):
                        m.next = "READ"
                    with m.Else():
                        to_reply()
                with m.Elif(timed_out):
                    # Withdrawn untaken: the PPU side never sees it.
                    m.d.sync += [self.bus_cmd.valid.eq(0), status.eq(Status.PPU_TIMEOUT)]
                    to_reply()

            with m.State("READ"):
                with m.If(answer.valid):
                    with m.If(answer.error):
                        m.d.sync += [status.eq(Status.BAD_ADDRESS), last_seq.eq(prev_seq),
                                     seq_next.eq(prev_seq + 1), have_seq.eq(prev_have_seq)]
                    with m.Else():
                        m.d.sync += value.eq(answer.value)
                    to_reply()
                with m.Elif(timed_out):
                    m.d.sync += status.eq(Status.PPU_TIMEOUT)
                    to_reply()

            with m.State("REPLY"):
                with m.If(~want_reply | self.reply.ready):
                    m.d.sync += reply_valid.eq(0)
                    with m.If(stop):
                        # the request's pairs are freed, whether executed or not
                        m.d.sync += [rp.eq(rp + req.pairs - 1), ring_at.eq(rp + req.pairs - 1)]
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "NEXT"

            with m.State("NEXT"):
                # the next pair, from the ring (``pairs.data`` shows ``ring_at``'s entry: it
                # has not moved for at least a cycle)
                pair = CONTROL_PAIR.view(self.pairs.data)
                m.d.sync += [req.addr.eq(pair["addr"]), req.data.eq(pair["value"]),
                             ring_at.eq(ring_at + 1), left.eq(left - 1), first.eq(0)]
                m.next = "CHECK"

        # The reply's fields are the registers they come from in every state (they matter only
        # while ``reply.valid`` is high, in REPLY).
        reply = self.reply.payload
        m.d.comb += [
            reply.dst_mac.eq(req.src_mac),
            reply.dst_ip.eq(req.src_ip),
            reply.dst_port.eq(req.src_port),
            # an invalid command byte is echoed as it came (HSB's RTL)
            reply.cmd.eq(Mux(cmd_bad, req.cmd, req.cmd | RESPONSE_BIT)),
            reply.flags.eq(req.flags),
            reply.seq.eq(req.seq),
            reply.status.eq(status),
            reply.addr.eq(req.addr),
            # the register read; 0 for a write (HSB's RTL) and on error
            reply.value.eq(Mux((status == Status.OK) & is_read, value, 0)),
            reply.latched_seq.eq(last_seq),
            reply.last.eq(stop),
            self.reply.valid.eq(reply_valid),
        ]

        m.d.comb += in_read.eq(fsm.ongoing("READ"))
        with m.If(fsm.ongoing("IDLE")):
            m.d.sync += elapsed.eq(0)
        with m.Elif(~timed_out):
            m.d.sync += elapsed.eq(elapsed + 1)
        return m


#: Bytes of a response frame before its pairs: Ethernet, IPv4, UDP and the response header
#: (48: the pairs start beat-aligned).
_REPLY_HEAD_BYTES = (ETHERNET.length_bytes + IPV4.length_bytes + UDP.length_bytes +
                     CONTROL_RESPONSE_HEADER.length_bytes)
_REPLY_HEAD_BEATS = _REPLY_HEAD_BYTES // 8
assert _REPLY_HEAD_BYTES % 8 == 0


class ControlReplyBuilder(wiring.Component):
    """Turns the control plane's response pairs into one UDP datagram per response.

    # Ref: Holoscan Sensor Bridge control bus (ECB) response (openqlink.wire.control); RFC 791
    # (IPv4 header checksum); RFC 768 (UDP, checksum 0).

    The pairs of a response (:class:`~.common.ControlReply`, ``last`` on its last) are kept in a
    block RAM as they come; the last one's fields (addresses, cmd, flags, seq, status,
    latched_seq) head the frame: Ethernet, IPv4 (checksum computed), UDP from port 8192 to the
    requester's port, the 6-byte response header, the pairs (8 bytes each, beat-aligned from
    byte 48) and ``latched_seq``; a one-pair response is padded to 60 bytes (18 payload bytes,
    as HSB pads them), a longer one is ``50 + 8 n`` bytes.

    Members
    -------
    reply : In(stream.Signature(ControlReply))
        Pairs; ``ready`` while collecting, low from a response's last pair until its frame has
        left (at most BLOCK_MAX_PAIRS pairs per response: later ones overwrite the last).
    config : In(NetConfig)
        ``qsc_mac`` and ``qsc_ip``, the frame's source, sampled with the last pair.
    tx : Out(packet_signature())
        The frames, one beat per cycle while ``ready``.
    sent : Out(1)
        One-cycle strobe when a frame's last beat is taken (TX_FRAMES).

    Latency: the first beat is valid 4 cycles after the last pair was taken (the IPv4 checksum
    takes 2).
    """

    reply: In(stream.Signature(ControlReply))
    config: In(NetConfig)
    tx: Out(packet_signature())
    sent: Out(1)

    def elaborate(self, platform) -> Module:
        m = Module()
        depth = 1 << (BLOCK_MAX_PAIRS - 1).bit_length()
        m.submodules.pairs = pairs = Memory(shape=64, depth=depth, init=[],
                                            attrs={"no_rw_check": True})
        wport = pairs.write_port()
        rport = bram.read_port(m, pairs, name="reply_pairs_r")
        m.submodules.csum = csum = IPv4Checksum()

        r = self.reply.payload
        count = Signal(range(depth + 1))         # pairs collected
        head = Signal(ControlReply)              # the last pair's fields
        mac = Signal(48)
        ip = Signal(32)
        udp_len = Signal(16)
        ip_csum = Signal(16)
        beat = Signal(8)                         # the beat to load next
        last_beat = Signal(8)                    # _REPLY_HEAD_BEATS + pairs: latched_seq's

        tx = self.tx
        load = Signal()
        m.d.comb += [
            wport.addr.eq(count),
            wport.data.eq(CONTROL_PAIR.build(addr=r.addr, value=r.value)),
            # ``rport.data`` shows pair ``beat - _REPLY_HEAD_BEATS`` (the address of the beat
            # loaded next, one cycle ahead)
            rport.addr.eq(Mux(load, beat + 1, beat) - _REPLY_HEAD_BEATS),
            self.sent.eq(tx.valid & tx.ready & tx.payload.last),
        ]
        def ip_header(checksum) -> Value:
            return IPV4.build(tos=0, total_length=udp_len + IPV4.length_bytes, identification=0,
                              fragment_offset=0, protocol=IpProtocol.UDP.value, src=ip,
                              dst=head.dst_ip, checksum=checksum)

        frame = Cat(
            ETHERNET.build(dst=head.dst_mac, src=mac, ethertype=EtherType.IPV4.value),
            ip_header(ip_csum),
            UDP.build(src_port=CONTROL_PORT, dst_port=head.dst_port, length=udp_len,
                      checksum=0),
            CONTROL_RESPONSE_HEADER.build(cmd=head.cmd, flags=head.flags, seq=head.seq,
                                          status=head.status, reserved=0),
        )
        assert len(frame) == 8 * _REPLY_HEAD_BYTES
        frame = named(m, frame, "reply_head")
        tail = Cat(head.latched_seq[8:], head.latched_seq[:8], Const(0, 48))

        with m.If(tx.valid & tx.ready):
            m.d.sync += tx.valid.eq(0)
        with m.FSM():
            with m.State("COLLECT"):
                m.d.comb += [self.reply.ready.eq(1), wport.en.eq(self.reply.valid)]
                with m.If(self.reply.valid):
                    with m.If(count < depth - 1):
                        m.d.sync += count.eq(count + 1)
                    with m.If(r.last):
                        m.d.sync += [
                            head.eq(r), mac.eq(self.config.qsc_mac), ip.eq(self.config.qsc_ip),
                            # 18 payload bytes for one pair, 6 + 8 n + 2 for more
                            udp_len.eq(UDP.length_bytes +
                                       Mux(count == 0, RESPONSE_MIN_BYTES,
                                           CONTROL_RESPONSE_HEADER.length_bytes + 2 +
                                           8 * (count + 1))),
                            last_beat.eq(_REPLY_HEAD_BEATS + count + 1),
                            beat.eq(0),
                        ]
                        m.next = "SUM"
            with m.State("SUM"):
                m.d.comb += [csum.valid.eq(1), csum.header.eq(ip_header(0))]
                m.next = "SUM2"
            with m.State("SUM2"):
                m.next = "SUM3"
            with m.State("SUM3"):
                m.d.sync += ip_csum.eq(csum.checksum)
                m.next = "SEND"
            with m.State("SEND"):
                m.d.comb += load.eq(~tx.valid | tx.ready)
                with m.If(load):
                    with m.If(beat < _REPLY_HEAD_BEATS):
                        with m.Switch(beat):
                            for k in range(_REPLY_HEAD_BEATS):
                                with m.Case(k):
                                    m.d.sync += tx.payload.data.eq(frame[64 * k:64 * k + 64])
                    with m.Elif(beat == last_beat):
                        m.d.sync += tx.payload.data.eq(tail)
                    with m.Else():
                        m.d.sync += tx.payload.data.eq(rport.data)
                    is_last = beat == last_beat
                    m.d.sync += [
                        tx.valid.eq(1),
                        tx.payload.first.eq(beat == 0),
                        tx.payload.last.eq(is_last),
                        # latched_seq, padded to 60 bytes after one pair
                        tx.payload.keep.eq(Mux(is_last, Mux(count == 1, 0x0F, 0x03), 0xFF)),
                        tx.payload.error.eq(0),
                        beat.eq(beat + 1),
                    ]
                    with m.If(is_last):
                        m.next = "DRAIN"
            with m.State("DRAIN"):
                # the last beat leaves; then the next response's pairs may come
                with m.If(~tx.valid | tx.ready):
                    m.d.sync += count.eq(0)
                    m.next = "COLLECT"
        return m
