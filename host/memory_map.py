"""The QSC memory map and QP contract: one definition for the gateware, the host and the docs.

One 32-bit byte address space serves both the control plane (WR_DWORD/RD_DWORD, 32-bit
registers) and RDMA (the RETH virtual address *is* this address; VA bits [63:32] must be zero):

| address | what |
|---|---|
| `0x0000_0000` | global registers, `rti` domain (version, network configuration, counters) |
| `0x0000_1000 + 0x100*q` | context of QP `q`, `rti` domain (QPNs, peer, R_Keys, counters) |
| `0x1000_0000 + n<<24` | window of PPU `n`, `dtd` domain, reached through the internal bus: |
| `  +0x00_0000` | instruction ring, `imem_depth` x 16 bytes (RDMA: IMEM_RKEY) |
| `  +0x40_0000` | envelope memory, `env_depth` x 2 bytes, signed Q1.15 (RDMA: ENV_RKEY) |
| `  +0x80_0000` | response mailbox, 64 bytes; written only by a SEND to the PPU's QP |
| `  +0xC0_0000` | PPU registers (RDMA: REGS_RKEY covers TAIL .. TRIGGER only) |
| `  +0xC0_0200` | readout channel registers, 0x20 bytes per channel; read only |
| `  +0xE0_0000` | raw-trace memory, `trace_depth` x 2 bytes, signed 16-bit; read only, no RDMA |

Generate ``docs/memory_map.md`` with ``qlink docs memory-map``; a test keeps it in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = [
    "Access", "Register", "Region", "QSCParams",
    "GLOBAL_REGISTERS", "QP_REGISTERS", "QP_COUNTERS", "QP_COUNTERS_OFFSET", "PPU_REGISTERS",
    "COUNTERS",
    "GLOBAL_BASE", "COUNTERS_BASE", "QP_BASE", "QP_STRIDE", "PPU_BASE", "PPU_STRIDE",
    "IMEM_OFFSET", "ENV_OFFSET", "MAILBOX_OFFSET", "MAILBOX_BYTES", "REGS_OFFSET",
    "REGS_RDMA_BYTES", "READOUT_REGISTERS", "READOUT_OFFSET", "READOUT_STRIDE", "TRACE_OFFSET",
    "GATEWARE_VERSION", "version_word", "global_reg", "qp_reg", "ppu_reg",
    "readout_reg", "ppu_base", "trace_addr", "counter_addr", "regions", "render_markdown",
]

GLOBAL_BASE = 0x0000_0000
QP_BASE = 0x0000_1000
QP_STRIDE = 0x100
PPU_BASE = 0x1000_0000
PPU_STRIDE = 0x0100_0000
IMEM_OFFSET = 0x00_0000
ENV_OFFSET = 0x40_0000
MAILBOX_OFFSET = 0x80_0000
MAILBOX_BYTES = 64
REGS_OFFSET = 0xC0_0000
#: Bytes of the PPU register block that RDMA WRITEs may reach (TAIL .. TRIGGER).
REGS_RDMA_BYTES = 0x18
#: Readout channel ``c``'s registers (:data:`READOUT_REGISTERS`) are at
#: ``REGS_OFFSET + READOUT_OFFSET + READOUT_STRIDE * c`` of the PPU's window.
READOUT_OFFSET = 0x200
READOUT_STRIDE = 0x20
#: The raw-trace memory: sample ``n`` (16 bits, little-endian) at byte ``TRACE_OFFSET + 2n``.
TRACE_OFFSET = 0xE0_0000

#: Gateware version (major, minor); the host refuses a QSC whose major differs.
GATEWARE_VERSION = (0, 1)


def version_word(isa_version: int) -> int:
    """VERSION register value: ``{major[31:24], minor[23:16], isa[15:8], 0x51 ('Q')[7:0]}``."""
    major, minor = GATEWARE_VERSION
    return (major << 24) | (minor << 16) | (isa_version << 8) | 0x51


class Access(Enum):
    RO = "RO"   #: read only
    RW = "RW"   #: read and write
    WO = "WO"   #: write only (reads return 0)


@dataclass(frozen=True)
class Register:
    """One 32-bit register. ``offset`` is from its block's base, in bytes."""

    name: str
    offset: int
    access: Access
    reset: int
    doc: str


@dataclass(frozen=True)
class Region:
    """A remotely writable region: RDMA WRITEs must fall in ``[va, va + length)`` and carry the
    R_Key held in the QP-context register ``rkey_register``."""

    name: str
    va: int
    length_bytes: int
    rkey_register: str


