"""The CALL unit of a PPU: RPC requests out, responses in through the response mailbox.

A CALL is NVQLink's ``device_call`` seen from the PPU. The unit sends a
:class:`~openqlink.gateware.bus.CallRequest` (the network core turns it into a CUDA-Q realtime
RPC request), then waits for the response, which the host SENDs into the PPU's 64-byte response
mailbox: the network core writes it with bus WRITEs and then issues one ``BusOp.MAILBOX_COMMIT``
whose ``data[15:0]`` is the byte count. The mailbox then holds an ``RPCResponse`` header (24
bytes, little-endian) followed by ``result_len`` result bytes.

A response is taken only if a call is waiting (its request already handed over), the magic is
CUQS, the request_id is the awaited one, the byte count is 24..64 and ``result_len`` fits in it.
Anything else is dropped and counted in ``stale`` (STALE_RESPONSES): a late answer to a call that
timed out can never be taken as a later call's result, because every call has a new request_id.

Slots. The network core writes the requests into the host ring's slots round-robin, and the host
owns a slot until it answers. The unit counts the requests handed over but not answered
(``outstanding``): a response (taken or stale) whose request_id is one of them answers it and
every older one (a request the host never saw was lost, and its slot is free). A call starts
only while fewer than ``slots`` (the ring's size) are outstanding; else it waits, under its
time-out. ``slots_reset`` forgets the outstanding requests (the host restarted its ring).

# Ref: cuda-quantum realtime/docs/cudaq_realtime_message_protocol.md (RPCResponse);
# openqlink docs/architecture.md (CALL); openqlink.memory_map (CALL registers).
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...wire.rpc import HEADER_BYTES, RESPONSE_MAGIC, RPCResponse
from ..bus import MAX_CALL_ARG_BYTES, BusCommand, call_request_layout

__all__ = ["CallUnit", "MAILBOX_WORDS", "CALL_SEQ_BITS"]

#: 64-bit words in the response mailbox (64 bytes).
MAILBOX_WORDS = 8
#: Groups of the mailbox read mux that each have a copy of the word address.
_READ_GROUPS = 4
#: Bits of the per-PPU call sequence number in ``request_id = (ppu << 24) | seq``.
CALL_SEQ_BITS = 24


class CallUnit(wiring.Component):
    """CALL request/response engine and response mailbox of one PPU (``sync`` = dtd).

    Parameters
    ----------
    ppu : int
        Index of the PPU (0..15): ``CallRequest.ppu`` and the top byte of ``request_id``.
    arg_bytes : int
        The build's ``call_arg_bytes`` (0..16): the width of ``arg`` and of the request's
        ``args`` (:func:`~openqlink.gateware.bus.call_request_layout`).

    Members
    -------
    issue : ``In(1)``
        Start a call with ``function_id : In(32)``, ``arg : In(8 * arg_bytes)`` (the argument
        bytes, byte i at bits [8i+7:8i], already packed and masked by the caller) and
        ``arg_len : In(range(arg_bytes + 1))`` (0..arg_bytes bytes). The
        call starts in this cycle when the unit is idle; while it is busy (a previous call's
        request not yet handed over, or its response awaited) or ``slots`` requests are
        outstanding, the issue is kept and the call starts in the first idle cycle with a
        slot free, with the inputs of that cycle: the caller holds them
        until ``done``, ``failed``, ``timeout`` or ``abort``. One issue per call.
    busy : ``Out(1)``
        A request is waiting to be handed over, or a response is awaited.
    abort : ``In(1)``
        Stop waiting (the PPU stopped on an error) and drop a kept issue. A request already
        offered on ``call_req`` stays offered until it is taken (stream rule); its response
        will count as stale.
    done : ``Out(1)``; ``result : Out(64)``
        One-cycle pulse, two cycles after the commit: the awaited response arrived with status
        0; ``result`` is its first 8 result bytes, little-endian, zero-extended when
        ``result_len < 8``; it holds until the next response is taken.
    failed : ``Out(1)``
        One-cycle pulse, two cycles after the commit: the awaited response had a status != 0.
    timeout : ``Out(1)``
        One-cycle pulse: ``timeout_cycles`` (``In(32)``, 0 = never) cycles have passed since the
        issue cycle with no response; the unit stops waiting. The time-out covers the whole
        call: a kept issue (its request never offered, because an earlier request is still
        not taken) times out too, and is dropped.
    call_req : ``Out(stream.Signature(call_request_layout(arg_bytes)))``
        The request; valid from the cycle after ``issue`` until taken (while the unit is idle
        its payload follows the inputs, with ``valid`` low).
    bus_cmd : ``In(BusCommand)``; ``mb_write : In(1)``; ``mb_commit : In(1)``
        The PPU's bus command as it enters the PPU (``word_addr[2:0]`` the mailbox word,
        ``be``, ``data``), and whether it is a WRITE to a mapped mailbox word or a
        MAILBOX_COMMIT to the mailbox region (``data[15:0]`` the byte count). The unit
        registers them in a command stage of its own, in step with the PPU's (its registers
        sit by the mailbox): a WRITE lands, and a commit parses the mailbox (after all its
        writes), in the cycle after the command.
    mb_rdata : ``Out(64)``
        The mailbox word of the command stage's address (``word_addr[2:0]``), registered: valid
        two cycles after the command, for a READ of the mailbox region.
    last_status : ``Out(32)``
        ``status`` of the last response taken (LAST_CALL_STATUS).
    call_count : ``Out(32)``
        Requests handed over since reset (CALL_COUNT), wrapping.
    stale : ``Out(32)``
        Responses dropped (STALE_RESPONSES), wrapping.
    slots : ``In(13)``
        Requests the host ring holds (its NUM_SLOTS; 0 is taken as 1).
    slots_reset : ``In(1)``
        Forget every outstanding request (the host restarted its ring).
    outstanding : ``Out(24)``
        Requests handed over and not answered yet.
    last_rtt_cycles : ``Out(32)``
        Cycles from the ``call_req`` handshake to the cycle the response was taken.

    Latency: ``call_req`` is valid one cycle after ``issue``; a commit is registered, the
    response taken in the next cycle (``busy`` is low from the one after) and ``done``/``failed``
    pulse, with ``result``, two cycles after the commit.
    """

    def __init__(self, ppu: int, arg_bytes: int = MAX_CALL_ARG_BYTES):
        if not 0 <= ppu < 16:
            raise ValueError(f"ppu must be 0..15, not {ppu}")
        layout = call_request_layout(arg_bytes)
        self._ppu = ppu
        super().__init__({
            "issue": In(1),
            "function_id": In(32),
            "arg": In(8 * arg_bytes),
            "arg_len": In(arg_bytes.bit_length()),
            "busy": Out(1),
            "abort": In(1),
            "done": Out(1),
            "result": Out(64),
            "failed": Out(1),
            "timeout": Out(1),
            "timeout_cycles": In(32),
            "call_req": Out(stream.Signature(layout)),
            "bus_cmd": In(BusCommand),
            "mb_write": In(1),
            "mb_commit": In(1),
            "mb_rdata": Out(64),
            "last_status": Out(32),
            "call_count": Out(32),
            "stale": Out(32),
            "last_rtt_cycles": Out(32),
            "slots": In(13),
            "slots_reset": In(1),
            "outstanding": Out(24),
        })

    def elaborate(self, platform):
        m = Module()

        # Command stage: the mailbox's WRITE, COMMIT and read address, registered here. A
        # COMMIT's byte count ``n`` is checked ahead: 24..64, and ``n[6:0] - 24`` (mod 128).
        mb_we = Signal()
        # The mailbox word address, as copies of one register (kept apart by the build): the
        # first selects the word a WRITE lands in, each other one a 16-bit group of the read
        # mux (a copy per group, so that no address bit reaches all 64 bits' selections).
        mb_addrs = [Signal(3, name=f"mb_addr__rep{k}") for k in range(1 + _READ_GROUPS)]
        mb_addr = mb_addrs[0]
        mb_be = Signal(8)
        mb_data = Signal(64)
        commit = Signal()
        commit_len_ok = Signal()
        commit_room = Signal(7)
        count = self.bus_cmd.data[:16]
        m.d.sync += [
            mb_we.eq(self.mb_write),
            *(a.eq(self.bus_cmd.word_addr[:3]) for a in mb_addrs),
            mb_be.eq(self.bus_cmd.be),
            mb_data.eq(self.bus_cmd.data),
            commit.eq(self.mb_commit),
            commit_len_ok.eq((count >= HEADER_BYTES) & (count <= 8 * MAILBOX_WORDS)),
            commit_room.eq(count[:7] - HEADER_BYTES),
        ]

        # Response mailbox: 8 x 64-bit registers, byte-writable.
        mailbox = Array(Signal(64, name=f"mailbox{i}") for i in range(MAILBOX_WORDS))
        with m.If(mb_we):
            word = mailbox[mb_addr]
            for b in range(8):
                with m.If(mb_be[b]):
                    m.d.sync += word[8 * b:8 * b + 8].eq(mb_data[8 * b:8 * b + 8])
        grp = 64 // _READ_GROUPS
        for k, addr in enumerate(mb_addrs[1:]):
            m.d.sync += self.mb_rdata[k * grp:(k + 1) * grp].eq(
                Array(w[k * grp:(k + 1) * grp] for w in mailbox)[addr])

        seq = Signal(CALL_SEQ_BITS)
        req_valid = Signal()
        waiting = Signal()      # a response is awaited
        sent = Signal()         # ... and its request has been handed over
        awaited = Signal(32)
        elapsed = Signal(32)    # cycles since the issue cycle, plus one
        rtt = Signal(32)        # cycles since the handshake cycle
        m.d.comb += [
            self.busy.eq(req_valid | waiting),
            self.call_req.valid.eq(req_valid),
        ]

        # Issue. While idle, the request and its counters follow the inputs every cycle, so
        # a start only sets a few flip-flops. ``busy`` does not reach the caller's ``issue``:
        # an issue while busy is kept in ``kept`` (a CALL after an error stop, while the
        # stopped call's request is still offered) and starts the call once idle.
        kept = Signal()
        start = Signal()
        # ``room``: fewer than ``slots`` requests outstanding, registered (the count changes at
        # a handshake or a response, while the unit is busy, or at a reset).
        room = Signal()
        released = Signal(CALL_SEQ_BITS)   # the oldest request not answered yet
        count_now = (seq - released)[:CALL_SEQ_BITS]
        m.d.sync += room.eq(count_now < Mux(self.slots == 0, 1, self.slots))
        m.d.comb += self.outstanding.eq(count_now)
        m.d.comb += start.eq((self.issue | (kept & ~self.abort)) & ~self.busy & room)
        with m.If(~self.busy):
            request_id = Cat(seq, Const(self._ppu, 8))
            m.d.sync += [
                self.call_req.payload.ppu.eq(self._ppu),
                self.call_req.payload.function_id.eq(self.function_id),
                self.call_req.payload.request_id.eq(request_id),
                self.call_req.payload.arg_len.eq(self.arg_len),
                self.call_req.payload.args.eq(self.arg),
                awaited.eq(request_id),
            ]
        # ``elapsed`` counts from the issue cycle, a kept issue's included: the time-out covers
        # the whole call, from the issue to the response (a request that cannot be handed over
        # times out like a response that never comes). An issue's restart below wins.
        # ``restart``: no call counts (idle), or one starts counting now.
        restart = Signal()
        m.d.comb += restart.eq(~kept & (~self.busy | self.issue))
        with m.If(waiting | kept):
            m.d.sync += elapsed.eq(elapsed + 1)
        with m.If(restart):
            m.d.sync += elapsed.eq(2)
        with m.If(start):
            m.d.sync += [
                req_valid.eq(1),
                waiting.eq(1),
                sent.eq(0),
                kept.eq(0),
            ]
        with m.Elif(self.issue):
            m.d.sync += kept.eq(1)
        with m.If(self.slots_reset):
            m.d.sync += released.eq(seq)

        # Handshake. The sequence number moves on here, not at the start (a start stays a few
        # flip-flops): a call's request_id was taken from ``seq`` while the unit was idle, and
        # the unit is idle again only after its request was handed over.
        with m.If(self.call_req.valid & self.call_req.ready):
            m.d.sync += [
                req_valid.eq(0),
                sent.eq(1),
                rtt.eq(1),
                seq.eq(seq + 1),
                self.call_count.eq(self.call_count + 1),
            ]
        with m.Elif(sent):
            m.d.sync += rtt.eq(rtt + 1)

        # Response parsing, in stages. The check stage ``chk_*`` registers, every cycle, the
        # header checks that need no commit (the mailbox is written before its commit); the
        # commit stage ``commit_r`` registers the MAILBOX_COMMIT once more (its byte count was
        # checked in the command stage); in its cycle the response is taken (or dropped), and
        # done/failed pulse in the next.
        # The result's status and first eight bytes are registered in the check stage too, so
        # the response stage only chooses between flip-flops.
        header = RPCResponse(Cat(mailbox[0], mailbox[1], mailbox[2]))
        chk_magic = Signal()
        chk_rid = Signal()
        chk_status_ok = Signal()   # status == 0
        chk_word = Signal(64)      # the first eight result bytes ...
        chk_keep = Signal(8)       # ... and which of them result_len keeps (byte b: len > b)
        chk_answers = Signal()     # the request_id is this unit's and outstanding
        commit_r = Signal()
        length_ok = Signal()       # the byte count fits the header and result_len
        # ``result_len > b`` for each byte b < 8, as an OR of its high bits (LUTs beside the
        # mailbox, not a 32-bit carry chain); the word and the byte mask are registered apart
        # and AND'ed in the result stage.
        # A response is taken only with ``result_len`` <= 40 (``length_ok``), so its bits
        # 3..7 decide "at least 8" for every response taken.
        len_lo = header.result_len[:8]
        len_hi = len_lo[3:].any()
        m.d.sync += [
            chk_magic.eq(header.magic == RESPONSE_MAGIC),
            chk_rid.eq(header.request_id == awaited),
            chk_status_ok.eq(header.status == 0),
            chk_word.eq(mailbox[3]),
            chk_keep.eq(Cat(*(len_hi | (header.result_len[:3] > b) for b in range(8)))),
            chk_answers.eq((header.request_id[CALL_SEQ_BITS:] == self._ppu) &
                           ((header.request_id[:CALL_SEQ_BITS] - released)[:CALL_SEQ_BITS] <
                            self.outstanding)),
            commit_r.eq(commit),
            # The mailbox's last write precedes the commit: its header is final in this cycle.
            length_ok.eq(commit_len_ok & (header.result_len[6:] == 0) &
                         (header.result_len[:6] <= commit_room)),
        ]
        match = waiting & sent & length_ok & chk_magic & chk_rid
        # Result stage: done/failed/result registered, the cycle after the response is taken.
        # The mailbox is the same here as in the commit's cycle (the command stage held the
        # commit then, not a write), so the header read now is the one the checks saw.
        m.d.sync += [self.done.eq(0), self.failed.eq(0)]
        with m.If(commit_r & length_ok & chk_magic & chk_answers & ~self.slots_reset):
            # The host answered this request: its slot and every older one are free.
            m.d.sync += released.eq(header.request_id[:CALL_SEQ_BITS] + 1)
        with m.If(commit_r):
            with m.If(match):
                m.d.sync += [
                    self.last_status.eq(header.status),
                    self.last_rtt_cycles.eq(rtt),
                    waiting.eq(0),
                    sent.eq(0),
                    self.result.eq(chk_word & Cat(*(k.replicate(8) for k in chk_keep))),
                ]
                with m.If(chk_status_ok):
                    m.d.sync += self.done.eq(1)
                with m.Else():
                    m.d.sync += self.failed.eq(1)
            with m.Else():
                m.d.sync += self.stale.eq(self.stale + 1)

        # Time-out: ``due`` is ``elapsed >= timeout_cycles``, registered; a response being
        # parsed defers it a cycle (the response wins).
        due = Signal()
        with m.If(restart):
            m.d.sync += due.eq(self.timeout_cycles <= 1)
        with m.Else():
            m.d.sync += due.eq(elapsed >= self.timeout_cycles)
        timeout_on = Signal()
        m.d.sync += timeout_on.eq(self.timeout_cycles != 0)
        with m.If((waiting | kept) & ~commit_r & timeout_on & due):
            m.d.comb += self.timeout.eq(1)
            m.d.sync += [waiting.eq(0), sent.eq(0), kept.eq(0)]

        with m.If(self.abort):
            m.d.sync += [waiting.eq(0), sent.eq(0), kept.eq(0)]
        return m
