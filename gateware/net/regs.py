"""Global registers, counters and QP contexts of the network core (``rti`` domain).

# Ref: openqlink.memory_map (GLOBAL_REGISTERS, COUNTERS, QP_REGISTERS: the one register map shared
# by gateware, host and docs/memory_map.md).

Every register is 32 bits wide on the control plane; a register whose field is narrower stores
only its low bits (listed in :data:`REGISTER_WIDTHS`) and reads back zero-extended. Writes to
read-only registers and to counters are ignored. The block is generated from the tables in
:mod:`openqlink.memory_map`, so a register added there without a width here is an elaboration
error.
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory, MemoryData
from amaranth.lib.wiring import In, Out

from ...isa.layout import ISA_VERSION
from ...memory_map import (
    COUNTERS,
    COUNTERS_BASE,
    GLOBAL_BASE,
    GLOBAL_REGISTERS,
    QP_BASE,
    QP_COUNTERS,
    QP_COUNTERS_OFFSET,
    QP_REGISTERS,
    QP_STRIDE,
    Access,
    QSCParams,
    regions,
    version_word,
)
from ...wire.ethernet import mac_to_int
from ...wire.ipv4 import ip_to_int
from ...wire.roce import PATH_MTU_BYTES
from .common import NetConfig, QPContext

__all__ = ["RegisterPortSignature", "NetRegisters", "REGISTER_WIDTHS", "NUM_COUNTERS",
           "NUM_QP_COUNTERS", "CONTROL_PLANE_REGISTERS",
           "READ_LATENCY_CYCLES", "COUNTER_LAG_CYCLES", "qp_counter_lag_cycles"]

#: Number of 32-bit counters (one increment strobe bit each).
NUM_COUNTERS = len(COUNTERS)

#: Most cycles from an increment strobe to the counter value that includes it: a read whose
#: address is applied this many cycles after the strobe's cycle returns a count including it.
#: The strobes are summed into a register (1 cycle), added to the counter's pending count
#: (1 cycle), taken by the update engine at its next visit (up to NUM_COUNTERS cycles apart),
#: registered with the stored value in the cycle after (1 cycle) and their sum written back in
#: the next (1 cycle).
COUNTER_LAG_CYCLES = NUM_COUNTERS + 4

#: Number of counters of each QP (:data:`openqlink.memory_map.QP_COUNTERS`).
NUM_QP_COUNTERS = len(QP_COUNTERS)


def qp_counter_lag_cycles(num_qps: int) -> int:
    """:data:`COUNTER_LAG_CYCLES` of the QP counters of a build with ``num_qps`` QPs: they are
    a bank of their own, of NUM_QP_COUNTERS counters per QP."""
    return NUM_QP_COUNTERS * num_qps + 4

#: Cycles from ``port.addr`` to its ``port.r_data`` and ``port.hit``: the address is decoded
#: into one register per 64-byte window (a 16-way choice inside it and the window match), and
#: the windows' results are combined into a second.
READ_LATENCY_CYCLES = 2

#: Address bits below the window: the registers are decoded in windows of 64 bytes (global
#: registers, counters, one QP), so that a 16-way choice picks the entry inside one.
_WINDOW_BITS = 6

#: Global registers that the control plane holds itself (they concern the requests, not the
#: network configuration): not decoded here.
CONTROL_PLANE_REGISTERS = ("CLAIM",)

#: Stored width in bits of every writable register (global and QP context).
REGISTER_WIDTHS: dict[str, int] = {
    "SCRATCH": 32,
    "QSC_MAC_HI": 16,
    "QSC_MAC_LO": 32,
    "QSC_IP": 32,
    "UDP_SRC_PORT": 16,
    "P_KEY": 16,
    "TIMESTAMP_FORMAT": 1,
    "RX_ENABLE": 1,
    "BOOTP_INTERVAL_MS": 16,
    "QSC_QPN": 24,
    "HOST_QPN": 24,
    "HOST_RKEY": 32,
    "RING_VA_HI": 32,
    "RING_VA_LO": 32,
    "NUM_SLOTS": 13,
    "SLOT_SIZE": 16,
    "IMEM_RKEY": 32,
    "ENV_RKEY": 32,
    "REGS_RKEY": 32,
    "RESPONSE_BYTES": 13,
    "PMTU": 3,
    "PEER_MAC_HI": 16,
    "PEER_MAC_LO": 32,
    "PEER_IP": 32,
    "PPU": 4,
    "TRANSPORT": 1,
    "PEER_UDP_PORT": 16,
}


def pmtu_bytes(code: Value) -> Value:
    """The path MTU in bytes (13 bits) of a PMTU register's value (3 bits, IBTA's MTU code):
    256 << (code - 1) for codes 1..5, 256 for the others."""
    out = Const(256, 13)
    for value, size in PATH_MTU_BYTES.items():
        out = Mux(code == value, size, out)
    return out


def _or_tree(values: list[Value]) -> Value:
    """The OR of ``values``, as a balanced tree."""
    while len(values) > 1:
        values = [values[k] | values[k + 1] if k + 1 < len(values) else values[k]
                  for k in range(0, len(values), 2)]
    return values[0]


class RegisterPortSignature(wiring.Signature):
    """A 32-bit register access port, seen from the initiator (the control plane).

    Members
    -------
    addr : Out(32)
        Byte address (4-byte aligned; bits [1:0] are ignored by :class:`NetRegisters`).
    w_en : Out(1)
        Write strobe: the register at ``addr`` takes ``w_data`` at the next clock edge.
    w_data : Out(32)
        Write data.
    r_data : In(32)
        Value of the register at ``addr`` (0 when ``hit`` is low), registered:
        :data:`READ_LATENCY_CYCLES` cycles behind ``addr``.
    hit : In(1)
        ``addr`` names a register of this block, registered like ``r_data``.

    ``addr`` is decoded into a register first: a write takes effect only if ``addr`` was
    already applied in the cycle before ``w_en``.
    """

    def __init__(self):
        super().__init__({
            "addr": Out(32),
            "w_en": Out(1),
            "w_data": Out(32),
            "r_data": In(32),
            "hit": In(1),
        })


class NetRegisters(wiring.Component):
    """The rti register block: global registers, counters, and every QP's context and counters.

    Parameters
    ----------
    params : QSCParams
        ``num_ppus``, ``num_qps``, ``qpn_base`` (QSC_QPN's reset value: qpn_base + q) and the
        reset MAC/IP address.
    num_inc_sources : int
        Number of counter increment vectors (one per block that counts).

    Members
    -------
    port : In(RegisterPortSignature())
        Control-plane access: read :data:`READ_LATENCY_CYCLES` cycles behind the address, write
        at the clock edge (the address applied at least one cycle before ``w_en``).
    config : Out(NetConfig)
        The network configuration held in the global registers (registered outputs).
    qp : Out(ArrayLayout(QPContext, num_qps))
        Each QP's context (registered outputs). A region's R_Key is valid
        (``<name>_rkey_valid``) once its register has been written since the last reset or
        restart of the QP (a write of HOST_QPN): until the host configures it, no R_Key opens
        a region, whatever its value (zero included). ``ppu`` is ``q`` for a PPU's own QP
        (``q < num_ppus``), the PPU register (always < num_ppus) for the others.
    tx_psn : In(ArrayLayout(24, num_ppus))
        Next PSN the TX builder sends on each PPU's own QP, read back as TX_PSN (0 for the
        other QPs: they send nothing).
    rx_epsn : In(ArrayLayout(24, num_qps))
        Next PSN the receiver expects on each QP, read back as RX_EPSN.
    qp_reset : Out(num_qps)
        Bit ``q`` is high for one cycle, the cycle after a write of QP ``q``'s HOST_QPN (a
        host configuring the QP): the TX builder and the receiver restart the QP (PSNs and
        ring slot at 0).
    inc : In(ArrayLayout(NUM_COUNTERS, num_inc_sources))
        Counter increment strobes: bit ``i`` of any source adds one to counter ``i``
        (:data:`openqlink.memory_map.COUNTERS` order). Counters are 32 bits and wrap. Every
        strobe counts, however many sources strobe one counter in a cycle and for however
        many cycles: a strobe shows in the counter's value at most
        :data:`COUNTER_LAG_CYCLES` (NUM_COUNTERS + 4) cycles later (at least 5), i.e. in a
        read whose address is applied that many cycles after the strobe's cycle.
    qp_inc : In(NUM_QP_COUNTERS * num_qps)
        QP counter strobes: bit ``NUM_QP_COUNTERS * q + k`` adds one to counter ``k``
        (:data:`openqlink.memory_map.QP_COUNTERS` order) of QP ``q``; it shows within
        :func:`qp_counter_lag_cycles` cycles.

    The counters are two banks (the global ones, the QPs'), not one register and adder each:
    their values live in a small memory (distributed RAM; a second copy serves the
    control-plane read), each counter has a few-bit pending count that its strobes add to, and
    an update engine visits the counters round robin, one a cycle, adding the pending count it
    takes (and clears) to the stored value. After a reset the engine's first pass writes zeros;
    until it ends the counters read zero (a strobe of those cycles still shows within the bound
    above).

    Attributes
    ----------
    counter_values : MemoryData
        The counters' stored values, by :data:`openqlink.memory_map.COUNTERS` index (a
        simulation may preset or inspect them; the hardware writes them only by counting).
    qp_counter_values : MemoryData
        The QP counters' stored values, QP ``q``'s counter ``k`` at ``NUM_QP_COUNTERS * q + k``.
    """

    def __init__(self, params: QSCParams, *, num_inc_sources: int = 3):
        if num_inc_sources < 1:
            raise ValueError(f"num_inc_sources must be at least 1, not {num_inc_sources}")
        for reg in GLOBAL_REGISTERS + QP_REGISTERS:
            if (reg.access is not Access.RO and reg.name not in REGISTER_WIDTHS
                    and reg.name not in CONTROL_PLANE_REGISTERS):
                raise ValueError(f"register {reg.name} has no stored width in REGISTER_WIDTHS")
        self.params = params
        self.num_inc_sources = num_inc_sources
        self.counter_values = MemoryData(shape=32, depth=NUM_COUNTERS, init=[])
        self.qp_counter_values = MemoryData(shape=32, depth=NUM_QP_COUNTERS * params.num_qps,
                                            init=[])
        n = params.num_ppus
        q = params.num_qps
        super().__init__({
            "port": In(RegisterPortSignature()),
            "config": Out(NetConfig),
            "qp": Out(data.ArrayLayout(QPContext, q)),
            "tx_psn": In(data.ArrayLayout(24, n)),
            "rx_epsn": In(data.ArrayLayout(24, q)),
            "qp_reset": Out(q),
            "inc": In(data.ArrayLayout(NUM_COUNTERS, num_inc_sources)),
            "qp_inc": In(NUM_QP_COUNTERS * q),
        })

    def _reset_value(self, name: str, default: int) -> int:
        mac = mac_to_int(self.params.mac)
        return {
            "QSC_MAC_HI": mac >> 32,
            "QSC_MAC_LO": mac & 0xFFFF_FFFF,
            "QSC_IP": ip_to_int(self.params.ip),
        }.get(name, default)

    def elaborate(self, platform) -> Module:
        m = Module()
        params = self.params
        port = self.port

        # address -> (read value, storage signal or None)
        entries: dict[int, tuple] = {}
        # storage signal -> the strobe that its write pulses (a QP's HOST_QPN: ``qp_reset``)
        strobes: dict[int, Value] = {}
        # storage signal -> the flag that its write sets (a region's R_Key: its valid bit)
        sets: dict[int, Signal] = {}
        region_keys = {r.rkey_register for r in regions(params, 0)}
        m.d.sync += self.qp_reset.eq(0)

        glob: dict[str, Signal] = {}
        for reg in GLOBAL_REGISTERS:
            addr = GLOBAL_BASE + reg.offset
            if reg.name in CONTROL_PLANE_REGISTERS:
                continue
            if reg.name == "VERSION":
                entries[addr] = (Const(version_word(ISA_VERSION), 32), None)
            elif reg.name == "NUM_PPUS":
                entries[addr] = (Const(params.num_ppus, 32), None)
            elif reg.name == "NUM_QPS":
                entries[addr] = (Const(params.num_qps, 32), None)
            else:
                sig = Signal(REGISTER_WIDTHS[reg.name], name=f"reg_{reg.name.lower()}",
                             init=self._reset_value(reg.name, reg.reset))
                glob[reg.name] = sig
                entries[addr] = (sig, sig if reg.access is Access.RW else None)

        cnt_data, cnt_data_ok, cnt_hit = self._counter_bank(m)

        qpc_data, qpc_ok, qpc_hit = self._qp_counter_bank(m)

        # storage signal -> the condition its write needs besides the address (the PPU
        # register of a QP takes only a PPU the build has)
        guards: dict[int, Value] = {}
        qpregs: list[dict[str, Value]] = []
        for n in range(params.num_qps):
            regs: dict[str, Value] = {}
            for reg in QP_REGISTERS:
                addr = QP_BASE + QP_STRIDE * n + reg.offset
                if reg.name == "TX_PSN":
                    entries[addr] = (self.tx_psn[n] if n < params.num_ppus else Const(0, 24),
                                     None)
                elif reg.name == "RX_EPSN":
                    entries[addr] = (self.rx_epsn[n], None)
                elif reg.name == "TRANSPORT" and n >= params.num_ppus:
                    # only a PPU's own QP sends CALLs: another reads 0, ignores writes
                    regs[reg.name] = Const(0, REGISTER_WIDTHS[reg.name])
                    entries[addr] = (regs[reg.name], None)
                elif reg.name == "PPU" and n < params.num_ppus:
                    # a PPU's own QP: fixed
                    regs[reg.name] = Const(n, REGISTER_WIDTHS[reg.name])
                    entries[addr] = (regs[reg.name], None)
                else:
                    init = params.qpn_base + n if reg.name == "QSC_QPN" else reg.reset
                    sig = Signal(REGISTER_WIDTHS[reg.name], init=init,
                                 name=f"qp{n}_{reg.name.lower()}")
                    regs[reg.name] = sig
                    entries[addr] = (sig, sig if reg.access is Access.RW else None)
                    if reg.name == "PPU":
                        guards[id(sig)] = port.w_data < params.num_ppus
                    if reg.name == "HOST_QPN":
                        strobes[id(sig)] = self.qp_reset[n]
                    if reg.name in region_keys:
                        valid = Signal(name=f"qp{n}_{reg.name.lower()}_valid")
                        sets[id(sig)] = valid
                        regs[reg.name + "_VALID"] = valid
                        # a restart of the QP (its HOST_QPN written) invalidates the key
                        with m.If(self.qp_reset[n]):
                            m.d.sync += valid.eq(0)
            qpregs.append(regs)

        # The entries by 64-byte window. Stage 1 registers, per window, whether ``addr`` lies
        # in it and the entry its low bits choose; stage 2 combines the windows.
        windows: dict[int, dict[int, tuple]] = {}
        for addr, entry in entries.items():
            slot = (addr % (1 << _WINDOW_BITS)) >> 2
            windows.setdefault(addr >> _WINDOW_BITS, {})[slot] = entry
        cnt_lo, cnt_hi = self._counter_region()
        for addr in entries:
            if cnt_lo <= addr < cnt_hi or (
                    addr >= QP_BASE and QP_COUNTERS_OFFSET <= (addr - QP_BASE) % QP_STRIDE
                    < QP_COUNTERS_OFFSET + 4 * NUM_QP_COUNTERS):
                raise ValueError(f"register at {addr:#x} lies in a counters' address region")
        low_q = Signal(_WINDOW_BITS - 2)      # addr[7:2], registered
        m.d.sync += low_q.eq(port.addr[2:_WINDOW_BITS])
        r_data = Const(0, 32)
        hit = Const(0, 1)
        for w, slots in sorted(windows.items()):
            in_w = Signal(name=f"in_window_{w:x}")
            w_data = Signal(32, name=f"window_data_{w:x}")
            w_hit = Signal(name=f"window_hit_{w:x}")
            low = port.addr[2:_WINDOW_BITS]
            nslots = 1 << (_WINDOW_BITS - 2)
            hits = sum(1 << slot for slot in slots)
            values = [Value.cast(slots[k][0]) if k in slots else Const(0, 32)
                      for k in range(nslots)]
            m.d.sync += [
                in_w.eq(port.addr[_WINDOW_BITS:] == w),
                w_hit.eq(Const(hits, nslots).bit_select(low, 1)),
                w_data.eq(Array(values)[low]),
            ]
            # writes: the window match and the low bits of the address of the cycle before
            with m.If(port.w_en & in_w):
                with m.Switch(low_q):
                    for slot, (_value, storage) in sorted(slots.items()):
                        if storage is not None:
                            with m.Case(slot), m.If(guards.get(id(storage), 1)):
                                m.d.sync += storage.eq(port.w_data)
                                if id(storage) in strobes:
                                    m.d.sync += strobes[id(storage)].eq(1)
                                if id(storage) in sets:
                                    m.d.sync += sets[id(storage)].eq(1)
            r_data = r_data | Mux(in_w, w_data, 0)
            hit = hit | (in_w & w_hit)
        # the counters: stage 1 is the bank's registered read, the region match and its gate
        r_data = r_data | Mux(cnt_data_ok, cnt_data, 0) | Mux(qpc_ok, qpc_data, 0)
        hit = hit | cnt_hit | qpc_hit
        m.d.sync += [port.r_data.eq(r_data), port.hit.eq(hit)]

        m.d.comb += [
            self.config.qsc_mac.eq(Cat(glob["QSC_MAC_LO"], glob["QSC_MAC_HI"])),
            self.config.qsc_ip.eq(glob["QSC_IP"]),
            self.config.udp_src_port.eq(glob["UDP_SRC_PORT"]),
            self.config.p_key.eq(glob["P_KEY"]),
            self.config.timestamp_format.eq(glob["TIMESTAMP_FORMAT"]),
            self.config.rx_enable.eq(glob["RX_ENABLE"]),
            self.config.bootp_interval_ms.eq(glob["BOOTP_INTERVAL_MS"]),
        ]
        for n, regs in enumerate(qpregs):
            qp = self.qp[n]
            m.d.comb += [
                qp.qsc_qpn.eq(regs["QSC_QPN"]),
                qp.host_qpn.eq(regs["HOST_QPN"]),
                qp.host_rkey.eq(regs["HOST_RKEY"]),
                qp.ring_va.eq(Cat(regs["RING_VA_LO"], regs["RING_VA_HI"])),
                qp.num_slots.eq(regs["NUM_SLOTS"]),
                qp.slot_size.eq(regs["SLOT_SIZE"]),
                qp.imem_rkey.eq(regs["IMEM_RKEY"]),
                qp.env_rkey.eq(regs["ENV_RKEY"]),
                qp.regs_rkey.eq(regs["REGS_RKEY"]),
                qp.imem_rkey_valid.eq(regs["IMEM_RKEY_VALID"]),
                qp.env_rkey_valid.eq(regs["ENV_RKEY_VALID"]),
                qp.regs_rkey_valid.eq(regs["REGS_RKEY_VALID"]),
                qp.response_bytes.eq(regs["RESPONSE_BYTES"]),
                qp.pmtu_bytes.eq(pmtu_bytes(regs["PMTU"])),
                qp.peer_mac.eq(Cat(regs["PEER_MAC_LO"], regs["PEER_MAC_HI"])),
                qp.peer_ip.eq(regs["PEER_IP"]),
                qp.ppu.eq(regs["PPU"]),
                qp.transport.eq(regs["TRANSPORT"]),
                qp.peer_udp_port.eq(regs["PEER_UDP_PORT"]),
            ]
        return m

    @staticmethod
    def _counter_region() -> tuple[int, int]:
        """Byte addresses [lo, hi) that the counters' read decodes (a power of two, aligned)."""
        size = 4 << max(1, (NUM_COUNTERS - 1).bit_length())
        lo = GLOBAL_BASE + COUNTERS_BASE
        if lo % size:
            raise ValueError(f"the counters' base {lo:#x} is not aligned to {size:#x} bytes")
        return lo, lo + size

    def _counter_bank(self, m: Module) -> tuple[Value, Value, Value]:
        """The global counters. Returns the control-plane read of ``port.addr`` after stage 1
        of the read: the stored value, whether it may be shown (a counter, not during the
        pass that clears after a reset) and whether ``addr`` names a counter."""
        port = self.port
        lo, hi = self._counter_region()
        bits = (hi - lo).bit_length() - 1        # byte address bits inside the region
        value, ready = _counter_bank(
            m, "cnt", self.counter_values, [name for name, _ in COUNTERS],
            [self.inc[k] for k in range(self.num_inc_sources)], port.addr[2:bits])
        hit = Signal(name="cnt_hit")
        m.d.sync += hit.eq((port.addr[bits:] == lo >> bits) & (port.addr[2:bits] < NUM_COUNTERS))
        return value, hit & ready, hit

    def _qp_counter_bank(self, m: Module) -> tuple[Value, Value, Value]:
        """The QP counters, read at ``QP_COUNTERS_OFFSET`` of each QP's context: as
        :meth:`_counter_bank`."""
        params, port = self.params, self.port
        k_bits = max(1, (NUM_QP_COUNTERS - 1).bit_length())
        q_bits = (QP_STRIDE - 1).bit_length()           # byte address bits inside a context
        if QP_COUNTERS_OFFSET % (4 << k_bits) or QP_BASE % (QP_STRIDE * 16):
            raise ValueError("the QP counters must be aligned to their block")
        names = [f"qp{q}_{name}" for q in range(params.num_qps) for name, _ in QP_COUNTERS]
        # counter k of QP q at index NUM_QP_COUNTERS * q + k: the QP's index and the counter's
        # address bits side by side when NUM_QP_COUNTERS is a power of two
        assert NUM_QP_COUNTERS == 1 << k_bits
        index = Cat(port.addr[2:2 + k_bits], port.addr[q_bits:q_bits + 4])
        value, ready = _counter_bank(m, "qpcnt", self.qp_counter_values, names,
                                     [self.qp_inc], index)
        hit = Signal(name="qpcnt_hit")
        m.d.sync += hit.eq(
            (port.addr[q_bits + 4:] == QP_BASE >> (q_bits + 4)) &
            (port.addr[q_bits:q_bits + 4] < params.num_qps) &
            (port.addr[2 + k_bits:q_bits] == QP_COUNTERS_OFFSET >> (2 + k_bits)))
        return value, hit & ready, hit