@dataclass(frozen=True)
class QSCParams:
    """Elaboration parameters of a QSC build, shared by gateware, host and bench.

    Clock frequencies are those the timeline and timestamps are computed with; in simulation
    they set the bench's clock periods. The channel counts size each PPU's physical interface
    (:class:`~openqlink.gateware.ppu.channels.PTDSignature`); the assembler refuses a channel
    number, envelope range or branch target that the build does not have.
    """

    num_ppus: int = 1
    #: QPs of the QSC (num_ppus..16; None: max(4, num_ppus)). QP n < num_ppus is PPU n's own
    #: QP, which carries its CALL requests; the others reach the PPU their PPU register names
    #: and send nothing (UC needs no acknowledgements)
    num_qps: int | None = None
    imem_depth: int = 1024            #: instructions in each PPU's ring (power of two)
    env_depth: int = 4096             #: 16-bit samples of envelope memory per PPU
    data_width_bits: int = 64         #: MAC-side packet stream width
    markers_per_ppu: int = 4          #: MARKER channels of each PPU (``marker 0..N-1``)
    drives_per_ppu: int = 1           #: drive (DAC) channels of each PPU (``play 0..N-1``)
    readouts_per_ppu: int = 1         #: readout (ADC) channels of each PPU (``acquire 0..N-1``)
    timeline_bits: int = 64           #: width of the DTD timeline and every time in the PPUs
    samples_per_cycle: int = 1        #: PTD samples per DTD cycle and converter (1, 2 or 4)
    nco: bool = True                  #: NCOs on the drive channels and readout demodulation
    #: The ALU op (``add``/``sub`` of two registers, ``and``, ``or``, ``xor``, shifts); without
    #: it (``False``) ALU is an illegal instruction: ADD of an immediate, LOOP and BRANCH remain
    alu: bool = True
    #: 16-bit ADC samples of each PPU's raw-trace memory (a power of two >= 4, at most 2**20;
    #: 0: no trace logic at all, as the board builds have)
    trace_depth: int = 1024
    #: Argument bytes a CALL may send (0..16; its registers' ``ceil(bits / 8)`` bytes summed): the
    #: width of the CALL request from the PPU to the network core. A CALL with more bytes is an
    #: illegal instruction (the assembler refuses it for the build).
    call_arg_bytes: int = 16
    rti_clk_hz: int = 156_250_000     #: network clock (10GBASE-R MAC side)
    dtd_clk_hz: int = 250_000_000     #: PPU / timeline clock
    qpn_base: int = 0x100             #: QPN of QP n from reset is qpn_base + n (QSC_QPN)
    mac: str = "02:4e:56:51:00:02"    #: QSC MAC address at reset (locally administered)
    ip: str = "192.168.0.2"           #: QSC IPv4 address at reset (HSB's default)

    def __post_init__(self):
        if not 1 <= self.num_ppus <= 16:
            raise ValueError(f"num_ppus must be 1..16, not {self.num_ppus}")
        if self.num_qps is None:
            object.__setattr__(self, "num_qps", max(4, self.num_ppus))
        if not self.num_ppus <= self.num_qps <= 16:
            raise ValueError(f"num_qps must be num_ppus ({self.num_ppus})..16, not "
                             f"{self.num_qps}")
        for name in ("imem_depth", "env_depth"):
            v = getattr(self, name)
            if v <= 0 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, not {v}")
        if self.imem_depth > 1 << 16:
            raise ValueError(f"imem_depth must be at most 65536 (16-bit targets), "
                             f"not {self.imem_depth}")
        for name in ("markers_per_ppu", "drives_per_ppu", "readouts_per_ppu"):
            v = getattr(self, name)
            if not 1 <= v <= 16:
                raise ValueError(f"{name} must be 1..16 (a 4-bit channel field), not {v}")
        if self.samples_per_cycle not in (1, 2, 4):
            raise ValueError(f"samples_per_cycle must be 1, 2 or 4, not "
                             f"{self.samples_per_cycle}")
        if self.trace_depth and (self.trace_depth < 4 or self.trace_depth > 1 << 20
                                 or self.trace_depth & (self.trace_depth - 1)):
            raise ValueError(f"trace_depth must be 0 or a power of two in 4..2**20, not "
                             f"{self.trace_depth}")
        if not 0 <= self.call_arg_bytes <= 16:
            raise ValueError(f"call_arg_bytes must be 0..16, not {self.call_arg_bytes}")
        if self.env_depth < 4 * self.samples_per_cycle:
            raise ValueError(f"env_depth must hold at least 4 cycles of samples "
                             f"({4 * self.samples_per_cycle}), not {self.env_depth}")
        if not 40 <= self.timeline_bits <= 64:
            raise ValueError(f"timeline_bits must be 40..64, not {self.timeline_bits}")
        if self.data_width_bits != 64:
            raise ValueError(f"data_width_bits must be 64 for now, not {self.data_width_bits}")

    @property
    def timeline_wrap_s(self) -> float:
        """Seconds until the timeline wraps (``2**timeline_bits`` DTD cycles)."""
        return (1 << self.timeline_bits) / self.dtd_clk_hz

    @property
    def sample_rate_hz(self) -> int:
        """PTD samples per second of each converter (``dtd_clk_hz * samples_per_cycle``)."""
        return self.dtd_clk_hz * self.samples_per_cycle

    @property
    def dtd_period_ns(self) -> float:
        return 1e9 / self.dtd_clk_hz

    @property
    def rti_period_ns(self) -> float:
        return 1e9 / self.rti_clk_hz


