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
from amaranth.lib.wiring import In, Out

from ...isa.layout import ISA_VERSION
from ...memory_map import (
    COUNTERS,
    COUNTERS_BASE,
    GLOBAL_BASE,
    GLOBAL_REGISTERS,
    QP_BASE,
    QP_REGISTERS,
    QP_STRIDE,
    Access,
    QSCParams,
    version_word,
)
from ...wire.ethernet import mac_to_int
from ...wire.ipv4 import ip_to_int
from .common import NetConfig, QPContext

__all__ = ["RegisterPortSignature", "NetRegisters", "REGISTER_WIDTHS", "NUM_COUNTERS",
           "READ_LATENCY_CYCLES"]

#: Number of 32-bit counters (one increment strobe bit each).
NUM_COUNTERS = len(COUNTERS)

#: Cycles from ``port.addr`` to its ``port.r_data`` and ``port.hit``: the address is decoded
#: into one register per 64-byte window (a 16-way choice inside it and the window match), and
#: the windows' results are combined into a second.
READ_LATENCY_CYCLES = 2

#: Address bits below the window: the registers are decoded in windows of 64 bytes (global
#: registers, counters, one QP), so that a 16-way choice picks the entry inside one.
_WINDOW_BITS = 6

#: Stored width in bits of every writable register (global and QP context).
REGISTER_WIDTHS: dict[str, int] = {
    "SCRATCH": 32,
    "QSC_MAC_HI": 16,
    "QSC_MAC_LO": 32,
    "QSC_IP": 32,
    "HOST_MAC_HI": 16,
    "HOST_MAC_LO": 32,
    "HOST_IP": 32,
    "UDP_SRC_PORT": 16,
    "P_KEY": 16,
    "TIMESTAMP_FORMAT": 1,
    "RX_ENABLE": 1,
    "HOST_QPN": 24,
    "HOST_RKEY": 32,
    "RING_VA_HI": 32,
    "RING_VA_LO": 32,
    "NUM_SLOTS": 13,
    "SLOT_SIZE": 16,
    "IMEM_RKEY": 32,
    "ENV_RKEY": 32,
    "REGS_RKEY": 32,
}


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
    """The rti register block: global registers, counters and the QP context of every PPU.

    Parameters
    ----------
    params : QSCParams
        ``num_ppus``, ``qpn_base`` (QSC_QPN = qpn_base + n) and the reset MAC/IP address.
    num_inc_sources : int
        Number of counter increment vectors (one per block that counts).

    Members
    -------
    port : In(RegisterPortSignature())
        Control-plane access: read :data:`READ_LATENCY_CYCLES` cycles behind the address, write
        at the clock edge (the address applied at least one cycle before ``w_en``).
    config : Out(NetConfig)
        The network configuration held in the global registers (registered outputs).
    qp : Out(ArrayLayout(QPContext, num_ppus))
        Each PPU's QP context (registered outputs).
    tx_psn : In(ArrayLayout(24, num_ppus))
        Next PSN the TX builder sends on each QP, read back as TX_PSN.
    rx_epsn : In(ArrayLayout(24, num_ppus))
        Next PSN the receiver expects on each QP, read back as RX_EPSN.
    inc : In(ArrayLayout(NUM_COUNTERS, num_inc_sources))
        Counter increment strobes: bit ``i`` of any source adds one to counter ``i``
        (:data:`openqlink.memory_map.COUNTERS` order). Counters are 32 bits and wrap. The sum of
        all sources' strobes of one cycle is registered and added in the next, so simultaneous
        strobes are not lost: a strobe shows in the counter's value 2 cycles later.
    """

    def __init__(self, params: QSCParams, *, num_inc_sources: int = 3):
        if num_inc_sources < 1:
            raise ValueError(f"num_inc_sources must be at least 1, not {num_inc_sources}")
        for reg in GLOBAL_REGISTERS + QP_REGISTERS:
            if reg.access is not Access.RO and reg.name not in REGISTER_WIDTHS:
                raise ValueError(f"register {reg.name} has no stored width in REGISTER_WIDTHS")
        self.params = params
        self.num_inc_sources = num_inc_sources
        n = params.num_ppus
        super().__init__({
            "port": In(RegisterPortSignature()),
            "config": Out(NetConfig),
            "qp": Out(data.ArrayLayout(QPContext, n)),
            "tx_psn": In(data.ArrayLayout(24, n)),
            "rx_epsn": In(data.ArrayLayout(24, n)),
            "inc": In(data.ArrayLayout(NUM_COUNTERS, num_inc_sources)),
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

        glob: dict[str, Signal] = {}
        for reg in GLOBAL_REGISTERS:
            addr = GLOBAL_BASE + reg.offset
            if reg.name == "VERSION":
                entries[addr] = (Const(version_word(ISA_VERSION), 32), None)
            elif reg.name == "NUM_PPUS":
                entries[addr] = (Const(params.num_ppus, 32), None)
            else:
                sig = Signal(REGISTER_WIDTHS[reg.name], name=f"reg_{reg.name.lower()}",
                             init=self._reset_value(reg.name, reg.reset))
                glob[reg.name] = sig
                entries[addr] = (sig, sig if reg.access is Access.RW else None)

        counters = []
        for i, (name, _) in enumerate(COUNTERS):
            sig = Signal(32, name=f"count_{name.lower()}")
            counters.append(sig)
            entries[GLOBAL_BASE + COUNTERS_BASE + 4 * i] = (sig, None)
            # inc_q: the strobes of one cycle, summed and registered, so that no strobe logic
            # sits in front of the 32-bit adder.
            inc_q = Signal(range(self.num_inc_sources + 1), name=f"inc_{name.lower()}")
            m.d.sync += [
                inc_q.eq(sum(self.inc[s][i] for s in range(self.num_inc_sources))),
                sig.eq(sig + inc_q),
            ]

        qpregs: list[dict[str, Signal]] = []
        for n in range(params.num_ppus):
            regs: dict[str, Signal] = {}
            for reg in QP_REGISTERS:
                addr = QP_BASE + QP_STRIDE * n + reg.offset
                if reg.name == "QSC_QPN":
                    entries[addr] = (Const(params.qpn_base + n, 32), None)
                elif reg.name == "TX_PSN":
                    entries[addr] = (self.tx_psn[n], None)
                elif reg.name == "RX_EPSN":
                    entries[addr] = (self.rx_epsn[n], None)
                else:
                    sig = Signal(REGISTER_WIDTHS[reg.name], init=reg.reset,
                                 name=f"qp{n}_{reg.name.lower()}")
                    regs[reg.name] = sig
                    entries[addr] = (sig, sig if reg.access is Access.RW else None)
            qpregs.append(regs)

        # The entries by 64-byte window. Stage 1 registers, per window, whether ``addr`` lies
        # in it and the entry its low bits choose; stage 2 combines the windows.
        windows: dict[int, dict[int, tuple]] = {}
        for addr, entry in entries.items():
            slot = (addr % (1 << _WINDOW_BITS)) >> 2
            windows.setdefault(addr >> _WINDOW_BITS, {})[slot] = entry
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
                            with m.Case(slot):
                                m.d.sync += storage.eq(port.w_data)
            r_data = r_data | Mux(in_w, w_data, 0)
            hit = hit | (in_w & w_hit)
        m.d.sync += [port.r_data.eq(r_data), port.hit.eq(hit)]

        m.d.comb += [
            self.config.qsc_mac.eq(Cat(glob["QSC_MAC_LO"], glob["QSC_MAC_HI"])),
            self.config.qsc_ip.eq(glob["QSC_IP"]),
            self.config.host_mac.eq(Cat(glob["HOST_MAC_LO"], glob["HOST_MAC_HI"])),
            self.config.host_ip.eq(glob["HOST_IP"]),
            self.config.udp_src_port.eq(glob["UDP_SRC_PORT"]),
            self.config.p_key.eq(glob["P_KEY"]),
            self.config.timestamp_format.eq(glob["TIMESTAMP_FORMAT"]),
            self.config.rx_enable.eq(glob["RX_ENABLE"]),
        ]
        for n, regs in enumerate(qpregs):
            qp = self.qp[n]
            m.d.comb += [
                qp.host_qpn.eq(regs["HOST_QPN"]),
                qp.host_rkey.eq(regs["HOST_RKEY"]),
                qp.ring_va.eq(Cat(regs["RING_VA_LO"], regs["RING_VA_HI"])),
                qp.num_slots.eq(regs["NUM_SLOTS"]),
                qp.slot_size.eq(regs["SLOT_SIZE"]),
                qp.imem_rkey.eq(regs["IMEM_RKEY"]),
                qp.env_rkey.eq(regs["ENV_RKEY"]),
                qp.regs_rkey.eq(regs["REGS_RKEY"]),
            ]
        return m
