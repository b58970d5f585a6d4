"""RoCEv2 UC transport headers (BTH, RETH, ImmDt), opcodes and the ICRC.

# Ref: IBTA Vol 1 Release 1.4 ch. 9.2 (BTH), 9.3.2 (RETH), 9.3.4 (ImmDt), 9.8.1-9.8.3 (UC),
# 7.8.1 (ICRC); Annex A17 (RoCEv2) A17.4.4 (ICRC over the IP/UDP headers with masked fields).
"""

from __future__ import annotations

import zlib

from amaranth.lib import enum

from .header import Header

__all__ = [
    "BTH", "RETH", "IMMDT", "Opcode", "DEFAULT_P_KEY", "ICRC_BYTES", "PATH_MTU_BYTES",
    "path_mtu_code",
    "icrc", "icrc_masked_bytes", "slot_immediate", "split_slot_immediate",
]

#: Base Transport Header, 12 bytes (IBTA Vol 1 9.2). ``resv6`` is the 6 reserved bits after
#: FECN/BECN; together with them it is the byte the ICRC masks to all ones.
BTH = Header("BTH", [
    ("opcode", 8), ("se", 1), ("m", 1), ("pad_cnt", 2), ("tver", 4), ("p_key", 16),
    ("fecn", 1), ("becn", 1), ("resv6", 6), ("dest_qp", 24),
    ("a", 1), ("resv7", 7), ("psn", 24),
], ref="IBTA Vol 1 9.2", defaults={"p_key": 0xFFFF})

#: RDMA Extended Transport Header, 16 bytes (IBTA Vol 1 9.3.2): virtual address, R_Key and the
#: DMA length of the whole message in bytes (pad bytes excluded).
RETH = Header("RETH", [("va", 64), ("r_key", 32), ("dma_len", 32)], ref="IBTA Vol 1 9.3.2")

#: Immediate Data Extended Transport Header, 4 bytes (IBTA Vol 1 9.3.4).
IMMDT = Header("ImmDt", [("imm", 32)], ref="IBTA Vol 1 9.3.4")

#: Default partition key: full member of the default partition (IBTA Vol 1 10.9.1.2).
DEFAULT_P_KEY = 0xFFFF
#: Invariant CRC length, appended after the payload and pad bytes.
ICRC_BYTES = 4


#: Path MTU codes (IBTA Vol 1's MTU encoding, as in a PathRecord's MTU field; ibverbs'
#: ``enum ibv_mtu``) -> payload bytes per packet.
PATH_MTU_BYTES: dict[int, int] = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}


def path_mtu_code(pmtu_bytes: int) -> int:
    """The PathMTU code of a path MTU of ``pmtu_bytes`` (256, 512, 1024, 2048 or 4096).

    Raises ValueError for any other size."""
    for code, size in PATH_MTU_BYTES.items():
        if size == pmtu_bytes:
            return code
    raise ValueError(f"a path MTU is one of {sorted(PATH_MTU_BYTES.values())} bytes, "
                     f"not {pmtu_bytes}")


class Opcode(enum.IntEnum, shape=8):
    """Unreliable Connection opcodes (IBTA Vol 1 table 38, transport type UC = 0b001)."""

    SEND_FIRST = 0x20
    SEND_MIDDLE = 0x21
    SEND_LAST = 0x22
    SEND_LAST_WITH_IMMEDIATE = 0x23
    SEND_ONLY = 0x24
    SEND_ONLY_WITH_IMMEDIATE = 0x25
    RDMA_WRITE_FIRST = 0x26
    RDMA_WRITE_MIDDLE = 0x27
    RDMA_WRITE_LAST = 0x28
    RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29
    RDMA_WRITE_ONLY = 0x2A
    RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2B

    @property
    def has_reth(self) -> bool:
        return self in (Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_ONLY,
                        Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE)

    @property
    def has_immdt(self) -> bool:
        return self in (Opcode.SEND_LAST_WITH_IMMEDIATE, Opcode.SEND_ONLY_WITH_IMMEDIATE,
                        Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE,
                        Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE)

    @property
    def is_send(self) -> bool:
        """A SEND (else an RDMA WRITE)."""
        return Opcode.SEND_FIRST <= self <= Opcode.SEND_ONLY_WITH_IMMEDIATE

    @property
    def starts_message(self) -> bool:
        """FIRST or ONLY: the packet begins a message (IBTA Vol 1 9.8.3)."""
        return self in (Opcode.SEND_FIRST, Opcode.SEND_ONLY, Opcode.SEND_ONLY_WITH_IMMEDIATE,
                        Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_ONLY,
                        Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE)

    @property
    def ends_message(self) -> bool:
        """LAST or ONLY: the packet ends a message."""
        return self in (Opcode.SEND_LAST, Opcode.SEND_LAST_WITH_IMMEDIATE, Opcode.SEND_ONLY,
                        Opcode.SEND_ONLY_WITH_IMMEDIATE, Opcode.RDMA_WRITE_LAST,
                        Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE, Opcode.RDMA_WRITE_ONLY,
                        Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE)