_R = Register
GLOBAL_REGISTERS: tuple[Register, ...] = (
    _R("VERSION", 0x000, Access.RO, 0, "Gateware and ISA version, see version_word()"),
    _R("NUM_PPUS", 0x004, Access.RO, 0, "Number of PPUs in this build"),
    _R("SCRATCH", 0x008, Access.RW, 0, "Free for the host: connection check"),
    _R("NUM_QPS", 0x00C, Access.RO, 0,
       "Number of QPs in this build (num_ppus..16; QP n < NUM_PPUS is PPU n's own)"),
    _R("QSC_MAC_HI", 0x010, Access.RW, 0, "QSC MAC address bits [47:32]"),
    _R("QSC_MAC_LO", 0x014, Access.RW, 0, "QSC MAC address bits [31:0]"),
    _R("QSC_IP", 0x018, Access.RW, 0, "QSC IPv4 address"),
    _R("UDP_SRC_PORT", 0x02C, Access.RW, 0xC000, "UDP source port of RoCEv2 packets we send"),
    _R("P_KEY", 0x030, Access.RW, 0xFFFF, "Partition key: low 15 bits matched, bit 15 = full"),
    _R("TIMESTAMP_FORMAT", 0x034, Access.RW, 0,
       "ptp_timestamp encoding: 0 = ns since reset (u64), 1 = {seconds[63:32], ns[31:0]}"),
    _R("RX_ENABLE", 0x038, Access.RW, 0,
       "Bit 0: accept RoCEv2 packets (off from reset: the host sets it once it has configured "
       "the QPs)"),
    _R("CLAIM", 0x03C, Access.RW, 0,
       "Control-plane owner: reads the IPv4 address of the host that claimed the QSC (0: "
       "unclaimed). An accepted write from any host claims an unclaimed QSC; while claimed, "
       "writes from another source MAC or IP are refused with status CLAIMED (reads stay "
       "open); the owner writing 0 here, or a reset, releases it"),
    _R("BOOTP_INTERVAL_MS", 0x040, Access.RW, 1000,
       "Milliseconds between the QSC's BOOTP announcements (a sensor bridge's enumeration "
       "request, openqlink.wire.bootp; 16 bits); 0: none"),
)

