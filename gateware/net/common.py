"""Layouts shared by the parts of the network core (rti domain).

# Ref: docs/architecture.md (NetworkCore); openqlink.memory_map (register meanings).
"""

# No ``from __future__ import annotations``: data.Struct reads its annotations as shapes.
from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from ...memory_map import COUNTERS

__all__ = ["NetConfig", "QPContext", "ControlReply", "DropReason", "COUNTER_INDEX"]


class NetConfig(data.Struct):
    """Global network configuration, from the global registers."""

    qsc_mac: unsigned(48)
    qsc_ip: unsigned(32)
    udp_src_port: unsigned(16)
    p_key: unsigned(16)
    timestamp_format: unsigned(1)   #: 0 = ns (u64), 1 = {seconds[63:32], ns[31:0]}
    rx_enable: unsigned(1)
    bootp_interval_ms: unsigned(16)  #: between BOOTP announcements; 0: none


class QPContext(data.Struct):
    """One QP's context, from its QP registers."""

    qsc_qpn: unsigned(24)           #: the DestQP of this QP's packets
    host_qpn: unsigned(24)
    host_rkey: unsigned(32)
    ring_va: unsigned(64)
    num_slots: unsigned(13)         #: 1..4096
    slot_size: unsigned(16)         #: bytes
    imem_rkey: unsigned(32)
    env_rkey: unsigned(32)
    regs_rkey: unsigned(32)
    imem_rkey_valid: unsigned(1)    #: IMEM_RKEY written since the QP's reset or restart
    env_rkey_valid: unsigned(1)
    regs_rkey_valid: unsigned(1)
    response_bytes: unsigned(13)    #: largest SEND payload taken into the mailbox
    pmtu_bytes: unsigned(13)        #: path MTU in bytes, 256..4096 (decoded PMTU register)
    peer_mac: unsigned(48)          #: the peer's MAC and IP: packets from them only, requests
    peer_ip: unsigned(32)           #: to them
    ppu: unsigned(4)                #: the PPU whose regions and mailbox the QP reaches
    transport: unsigned(1)          #: CALLs: 0 = RoCEv2 UC, 1 = UDP (a PPU's own QP only)
    peer_udp_port: unsigned(16)     #: UDP mode: the peer's port (requests to, responses from)


class ControlReply(data.Struct):
    """One pair of a control-plane response (:class:`~.control.ControlReplyBuilder`): where to
    send it, the response's fields, the pair's ``addr``/``value``; ``last`` on the response's
    last pair (its ``status`` is the response's)."""

    dst_mac: unsigned(48)
    dst_ip: unsigned(32)
    dst_port: unsigned(16)          #: the requester's UDP source port
    cmd: unsigned(8)                #: request cmd | 0x80
    flags: unsigned(8)
    seq: unsigned(16)
    status: unsigned(8)
    addr: unsigned(32)
    value: unsigned(32)
    latched_seq: unsigned(16)
    last: unsigned(1)               #: the request's last pair: the response ends here


#: Index of each counter in openqlink.memory_map.COUNTERS.
COUNTER_INDEX = {name: i for i, (name, _) in enumerate(COUNTERS)}


class DropReason(enum.Enum, shape=5):
    """Why a received frame was dropped; the value is the index of its counter in COUNTERS."""

    MAC = COUNTER_INDEX["DROP_MAC"]
    ETH = COUNTER_INDEX["DROP_ETH"]
    IP = COUNTER_INDEX["DROP_IP"]
    UDP = COUNTER_INDEX["DROP_UDP"]
    ICRC = COUNTER_INDEX["DROP_ICRC"]
    OPCODE = COUNTER_INDEX["DROP_OPCODE"]
    PKEY = COUNTER_INDEX["DROP_PKEY"]
    QPN = COUNTER_INDEX["DROP_QPN"]
    RKEY = COUNTER_INDEX["DROP_RKEY"]
    VA = COUNTER_INDEX["DROP_VA"]
    LENGTH = COUNTER_INDEX["DROP_LENGTH"]
    PSN = COUNTER_INDEX["DROP_PSN"]
    OVERFLOW = COUNTER_INDEX["DROP_OVERFLOW"]
    IMMDT = COUNTER_INDEX["DROP_IMMDT"]
    PEER = COUNTER_INDEX["DROP_PEER"]
    ARP = COUNTER_INDEX["DROP_ARP"]
    ICMP = COUNTER_INDEX["DROP_ICMP"]
