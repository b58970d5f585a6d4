"""Shared helpers of the receive-path, control-plane and NetworkCore tests.

Frame builders with fault injection (built from the shared host headers and the software ICRC),
a packet-stream driver, a bus-side monitor that checks the stream rules, and the expected bus
commands of a write (a software model of the commit engine).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from openqlink.gateware.bus import BusOp
from openqlink.memory_map import QSCParams
from openqlink.wire.control import CONTROL_BLOCK_HEADER, CONTROL_REQUEST
from openqlink.wire.ethernet import ETHERNET, EtherType, mac_to_int
from openqlink.wire.ipv4 import IPV4, IpProtocol, ip_to_int, ipv4_checksum
from openqlink.wire.roce import BTH, IMMDT, RETH, Opcode, icrc
from openqlink.wire.udp import CONTROL_PORT, ROCEV2_PORT, UDP

PARAMS = QSCParams()
QSC_MAC = mac_to_int(PARAMS.mac)
QSC_IP = ip_to_int(PARAMS.ip)
HOST_MAC = 0x02_00_00_00_00_65
HOST_IP = ip_to_int("192.168.0.101")
HOST_PORT = 0xC123

Cmd = tuple[BusOp, int, int, int]   # (op, word_addr, be, data)


def eth_header(**over: int) -> bytes:
    fields = dict(dst=QSC_MAC, src=HOST_MAC, ethertype=EtherType.IPV4)
    fields.update(over)
    return ETHERNET.pack(**fields)


def ip_udp(l4: bytes, *, dst_port: int, src_port: int = HOST_PORT,
           ip: dict | None = None, udp: dict | None = None) -> bytes:
    """IPv4 + UDP headers (checksum computed unless ``ip`` overrides it) followed by ``l4``."""
    udp_fields = dict(src_port=src_port, dst_port=dst_port, length=8 + len(l4), checksum=0)
    udp_fields.update(udp or {})
    ip_fields = dict(total_length=20 + 8 + len(l4), identification=0x1234, ttl=64,
                     protocol=IpProtocol.UDP, src=HOST_IP, dst=QSC_IP)
    ip_fields.update({k: v for k, v in (ip or {}).items() if k != "checksum"})
    hdr = IPV4.pack(**ip_fields)
    checksum = (ip or {}).get("checksum", ipv4_checksum(hdr))
    return IPV4.pack(**ip_fields, checksum=checksum) + UDP.pack(**udp_fields) + l4


def pad60(frame: bytes) -> bytes:
    return frame + bytes(max(0, 60 - len(frame)))


def roce_frame(opcode: int, *, dest_qp: int = PARAMS.qpn_base, psn: int = 0,
               va: int | None = None, r_key: int | None = None, dma_len: int | None = None,
               imm: int | None = None, payload: bytes = b"", pad_cnt: int | None = None,
               bth: dict | None = None, eth: dict | None = None, ip: dict | None = None,
               udp: dict | None = None, bad_icrc: bool = False, extra: bytes = b"") -> bytes:
    """A RoCEv2 frame; the keyword dicts override header fields, ``extra`` is appended after
    the ICRC (Ethernet padding)."""
    pad = (-len(payload)) % 4 if pad_cnt is None else pad_cnt
    bth_fields = dict(opcode=opcode, pad_cnt=pad, dest_qp=dest_qp, psn=psn)
    bth_fields.update(bth or {})
    l4 = BTH.pack(**bth_fields)
    if va is not None:
        l4 += RETH.pack(va=va, r_key=r_key or 0,
                        dma_len=len(payload) if dma_len is None else dma_len)
    if imm is not None:
        l4 += IMMDT.pack(imm=imm)
    l4 += payload + bytes((-len(payload)) % 4)
    packet = ip_udp(l4 + bytes(4), dst_port=ROCEV2_PORT, ip=ip, udp=udp)[:-4]
    crc = icrc(packet)
    if bad_icrc:
        crc = bytes([crc[0] ^ 0x01]) + crc[1:]
    return pad60(eth_header(**(eth or {})) + packet + crc + extra)


def write_frame(va: int, payload: bytes, r_key: int, *, imm: int | None = None,
                **kw) -> bytes:
    op = Opcode.RDMA_WRITE_ONLY if imm is None else Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE
    return roce_frame(op, va=va, r_key=r_key, imm=imm, payload=payload, **kw)


def send_frame(payload: bytes, **kw) -> bytes:
    return roce_frame(Opcode.SEND_ONLY, payload=payload, **kw)


def control_frame(cmd: int, addr: int, data: int = 0, *, flags: int = 0, seq: int = 0,
                  src_port: int = HOST_PORT, ip: dict | None = None, udp: dict | None = None,
                  eth: dict | None = None) -> bytes:
    req = CONTROL_REQUEST.pack(cmd=cmd, flags=flags, seq=seq, addr=addr, data=data)
    return pad60(eth_header(**(eth or {})) +
                 ip_udp(req, dst_port=CONTROL_PORT, src_port=src_port, ip=ip, udp=udp))


def block_frame(cmd: int, pairs: list[tuple[int, int]], *, flags: int = 0, seq: int = 0,
                src_port: int = HOST_PORT) -> bytes:
    """A WR_BLOCK or RD_BLOCK as the Holoscan Sensor Bridge host serializes it (its
    ``write_uint32_block_`` / ``read_uint32_block_``: the 6-byte header, then (addr, value))."""
    req = CONTROL_BLOCK_HEADER.pack(cmd=cmd, flags=flags, seq=seq) + b"".join(
        a.to_bytes(4, "big") + v.to_bytes(4, "big") for a, v in pairs)
    return pad60(eth_header() + ip_udp(req, dst_port=CONTROL_PORT, src_port=src_port))


async def open_rx(write, ctx, qps: range = range(1)) -> None:
    """What a host's configure writes before RDMA is taken (the QSC is closed from reset): each
    of the QPs ``qps``'s peer MAC and IP, then RX_ENABLE. ``write(ctx, addr, value)`` is the
    bench's control-plane write. The region R_Keys the test writes itself."""
    from openqlink.memory_map import global_reg, qp_reg

    for n in qps:
        await write(ctx, qp_reg(n, "PEER_MAC_HI"), HOST_MAC >> 32)
        await write(ctx, qp_reg(n, "PEER_MAC_LO"), HOST_MAC & 0xFFFF_FFFF)
        await write(ctx, qp_reg(n, "PEER_IP"), HOST_IP)
    await write(ctx, global_reg("RX_ENABLE"), 1)