#: Counters (RO, 32-bit, wrap), each a reason a frame is counted; at ``0x100 + 4*i``.
COUNTERS: tuple[tuple[str, str], ...] = (
    ("RX_FRAMES", "Frames received from the MAC"),
    ("RX_ROCE_ACCEPTED", "RoCEv2 packets accepted and committed"),
    ("RX_CONTROL", "Control-plane requests accepted"),
    ("DROP_ETH", "Not for our MAC, or EtherType not handled"),
    ("DROP_IP", "Bad IPv4 version/IHL/checksum/length/address/fragment/protocol"),
    ("DROP_UDP", "Bad UDP length or port not handled"),
    ("DROP_ICRC", "RoCEv2 ICRC mismatch"),
    ("DROP_OPCODE", "BTH opcode not handled (not UC, or not supported yet)"),
    ("DROP_PKEY", "P_Key does not match"),
    ("DROP_QPN", "DestQP is no QP's QSC_QPN"),
    ("DROP_RKEY", "R_Key does not match the region's"),
    ("DROP_VA", "VA range leaves the region, or is not 4-byte aligned"),
    ("DROP_LENGTH", "Payload length inconsistent with DMALen, pad count or buffer; a UDP-mode "
                    "response shorter than 24 bytes or longer than RESPONSE_BYTES"),
    ("DROP_PSN", "MIDDLE/LAST with unexpected PSN or no open message"),
    ("PSN_GAP", "FIRST/ONLY whose PSN jumped (kept)"),
    ("DROP_OVERFLOW", "Receive buffer full"),
    ("TX_FRAMES", "Frames sent to the MAC"),
    ("TX_RPC_REQUESTS", "RPC requests sent"),
    ("RX_RPC_RESPONSES", "RPC responses delivered to a mailbox (a SEND message's LAST or ONLY "
                         "packet, or a UDP-mode response datagram)"),
    ("DROP_BUS", "Commands to the PPUs dropped: the dtd side took none for 256 rti cycles "
                 "(no clock, in reset)"),
    ("DROP_MAC", "Frame flagged bad by the MAC: FCS or PHY error"),
    ("DROP_IMMDT", "RDMA_WRITE_WITH_IMMEDIATE into an instruction ring whose ImmDt is not a "
                   "TAIL of the ring (>= imem_depth): dropped whole, no byte written"),
    ("DROP_PEER", "RoCEv2 packet whose source MAC or IP is not the QP's peer (its PEER_MAC, "
                  "PEER_IP); a UDP-mode response whose source MAC, IP or UDP port is not the "
                  "QP's PEER_MAC, PEER_IP, PEER_UDP_PORT"),
    ("RX_ARP_REQUESTS", "ARP requests for the QSC's IP (each answered, unless counted in "
                        "REPLIES_SKIPPED)"),
    ("RX_ECHO_REQUESTS", "ICMP echo requests to the QSC (each answered, unless counted in "
                         "REPLIES_SKIPPED)"),
    ("DROP_ARP", "ARP packet that is not a request for the QSC's IP (replies and "
                 "announcements included: the QSC learns no address from ARP)"),
    ("DROP_ICMP", "ICMP message that is not an echo request, fails its checksum, or is "
                  "longer than the echo buffer"),
    ("REPLIES_SKIPPED", "ARP or echo requests not answered: the responder was still busy "
                        "with an earlier reply"),
)
COUNTERS_BASE = 0x100

