"""The PPU cluster: bus decoder, shared timeline counter, CALL arbiter and the PPUs (dtd).

# Ref: openqlink docs/architecture.md (PPUCluster); openqlink.memory_map (PPU windows);
# openqlink.gateware.bus (BusCommand, BusReadData, call_request_layout).
"""

from amaranth.hdl import Array, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...memory_map import PPU_BASE, PPU_STRIDE, QSCParams
from ..bus import READ_TAG_BITS, BusCommand, BusOp, BusReadData, call_request_layout
from .channels import PTDSignature
from .core import LOCAL_ADDR_BITS, PPU

__all__ = ["PPUCluster"]

#: ``word_addr`` bits above the window offset: byte address bits [31:24].
_WINDOW_BITS = 29 - LOCAL_ADDR_BITS
assert PPU_STRIDE == 8 << LOCAL_ADDR_BITS and PPU_BASE % PPU_STRIDE == 0


class PPUCluster(wiring.Component):
    """All PPUs of a QSC, written in ``sync`` (the top renames it to ``dtd``).

    Parameters
    ----------
    params : QSCParams
        ``num_ppus``, ``imem_depth``, ``env_depth``, ``timeline_bits`` and the channel counts
        ``drives_per_ppu``, ``readouts_per_ppu`` and ``markers_per_ppu`` are used.
    n_drive, n_readout, n_marker : int | None
        Channels of each kind per PPU (see :class:`~.channels.PTDSignature`); ``None`` (the
        default) takes ``params.drives_per_ppu``, ``params.readouts_per_ppu`` and
        ``params.markers_per_ppu``.

    Members
    -------
    bus_cmd : ``In(stream.Signature(BusCommand))``
        Commands from the network core. ``word_addr`` is decoded into PPU windows
        (``PPU_BASE + n * PPU_STRIDE``, ``n < num_ppus``); a command outside them is unmapped: a
        WRITE or MAILBOX_COMMIT is ignored, a READ answered with ``error = 1``. A WRITE or
        MAILBOX_COMMIT is taken in one cycle and acts in the next (command stage); a READ holds
        ``ready`` low until its answer has been taken from ``bus_rdata`` (at most one read in
        flight; an answer is valid ``2 + PPU.READ_LATENCY`` cycles after its READ was taken).
    bus_rdata : ``Out(stream.Signature(BusReadData))``
        Exactly one answer per READ, in order, echoing the READ's tag.
    call_req : ``Out(stream.Signature(call_request_layout(params.call_arg_bytes)))``
        The PPUs' CALL requests, arbitrated round robin (a request offered is held until taken).
    ptd : ``Out(PTDSignature(n_drive, n_readout, n_marker, samples_per_cycle)).array(num_ppus)``
        The physical interface of each PPU.
    now : ``Out(params.timeline_bits)``
        The timeline counter shared by all PPUs: 0 after reset, +1 every cycle, wrapping at
        ``2**timeline_bits``. Every timed effect of a PPU appears on its ``ptd`` outputs on the
        cycle ``now`` equals its time.
    """

    def __init__(self, params: QSCParams, *, n_drive: int | None = None,
                 n_readout: int | None = None, n_marker: int | None = None):
        self._params = params
        if n_drive is None:
            n_drive = params.drives_per_ppu
        if n_readout is None:
            n_readout = params.readouts_per_ppu
        if n_marker is None:
            n_marker = params.markers_per_ppu
        self._channels = dict(n_drive=n_drive, n_readout=n_readout, n_marker=n_marker)
        super().__init__({
            "bus_cmd": In(stream.Signature(BusCommand)),
            "bus_rdata": Out(stream.Signature(BusReadData)),
            "call_req": Out(stream.Signature(call_request_layout(params.call_arg_bytes))),
            "ptd": Out(PTDSignature(n_drive, n_readout, n_marker, params.samples_per_cycle))
            .array(params.num_ppus),
            "now": Out(params.timeline_bits),
        })

    def elaborate(self, platform):
        m = Module()
        n_ppus = self._params.num_ppus
        # Two 32-bit halves: the high half counts when the low half wraps, known a cycle ahead
        # (``lo_full``: the low half is all ones), so no 64-bit carry chain.
        lo_full = Signal()
        m.d.sync += [self.now[:32].eq(self.now[:32] + 1),
                     lo_full.eq(self.now[:32] == 0xFFFF_FFFE)]
        with m.If(lo_full):
            m.d.sync += self.now[32:].eq(self.now[32:] + 1)

        ppus = []
        for n in range(n_ppus):
            ppu = PPU(self._params, n, **self._channels)
            m.submodules[f"ppu{n}"] = ppu
            ppus.append(ppu)
            m.d.comb += ppu.now.eq(self.now)
            wiring.connect(m, wiring.flipped(self.ptd[n]), ppu.ptd)

        # ---- BARRIER -----------------------------------------------------------------------
        # The PPUs waiting at a BARRIER, registered: every PPU of a mask sees the last one's
        # arrival in the same cycle and is released in it (a PPU's own arrival counts a cycle
        # late, like the others'), so they re-anchor their ``t`` at the same ``now``.
        arrived = Signal(n_ppus)
        m.d.sync += arrived.eq(Cat(*(ppu.barrier_arrive for ppu in ppus)))
        for ppu in ppus:
            mask = ppu.barrier_mask[:n_ppus]
            m.d.comb += ppu.barrier_go.eq(ppu.barrier_arrive & ((arrived & mask) == mask))

        # ---- Bus decoder -------------------------------------------------------------------
        cmd = self.bus_cmd.payload
        window = cmd.word_addr[LOCAL_ADDR_BITS:]
        first = PPU_BASE // PPU_STRIDE
        sel = Signal(range(n_ppus))
        m.d.comb += sel.eq(window - first)
        hit = (window >= first) & (window < first + n_ppus)
        assert len(window) == _WINDOW_BITS

        # Command stage: the accepted command and its decoded window, registered; the PPUs
        # act on it in the cycle after it was taken.
        c_valid = Signal()
        c_cmd = Signal(BusCommand)
        c_sel = Signal(range(n_ppus))
        c_hit = Signal()
        c_read = c_valid & (c_cmd.op == BusOp.READ)

        rd_pipe = Signal(PPU.READ_LATENCY)     # a READ forwarded 1.. cycles ago
        rd_wait = rd_pipe[-1]                   # ... its answer is due now
        rd_sel = Signal(range(n_ppus))
        rd_hit = Signal()
        resp_valid = Signal()
        resp = Signal(BusReadData)
        m.d.comb += [
            self.bus_cmd.ready.eq(~c_read & ~rd_pipe.any() & ~resp_valid),
            self.bus_rdata.valid.eq(resp_valid),
            self.bus_rdata.payload.eq(resp),
        ]
        accept = self.bus_cmd.valid & self.bus_cmd.ready
        m.d.sync += c_valid.eq(accept)
        with m.If(accept):
            m.d.sync += [c_cmd.eq(cmd), c_sel.eq(sel), c_hit.eq(hit)]
        for n, ppu in enumerate(ppus):
            m.d.comb += [
                ppu.bus_valid.eq(c_valid & c_hit & (c_sel == n)),
                ppu.bus_cmd.eq(c_cmd),
            ]
        m.d.sync += rd_pipe.eq(Cat(c_read, rd_pipe[:-1]))
        with m.If(c_read):
            m.d.sync += [rd_sel.eq(c_sel), rd_hit.eq(c_hit),
                         resp.tag.eq(c_cmd.data[:READ_TAG_BITS])]   # echoed with the answer
        with m.If(rd_wait):
            answer = BusReadData(Array(ppu.bus_rdata.as_value() for ppu in ppus)[rd_sel])
            m.d.sync += [
                resp_valid.eq(1),
                resp.data.eq(Mux(rd_hit, answer.data, 0)),
                resp.error.eq(~rd_hit | answer.error),
            ]
        with m.If(self.bus_rdata.valid & self.bus_rdata.ready):
            m.d.sync += resp_valid.eq(0)

        # ---- CALL arbiter (round robin) -----------------------------------------------------
        if n_ppus == 1:
            wiring.connect(m, wiring.flipped(self.call_req), ppus[0].call_req)
        else:
            grant = Signal(range(n_ppus))
            valids = Array(ppu.call_req.valid for ppu in ppus)
            payloads = Array(ppu.call_req.payload.as_value() for ppu in ppus)
            m.d.comb += [
                self.call_req.valid.eq(valids[grant]),
                self.call_req.payload.eq(payloads[grant]),
            ]
            for n, ppu in enumerate(ppus):
                m.d.comb += ppu.call_req.ready.eq(self.call_req.ready & (grant == n))
            # Move on when the granted PPU offers nothing or its request is taken: the next PPU
            # after it (cyclically) that offers one gets the grant.
            with m.If(~valids[grant] | self.call_req.ready):
                for k in reversed(range(1, n_ppus + 1)):
                    cand = Signal(range(n_ppus), name=f"rr_cand{k}")
                    m.d.comb += cand.eq(Mux(grant + k >= n_ppus, grant + k - n_ppus, grant + k))
                    with m.If(valids[cand]):
                        m.d.sync += grant.eq(cand)
        return m