class MacError(bytes):
    """A frame that the MAC flags bad (``error`` set on its last beat), e.g. an FCS mismatch."""


def beats(frame: bytes) -> list[dict]:
    """The 64-bit beats of ``frame`` as packet-stream payload dicts (``error`` on the last beat
    of a :class:`MacError` frame)."""
    out = []
    for i in range(0, len(frame), 8):
        chunk = frame[i:i + 8]
        last = i + 8 >= len(frame)
        out.append(dict(data=int.from_bytes(chunk.ljust(8, b"\0"), "little"),
                        keep=(1 << len(chunk)) - 1, first=int(i == 0),
                        last=int(last), error=int(last and isinstance(frame, MacError))))
    return out


async def drive_frames(ctx, port, frames: list[bytes], *, gap: int = 0,
                       rng: random.Random | None = None) -> None:
    """Drive ``frames`` into a packet stream whose ``ready`` is always high.

    ``gap`` idle cycles follow each frame; with ``rng``, idle cycles are also inserted at random
    inside frames (valid low), as a MAC may do. A :class:`MacError` frame carries ``error``.
    """
    for frame in frames:
        for b in beats(frame):
            while rng is not None and rng.random() < 0.2:
                ctx.set(port.valid, 0)
                await ctx.tick()
            assert ctx.get(port.ready)
            ctx.set(port.valid, 1)
            ctx.set(port.payload, b)
            await ctx.tick()
        ctx.set(port.valid, 0)
        for _ in range(gap):
            await ctx.tick()


def as_cmd(payload) -> Cmd:
    return (BusOp(payload.op), int(payload.word_addr), int(payload.be), int(payload.data))


class StreamSink:
    """Takes transfers from a stream, with a ``ready`` pattern, checking the stream rules.

    ``ready(cycle)`` gives ``ready`` for each cycle; every transfer's payload is passed through
    ``convert`` and appended to ``items``.
    """

    def __init__(self, port, ready: Callable[[int], bool] = lambda cycle: True,
                 convert: Callable = as_cmd):
        self.port = port
        self.ready = ready
        self.convert = convert
        self.items: list = []

    async def run(self, ctx) -> None:
        cycle = 0
        pending = None
        while True:
            r = bool(self.ready(cycle))
            ctx.set(self.port.ready, r)
            _, _, valid, payload = await ctx.tick().sample(self.port.valid, self.port.payload)
            value = self.convert(payload) if valid else None
            if pending is not None:
                assert valid, "valid fell before the transfer"
                assert value == pending, "payload changed while valid and not ready"
            if valid and r:
                self.items.append(value)
                pending = None
            elif valid:
                pending = value
            cycle += 1


def beat_tuple(p) -> tuple[int, int, int, int]:
    """A packet-stream beat as (data, keep, first, last): :class:`StreamSink`'s ``convert`` for
    :func:`frames_of`."""
    return int(p.data), int(p.keep), int(p.first), int(p.last)


def frames_of(beats: list[tuple[int, int, int, int]]) -> list[bytes]:
    """The whole frames of a beat stream taken as :func:`beat_tuple` gives them, checking the
    stream's framing (``first`` starts a frame, a partial ``keep`` only on a last beat)."""
    frames, current = [], b""
    for data, keep, first, last in beats:
        assert first == (current == b""), "first does not start a frame"
        assert keep == 0xFF or last, f"keep {keep:#x} on a beat that is not the last"
        current += data.to_bytes(8, "little")[:keep.bit_length()]
        if last:
            frames.append(current)
            current = b""
    return frames


def expected_writes(addr: int, payload: bytes) -> list[Cmd]:
    """The WRITEs that put ``payload`` at byte address ``addr`` (disabled lanes zero)."""
    out = []
    end = addr + len(payload)
    if not payload:
        return out
    for word in range(addr >> 3, ((end - 1) >> 3) + 1):
        be = 0
        value = 0
        for lane in range(8):
            a = 8 * word + lane
            if addr <= a < end:
                be |= 1 << lane
                value |= payload[a - addr] << (8 * lane)
        out.append((BusOp.WRITE, word, be, value))
    return out


def tail_write(tail_addr: int, imm: int) -> Cmd:
    return (BusOp.WRITE, tail_addr >> 3, 0xF0 if tail_addr & 4 else 0x0F, imm | imm << 32)


def mailbox_commit(mailbox_addr: int, length: int) -> Cmd:
    return (BusOp.MAILBOX_COMMIT, mailbox_addr >> 3, 0, length)