#: Context of QP ``q`` at ``QP_BASE + QP_STRIDE * q``. QP ``q < num_ppus`` is PPU ``q``'s own
#: (its CALL requests go out on it); the others reach the PPU their PPU register names.
QP_REGISTERS: tuple[Register, ...] = (
    _R("QSC_QPN", 0x00, Access.RW, 0,
       "QPN of this QP: the DestQP its packets carry (from reset the build's qpn_base + q). "
       "Write it before HOST_QPN, e.g. 0x2 for CUDA-Q's GPU bridge's default remote QP; QPNs "
       "of two QPs must differ (a packet goes to the lowest QP whose QSC_QPN matches)"),
    _R("HOST_QPN", 0x04, Access.RW, 0,
       "The peer's QPN: DestQP of the requests of a PPU's own QP; a write restarts the QP (a "
       "host configuring it): TX_PSN, RX_EPSN and the next request's ring slot return to 0, "
       "its open message closes and its R_Keys become invalid"),
    _R("HOST_RKEY", 0x08, Access.RW, 0, "R_Key of the host's request ring"),
    _R("RING_VA_HI", 0x0C, Access.RW, 0, "Host ring base VA bits [63:32] (iova 0: keep 0)"),
    _R("RING_VA_LO", 0x10, Access.RW, 0, "Host ring base VA bits [31:0]"),
    _R("NUM_SLOTS", 0x14, Access.RW, 8, "Slots in the host ring (1..4096)"),
    _R("SLOT_SIZE", 0x18, Access.RW, 256, "Bytes per slot; requests must fit"),
    _R("IMEM_RKEY", 0x1C, Access.RW, 0, "R_Key of the instruction ring"),
    _R("ENV_RKEY", 0x20, Access.RW, 0, "R_Key of the envelope memory"),
    _R("REGS_RKEY", 0x24, Access.RW, 0, "R_Key of the PPU registers TAIL .. TRIGGER"),
    _R("TX_PSN", 0x28, Access.RO, 0,
       "Next PSN we send on this QP (a QP q >= NUM_PPUS sends nothing: 0; a request in UDP "
       "mode takes no PSN)"),
    _R("RX_EPSN", 0x2C, Access.RO, 0, "Next PSN we expect on this QP"),
    _R("RESPONSE_BYTES", 0x30, Access.RW, 64,
       "Largest SEND payload this QP takes into the PPU's response mailbox, in bytes (13 "
       "bits; a larger SEND is dropped, DROP_LENGTH). The mailbox keeps the first 64 bytes: the "
       "RPC response header and up to 40 result bytes, as result_len says. CUDA-Q's GPU "
       "bridge SENDs 24 + its payload size whatever result_len is: set its size here. In UDP "
       "mode (TRANSPORT 1) also the largest response datagram (24 bytes at least): CUDA-Q's "
       "udp bridge answers with whole slots, so set its slot_size here"),
    _R("PMTU", 0x34, Access.RW, 3,
       "Path MTU of this QP as IBTA's PathMTU / ibverbs' ibv_mtu codes it: 1 = 256, 2 = 512, "
       "3 = 1024, 4 = 2048, 5 = 4096 bytes (3 bits; other values act as 256). A FIRST or MIDDLE "
       "packet carries exactly this many payload bytes, a LAST 1 up to it, an ONLY at most it "
       "(else DROP_LENGTH)"),
    _R("PEER_MAC_HI", 0x38, Access.RW, 0,
       "MAC address of this QP's peer (the real-time host's NIC) bits [47:32]: the QP takes "
       "packets from this source MAC only (DROP_PEER) and sends its requests to it"),
    _R("PEER_MAC_LO", 0x3C, Access.RW, 0, "Peer MAC address bits [31:0]"),
    _R("PEER_IP", 0x40, Access.RW, 0,
       "IPv4 address of this QP's peer: the QP takes packets from this source IP only "
       "(DROP_PEER) and sends its requests to it"),
    _R("PPU", 0x44, Access.RW, 0,
       "The PPU whose regions (as this QP's R_Keys open them) and response mailbox this QP "
       "reaches (4 bits). A PPU's own QP (q < NUM_PPUS) reads q and ignores writes; another "
       "QP's is 0 from reset, and a write of a PPU the build lacks is ignored"),
    _R("TRANSPORT", 0x48, Access.RW, 0,
       "How this QP carries its PPU's CALLs (1 bit): 0 = RoCEv2 UC (requests as "
       "RDMA_WRITE_ONLY_WITH_IMMEDIATE into the host ring, responses as SENDs), 1 = UDP, CUDA-Q "
       "realtime's udp bridge format (a request is one datagram, RPCHeader and arguments, from "
       "UDP port UDP_CALL_PORT_BASE + q to PEER_UDP_PORT; a response is a datagram from "
       "PEER_UDP_PORT to UDP_CALL_PORT_BASE + q whose first 64 bytes go to the mailbox). RoCE "
       "packets for the QP's QSC_QPN are taken in both modes. A PPU's own QP (q < NUM_PPUS) "
       "only: another QP reads 0 and ignores writes"),
    _R("PEER_UDP_PORT", 0x4C, Access.RW, 0,
       "The peer's UDP port (16 bits), used in UDP mode (TRANSPORT = 1): the destination "
       "port of this QP's requests and the only source port whose responses it takes "
       "(DROP_PEER)"),
)

#: Offset of the QP counters in each QP context.
QP_COUNTERS_OFFSET = 0x80

#: Counters of each QP (RO, 32-bit, wrap) at ``QP_BASE + QP_STRIDE * q + QP_COUNTERS_OFFSET``,
#: 4 bytes apart. A packet is the QP's when its DestQP is the QP's QSC_QPN; in UDP mode
#: (TRANSPORT 1) a UDP datagram to the QP's UDP port (UDP_CALL_PORT_BASE + q) is too.
QP_COUNTERS: tuple[tuple[str, str], ...] = (
    ("RX_PACKETS", "Packets of this QP accepted"),
    ("RX_DROPS", "Packets of this QP dropped, for any reason after DestQP (DROP_PEER and "
                 "DROP_OVERFLOW included)"),
    ("RX_DROPS_PSN", "Of those, the DROP_PSN ones (a MIDDLE or LAST of a broken message)"),
    ("TX_PACKETS", "RPC requests sent on this QP (a QP q >= NUM_PPUS sends none)"),
)

