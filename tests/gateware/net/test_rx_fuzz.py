"""Fuzzing of the receive engine (openqlink.gateware.net.rx) against the reference model of its
rules (openqlink.sim.rx_model), in Amaranth's simulator, driven by hypothesis.

One example is one configuration (the QSC's addresses, P_Key, RX_ENABLE, the number of PPUs
and QPs, and every QP's context: its peer, some QPs another host's than others, the PPU an
extra QP reaches, its map of regions (the R_Keys written and their valid bits, a random subset
for an extra QP), QSC_QPN, RESPONSE_BYTES and PMTU) and one batch of frames through one
simulation: valid frames of every kind the QSC takes, to every QP (UC
RDMA_WRITE_ONLY[_WITH_IMMEDIATE], zero-length ones with any VA and R_Key among them,
SEND_ONLY[_WITH_IMMEDIATE] to the mailbox, control requests on UDP 8192, ARP requests, ICMP echo
requests) and UC messages of several packets (RDMA WRITE and SEND, FIRST, MIDDLEs, LAST with or
without immediate, at the QP's PMTU: 256 or 512 bytes), then mutated (header fields set to edge
values, opcodes out of sequence, bits flipped, frames cut or extended, the MAC's error flag),
with the IPv4 checksum, the UDP checksum (or zero) and the ICRC recomputed or not so that every
check is reached; messages cut short, with packets lost, duplicated or swapped (PSNs out of
order), other frames between their packets; packets to a QP from another QP's peer or a
stranger and with another QP's R_Key; QPs restarted, rekeyed, moved to another PPU and given
another peer between frames; valid probes after them. Every batch is checked (:func:`check`)
for:

(a) no bus write outside a region of the PPU that the packet's QP reaches;
(b) no byte of a RoCEv2 frame whose ICRC is bad reaches the bus;
(c) every write the model expects lands, byte for byte, at the address the model says (a
    message's MIDDLE and LAST where its earlier packets left off) and in order, and nothing
    else;
(d) the counters add up: RX_FRAMES is the number of frames sent, each frame's decision strobes
    exactly one outcome (taken, or one drop counter), the model's, PSN_GAP and
    RX_RPC_RESPONSES as the model says, and the counters read back are the strobes' sums;
    every QP's RX_EPSN and counters read back (RX_PACKETS, RX_DROPS, RX_DROPS_PSN; TX_PACKETS
    0) are the model's;
(e) a valid frame after any garbage is taken;
(f) nothing wedges under back-pressure (bus and control-request ``ready`` toggled at random,
    idle cycles inside frames, gaps between them): every frame gets its decision and the
    engine drains.

Under back-pressure a packet the model takes may be dropped for overflow; the model is told
(:meth:`~openqlink.sim.rx_model.RxModel.apply_dropped`), so its QP's open message closes as the
receiver's does.

The fuzzing found one engine fault, kept as
:func:`test_an_unpadded_arp_request_is_judged_on_its_own_target_ip`. ``benchmarks/rx_fuzz.py``
runs the same generator and checks over many more frames.
"""

from __future__ import annotations

import dataclasses
import random
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest
from amaranth.lib import data as amaranth_data
from amaranth.sim import Simulator
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from netbench import HOST_IP, HOST_MAC, expected_writes, ip_udp, pad60, roce_frame
from test_rx import RxHarness, reg_read, reg_write

from openqlink.gateware.bus import BusCommand, BusOp
from openqlink.gateware.net.control import PAIR_RING_DEPTH, ControlRequest
from openqlink.gateware.net.regs import COUNTER_LAG_CYCLES, qp_counter_lag_cycles
from openqlink.gateware.packet import beat_layout
from openqlink.memory_map import (
    COUNTERS,
    MAILBOX_BYTES,
    MAILBOX_OFFSET,
    QP_COUNTERS,
    QSCParams,
    counter_addr,
    global_reg,
    ppu_base,
    qp_reg,
    regions,
)
from openqlink.sim.rx_model import (
    ACCEPTED,
    CONTROL,
    DROP_REASONS,
    PMTU_RESET,
    UDP_RESPONSE,
    RxConfig,
    RxModel,
    Verdict,
    pmtu_bytes,
)
from openqlink.wire.arp import ARP
from openqlink.wire.control import BLOCK_MAX_PAIRS, CONTROL_REQUEST, Command
from openqlink.wire.ethernet import ETHERNET, EtherType
from openqlink.wire.icmp import ICMP_ECHO
from openqlink.wire.ipv4 import IPV4, IpProtocol, ipv4_checksum
from openqlink.wire.roce import Opcode, icrc
from openqlink.wire.udp import CONTROL_PORT, ROCEV2_PORT, UDP_CALL_PORT_BASE

Cmd = tuple[BusOp, int, int, int]     # (op, word_addr, be, data)

#: Counters that the receiver strobes, one of them per frame (with RX_FRAMES), or none for a
#: control request or a UDP-mode response taken (the latter strobes RX_RPC_RESPONSES).
OUTCOME_COUNTERS = (ACCEPTED, "RX_ARP_REQUESTS", "RX_ECHO_REQUESTS") + DROP_REASONS


# ---- where the choices come from -------------------------------------------------------------

class Chooser:
    """The generator's structural choices: hypothesis draws, or a seeded Random (the
    benchmark). Byte contents and random field values come from a seeded Random in both."""

    def integer(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def choice(self, options: Sequence):
        return options[self.integer(0, len(options) - 1)]

    def chance(self, percent: int) -> bool:
        """True with ``percent`` % probability (a draw of 0 gives False)."""
        return self.integer(0, 99) >= 100 - percent


class RandomChooser(Chooser):
    def __init__(self, rng: random.Random):
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


class DrawChooser(Chooser):
    def __init__(self, draw: Callable):
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))


# ---- configuration ---------------------------------------------------------------------------

@dataclass
class Setup:
    """A configuration: the model's view of it and the register writes that apply it."""

    config: RxConfig
    writes: list[tuple[int, int]]


def make_setup(ch: Chooser, rng: random.Random, *, vary: bool) -> Setup:
    """The configuration of a host's configure, of every QP of a build of one or two PPUs (four
    QPs: each PPU's own, the others extra): each QP's peer (the host for QP 0, for each other QP
    the host or a second one, or the host's MAC with another IP), the PPU each extra QP reaches
    (a random PPU; now and then a write of a PPU the build lacks, or to a PPU's own QP, which
    the register ignores), each QP's map (every region's R_Key for a PPU's own QP, a random
    subset for an extra QP), each QP's PMTU (256 or 512 bytes, so that messages stay short)
    and, half the time, a RESPONSE_BYTES that leaves room for SEND messages of several packets,
    RX_ENABLE; with ``vary``, also three PPUs and more QPs, QSC addresses, P_Keys, keys never
    written, an extra QP left unconfigured, other QSC_QPNs and RESPONSE_BYTES, other PMTU
    register values (the reset value 1024 left, values outside the enum acting as 256),
    RX_ENABLE left off, and now and then a 4 KiB receive buffer with a PMTU of 4096 (a packet
    taken may then be longer than the whole buffer)."""
    num_ppus = ch.choice([1, 2, 3] if vary else [1, 2])
    num_qps = max(4, num_ppus)
    if vary and ch.chance(20):
        num_qps += ch.choice([1, 2])
    params = QSCParams(num_ppus=num_ppus, num_qps=num_qps)
    writes: list[tuple[int, int]] = []
    qsc_mac = qsc_ip = None
    if vary and ch.chance(30):
        qsc_mac = 0x02_00_00_00_00_00 | rng.getrandbits(40)
        qsc_ip = rng.getrandbits(32)
        writes += [(global_reg("QSC_MAC_HI"), qsc_mac >> 32),
                   (global_reg("QSC_MAC_LO"), qsc_mac & 0xFFFF_FFFF),
                   (global_reg("QSC_IP"), qsc_ip)]
    host_mac, host_ip = HOST_MAC, HOST_IP
    if vary and ch.chance(30):
        host_mac, host_ip = 0x02_00_00_00_00_00 | rng.getrandbits(40), rng.getrandbits(32)
    # a second host, and the host's MAC with another IP (one NIC, two addresses)
    second = (0x02_00_00_00_00_00 | rng.getrandbits(40), rng.getrandbits(32))
    same_mac = (host_mac, rng.getrandbits(32))
    # extra QPs a host never configured: peer, PPU and keys at their reset values
    unconfigured = {q for q in range(num_ppus, num_qps) if vary and ch.chance(10)}
    peers: list[tuple[int, int]] = []
    for q in range(num_qps):
        peer = (host_mac, host_ip)
        if q in unconfigured:
            peer = (0, 0)
        elif q and ch.chance(40):
            peer = ch.choice([second, second, same_mac])
        peers.append(peer)
        if q not in unconfigured:
            mac, ip = peer
            writes += [(qp_reg(q, "PEER_MAC_HI"), mac >> 32),
                       (qp_reg(q, "PEER_MAC_LO"), mac & 0xFFFF_FFFF),
                       (qp_reg(q, "PEER_IP"), ip)]
    p_key = 0xFFFF
    if vary and ch.chance(40):
        p_key = ch.choice([0x7FFF, 0x8005, 0x0005, 0x0000, 0x8000, rng.getrandbits(16)])
        writes.append((global_reg("P_KEY"), p_key))
    ppu_writes: list[tuple[int, int]] = []
    for q in range(num_qps):
        if q in unconfigured:
            continue
        if q >= num_ppus:
            ppu_writes.append((q, rng.randrange(num_ppus)))
        if ch.chance(8):
            # a PPU the build lacks, or a write to a PPU's own QP: ignored
            ppu_writes.append((q, ch.choice([num_ppus, 15, 16, rng.randrange(num_ppus)])))
    rkeys = []
    for q in range(num_qps):
        keys = {}
        for region in regions(params, 0):
            key = ch.choice([rng.getrandbits(32), 0, 0xFFFF_FFFF, 0x1111_0001 + q])
            if q in unconfigured:
                valid = False
            elif q < num_ppus:
                valid = not (vary and ch.chance(15))
            else:
                valid = ch.chance(60)             # the extra QP's map: some regions
            # a key never written holds its reset value, 0, and is not valid
            keys[region.rkey_register] = (key if valid else 0, valid)
            if valid:
                writes.append((qp_reg(q, region.rkey_register), key))
        rkeys.append(keys)
    # QSC_QPN (e.g. a GPU bridge's 0x2; two QPs may share one: the lower QP takes its
    # packets) and RESPONSE_BYTES (SENDs longer than the mailbox)
    qsc_qpns = [params.qpn_base + q for q in range(num_qps)]
    response_bytes = [64] * num_qps
    pmtu = [pmtu_bytes(PMTU_RESET)] * num_qps
    small_buffer = vary and ch.chance(8)
    for q in range(num_qps):
        if vary and ch.chance(30):
            qsc_qpns[q] = ch.choice([0x2, rng.getrandbits(24), qsc_qpns[0], 0xFFFFFF])
            writes.append((qp_reg(q, "QSC_QPN"), qsc_qpns[q]))
        if vary and ch.chance(50):
            response_bytes[q] = ch.choice([24, 63, 65, 280, 280, 1024, rng.getrandbits(13)])
            writes.append((qp_reg(q, "RESPONSE_BYTES"), response_bytes[q]))
        elif not vary and ch.chance(50):
            response_bytes[q] = ch.choice([700, 1024, 2000])
            writes.append((qp_reg(q, "RESPONSE_BYTES"), response_bytes[q]))
        register = ch.choice([1, 1, 2])
        if small_buffer:
            register = 5
        elif vary and ch.chance(15):
            register = ch.choice([0, 3, 6, 7])
        if not (vary and register == PMTU_RESET and ch.chance(50)):
            writes.append((qp_reg(q, "PMTU"), register))
        pmtu[q] = pmtu_bytes(register)
    # UDP mode (CUDA-Q realtime's udp bridge) on some PPUs' own QPs, with their peer's port;
    # now and then a TRANSPORT write to an extra QP (ignored)
    transports = [0] * num_qps
    peer_udp_ports = [0] * num_qps
    transport_writes: list[tuple[int, int]] = []
    for q in range(num_qps):
        if q < num_ppus and ch.chance(40):
            transports[q] = 1
            transport_writes.append((q, 1))
        if q < num_ppus and (transports[q] or ch.chance(20)):
            peer_udp_ports[q] = ch.choice([rng.getrandbits(16), 0, UDP_CALL_PORT_BASE + q])
            writes.append((qp_reg(q, "PEER_UDP_PORT"), peer_udp_ports[q]))
        if q >= num_ppus and ch.chance(8):
            transport_writes.append((q, 1))
    rx_enable = not (vary and ch.chance(15))
    if rx_enable:
        writes.append((global_reg("RX_ENABLE"), 1))
    config = RxConfig(params=params, qsc_mac=qsc_mac, qsc_ip=qsc_ip, host_mac=host_mac,
                      host_ip=host_ip, p_key=p_key, rx_enable=rx_enable, rkeys=rkeys,
                      peers=peers, qsc_qpns=qsc_qpns, response_bytes=response_bytes, pmtu=pmtu,
                      peer_udp_ports=peer_udp_ports,
                      buffer_bytes=4096 if small_buffer else 16384)
    for q, value in ppu_writes:
        writes.append((qp_reg(q, "PPU"), value))
        config.write_ppu(q, value)
    for q, value in transport_writes:
        writes.append((qp_reg(q, "TRANSPORT"), value))
        config.write_transport(q, value)
    return Setup(config, writes)