def icrc_masked_bytes(ip_udp_bth_and_rest: bytes) -> bytes:
    """The bytes the ICRC covers, given the packet from the IPv4 header through the pad bytes.

    Prepends 8 bytes of 0xFF and masks, to all ones: IPv4 TOS (byte 1), TTL (byte 8) and header
    checksum (bytes 10-11); UDP checksum (bytes 26-27); BTH byte 4 (FECN, BECN, resv6) at
    byte 32 (IBTA Annex A17.4.4, IPv4 without options).
    """
    b = bytearray(ip_udp_bth_and_rest)
    if len(b) < _ICRC_HEAD_BYTES:
        raise ValueError("ICRC needs at least the IPv4, UDP and BTH headers")
    return b"\xff" * 8 + bytes(_masked_head(b[:_ICRC_HEAD_BYTES])) + bytes(b[_ICRC_HEAD_BYTES:])


#: The IPv4, UDP and BTH headers: the part of the ICRC's input with masked fields.
_ICRC_HEAD_BYTES = 20 + 8 + 12
#: CRC-32 state after the 8 bytes of ones that stand for the masked LRH.
_ICRC_SEED = zlib.crc32(b"\xff" * 8)


def _masked_head(head: bytearray) -> bytearray:
    head[1] = 0xFF
    head[8] = 0xFF
    head[10:12] = b"\xff\xff"
    head[26:28] = b"\xff\xff"
    head[32] = 0xFF
    return head


def icrc(ip_udp_bth_and_rest: bytes | bytearray | memoryview) -> bytes:
    """The 4 ICRC bytes, in wire order (least significant byte of the CRC-32 first, like the FCS).

    ``ip_udp_bth_and_rest`` runs from the first byte of the IPv4 header to the last pad byte.
    The masked 40 header bytes are copied; the rest goes to ``zlib.crc32`` as it is.
    """
    data = memoryview(ip_udp_bth_and_rest).cast("B")
    if len(data) < _ICRC_HEAD_BYTES:
        raise ValueError("ICRC needs at least the IPv4, UDP and BTH headers")
    crc = zlib.crc32(_masked_head(bytearray(data[:_ICRC_HEAD_BYTES])), _ICRC_SEED)
    return zlib.crc32(data[_ICRC_HEAD_BYTES:], crc).to_bytes(4, "little")


def slot_immediate(psn: int, slot: int) -> int:
    """ImmDt of a request written into a host ring slot: ``{PSN[19:0], slot[11:0]}``.

    The layout of CUDA-Q's gpu_roce bridge and Holoscan Sensor Bridge: the receiver takes the slot
    from the low 12 bits of the immediate.
    """
    if not 0 <= slot < 1 << 12:
        raise ValueError(f"slot {slot} does not fit in 12 bits")
    return ((psn & 0xFFFFF) << 12) | slot


def split_slot_immediate(imm: int) -> tuple[int, int]:
    """Inverse of :func:`slot_immediate`: ``(psn[19:0], slot)``."""
    return (imm >> 12) & 0xFFFFF, imm & 0xFFF