#: PPU registers at ``ppu_base(n) + REGS_OFFSET``.
PPU_REGISTERS: tuple[Register, ...] = (
    _R("TAIL", 0x00, Access.RW, 0, "Committed tail: index one past the last valid instruction"),
    _R("HEAD", 0x04, Access.RW, 0,
       "First committed instruction: the committed range is HEAD .. TAIL - 1 (mod imem_depth); "
       "a trigger sets it to 0, the host moves it forward to release slots"),
    _R("START_TIME_LO", 0x08, Access.RW, 0, "Trigger start time, DTD cycles, bits [31:0]"),
    _R("START_TIME_HI", 0x0C, Access.RW, 0,
       "Trigger start time, DTD cycles, bits [timeline_bits-1:32]"),
    _R("TRIGGER", 0x10, Access.WO, 0,
       "Atomic trigger: bits 15..0 the new TAIL, bit 31 'check the upload' with bits 30..16 "
       "the upload's words mod 2**15 (UPLOAD_WORDS); in one DTD cycle commits TAIL and arms "
       "the PPU for START_TIME (refused with trigger_busy / trigger_late / trigger_incomplete)"),
    _R("STATUS", 0x14, Access.RO, 0, "PPUStatus (openqlink.isa.PPUStatus)"),
    _R("PC", 0x18, Access.RO, 0, "Program counter (instruction index)"),
    _R("IMEM_WRITES_REFUSED", 0x1C, Access.RO, 0,
       "Bus words written into the committed range while ARMED or RUNNING: refused"),
    _R("TIMELINE_LO", 0x20, Access.RO, 0, "Timeline counter bits [31:0]; reading latches HI"),
    _R("TIMELINE_HI", 0x24, Access.RO, 0,
       "Timeline counter bits [timeline_bits-1:32] latched by LO"),
    _R("CALL_TIMEOUT_CYCLES", 0x28, Access.RW, 250_000, "CALL time-out, DTD cycles (0: none)"),
    _R("LAST_CALL_STATUS", 0x2C, Access.RO, 0, "status field of the last RPC response"),
    _R("CALL_COUNT", 0x30, Access.RO, 0, "CALLs issued since reset"),
    _R("STALE_RESPONSES", 0x34, Access.RO, 0, "Responses dropped: request_id not awaited"),
    _R("LAST_RTT_CYCLES", 0x38, Access.RO, 0, "DTD cycles from the last CALL to its result"),
    _R("LATE_EVENTS", 0x3C, Access.RO, 0, "Events that reached their channel late"),
) + tuple(_R(f"R{i}", 0x40 + 4 * i, Access.RO, 0, f"General register r{i}")
        for i in range(16)) + (
    _R("UPLOAD_WORDS", 0x80, Access.RW, 0,
       "64-bit words written into the ring and envelope memory since the last accepted trigger "
       "(write 0 to restart the count)"),
    _R("CALL_SLOTS", 0x84, Access.RW, 8,
       "CALLs this PPU may have outstanding: the host ring's NUM_SLOTS (1..4096; 0 counts as "
       "1); a write also forgets the outstanding ones (the host restarted its ring)"),
    _R("CALL_OUTSTANDING", 0x88, Access.RO, 0,
       "CALL requests handed to the network core and not answered yet (their slots are the "
       "host's)"),
    _R("TRACE_ARM", 0x8C, Access.WO, 0,
       "Raw-trace capture: a write of readout channel c (0..readouts_per_ppu-1; all four byte "
       "lanes, else ignored) stops any capture, sets TRACE_COUNT to 0 and arms the trace for "
       "c's next ACQUIRE window; any other value is refused (TRACE_STATUS.refused)"),
    _R("TRACE_STATUS", 0x90, Access.RO, 0,
       "Raw-trace state: bit 0 armed, bit 1 capturing, bit 2 done, bit 3 full (stopped at the "
       "memory's end before the window's), bit 4 refused (the last TRACE_ARM write), bits "
       "11..8 the armed channel"),
    _R("TRACE_COUNT", 0x94, Access.RO, 0,
       "ADC samples captured into the trace memory since the last accepted TRACE_ARM"),
    _R("TRACE_DEPTH", 0x98, Access.RO, 0,
       "Samples the trace memory holds: the build's trace_depth (0: no trace)"),
    _R("CALL_ARG_BYTES", 0x9C, Access.RO, 0,
       "Argument bytes a CALL may send: the build's call_arg_bytes (0..16)"),
)