# ---- frames ----------------------------------------------------------------------------------

@dataclass
class Frame:
    """A frame to drive: its bytes, the MAC's error flag, whether it is a valid probe, and how
    it was made (for failure messages)."""

    data: bytes
    mac_error: bool = False
    probe: bool = False
    label: str = ""
    #: Configuration changes made before the frame, once every earlier frame is decided:
    #: ``("restart", qp)`` (a write of HOST_QPN), ``("rkey", qp, register, key)``,
    #: ``("ppu", qp, value)``, ``("peer", qp, mac, ip)``, ``("transport", qp, value)``,
    #: ``("p_key", value)``, ``("rx_enable", bit)``.
    before: tuple[tuple, ...] = ()


#: Header fields the mutations set: name -> (byte offset in the frame, bytes), and the frame
#: kinds they apply to.
_COMMON = {
    "eth.dst": (0, 6), "eth.src": (6, 6), "eth.type": (12, 2),
}
_IP = {
    "ip.ver_ihl": (14, 1), "ip.tos": (15, 1), "ip.total_length": (16, 2), "ip.id": (18, 2),
    "ip.flags_frag": (20, 2), "ip.ttl": (22, 1), "ip.protocol": (23, 1), "ip.checksum": (24, 2),
    "ip.src": (26, 4), "ip.dst": (30, 4),
}
_UDP_F = {
    "udp.src_port": (34, 2), "udp.dst_port": (36, 2), "udp.length": (38, 2),
    "udp.checksum": (40, 2),
}
_BTH_F = {
    "bth.opcode": (42, 1), "bth.flags": (43, 1), "bth.p_key": (44, 2), "bth.fecn": (46, 1),
    "bth.dest_qp": (47, 3), "bth.a": (50, 1), "bth.psn": (51, 3),
}
_RETH_F = {"reth.va": (54, 8), "reth.r_key": (62, 4), "reth.dma_len": (66, 4)}
_IMM_F = {"immdt": (70, 4)}
_IMM_NORETH_F = {"immdt": (54, 4)}          # the ImmDt of a packet without a RETH
_CTL_F = {"ctl.cmd": (42, 1), "ctl.flags": (43, 1), "ctl.seq": (44, 2), "ctl.addr": (48, 4),
          "ctl.data": (52, 4)}
_ARP_F = {"arp.htype": (14, 2), "arp.ptype": (16, 2), "arp.hlen": (18, 1), "arp.plen": (19, 1),
          "arp.oper": (20, 2), "arp.spa": (28, 4), "arp.tpa": (38, 4)}
_ICMP_F = {"icmp.type": (34, 1), "icmp.code": (35, 1), "icmp.checksum": (36, 2)}
#: The field groups each kind's mutations pick from, a group listed once per weight: the deeper
#: headers more often, so that the later checks are reached.
FIELDS = {
    "write": [_COMMON, _IP, _UDP_F, _BTH_F, _BTH_F, _BTH_F, _RETH_F, _RETH_F, _RETH_F],
    "write_imm": [_COMMON, _IP, _UDP_F, _BTH_F, _BTH_F, _RETH_F, _RETH_F, _IMM_F, _IMM_F],
    "send": [_COMMON, _IP, _UDP_F, _UDP_F, _BTH_F, _BTH_F, _BTH_F],
    # a packet with neither RETH nor ImmDt (a MIDDLE, a LAST), one with an ImmDt only
    "cont": [_COMMON, _IP, _UDP_F, _BTH_F, _BTH_F, _BTH_F, _BTH_F],
    "cont_imm": [_COMMON, _UDP_F, _BTH_F, _BTH_F, _BTH_F, _IMM_NORETH_F, _IMM_NORETH_F],
    "control": [_COMMON, _IP, _UDP_F, _UDP_F, _CTL_F, _CTL_F],
    "arp": [_COMMON, _ARP_F, _ARP_F, _ARP_F],
    "icmp": [_COMMON, _IP, _ICMP_F, _ICMP_F],
    # a UDP-mode response (CUDA-Q realtime's udp bridge): its ports and length above all
    "udp": [_COMMON, _IP, _UDP_F, _UDP_F, _UDP_F],
}
KINDS = ("write", "write", "write_imm", "write_imm", "send", "control", "arp", "icmp", "udp")
#: The kinds (frame layouts) of RoCEv2 packets.
ROCE_KINDS = ("write", "write_imm", "send", "cont", "cont_imm")
_PSN_MASK = (1 << 24) - 1


def _get(frame: bytes | bytearray, at: int, n: int) -> int:
    return int.from_bytes(frame[at:at + n], "big") if at + n <= len(frame) else 0


def _put(frame: bytearray, at: int, n: int, value: int) -> None:
    if at + n <= len(frame):
        frame[at:at + n] = (value % (1 << (8 * n))).to_bytes(n, "big")


def fix_udp_checksum(frame: bytearray, *, zero: bool = False) -> None:
    """Set the UDP checksum of ``frame`` (RFC 768: 0xFFFF for a sum of zero), or zero it."""
    ip_end = 14 + _get(frame, 16, 2)
    if ip_end > len(frame) or ip_end < 42:
        return
    _put(frame, 40, 2, 0)
    if zero:
        return
    datagram = bytes(frame[34:ip_end])
    pseudo = bytes(frame[26:34]) + struct.pack(">BBH", 0, IpProtocol.UDP, len(datagram))
    csum = ipv4_checksum(pseudo + datagram)
    _put(frame, 40, 2, csum or 0xFFFF)


def fix_icmp_checksum(frame: bytearray) -> None:
    ip_end = 14 + _get(frame, 16, 2)
    if ip_end > len(frame) or ip_end < 38:
        return
    _put(frame, 36, 2, 0)
    _put(frame, 36, 2, ipv4_checksum(bytes(frame[34:ip_end])))


def fix_icrc(frame: bytearray) -> None:
    ip_end = 14 + _get(frame, 16, 2)
    if ip_end > len(frame) or ip_end < 14 + 20 + 8 + 12 + 4:
        return
    frame[ip_end - 4:ip_end] = icrc(bytes(frame[14:ip_end - 4]))


def fix_ip_checksum(frame: bytearray) -> None:
    if len(frame) < 34:
        return
    _put(frame, 24, 2, 0)
    _put(frame, 24, 2, ipv4_checksum(bytes(frame[14:34])))


def apply_action(model: RxModel, action: tuple) -> None:
    """What a configuration change does to the receive rules (a restart: the QP's expected PSN
    is 0 and its keys are not valid; a key written is valid; a PPU register write moves an
    extra QP to a PPU the build has, else nothing; a peer written is the QP's peer)."""
    if action[0] == "restart":
        model.restart_qp(action[1])
    elif action[0] == "rkey":
        _, qp, register, key = action
        model.config.rkeys[qp][register] = (key, True)
    elif action[0] == "ppu":
        model.config.write_ppu(action[1], action[2])
    elif action[0] == "peer":
        _, qp, mac, ip = action
        model.config.peers[qp] = (mac, ip)
    elif action[0] == "p_key":
        model.config.p_key = action[1]
    elif action[0] == "transport":
        model.config.write_transport(action[1], action[2])
    else:
        model.config.rx_enable = bool(action[1])