def _counter_bank(m: Module, prefix: str, values: MemoryData, names: list[str],
                  inc: list[Value], read_index: Value) -> tuple[Value, Value]:
    """A bank of ``len(names)`` 32-bit counters whose values live in the memory ``values``;
    ``inc`` holds one strobe vector per source (bit ``i``: one more for counter ``i``).

    Returns the read of counter ``read_index`` a cycle later (registered) and whether the
    values may be shown (not during the pass that clears after a reset), registered likewise.
    """
    n, s = len(names), len(inc)
    m.submodules[f"{prefix}_values"] = mem = Memory(data=values)

    # Update engine, stage A (cycle v): ``ptr`` names the counter visited, ``visit`` is the
    # same as a one-hot ring; its pending count is taken into ``take`` and restarts from
    # this cycle's strobes. Stage B (cycle v + 1): the stored value is read and registered
    # beside ``take``. Stage C (cycle v + 2): their sum is written back (a carry chain
    # between flip-flops and the memory, no read in front of it). A counter's stage C
    # write lands before its next stage B, n cycles on (n >= 2).
    assert n >= 2
    ptr = Signal(range(n), name=f"{prefix}_ptr")
    visit = Signal(n, init=1, name=f"{prefix}_visit")
    take = Signal(range(n * s + 1), name=f"{prefix}_take")
    idx = Signal(range(n), name=f"{prefix}_idx")
    # A reset clears the values: the first pass after it writes ``take`` alone.
    clearing = Signal(init=1, name=f"{prefix}_clearing")
    clear_b = Signal(init=1, name=f"{prefix}_clear_b")
    m.d.sync += [
        ptr.eq(Mux(ptr == n - 1, 0, ptr + 1)),
        visit.eq(visit.rotate_left(1)),
        idx.eq(ptr),
        clear_b.eq(clearing),
    ]
    with m.If(ptr == n - 1):
        m.d.sync += clearing.eq(0)

    # Pending counts. inc_q is the sum of one cycle's strobes, registered so that no strobe
    # logic sits in front of the pending adder: at most s. A pending count restarts from
    # inc_q in the cycle its counter is visited (stage A takes the old count, so nothing is
    # lost) and adds inc_q in every other cycle. Visits of one counter are exactly n cycles
    # apart (ptr steps by one modulo n every cycle), so the count taken at a visit is the
    # sum of the n inc_q values of the cycles since the previous visit: at most n * s
    # (the first visit after a reset takes fewer: the cycles before it), which
    # ``range(n * s + 1)`` holds: the pending counts never overflow.
    pend = []
    for i, name in enumerate(names):
        inc_q = Signal(range(s + 1), name=f"inc_{name.lower()}")
        p = Signal(range(n * s + 1), name=f"pend_{name.lower()}")
        pend.append(p)
        m.d.sync += [
            inc_q.eq(sum(inc[k][i] for k in range(s))),
            p.eq(Mux(visit[i], 0, p) + inc_q),
        ]
    # the visited count, picked by the one-hot ring (an AND-OR: fewer LUT levels than a
    # multiplexer on ptr)
    m.d.sync += take.eq(_or_tree([Mux(visit[i], p, 0) for i, p in enumerate(pend)]))

    rd = mem.read_port(domain="comb")
    wr = mem.write_port()
    value = Signal(32, name=f"{prefix}_value")
    take_c = Signal.like(take, name=f"{prefix}_take_c")
    idx_c = Signal.like(idx, name=f"{prefix}_idx_c")
    clear_c = Signal(init=1, name=f"{prefix}_clear_c")
    m.d.sync += [
        value.eq(Mux(clear_b, 0, rd.data)),
        take_c.eq(take),
        idx_c.eq(idx),
        clear_c.eq(clear_b),
    ]
    m.d.comb += [
        rd.addr.eq(idx),
        wr.addr.eq(idx_c),
        wr.en.eq(1),
        wr.data.eq(value + take_c),                       # wraps at 32 bits
    ]

    # Control-plane read: the stored value of the cycle ``read_index`` is applied in (the read
    # port is not transparent: it does not see stage C's write of the same edge).
    cp = mem.read_port(transparent_for=())
    # the values are stale until the clearing pass has written its last (stage C of
    # counter n - 1, in the last cycle of clear_c)
    ready = Signal(name=f"{prefix}_ready")
    m.d.comb += cp.addr.eq(read_index)
    m.d.sync += ready.eq(~clear_c)
    return cp.data, ready