#: Registers of readout channel ``c`` of a PPU, at ``REGS_OFFSET + READOUT_OFFSET +
#: READOUT_STRIDE * c`` of its window (:func:`readout_reg`). I and Q are 40-bit signed integrals
#: in ADC units (sums of 16-bit samples, or of their demodulated products: docs/isa.md, ACQUIRE).
READOUT_REGISTERS: tuple[Register, ...] = (
    _R("I_LO", 0x00, Access.RO, 0,
       "I of the last completed window, bits [31:0]; reading it latches I_HI, Q_LO, Q_HI and "
       "IQ_COUNT (a snapshot of the same window)"),
    _R("I_HI", 0x04, Access.RO, 0, "I bits [39:32] sign-extended to 32 bits, latched by I_LO"),
    _R("Q_LO", 0x08, Access.RO, 0, "Q bits [31:0], latched by I_LO (0 without NCOs)"),
    _R("Q_HI", 0x0C, Access.RO, 0, "Q bits [39:32] sign-extended to 32 bits, latched by I_LO"),
    _R("IQ_COUNT", 0x10, Access.RO, 0, "WINDOW_COUNT of the window I_LO latched"),
    _R("WINDOW_COUNT", 0x14, Access.RO, 0,
       "ACQUIRE windows completed on this channel since reset (wraps at 2**32); I and Q "
       "change only as it counts"),
)


def _find(table: tuple[Register, ...], name: str) -> Register:
    for r in table:
        if r.name == name:
            return r
    raise KeyError(f"no register {name!r}")


def global_reg(name: str) -> int:
    """Byte address of a global register or counter."""
    try:
        return GLOBAL_BASE + _find(GLOBAL_REGISTERS, name).offset
    except KeyError:
        return counter_addr(name)


def counter_addr(name: str) -> int:
    for i, (n, _) in enumerate(COUNTERS):
        if n == name:
            return GLOBAL_BASE + COUNTERS_BASE + 4 * i
    raise KeyError(f"no register or counter {name!r}")


def qp_reg(qp: int, name: str) -> int:
    """Byte address of register or counter ``name`` in QP ``qp``'s context (PPU ``n``'s own QP
    is QP ``n``)."""
    for i, (n, _) in enumerate(QP_COUNTERS):
        if n == name:
            return QP_BASE + QP_STRIDE * qp + QP_COUNTERS_OFFSET + 4 * i
    return QP_BASE + QP_STRIDE * qp + _find(QP_REGISTERS, name).offset


def ppu_base(ppu: int) -> int:
    """Base address of PPU ``ppu``'s window."""
    return PPU_BASE + PPU_STRIDE * ppu


def ppu_reg(ppu: int, name: str) -> int:
    """Byte address of PPU register ``name``."""
    return ppu_base(ppu) + REGS_OFFSET + _find(PPU_REGISTERS, name).offset


def readout_reg(ppu: int, channel: int, name: str) -> int:
    """Byte address of register ``name`` (:data:`READOUT_REGISTERS`) of readout channel
    ``channel`` (0..15) of PPU ``ppu``."""
    if not 0 <= channel < 16:
        raise ValueError(f"readout channel must be 0..15, not {channel}")
    return (ppu_base(ppu) + REGS_OFFSET + READOUT_OFFSET + READOUT_STRIDE * channel
            + _find(READOUT_REGISTERS, name).offset)


def trace_addr(ppu: int, sample: int = 0) -> int:
    """Byte address of sample ``sample`` of PPU ``ppu``'s raw-trace memory."""
    return ppu_base(ppu) + TRACE_OFFSET + 2 * sample


def regions(params: QSCParams, ppu: int) -> tuple[Region, ...]:
    """The RDMA-writable regions of PPU ``ppu`` (the response mailbox is SEND-only)."""
    base = ppu_base(ppu)
    return (
        Region("IMEM", base + IMEM_OFFSET, params.imem_depth * 16, "IMEM_RKEY"),
        Region("ENV", base + ENV_OFFSET, params.env_depth * 2, "ENV_RKEY"),
        Region("REGS", base + REGS_OFFSET, REGS_RDMA_BYTES, "REGS_RKEY"),
    )


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _offset_table(registers) -> str:
    """A register block's table, by offset from the block's base."""
    return _table([(f"`+{r.offset:#04x}`", r.name, r.access.value, f"`{r.reset:#x}`", r.doc)
                   for r in registers], ("offset", "name", "access", "reset", ""))