def action_writes(action: tuple) -> list[tuple[int, int]]:
    """The register writes of a configuration change."""
    if action[0] == "restart":
        return [(qp_reg(action[1], "HOST_QPN"), 0x11 + action[1])]
    if action[0] == "rkey":
        _, qp, register, key = action
        return [(qp_reg(qp, register), key)]
    if action[0] == "ppu":
        return [(qp_reg(action[1], "PPU"), action[2])]
    if action[0] == "peer":
        _, qp, mac, ip = action
        return [(qp_reg(qp, "PEER_MAC_HI"), mac >> 32),
                (qp_reg(qp, "PEER_MAC_LO"), mac & 0xFFFF_FFFF), (qp_reg(qp, "PEER_IP"), ip)]
    if action[0] == "transport":
        return [(qp_reg(action[1], "TRANSPORT"), action[2])]
    return [(global_reg("P_KEY" if action[0] == "p_key" else "RX_ENABLE"), action[1])]


class FrameGen:
    """Valid frames for a configuration, and their mutations."""

    def __init__(self, config: RxConfig, ch: Chooser, rng: random.Random):
        self.m = RxModel(config)             # its configuration, changed by the actions
        self.c = self.m.config
        self.p = config.params
        self.ch = ch
        self.rng = rng
        self.next_psn = [0] * self.p.num_qps
        self.probing = False

    # -- valid frames --------------------------------------------------------------------------

    def _source(self, qp: int) -> tuple[int, int]:
        """The source (MAC, IP) of a packet to QP ``qp``: its peer; now and then (not in a
        probe) another QP's peer or a stranger (DROP_PEER)."""
        peer = self.c.peers[qp]
        if self.probing or not self.ch.chance(8):
            return peer
        others = sorted({p for p in self.c.peers if p != peer})
        stranger = (0x02_00_00_00_00_00 | self.rng.getrandbits(40), self.rng.getrandbits(32))
        half = self.ch.choice([(peer[0], stranger[1]), (stranger[0], peer[1])])
        return self.ch.choice(others + [stranger, half])

    def _eth(self, src: int) -> dict:
        dst = self.c.qsc_mac if not self.ch.chance(10) else (1 << 48) - 1
        return {"dst": dst, "src": src}

    def _ip(self, src: int) -> dict:
        ip = {"src": src, "dst": self.c.qsc_ip}
        if self.ch.chance(30):
            ip.update(tos=self.rng.getrandbits(8), ttl=self.rng.getrandbits(8),
                      identification=self.rng.getrandbits(16),
                      flags=self.rng.choice([0, 0b010, 0b100]))
        return ip

    def _payload(self, limit: int) -> bytes:
        n = self.ch.choice([0, 1, 3, 4, 7, 8, 13, 16, 32, 64, "small", "small", "medium",
                            "large"])
        if n == "small":
            n = self.rng.randint(0, 64)
        elif n == "medium":
            n = self.rng.randint(65, 300)
        elif n == "large":
            # now and then longer than the whole receive buffer (4 KiB): dropped for overflow
            jumbo = not self.probing and self.ch.chance(10)
            n = self.rng.randint(4200, 6000) if jumbo else self.rng.randint(301, 1400)
        return self.rng.randbytes(min(n, limit))

    def _psn(self, qp: int) -> int:
        how = self.ch.choice(["next", "next", "random", "zero", "wrap"])
        psn = {"next": self.next_psn[qp], "zero": 0, "random": self.rng.getrandbits(24),
               "wrap": (1 << 24) - self.rng.randint(1, 3)}[how]      # a message across 0
        self.next_psn[qp] = (psn + 1) & 0xFFFFFF
        return psn

    def _owners(self) -> list[int]:
        """The QPs that own their QPN (one shared with a lower QP is that QP's)."""
        c = self.c
        return [q for q in range(self.p.num_qps) if c.qsc_qpns.index(c.qsc_qpns[q]) == q]

    def _qp(self) -> int:
        """A QP that owns its QPN."""
        return self.rng.choice(self._owners())

    def _common(self, qp: int, psn: int) -> dict:
        """The fields of a packet of QP ``qp`` at ``psn`` that its peer sends (now and then
        someone else: :meth:`_source`)."""
        mac, ip = self._source(qp)
        return dict(dest_qp=self.c.qsc_qpns[qp], psn=psn, eth=self._eth(mac), ip=self._ip(ip),
                    bth=self._bth())

    def _key(self, qp: int, register: str) -> int:
        """The R_Key a packet of QP ``qp`` carries for the region of ``register``: the QP's
        own; now and then (not in a probe) another QP's for the same region."""
        if not self.probing and self.ch.chance(6):
            return self.c.rkeys[self.rng.randrange(self.p.num_qps)][register][0]
        return self.c.rkeys[qp][register][0]

    def _message_qp(self, kind: str, avoid: int | None = None) -> int | None:
        """A QP that owns its QPN for a message of ``kind`` (a SEND's: one whose
        RESPONSE_BYTES leaves room for a message, where one does), not ``avoid`` (``None``
        where there is no other)."""
        c = self.c
        owners = [q for q in self._owners() if q != avoid]
        if not owners:
            return None
        roomy = [q for q in owners if c.response_bytes[q] > c.pmtu[q]]
        return self.rng.choice(roomy if kind == "send" and roomy else owners)

    def message(self, kind: str, qp: int | None = None) -> list[tuple[bytearray, str, str]]:
        """The packets of one UC message of ``kind`` (``"write"`` or ``"send"``) of several
        packets to QP ``qp`` (default: :meth:`_message_qp`) that the configuration takes:
        FIRST (PMTU bytes; a WRITE's with its RETH and the whole DMALen, into a region of the
        PPU the QP reaches that its map opens), MIDDLEs (PMTU bytes), LAST or
        LAST_WITH_IMMEDIATE (the rest), at consecutive PSNs. Each packet comes as (frame, its
        layout for :meth:`mutate`, label). Where the configuration takes no such message (no
        region open to the QP, or a RESPONSE_BYTES of no more than the PMTU) the message is one
        valid ONLY."""
        c, p, ch, rng = self.c, self.p, self.ch, self.rng
        if qp is None:
            qp = self._message_qp(kind)
        assert qp is not None
        ppu = c.qp_ppus[qp]
        pmtu = c.pmtu[qp]
        packets = ch.choice([2, 2, 3, 3, 4])
        with_imm = ch.chance(40)
        imm = None
        if kind == "write":
            # a region of the QP's whose key is valid, as a host writes (a closed one now
            # and then: DROP_RKEY, then PSN drops)
            keyed = [r for r in regions(p, ppu)
                     if c.rkeys[qp][r.rkey_register][1] or (not self.probing and ch.chance(5))]
            fits = [r for r in keyed if r.length_bytes > pmtu]
            if not fits:
                return [(self.valid("write"), "write", "write (no room for a message)")]
            region = ch.choice(fits)
            most = min(packets * pmtu, region.length_bytes)
            length = most if ch.chance(25) else rng.randint(pmtu + 1, most)
            offset = 4 * rng.randint(0, (region.length_bytes - length) // 4)
            va, r_key = region.va + offset, self._key(qp, region.rkey_register)
            if with_imm:
                imm = (rng.randrange(p.imem_depth)
                       if region.name == "IMEM" and not ch.chance(10) else rng.getrandbits(32))
        else:
            limit = c.response_bytes[qp]
            if limit <= pmtu:
                return [(self.valid("send"), "send", "send (no room for a message)")]
            most = min(packets * pmtu, limit)
            length = most if ch.chance(25) else rng.randint(pmtu + 1, most)
            if with_imm:
                imm = rng.getrandbits(32)
        data = rng.randbytes(length)
        chunks = [data[i:i + pmtu] for i in range(0, length, pmtu)]
        # now and then one packet 4 bytes short or long (DROP_LENGTH, the message closed)
        wrong = rng.randrange(len(chunks)) if not self.probing and ch.chance(8) else None
        psn = self._psn(qp)
        out = []
        for k, chunk in enumerate(chunks):
            twist = ""
            if k == wrong:
                chunk = chunk[:-4] if ch.chance(50) else chunk + rng.randbytes(4)
                twist = f", {len(chunk)} B"
            if k:
                psn = self.next_psn[qp]
                self.next_psn[qp] = (psn + 1) & _PSN_MASK
            ext: dict = {}
            if k == 0:
                op = Opcode.SEND_FIRST if kind == "send" else Opcode.RDMA_WRITE_FIRST
                if kind == "write":
                    ext = dict(va=va, r_key=r_key, dma_len=length)
            elif k < len(chunks) - 1:
                op = Opcode.SEND_MIDDLE if kind == "send" else Opcode.RDMA_WRITE_MIDDLE
            elif imm is None:
                op = Opcode.SEND_LAST if kind == "send" else Opcode.RDMA_WRITE_LAST
            else:
                op = (Opcode.SEND_LAST_WITH_IMMEDIATE if kind == "send"
                      else Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE)
                ext = dict(imm=imm)
            layout = "write" if "va" in ext else "cont_imm" if "imm" in ext else "cont"
            frame = roce_frame(op, payload=chunk, **ext, **self._common(qp, psn))
            out.append((self._finish(frame), layout,
                        f"{op.name} qp {qp} (ppu {ppu}) psn {psn:#x} of {length} B{twist}"))
        return out

    def _bth(self) -> dict:
        bth = {}
        if self.c.p_key & 0x8000:       # we are a full member: the peer may be either
            bth["p_key"] = (self.c.p_key & 0x7FFF) | (0x8000 if self.ch.chance(80) else 0)
        else:
            bth["p_key"] = self.c.p_key | 0x8000
        if self.ch.chance(30):
            bth.update(se=self.rng.getrandbits(1), m=self.rng.getrandbits(1),
                       fecn=self.rng.getrandbits(1), becn=self.rng.getrandbits(1),
                       a=self.rng.getrandbits(1))
        return bth

    def _finish(self, frame: bytes, *, udp: bool = True) -> bytearray:
        out = bytearray(frame)
        if udp and self.ch.chance(30):
            fix_udp_checksum(out)
        if self.ch.chance(15):
            out += bytes(self.rng.randint(1, 12))            # Ethernet padding
        elif len(out) == 60 and self.ch.chance(15):
            # not padded to 60 bytes (the MAC passes what it got)
            arp = out[12:14] == b"\x08\x06"
            out = out[:14 + 28] if arp else out[:14 + _get(out, 16, 2)]
        return out

    def valid(self, kind: str) -> bytearray:
        """A frame of ``kind`` that the configuration takes (when RX_ENABLE and the keys let a
        RoCEv2 packet through; else the closest to it)."""
        c, p, ch, rng = self.c, self.p, self.ch, self.rng
        if kind in ("write", "write_imm", "send"):
            qp = self._qp()
            ppu = c.qp_ppus[qp]
            common = self._common(qp, self._psn(qp))
            pmtu = c.pmtu[qp]
            # the regions of the PPU the QP reaches, open to it (its map) or not
            writable = [r for r in regions(p, ppu) if c.rkeys[qp][r.rkey_register][1]]
            closed = [r for r in regions(p, ppu) if not c.rkeys[qp][r.rkey_register][1]]
            if kind != "send" and closed and not self.probing and ch.chance(30):
                # a region whose key is not valid (never written, or the QP restarted), with
                # the key its register holds: closed, DROP_RKEY
                writable = closed
            if kind == "send" or not writable:
                # an ONLY fits the PMTU (now and then, not in a probe, it is longer: dropped)
                limit = c.response_bytes[qp]            # a longer SEND is dropped
                if self.probing or not ch.chance(10):
                    limit = min(limit, pmtu)
                if limit > MAILBOX_BYTES and ch.chance(50):
                    # longer than the mailbox, as CUDA-Q's GPU bridge sends: its first bytes kept
                    payload = rng.randbytes(rng.randint(MAILBOX_BYTES + 1, min(limit, 1400)))
                else:
                    payload = self._payload(limit)
                if ch.chance(25):
                    return self._finish(roce_frame(Opcode.SEND_ONLY_WITH_IMMEDIATE,
                                                   imm=rng.getrandbits(32), payload=payload,
                                                   **common))
                return self._finish(roce_frame(Opcode.SEND_ONLY, payload=payload, **common))
            region = ch.choice(writable)
            limit = region.length_bytes
            if self.probing or not ch.chance(10):
                limit = min(limit, pmtu)
            payload = self._payload(limit)
            # the VA inside the region, a zero-length write's too
            offset = 4 * rng.randint(0, (region.length_bytes - max(1, len(payload))) // 4)
            va, r_key = region.va + offset, self._key(qp, region.rkey_register)
            if not payload and ch.chance(40):
                # IBTA C9-88: a zero-length WRITE's VA and R_Key are not checked
                va = ch.choice([rng.getrandbits(64), 0, va + 1, ppu_base(ppu) + MAILBOX_OFFSET])
                r_key = rng.getrandbits(32)
            imm = None
            if kind == "write_imm":
                imm = (rng.randrange(p.imem_depth) if region.name == "IMEM" and not (
                    not payload and ch.chance(30)) else rng.getrandbits(32))
            op = (Opcode.RDMA_WRITE_ONLY if imm is None
                  else Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE)
            return self._finish(roce_frame(op, va=va, r_key=r_key, imm=imm, payload=payload,
                                           **common))
        if kind == "control":
            cmd = ch.choice([Command.WR_DWORD, Command.RD_DWORD, Command.RD_DWORD,
                             Command.WR_BLOCK, Command.RD_BLOCK])
            req = CONTROL_REQUEST.pack(cmd=cmd, flags=rng.getrandbits(8),
                                       seq=rng.getrandbits(16), addr=rng.getrandbits(32),
                                       data=rng.getrandbits(32))
            if cmd == Command.RD_DWORD and ch.chance(40):
                req = req[:10]                               # the bridge host's form
            elif cmd in (Command.WR_BLOCK, Command.RD_BLOCK) and ch.chance(60):
                # more pairs: a few, or the largest block (a longer one is a mutation's work:
                # this frame may be a probe, which must be taken)
                pairs = ch.choice([rng.randint(2, 12), BLOCK_MAX_PAIRS])
                req += rng.randbytes(8 * (pairs - 1))
            elif ch.chance(10):
                req += rng.randbytes(rng.randint(1, 9))
            eth = {"dst": c.qsc_mac, "src": rng.getrandbits(48) & ~(1 << 40)}
            ip = {"src": rng.getrandbits(32), "dst": c.qsc_ip}
            return self._finish(pad60(ETHERNET.pack(**eth, ethertype=EtherType.IPV4) +
                                      ip_udp(req, dst_port=CONTROL_PORT,
                                             src_port=rng.getrandbits(16), ip=ip)))
        if kind == "arp":
            dst = (1 << 48) - 1 if ch.chance(70) else c.qsc_mac
            src = rng.getrandbits(48) & ~(1 << 40)
            arp = ARP.pack(oper=1, sha=src, spa=rng.getrandbits(32), tha=0, tpa=c.qsc_ip)
            return self._finish(pad60(ETHERNET.pack(dst=dst, src=src,
                                                    ethertype=EtherType.ARP) + arp), udp=False)
        if kind == "udp":
            return self._udp_response()
        assert kind == "icmp"
        # up to the longest echo request taken (a 1514-byte frame) and one byte more
        body = rng.randbytes(ch.choice([0, 1, 7, 56, rng.randint(0, 200), 1472, 1473]))
        echo = ICMP_ECHO.pack(type=8, code=0, checksum=0, identifier=rng.getrandbits(16),
                              sequence=rng.getrandbits(16))
        message = bytearray(echo + body)
        message[2:4] = ipv4_checksum(bytes(message)).to_bytes(2, "big")
        ip_fields = dict(total_length=20 + len(message), identification=rng.getrandbits(16),
                         ttl=64, protocol=IpProtocol.ICMP, src=rng.getrandbits(32),
                         dst=c.qsc_ip)
        hdr = IPV4.pack(**ip_fields, checksum=ipv4_checksum(IPV4.pack(**ip_fields)))
        eth = ETHERNET.pack(dst=c.qsc_mac, src=rng.getrandbits(48) & ~(1 << 40),
                            ethertype=EtherType.IPV4)
        return self._finish(pad60(eth + hdr + bytes(message)), udp=False)

    def _udp_response(self) -> bytearray:
        """A UDP-mode response as CUDA-Q realtime's udp bridge sends it: to the port of a PPU's
        own QP in UDP mode (any PPU's QP where none is), from the QP's peer and PEER_UDP_PORT
        (now and then, not in a probe, another source or port), 24 to RESPONSE_BYTES bytes
        (a whole slot, zero-padded, or less; now and then, not in a probe, too short or
        long), the UDP checksum computed as Linux does, or 0."""
        c, p, ch, rng = self.c, self.p, self.ch, self.rng
        udp_qps = [q for q in range(p.num_ppus) if c.transports[q]
                   and (c.response_bytes[q] >= 24 or not self.probing)]
        qp = rng.choice(udp_qps or list(range(p.num_ppus)))
        mac, ip = self._source(qp)
        src_port = c.peer_udp_ports[qp]
        if not self.probing and ch.chance(8):
            src_port = ch.choice([src_port ^ 1, rng.getrandbits(16)])
        limit = max(24, c.response_bytes[qp])
        n = ch.choice([24, 64, 65, 256, limit, "some", "some"])
        n = rng.randint(24, min(limit, 1400)) if n == "some" else min(n, limit)
        if self.probing:
            n = min(n, 1400)                     # within any receive buffer
        if not self.probing and ch.chance(10):
            n = ch.choice([rng.randint(0, 23), limit + 1, limit + rng.randint(1, 64)])
        body = bytearray(rng.randbytes(min(n, 40)) + bytes(max(0, n - 40)))
        frame = bytearray(pad60(ETHERNET.pack(**self._eth(mac), ethertype=EtherType.IPV4) +
                                ip_udp(bytes(body), dst_port=UDP_CALL_PORT_BASE + qp,
                                       src_port=src_port, ip=self._ip(ip))))
        if ch.chance(70):
            fix_udp_checksum(frame)
        return self._finish(frame, udp=False)

    def probe(self) -> Frame:
        """A valid frame that must be taken whatever came before: a RoCEv2 packet (or a
        control request while RX_ENABLE is off)."""
        kind = (self.ch.choice(["write", "write_imm", "send"] * 2 + ["first"])
                if self.c.rx_enable else "control")
        if any(t and self.c.response_bytes[q] >= 24 for q, t in enumerate(self.c.transports)
               if q < self.p.num_ppus) and self.ch.chance(20):
            kind = "udp"
        buffer = self.c.buffer_bytes
        if kind == "first" and buffer is not None and max(self.c.pmtu) + 128 > buffer:
            kind = "write"                       # a FIRST would not fit the buffer
        saved = self.ch
        self.ch = RandomChooser(self.rng)        # probes need no shrinking
        self.probing = True
        try:
            if kind == "first":
                # a message's FIRST (whatever message it abandons); its rest never comes
                frame, _, label = self.message(self.ch.choice(["write", "send"]))[0]
                kind = f"first: {label}"
            else:
                frame = self.valid(kind)
        finally:
            self.ch = saved
            self.probing = False
        return Frame(bytes(frame), probe=True, label=f"probe {kind}")

    # -- mutations -----------------------------------------------------------------------------

    def _special(self, name: str, cur: int, frame: bytearray) -> list[int]:
        """Edge values worth trying for field ``name`` (currently ``cur``)."""
        c, p = self.c, self.p
        tl = _get(frame, 16, 2)
        if name == "eth.dst":
            return [(1 << 48) - 1, c.qsc_mac, c.qsc_mac ^ 1, 0x01_00_5E_00_00_01]
        if name == "eth.src":
            return [mac for mac, _ in c.peers] + [c.host_mac ^ 0x10, c.qsc_mac]
        if name == "eth.type":
            return [0x0800, 0x0806, 0x86DD, 0x8100, 0x0801]
        if name == "ip.ver_ihl":
            return [0x45, 0x46, 0x44, 0x65, 0x4F, 0x55]
        if name == "ip.total_length":
            n = len(frame) - 14
            return [cur - 1, cur + 1, cur - 4, cur + 4, 19, 20, 27, 28, 44, n, n + 1, n - 4]
        if name == "ip.flags_frag":
            return [0x0000, 0x4000, 0x2000, 0x0001, 0x8000, 0x6000, 0x1FFF, 0x4001]
        if name == "ip.protocol":
            return [1, 17, 6, 0]
        if name == "ip.src":
            return [ip for _, ip in c.peers] + [c.host_ip + 1, c.qsc_ip]
        if name in ("ip.dst", "arp.tpa"):
            return [c.qsc_ip, c.qsc_ip + 1, c.qsc_ip ^ 0x8000_0000, 0xFFFF_FFFF]
        if name == "udp.dst_port":
            return [ROCEV2_PORT, CONTROL_PORT, ROCEV2_PORT + 1, CONTROL_PORT - 1, 0,
                    *(UDP_CALL_PORT_BASE + q for q in range(p.num_ppus + 1)),
                    UDP_CALL_PORT_BASE - 1]
        if name == "udp.src_port":
            return [*c.peer_udp_ports, cur ^ 1, 0]
        if name == "udp.length":
            return [cur - 1, cur + 1, cur - 4, cur + 4, 0, 8, 17, 18, 21, 22, 23, 24, 28,
                    tl - 20]
        if name in ("udp.checksum", "icmp.checksum", "ip.checksum"):
            return [0, 0xFFFF, cur ^ 1, cur ^ 0x8000]
        if name == "bth.opcode":
            return [0x24, 0x2A, 0x2B, 0x20, 0x21, 0x22, 0x23, 0x25, 0x26, 0x27, 0x28, 0x29,
                    0x0A, 0x04, 0x64, 0x6A, 0xFF, 0x2C]
        if name == "bth.flags":
            return [cur ^ 0x01, cur ^ 0x08, cur ^ 0x10, cur ^ 0x20, cur ^ 0x30, cur & 0xF0,
                    cur ^ 0x80, cur ^ 0x40]
        if name == "bth.p_key":
            k = c.p_key
            return [k, k ^ 0x8000, k & 0x7FFF, k | 0x8000, k ^ 1, 0xFFFF, 0x7FFF, 0, 0x8000]
        if name == "bth.dest_qp":
            near = {q + k for q in c.qsc_qpns for k in (-1, 0, 1)}
            near |= {p.qpn_base + k for k in range(-1, p.num_qps + 1)} | {0, 2, 0xFFFFFF}
            return sorted(q for q in near if 0 <= q < 1 << 24)
        if name == "bth.psn":
            return [0, 0xFFFFFF, cur + 1, cur - 1]
        if name == "reth.va":
            out = [cur | 1 << 32, cur + 1, cur + 2, cur - 4, cur + 4, 0, 0xFFFF_FFFF_FFFF_FFFC]
            for n in range(p.num_ppus + 1):
                for r in regions(p, n):
                    end = r.va + r.length_bytes
                    out += [r.va, r.va + 4, end - 4, end, r.va - 4, end + 4,
                            end - _get(frame, 66, 4)]
                out += [ppu_base(n) + MAILBOX_OFFSET, ppu_base(n) - 4]
            return out
        if name == "reth.r_key":
            keys = [k for ppu in c.rkeys for k, _ in ppu.values()]
            return keys + [0, cur ^ 1, 0xFFFF_FFFF]
        if name == "reth.dma_len":
            return [cur + 1, cur - 1, cur + 4, cur - 4, 0, 0xFFFF_FFFF, 0x8000_0000,
                    p.imem_depth * 16, p.env_depth * 2, 0x18, 0x1C, 0xFFFF_FFFC]
        if name == "immdt":
            d = p.imem_depth
            return [d - 1, d, d + 1, 0, 1 << 31, 0xFFFF_FFFF, 2 * d - 1]
        if name == "ctl.cmd":
            return [0x04, 0x09, 0x14, 0x19, 0x00, 0xFF, 0x84, 0x94]
        if name == "arp.oper":
            return [1, 2, 3, 0, 0x0101]
        if name == "arp.htype":
            return [1, 6, 0x0101]
        if name == "arp.ptype":
            return [0x0800, 0x86DD, 0x0806]
        if name in ("arp.hlen", "arp.plen"):
            return [6, 4, 5, 0]
        if name == "icmp.type":
            return [8, 0, 13, 0x88]
        if name == "icmp.code":
            return [0, 1, 0xFF]
        return [0, cur + 1]

    def mutate(self, kind: str, frame: bytearray) -> tuple[bytearray, bool, list[str]]:
        """One to three mutations of ``frame``, then the repairs chosen; returns the frame,
        the MAC's error flag and the labels."""
        ch, rng = self.ch, self.rng
        labels: list[str] = []
        mac_error = False
        resized = False
        ip_fixed = False
        for _ in range(ch.choice([1, 1, 1, 2, 3])):
            how = ch.choice(["field"] * 10 + ["flip"] * 4 + ["truncate"] * 2 + ["extend"] * 2
                            + ["mac_error", "ip_zero_forms"])
            if how == "field":
                group = ch.choice(FIELDS[kind])
                name = ch.choice(sorted(group))
                at, n = group[name]
                cur = _get(frame, at, n)
                pick = ch.choice(["special", "special", "special", "zero", "ones", "bit",
                                  "random"])
                if pick == "special":
                    value = ch.choice(self._special(name, cur, frame))
                elif pick == "zero":
                    value = 0
                elif pick == "ones":
                    value = (1 << 8 * n) - 1
                elif pick == "bit":
                    value = cur ^ (1 << rng.randrange(8 * n))
                else:
                    value = rng.getrandbits(8 * n)
                _put(frame, at, n, value)
                labels.append(f"{name}={value % (1 << 8 * n):#x}")
            elif how == "flip":
                limit = len(frame) if ch.chance(30) else min(len(frame), 80)
                bit = rng.randrange(8 * limit)
                frame[bit // 8] ^= 1 << (bit % 8)
                labels.append(f"flip bit {bit}")
            elif how == "truncate" and len(frame) > 1:
                cut = ch.choice([rng.randint(1, len(frame) - 1), 13, 14, 33, 34, 41, 42, 54,
                                 len(frame) - 1, len(frame) - 4])
                frame = frame[:max(1, min(cut, len(frame) - 1))]
                labels.append(f"truncate to {len(frame)}")
                resized = True
            elif how == "extend":
                more = ch.choice([1, 4, 8, rng.randint(1, 64)])
                frame += rng.randbytes(more) if ch.chance(50) else bytes(more)
                labels.append(f"extend by {more}")
                resized = True
            elif how == "ip_zero_forms" and kind != "arp" and len(frame) >= 34:
                # RFC 1624: a header whose other words sum to 0xFFFF may carry 0x0000 or 0xFFFF
                _put(frame, 24, 2, 0)
                rest = ipv4_checksum(bytes(frame[14:34])) ^ 0xFFFF     # their folded sum
                ident = _get(frame, 18, 2)
                _put(frame, 18, 2, (ident + 0xFFFF - rest) % 0xFFFF)
                checksum = ch.choice([0x0000, 0xFFFF])
                _put(frame, 24, 2, checksum)
                labels.append(f"ip zero form {checksum:#x}")
                ip_fixed = True
            else:
                mac_error = True
                labels.append("mac error")
        # repairs, so that the checks after the broken one are reached
        if resized and ch.chance(40) and len(frame) >= 42:
            tl = max(0, len(frame) - 14 - ch.choice([0, 0, 1, 2, 4]))
            _put(frame, 16, 2, tl)
            if kind != "icmp" and kind != "arp":
                _put(frame, 38, 2, tl - 20)
            labels.append("relength")
        if kind in ROCE_KINDS and ch.chance(85):
            fix_icrc(frame)
            labels.append("icrc")
        if kind in ROCE_KINDS + ("control", "udp"):
            udp = ch.choice(["keep", "keep", "zero", "sum"])
            if udp != "keep":
                fix_udp_checksum(frame, zero=udp == "zero")
                labels.append(f"udp {udp}")
        if kind == "icmp" and ch.chance(85):
            fix_icmp_checksum(frame)
            labels.append("icmp sum")
        if kind != "arp" and not ip_fixed and ch.chance(85):
            fix_ip_checksum(frame)
            labels.append("ip sum")
        return frame, mac_error, labels

    def actions(self) -> tuple[tuple, ...]:
        """A configuration change between frames (and the same change to the generator's own
        view of the configuration): a QP restarted (its HOST_QPN written), rekeyed or both, an
        extra QP moved to another PPU as a host sets it up again (restart, PPU, a new map), a
        QP's peer changed, the P_Key, RX_ENABLE."""
        ch, rng, p = self.ch, self.rng, self.p
        qp = rng.randrange(p.num_qps)
        what = ch.choice(["restart", "restart_rekey", "rkey", "move", "peer", "p_key",
                          "rx_enable", "transport"])
        out: list[tuple] = []
        if what in ("restart", "restart_rekey", "move"):
            out.append(("restart", qp))
            self.next_psn[qp] = 0
        if what == "move":
            out.append(("ppu", qp, ch.choice([rng.randrange(p.num_ppus)] * 3 + [p.num_ppus])))
        if what in ("restart_rekey", "rkey", "move"):
            for region in regions(p, 0):
                if what == "restart_rekey" or ch.chance(50):
                    out.append(("rkey", qp, region.rkey_register, rng.getrandbits(32)))
        if what == "peer":
            out.append(("peer", qp, *ch.choice(self.c.peers)))
        if what == "p_key":
            out.append(("p_key", ch.choice([0xFFFF, 0x7FFF, 0x8005, rng.getrandbits(16)])))
        if what == "rx_enable":
            out.append(("rx_enable", int(not self.c.rx_enable)))
        if what == "transport":
            # a QP switched between RoCE and UDP mode (an extra QP's write is ignored)
            out.append(("transport", qp, int(not self.c.transports[qp])))
        for action in out:
            apply_action(self.m, action)
        return tuple(out)

    def messages(self, before: tuple[tuple, ...]) -> list[Frame]:
        """A UC message of several packets (:meth:`message`), disturbed as a lossy, reordering
        or hostile path would: cut short, a packet lost, duplicated or swapped with the next,
        packets mutated (opcodes out of sequence among them), other frames (any kind, mutated
        or not, for this QP or another) and configuration changes between its packets; now and
        then interleaved with a message of another QP (each QP keeps its own)."""
        ch, rng = self.ch, self.rng
        kind = ch.choice(["write", "write", "send"])
        qp = self._message_qp(kind)
        packets = self.message(kind, qp)
        order = list(range(len(packets)))
        how: list[str] = []
        if len(order) > 1 and ch.chance(15):
            order = order[:rng.randint(1, len(order) - 1)]
            how.append("cut")
        if len(order) > 1 and ch.chance(10):
            order.pop(rng.randrange(1, len(order)))
            how.append("lost")
        if ch.chance(10):
            k = rng.randrange(len(order))
            order.insert(k + rng.randint(1, 2), order[k])
            how.append("dup")
        if len(order) > 1 and ch.chance(10):
            k = rng.randrange(len(order) - 1)
            order[k], order[k + 1] = order[k + 1], order[k]
            how.append("swap")
        sequence = [packets[k] for k in order]
        other = self._message_qp(kind, avoid=qp) if ch.chance(25) else None
        if other is not None:
            # another QP's message, its packets in order among this one's
            second = self.message(ch.choice(["write", "send"]), other)
            merged = []
            while sequence or second:
                source = sequence if sequence and (not second or rng.randrange(2)) else second
                merged.append(source.pop(0))
            sequence = merged
            how.append("interleaved")
        tag = f"msg {kind}{' ' + '/'.join(how) if how else ''}"
        out: list[Frame] = []
        for n, (frame, layout, label) in enumerate(sequence):
            first_before = before if n == 0 else (self.actions() if ch.chance(3) else ())
            if n and ch.chance(12):
                # another frame between the packets
                other = self.ch.choice(KINDS)
                junk = self.valid(other)
                if ch.chance(60):
                    junk, mac_error, labels = self.mutate(other, junk)
                    out.append(Frame(bytes(junk), mac_error,
                                     label=f"{tag}: between, {other}: " + ", ".join(labels),
                                     before=first_before))
                else:
                    out.append(Frame(bytes(junk), label=f"{tag}: between, valid {other}",
                                     before=first_before))
                first_before = ()
            if ch.chance(12):
                frame, mac_error, labels = self.mutate(layout, bytearray(frame))
                out.append(Frame(bytes(frame), mac_error,
                                 label=f"{tag}: {label}: " + ", ".join(labels),
                                 before=first_before))
            else:
                out.append(Frame(bytes(frame), label=f"{tag}: {label}", before=first_before))
        return out

    def batch(self, count: int, *, probes: int = 40) -> list[Frame]:
        """``count`` frames or messages (about a quarter messages of several packets, disturbed
        or not: :meth:`messages`; of the single frames about a fifth valid, the rest mutated),
        a probe after a mutated frame ``probes`` % of the time, and a probe at the end."""
        out = []
        for _ in range(count):
            before = self.actions() if self.ch.chance(6) else ()
            if self.c.rx_enable and self.ch.chance(25):
                out += self.messages(before)
                continue
            kind = self.ch.choice(KINDS)
            frame = self.valid(kind)
            if self.ch.chance(20):
                out.append(Frame(bytes(frame), label=f"valid {kind}", before=before))
                continue
            frame, mac_error, labels = self.mutate(kind, frame)
            out.append(Frame(bytes(frame), mac_error, label=f"{kind}: " + ", ".join(labels),
                             before=before))
            if self.ch.chance(probes):
                out.append(self.probe())
        out.append(self.probe())
        return out


# ---- the simulation --------------------------------------------------------------------------

def _offsets(layout) -> dict[str, tuple[int, int]]:
    return {name: (f.offset, f.width) for name, f in amaranth_data.Layout.cast(layout)}


_BEAT = _offsets(beat_layout())
_CMD = _offsets(BusCommand)
_REQ = _offsets(ControlRequest)


def _field(value: int, spec: tuple[int, int]) -> int:
    return (value >> spec[0]) & ((1 << spec[1]) - 1)


def _beat_values(frame: bytes, mac_error: bool) -> list[int]:
    out = []
    for i in range(0, len(frame), 8):
        chunk = frame[i:i + 8]
        last = i + 8 >= len(frame)
        fields = {"data": int.from_bytes(chunk, "little"), "keep": (1 << len(chunk)) - 1,
                  "first": int(i == 0), "last": int(last), "error": int(last and mac_error)}
        out.append(sum(v << _BEAT[k][0] for k, v in fields.items()))
    return out


@dataclass
class Drive:
    """How a batch is driven: idle cycles after each frame (``gaps``), the chance of an idle
    cycle before each beat (``idle``, percent), the bus and control-request ``ready`` patterns
    (``None``: always ready), and whether the engine is drained before the last frame."""

    gaps: list[int]
    idle: int = 0
    bus_ready: list[bool] | None = None
    ctrl_ready: list[bool] | None = None
    drain_before_last: bool = False
    seed: int = 0

    @property
    def back_pressure(self) -> bool:
        return self.bus_ready is not None or self.ctrl_ready is not None


def make_drive(ch: Chooser, rng: random.Random, frames: int, *, pressure: bool) -> Drive:
    gaps = [ch.choice([0, 0, 0, 1, 3, 12]) for _ in range(frames)] if ch.chance(50) else (
        [0] * frames)
    if not pressure:
        return Drive(gaps, seed=rng.getrandbits(32))

    def pattern(percent: int, burst: int) -> list[bool]:
        out: list[bool] = []
        while len(out) < 4096:
            out += [rng.randrange(100) < percent] * rng.randint(1, burst)
        return out[:4096]

    bus = pattern(ch.choice([20, 40, 60, 90]), ch.choice([1, 4, 40])) if ch.chance(90) else None
    ctrl = pattern(ch.choice([10, 50]), ch.choice([1, 30])) if ch.chance(50) else None
    return Drive(gaps, idle=ch.choice([0, 10, 30]), bus_ready=bus, ctrl_ready=ctrl,
                 drain_before_last=True, seed=rng.getrandbits(32))


@dataclass
class Observed:
    """What the engine did: each frame's decision (the counters strobed with RX_FRAMES), the bus
    commands, the control requests, the replies' ``arp`` bits, the counters, each QP's RX_EPSN
    and counters read back, stream-rule breaches, and whether it failed to drain
    (``wedged``)."""

    decisions: list[frozenset[str]] = field(default_factory=list)
    commands: list[Cmd] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    replies: list[int] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    epsn: list[int] = field(default_factory=list)
    qp_counters: list[dict[str, int]] = field(default_factory=list)
    stream_errors: list[str] = field(default_factory=list)
    wedged: str | None = None
    cycles: int = 0
    quiet: int = 0


def simulate(setup: Setup, frames: list[Frame], drive: Drive) -> Observed:
    """Configure a RoCEReceiver (with its register block) as ``setup`` says, drive ``frames``
    as ``drive`` says and record what it does."""
    params = setup.config.params
    h = RxHarness(params, buffer_bytes=setup.config.buffer_bytes)
    dut, regs = h.dut, h.regs
    obs = Observed()
    names = [n for n, _ in COUNTERS]
    beats = [_beat_values(f.data, f.mac_error) for f in frames]
    rng = random.Random(drive.seed)
    bus_ready = drive.bus_ready
    ctrl_ready = drive.ctrl_ready
    state = {"sent": 0}
    ring = {"rp": 0}

    async def monitor(ctx):
        cycle = 0
        pending_cmd = pending_req = None
        while True:
            br = True if bus_ready is None else bus_ready[cycle % len(bus_ready)]
            cr = True if ctrl_ready is None else ctrl_ready[cycle % len(ctrl_ready)]
            ctx.set(dut.bus_cmd.ready, br)
            ctx.set(dut.ctrl_req.ready, cr)
            (_, _, bv, bp, cv, cp, count, rv, rarp,
             busy) = await ctx.tick().sample(dut.bus_cmd.valid, dut.bus_cmd.payload.as_value(),
                                             dut.ctrl_req.valid, dut.ctrl_req.payload.as_value(),
                                             dut.count, dut.reply.valid, dut.reply.arp, dut.busy)
            if pending_cmd is not None and (not bv or bp != pending_cmd):
                obs.stream_errors.append(f"cycle {cycle}: bus command changed before taken")
            if pending_req is not None and (not cv or cp != pending_req):
                obs.stream_errors.append(f"cycle {cycle}: control request changed")
            pending_cmd = bp if bv and not br else None
            pending_req = cp if cv and not cr else None
            if bv and br:
                obs.commands.append((BusOp(_field(bp, _CMD["op"])), _field(bp, _CMD["word_addr"]),
                                     _field(bp, _CMD["be"]), _field(bp, _CMD["data"])))
            if cv and cr:
                # taken as the control plane takes it: the pairs after the first read from the
                # pair ring, then freed
                request = {k: _field(cp, spec) for k, spec in _REQ.items()}
                more = b""
                for k in range(request["pairs"] - 1):
                    entry = ctx.get(dut.pair_ring.data[(ring["rp"] + k) % PAIR_RING_DEPTH])
                    more += entry.to_bytes(8, "little")
                ring["rp"] = (ring["rp"] + max(request["pairs"] - 1, 0)) % (2 * PAIR_RING_DEPTH)
                ctx.set(dut.pairs.rp, ring["rp"])
                obs.requests.append({**request, "more": more})
            # quiet: cycles since the last decision with no packet or request in progress
            obs.quiet = obs.quiet + 1 if not (busy or bv or cv or count) else 0
            if count:
                strobed = frozenset(names[i] for i in range(len(names)) if count >> i & 1)
                if "RX_FRAMES" in strobed:
                    obs.decisions.append(strobed - {"RX_FRAMES"})
                else:
                    obs.stream_errors.append(f"cycle {cycle}: counters {sorted(strobed)} "
                                             "strobed without RX_FRAMES")
            if rv:
                obs.replies.append(int(rarp))
            cycle += 1
            obs.cycles = cycle

    async def drained(ctx, limit: int) -> bool:
        for _ in range(limit):
            if len(obs.decisions) >= state["sent"] and obs.quiet >= 16:
                return True
            await ctx.tick()
        return False

    async def driver(ctx):
        for addr, value in setup.writes:
            await reg_write(ctx, regs, addr, value)
        for _ in range(2):
            await ctx.tick()
        for i, frame_beats in enumerate(beats):
            if drive.drain_before_last and i == len(beats) - 1:
                if not await drained(ctx, 20_000):
                    obs.wedged = f"did not drain before frame {i}"
            if frames[i].before:
                for _ in range(200):              # every earlier frame decided
                    if len(obs.decisions) >= state["sent"]:
                        break
                    await ctx.tick()
                for action in frames[i].before:
                    for addr, value in action_writes(action):
                        await reg_write(ctx, regs, addr, value)
                for _ in range(2):
                    await ctx.tick()
            for value in frame_beats:
                while drive.idle and rng.randrange(100) < drive.idle:
                    ctx.set(dut.rx.valid, 0)
                    await ctx.tick()
                ctx.set(dut.rx.valid, 1)
                ctx.set(dut.rx.payload.as_value(), value)
                await ctx.tick()
            ctx.set(dut.rx.valid, 0)
            state["sent"] += 1
            for _ in range(drive.gaps[i] if i < len(drive.gaps) else 0):
                await ctx.tick()
        words = sum(len(b) for b in beats)
        if not await drained(ctx, 2_000 + 40 * words) and obs.wedged is None:
            obs.wedged = (f"{len(obs.decisions)} decisions for {len(frames)} frames, or not "
                          "drained")
        for _ in range(max(COUNTER_LAG_CYCLES, qp_counter_lag_cycles(params.num_qps)) + 2):
            await ctx.tick()
        obs.counters = {n: await reg_read(ctx, regs, counter_addr(n)) for n in names}
        obs.epsn = [await reg_read(ctx, regs, qp_reg(q, "RX_EPSN"))
                    for q in range(params.num_qps)]
        obs.qp_counters = [{name: await reg_read(ctx, regs, qp_reg(q, name))
                            for name, _ in QP_COUNTERS} for q in range(params.num_qps)]

    sim = Simulator(h)
    sim.add_clock(6.4e-9)
    sim.add_testbench(driver)
    sim.add_testbench(monitor, background=True)
    sim.run()
    return obs


# ---- the properties --------------------------------------------------------------------------

def expected_commands(verdict: Verdict) -> list[Cmd]:
    """The bus commands of a RoCEv2 packet taken: its writes (64-bit words, byte enables),
    then the TAIL write of ImmDt or the MAILBOX_COMMIT."""
    out: list[Cmd] = []
    for w in verdict.writes:
        out += expected_writes(w.addr, w.data)
    if verdict.tail is not None:
        addr, imm = verdict.tail
        out.append((BusOp.WRITE, addr >> 3, 0xF0 if addr & 4 else 0x0F, imm | imm << 32))
    if verdict.mailbox_commit is not None:
        addr, length = verdict.mailbox_commit
        out.append((BusOp.MAILBOX_COMMIT, addr >> 3, 0, length))
    return out


def _masked(cmd: Cmd) -> Cmd:
    """A command as it lands: for a WRITE only the enabled bytes of its data count."""
    op, word, be, value = cmd
    if op == BusOp.WRITE:
        value &= sum(0xFF << 8 * i for i in range(8) if be >> i & 1)
    return op, word, be, value


def _writable(params: QSCParams, ppu: int) -> list[tuple[int, int]]:
    """Byte ranges a packet to PPU ``ppu``'s QP may write: its RDMA regions and its mailbox."""
    spans = [(r.va, r.va + r.length_bytes) for r in regions(params, ppu)]
    mailbox = ppu_base(ppu) + MAILBOX_OFFSET
    return spans + [(mailbox, mailbox + MAILBOX_BYTES)]


def _outside(cmd: Cmd, params: QSCParams, ppu: int) -> bool:
    op, word, be, _ = cmd
    spans = _writable(params, ppu)
    if op == BusOp.MAILBOX_COMMIT:
        return 8 * word != ppu_base(ppu) + MAILBOX_OFFSET
    if op != BusOp.WRITE:
        return True
    return any(not any(lo <= 8 * word + i < hi for lo, hi in spans)
               for i in range(8) if be >> i & 1)


@dataclass
class Report:
    """A batch's outcome: each frame's observed outcome and the property violations."""

    outcomes: list[str]
    violations: list[str]


def _describe(i: int, frame: Frame) -> str:
    flag = " (MAC error)" if frame.mac_error else ""
    return f"frame {i} [{frame.label}]{flag} {frame.data.hex()}"


def check(setup: Setup, frames: list[Frame], drive: Drive, obs: Observed) -> Report:
    """The properties (a)-(f) of a batch, against a fresh model of ``setup``."""
    model = RxModel(setup.config)
    params = setup.config.params
    v: list[str] = []
    outcomes: list[str] = []
    expected: list[Cmd] = []
    owner: list[int] = []                 # the PPU each expected command belongs to
    requests: list[dict] = []
    replies: list[int] = []
    counts: Counter = Counter()

    # (f) every frame gets its decision; nothing wedges
    if obs.wedged:
        v.append(f"(f) wedged: {obs.wedged}")
    if len(obs.decisions) != len(frames):
        v.append(f"(f) {len(obs.decisions)} decisions for {len(frames)} frames")
    v += [f"stream rule: {e}" for e in obs.stream_errors]

    for i, (frame, strobed) in enumerate(zip(frames, obs.decisions, strict=False)):
        for action in frame.before:
            apply_action(model, action)
        verdict = model.judge(frame.data, mac_error=frame.mac_error)
        counts.update(strobed)
        # (d) exactly one outcome per frame, the model's
        outs = [n for n in strobed if n in OUTCOME_COUNTERS]
        extra = strobed - set(OUTCOME_COUNTERS) - {"PSN_GAP", "RX_RPC_RESPONSES"}
        if len(outs) > 1 or extra:
            v.append(f"(d) {_describe(i, frame)}: counted {sorted(strobed)}")
        seen = outs[0] if outs else UDP_RESPONSE if "RX_RPC_RESPONSES" in strobed else CONTROL
        outcomes.append(seen)
        # Under back-pressure the buffer or a queue may be full: any packet or request taken
        # may then be dropped for overflow, but not the last frame, sent once the engine
        # drained.
        drained = drive.drain_before_last and i == len(frames) - 1
        overflow_ok = (drive.back_pressure and not drained and verdict.taken
                       and verdict.kind in ("write", "send", "control", "udp"))
        allowed = set(verdict.allowed) | ({"DROP_OVERFLOW"} if overflow_ok else set())
        if seen not in allowed:
            v.append(f"(d) {_describe(i, frame)}: counted {seen}, model {verdict.outcome}"
                     + (f" (or {sorted(verdict.also)})" if verdict.also else ""))
        if (frame.probe and seen not in (ACCEPTED, CONTROL, UDP_RESPONSE)
                and not (overflow_ok and seen == "DROP_OVERFLOW")):
            v.append(f"(e) {_describe(i, frame)}: a valid frame counted {seen}")
        if verdict.icrc_ok is False and seen == ACCEPTED:
            v.append(f"(b) {_describe(i, frame)}: bad ICRC, taken")
        gap = "PSN_GAP" in strobed
        rpc = "RX_RPC_RESPONSES" in strobed
        if seen == verdict.outcome and seen in (ACCEPTED, UDP_RESPONSE):
            if gap != verdict.psn_gap or rpc != verdict.rpc_response:
                v.append(f"(d) {_describe(i, frame)}: PSN_GAP {gap} RX_RPC_RESPONSES {rpc}, "
                         f"model {verdict.psn_gap} {verdict.rpc_response}")
            cmds = expected_commands(verdict)
            expected += cmds
            owner += [verdict.ppu] * len(cmds)
        elif gap or (rpc and seen != UDP_RESPONSE):
            v.append(f"(d) {_describe(i, frame)}: PSN_GAP/RX_RPC_RESPONSES without a packet")
        # the QP's state moves as the receiver decided: a packet the model takes but the
        # receiver dropped (for overflow, or wrongly: then reported above) closes its message
        if verdict.outcome in (ACCEPTED, UDP_RESPONSE) and seen != verdict.outcome:
            model.apply_dropped(verdict)
        else:
            model.apply(verdict)
        if seen == CONTROL and verdict.outcome == CONTROL:
            requests.append(verdict.request)
        if seen in ("RX_ARP_REQUESTS", "RX_ECHO_REQUESTS"):
            replies.append(int(seen == "RX_ARP_REQUESTS"))

    # (a) no write outside the addressed QP's regions, (c) the expected writes, nothing else
    # (where the commands are not the expected ones, which packet each belongs to is not
    # known: then (a) checks them against every PPU's regions)
    got = [_masked(c) for c in obs.commands]
    want = [_masked(c) for c in expected]
    for k, cmd in enumerate(got):
        if got == want:
            if _outside(cmd, params, owner[k]):
                v.append(f"(a) command {k} {cmd} outside PPU {owner[k]}'s regions")
        elif all(_outside(cmd, params, n) for n in range(params.num_ppus)):
            v.append(f"(a) command {k} {cmd} outside every PPU's regions")
    if got != want:
        first = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                     min(len(got), len(want)))
        v.append(f"(c) bus commands differ at {first}: got {got[first:first + 2]}, expected "
                 f"{want[first:first + 2]} ({len(got)} got, {len(want)} expected)")
    # control requests (the 10-byte RD_DWORD's data word is not the packet's)
    got_reqs = [dict(r, data=None) if k < len(requests) and requests[k]["data"] is None else r
                for k, r in enumerate(obs.requests)]
    if got_reqs != requests:
        v.append(f"(c) control requests: got {got_reqs}, expected {requests}")
    if obs.replies != replies:
        v.append(f"(d) replies {obs.replies}, expected {replies}")

    # (d) the counters read back: RX_FRAMES the frames, the others the strobes' sums
    if obs.counters:
        if obs.counters["RX_FRAMES"] != len(frames):
            v.append(f"(d) RX_FRAMES {obs.counters['RX_FRAMES']}, {len(frames)} frames sent")
        for name, _ in COUNTERS:
            want_n = len(obs.decisions) if name == "RX_FRAMES" else counts[name]
            if obs.counters[name] != want_n:
                v.append(f"(d) counter {name} reads {obs.counters[name]}, {want_n} strobed")
        taken_or_dropped = sum(obs.counters[n] for n in OUTCOME_COUNTERS)
        if (taken_or_dropped + outcomes.count(CONTROL) + outcomes.count(UDP_RESPONSE)
                != obs.counters["RX_FRAMES"]):
            v.append("(d) outcome counters do not add up to RX_FRAMES")
        if obs.epsn != model.epsn:
            v.append(f"(d) RX_EPSN {obs.epsn}, model {model.epsn}")
    # (d) each QP's counters read back: the model's count of its packets taken and dropped
    if obs.qp_counters:
        for q, (got_q, want_q) in enumerate(zip(obs.qp_counters, model.qp_counters,
                                                strict=True)):
            if got_q != want_q:
                v.append(f"(d) QP {q} counters {got_q}, model {want_q}")
    return Report(outcomes, v)


def run_batch(setup: Setup, frames: list[Frame], drive: Drive) -> Report:
    return check(setup, frames, drive, simulate(setup, frames, drive))


def _assert_clean(report: Report) -> None:
    assert not report.violations, "\n".join(report.violations[:10])


# ---- the tests -------------------------------------------------------------------------------

#: Derandomized and bounded (the file runs in about three minutes on one core). No shrinking: an
#: example is a whole simulation (seconds), and a failure names its frames in hex with how each
#: was made.
_SETTINGS = dict(derandomize=True, deadline=None, database=None,
                 phases=[Phase.explicit, Phase.generate],
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _fuzz_ready_bus(data, *, vary: bool, most: int) -> None:
    """One batch of 4..``most`` generated frames, the bus always ready."""
    ch = DrawChooser(data.draw)
    rng = random.Random(ch.integer(0, 2**32 - 1))
    setup = make_setup(ch, rng, vary=vary)
    frames = FrameGen(setup.config, ch, rng).batch(ch.integer(4, most))
    _assert_clean(run_batch(setup, frames, make_drive(ch, rng, len(frames), pressure=False)))


@pytest.mark.fuzz_deep
@settings(max_examples=12, **_SETTINGS)
@given(st.data())
def test_fuzz_mutated_frames(data):
    """Mutated frames of every kind, the bus always ready, the default configuration of one or
    two PPUs and their four QPs."""
    _fuzz_ready_bus(data, vary=False, most=14)


@pytest.mark.fuzz_deep
@settings(max_examples=10, **_SETTINGS)
@given(st.data())
def test_fuzz_configurations(data):
    """Other PPU and QP counts, QSC addresses, P_Keys, R_Keys never written, extra QPs left
    unconfigured, QSC_QPNs and RESPONSE_BYTES, RX_ENABLE off."""
    _fuzz_ready_bus(data, vary=True, most=12)


@pytest.mark.fuzz_deep
@settings(max_examples=8, **_SETTINGS)
@given(st.data())
def test_fuzz_back_pressure(data):
    """The bus and the control plane take at random, the MAC idles inside frames: every frame
    is decided, the engine drains, and the last (valid) frame is taken."""
    ch = DrawChooser(data.draw)
    rng = random.Random(ch.integer(0, 2**32 - 1))
    setup = make_setup(ch, rng, vary=ch.chance(50))
    frames = FrameGen(setup.config, ch, rng).batch(ch.integer(6, 16), probes=20)
    _assert_clean(run_batch(setup, frames, make_drive(ch, rng, len(frames), pressure=True)))


def test_model_agrees_with_the_hand_written_drop_table():
    """The model decides test_rx's hand-written frames as that table says (no simulation), with
    test_rx's configuration: PPU 0's own QP opened to the host, the extra QPs closed (no peer,
    no key)."""
    import test_rx

    from openqlink.sim.rx_model import parse_ip, parse_mac

    params = QSCParams()
    config = RxConfig(params=params, host_mac=HOST_MAC, host_ip=HOST_IP, rx_enable=True,
                      peers=[(HOST_MAC, HOST_IP)] + [(0, 0)] * (params.num_qps - 1),
                      rkeys=[{"IMEM_RKEY": (test_rx.IMEM_RKEY, True),
                              "ENV_RKEY": (test_rx.ENV_RKEY, True),
                              "REGS_RKEY": (test_rx.REGS_RKEY, True)}])
    assert config.qsc_mac == parse_mac(QSCParams().mac) and config.qsc_ip == parse_ip("192.168.0.2")
    model = RxModel(config)
    for name, (frame, reason) in test_rx.DROPS.items():
        assert model.judge(frame).outcome == (reason or ACCEPTED), name


def test_the_checks_catch_a_broken_engine():
    """The properties can fail: an observation with a write nobody asked for, a frame counted
    twice, a missing decision, a wrong PSN and QP counters that missed the packets taken are
    each reported."""
    rng = random.Random(5)
    ch = RandomChooser(rng)
    setup = make_setup(ch, rng, vary=False)
    frames = [FrameGen(setup.config, ch, rng).probe() for _ in range(2)]
    model = RxModel(setup.config)
    verdicts = [model.receive(f.data) for f in frames]
    good = Observed(decisions=[frozenset({ACCEPTED} | ({"RX_RPC_RESPONSES"}
                                                       if v.rpc_response else set()) |
                                         ({"PSN_GAP"} if v.psn_gap else set()))
                               for v in verdicts],
                    commands=[c for v in verdicts for c in expected_commands(v)])
    drive = Drive([0, 0])
    assert check(setup, frames, drive, good).violations == []
    stray = Observed(decisions=good.decisions,
                     commands=good.commands + [(BusOp.WRITE, 0x100 >> 3, 0xFF, 0)])
    assert any(x.startswith("(a)") for x in check(setup, frames, drive, stray).violations)
    twice = Observed(decisions=[good.decisions[0] | {"DROP_VA"}, good.decisions[1]],
                     commands=good.commands)
    assert any(x.startswith("(d)") for x in check(setup, frames, drive, twice).violations)
    lost = Observed(decisions=good.decisions[:1], commands=good.commands)
    assert any(x.startswith("(f)") for x in check(setup, frames, drive, lost).violations)
    psn = Observed(decisions=good.decisions, commands=good.commands, counters={
        n: 0 for n, _ in COUNTERS}, epsn=[12345])
    assert any("RX_EPSN" in x for x in check(setup, frames, drive, psn).violations)
    num_qps = setup.config.params.num_qps
    idle = Observed(decisions=good.decisions, commands=good.commands, qp_counters=[
        {n: 0 for n, _ in QP_COUNTERS} for _ in range(num_qps)])
    assert sum(v.qp is not None for v in verdicts) == 2
    assert any(x.startswith("(d) QP") for x in check(setup, frames, drive, idle).violations)


@pytest.mark.parametrize("seed", [1, 2])
def test_fuzz_fixed_seed_batch(seed):
    """A longer batch from a fixed seed (the benchmark's generator), the bus always ready."""
    rng = random.Random(seed)
    ch = RandomChooser(rng)
    setup = make_setup(ch, rng, vary=True)
    frames = FrameGen(setup.config, ch, rng).batch(30)
    _assert_clean(run_batch(setup, frames, make_drive(ch, rng, len(frames), pressure=False)))


def _arp_request(tpa: int) -> bytes:
    """An ARP request for ``tpa`` from the peer, as RFC 826 draws it: 42 bytes, not padded."""
    return (ETHERNET.pack(dst=(1 << 48) - 1, src=HOST_MAC, ethertype=EtherType.ARP) +
            ARP.pack(oper=1, sha=HOST_MAC, spa=HOST_IP, tha=0, tpa=tpa))


def test_an_unpadded_arp_request_is_judged_on_its_own_target_ip():
    """RFC 826: an ARP request for the QSC's IP is taken, one for another IP is not, whatever
    frame came before it; 42 bytes is a whole ARP request (the ETH and ARP length checks let it
    through), the size before a MAC pads it to 60. The fuzzing found the receiver judging such
    a frame with the previous frame's bytes 40-41 as the low half of its target IP (the compare
    was registered before the last beat landed)."""
    rng = random.Random(0)
    setup = make_setup(RandomChooser(rng), rng, vary=False)
    qsc_ip = setup.config.qsc_ip
    other_ip = (qsc_ip & ~0xFFFF) | 0x0707
    frames = [
        Frame(pad60(ETHERNET.pack(dst=setup.config.qsc_mac, src=HOST_MAC,
                                  ethertype=EtherType.IPV4) +
                    ip_udp(CONTROL_REQUEST.pack(cmd=Command.RD_DWORD, addr=0),
                           dst_port=CONTROL_PORT, ip={"src": HOST_IP, "dst": qsc_ip})),
              label="control request (bytes 40-41: its UDP checksum, 0)"),
        Frame(_arp_request(qsc_ip), label="42-byte ARP request for the QSC"),
        Frame(pad60(_arp_request(qsc_ip)), label="60-byte ARP request for the QSC"),
        Frame(_arp_request(other_ip), label="42-byte ARP request for another IP"),
    ]
    model = RxModel(setup.config)
    assert [model.judge(f.data).outcome for f in frames] == [
        CONTROL, "RX_ARP_REQUESTS", "RX_ARP_REQUESTS", "DROP_ARP"]
    drive = Drive([4] * len(frames))
    report = check(setup, frames, drive, simulate(setup, frames, drive))
    assert report.outcomes == [CONTROL, "RX_ARP_REQUESTS", "RX_ARP_REQUESTS", "DROP_ARP"], (
        report.outcomes)
    _assert_clean(report)


def test_a_message_packet_dropped_for_overflow_closes_the_message():
    """With the bus stalled the descriptor queue fills and a packet in the middle of a long
    message is dropped for overflow: the receiver closes the QP's message, so the packets after
    it are PSN drops, the dropped MIDDLE sent again at once too (its PSN is the expected one).
    The model, told of the overflow (``apply_dropped``), says the same; the checks run as the
    fuzzing runs them (a model not told would take the MIDDLE sent again). A first run finds
    which packet the stall drops, a second sends it again right after."""
    rng = random.Random(3)
    setup = make_setup(RandomChooser(rng), rng, vary=False)
    c = setup.config
    env = next(r for r in regions(c.params, 0) if r.name == "ENV")
    pmtu = c.pmtu[0]
    data = rng.randbytes(15 * pmtu + 8)
    chunks = [data[k:k + pmtu] for k in range(0, len(data), pmtu)]
    packets = []
    for k, chunk in enumerate(chunks):
        op, ext = Opcode.RDMA_WRITE_MIDDLE, {}
        if k == 0:
            op = Opcode.RDMA_WRITE_FIRST
            ext = dict(va=env.va, r_key=c.rkeys[0]["ENV_RKEY"][0], dma_len=len(data))
        elif k == len(chunks) - 1:
            op = Opcode.RDMA_WRITE_LAST
        packets.append(Frame(roce_frame(op, psn=k, payload=chunk, dest_qp=c.qsc_qpns[0],
                                        eth={"src": c.host_mac}, ip={"src": c.host_ip},
                                        **ext), label=f"{op.name} {k}"))
    probe = FrameGen(c, RandomChooser(rng), rng).probe()
    stall = [False] * 2400 + [True] * 40_000       # stalled, then ready for good

    def run(frames: list[Frame]) -> list[str]:
        drive = Drive([0] * len(frames), bus_ready=stall, drain_before_last=True)
        report = check(setup, frames, drive, simulate(setup, frames, drive))
        _assert_clean(report)
        return report.outcomes[:-1]

    outcomes = run(packets + [probe])
    dropped = outcomes.index("DROP_OVERFLOW")
    assert 1 < dropped < len(packets) - 1, outcomes
    assert outcomes[:dropped] == [ACCEPTED] * dropped, outcomes
    assert outcomes[dropped + 1:] == ["DROP_PSN"] * (len(packets) - dropped - 1), outcomes
    again = dataclasses.replace(packets[dropped], label=f"{packets[dropped].label} again")
    outcomes = run(packets[:dropped + 1] + [again, packets[dropped + 1], probe])
    assert outcomes[dropped:] == ["DROP_OVERFLOW", "DROP_PSN", "DROP_PSN"], outcomes


def test_fuzz_udp_mode_batch():
    """A fixed-seed batch of three PPUs, two of their QPs in UDP mode (CUDA-Q realtime's udp
    bridge): UDP-mode responses are taken into the mailboxes beside RoCEv2 packets, and the
    mutated ones dropped as the model says."""
    rng = random.Random(5)
    ch = RandomChooser(rng)
    setup = make_setup(ch, rng, vary=True)
    assert setup.config.transports[:3] == [1, 0, 1]
    frames = FrameGen(setup.config, ch, rng).batch(30)
    report = run_batch(setup, frames, make_drive(ch, rng, len(frames), pressure=False))
    _assert_clean(report)
    assert report.outcomes.count(UDP_RESPONSE) >= 3
    assert ACCEPTED in report.outcomes