def render_markdown(params: QSCParams | None = None) -> str:
    """``docs/memory_map.md``, generated from the tables in this module."""
    params = params or QSCParams()
    doc = (__doc__ or "").split("Generate")[0].strip()
    parts = [
        "# QSC memory map and QP contract",
        "",
        "Generated by `qlink docs memory-map` from `openqlink.memory_map`, the definition the "
        "gateware and the host share. Do not edit by hand.",
        "",
        doc,
        "",
        "## Global registers (rti domain)",
        "",
        _table([(f"`{GLOBAL_BASE + r.offset:#010x}`", r.name, r.access.value, f"`{r.reset:#x}`",
                 r.doc) for r in GLOBAL_REGISTERS], ("address", "name", "access", "reset", "")),
        "",
        "Reset values of the QSC MAC/IP come from the build parameters "
        f"(default {params.mac}, {params.ip}).",
        "",
        "## Counters (RO, 32-bit, wrapping)",
        "",
        _table([(f"`{counter_addr(n):#010x}`", n, d) for n, d in COUNTERS],
               ("address", "name", "counts")),
        "",
        "## Context of QP q (rti domain), at `0x1000 + 0x100*q`",
        "",
        f"A build has `num_qps` QPs (default max(4, num_ppus): {params.num_qps} here). QP "
        "`q < num_ppus` is PPU `q`'s own: its CALL requests go out on it. Every QP has its own "
        "peer, PSNs, open message, counters and R_Keys: a region of its PPU is writable "
        "through the QP once the QP's R_Key register for it has been written (its map).",
        "",
        _table([(f"`+{r.offset:#04x}`", r.name, r.access.value,
                 {"QSC_QPN": "qpn_base + q", "PPU": "q (own QP), 0"}.get(
                     r.name, f"`{r.reset:#x}`"), r.doc)
                for r in QP_REGISTERS], ("offset", "name", "access", "reset", "")),
        "",
        "Counters of QP q (RO, 32-bit, wrapping):",
        "",
        _table([(f"`+{QP_COUNTERS_OFFSET + 4 * i:#04x}`", n, d)
                for i, (n, d) in enumerate(QP_COUNTERS)], ("offset", "name", "counts")),
        "",
        f"QP q's QPN is QSC_QPN, `qpn_base + q` from reset (default qpn_base "
        f"{params.qpn_base:#x}). Requests go "
        "to HOST_QPN as UC RDMA_WRITE_ONLY_WITH_IMMEDIATE into slot `s` at VA "
        "`RING_VA + s*SLOT_SIZE` with ImmDt `{PSN[19:0], s[11:0]}`, slots round-robin from 0 "
        "(a write that changes SLOT_SIZE restarts them at 0), at most NUM_SLOTS outstanding. "
        "Responses come back as UC SEND_ONLY to QSC_QPN and land in the PPU's mailbox, matched "
        "by request_id; a SEND of up to RESPONSE_BYTES is taken, its first 64 bytes kept.",
        "",
        "## PPU registers, at `0x1000_0000 + 0x0100_0000*n + 0xC0_0000`",
        "",
        _offset_table(PPU_REGISTERS),
        "",
        "## Readout channel c of PPU n, at `0x1000_0000 + 0x0100_0000*n + 0xC0_0200 + "
        "0x20*c`",
        "",
        _offset_table(READOUT_REGISTERS),
        "",
        "Channels `c < readouts_per_ppu` are mapped (offsets `+0x18`, `+0x1C` read 0); the "
        "others are unmapped. A 64-bit bus read of I_LO's word returns I_LO and I_HI of the same "
        "window. A control-plane reader reads I_LO, then I_HI, Q_LO, Q_HI and IQ_COUNT: one "
        "window's values whatever windows complete in between.",
        "",
        "## Raw-trace memory of PPU n, at `0x1000_0000 + 0x0100_0000*n + 0xE0_0000`",
        "",
        f"`trace_depth` signed 16-bit ADC samples (default {params.trace_depth}; the board "
        "builds have none), little-endian, four to a 64-bit word: sample `k` of the captured "
        "window (cycle `k // S` of the window, lane `k % S`) at byte `2k`. Written only by a "
        "capture (TRACE_ARM); host writes are ignored and no RDMA region covers it. Words "
        "past `trace_depth` are unmapped.",
        "",
        "## RDMA-writable regions of PPU 0 with the default parameters",
        "",
        _table([(r.name, f"`{r.va:#010x}`", str(r.length_bytes), r.rkey_register)
                for r in regions(params, 0)], ("region", "VA", "bytes", "R_Key register")),
        "",
    ]
    return "\n".join(parts)
