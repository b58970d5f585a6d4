"""The host's end of a PPU's CALLs in the QSC's UDP transport (CUDA-Q realtime's ``udp`` format).

With its QP's TRANSPORT register set to UDP, the QSC sends each CALL request as one UDP datagram
from port ``UDP_CALL_PORT_BASE + q`` (QP ``q``) to the host's port (the QP's PEER_UDP_PORT)
holding the RPC message alone (RPCHeader and arguments, no RoCE headers), and takes the response
as one UDP datagram back to that port: its first 64 bytes go into the PPU's response mailbox.
This is the wire format of CUDA-Q realtime's ``udp`` bridge (one datagram is one ring slot,
requests placed in the ring strictly in arrival order, each answered to its source), so that
bridge can serve a QSC unchanged (docs/wire_formats.md).

:class:`UDPCallPort` checks each request frame and writes it into the next slot of its ring
(``SlotRingLike``), then publishes it; :meth:`UDPCallPort.response_frame` builds the answer.
Receive checks, in order, each dropping the frame and counting one reason in ``counters`` (the
names of :data:`openqlink.roce.RX_COUNTER_NAMES`): Ethernet destination and EtherType
(``DROP_ETH``); IPv4 version 4 without options, checksum, lengths, no fragment, destination,
protocol UDP (``DROP_IP``); UDP length, destination port, and a non-zero checksum that must
verify (``DROP_UDP``); source MAC, IP and port are the QSC's and its QP's (``DROP_PEER``); a
request of 24 bytes (the RPC header) up to a slot (``DROP_LENGTH``); the next slot still holding
a request the dispatcher has not taken (``DROP_OVERFLOW``). Bad frames never raise.

# Ref: cuda-quantum realtime/lib/cpu_transport/udp_transceiver.cpp and
# realtime/lib/daemon/bridge/udp/bridge_impl.cpp (one datagram per slot, strict ring order,
# answers to the request's source); RFC 768; RFC 791; RFC 1071.
"""

from __future__ import annotations

import logging
import struct

from .errors import FieldRangeError
from .roce import RX_COUNTER_NAMES, RxResult, SlotRingLike
from .wire.ethernet import EtherType, mac_to_int
from .wire.ipv4 import IpProtocol, ip_to_int, ipv4_header_ok, ones_complement_sum
from .wire.packet import UDP_FRAME_HEADERS, build_udp_frame
from .wire.rpc import HEADER_BYTES
from .wire.udp import udp_checksum, udp_checksum_ok

log = logging.getLogger(__name__)

__all__ = ["UDPCallPort"]

_ETH, _IP, _UDP = 14, 20, 8
_HEAD = 42


class UDPCallPort:
    """The host side of one PPU's CALLs over UDP.

    Parameters
    ----------
    local_mac, local_ip, local_port
        This host's addresses and UDP port (the QP's PEER_UDP_PORT): where requests arrive,
        the source of the responses.
    remote_mac, remote_ip, remote_port
        The QSC's addresses and the QP's own port (``UDP_CALL_PORT_BASE + q``).
    ring : SlotRingLike
        Where requests go, one per slot, in ring order from slot 0.

    Attributes
    ----------
    counters : dict[str, int]
        By :data:`openqlink.roce.RX_COUNTER_NAMES` (the RoCE-only ones stay 0).
    next_slot : int
        The slot the next request goes into.

    :meth:`handle_frame` must be called from one thread at a time; :meth:`response_frame` is
    thread safe (it builds a new frame from fixed fields).
    """

    def __init__(self, local_mac: str | bytes | int, local_ip: str | int, local_port: int,
                 remote_mac: str | bytes | int, remote_ip: str | int, remote_port: int,
                 ring: SlotRingLike):
        for name, value in (("local_port", local_port), ("remote_port", remote_port)):
            if not 1 <= value <= 0xFFFF:
                raise FieldRangeError("UDP", name, value, "a UDP port is 1..65535")
        if ring.slot_size < HEADER_BYTES:
            raise FieldRangeError("SlotRing", "slot_size", ring.slot_size,
                                  f"a slot must hold the {HEADER_BYTES}-byte RPC header")
        self.local_mac = mac_to_int(local_mac)
        self.local_ip = ip_to_int(local_ip)
        self.local_port = local_port
        self.remote_mac = mac_to_int(remote_mac)
        self.remote_ip = ip_to_int(remote_ip)
        self.remote_port = remote_port
        self.ring = ring
        self.next_slot = 0
        self.counters: dict[str, int] = dict.fromkeys(RX_COUNTER_NAMES, 0)
        self._local_mac_bytes = self.local_mac.to_bytes(6, "big")
        self._remote_mac_bytes = self.remote_mac.to_bytes(6, "big")
        self._template = bytes(build_udp_frame(
            dst_mac=self.remote_mac, src_mac=self.local_mac, src_ip=self.local_ip,
            dst_ip=self.remote_ip, src_port=local_port, dst_port=remote_port)[:_HEAD])

    def _drop(self, reason: str) -> RxResult:
        self.counters[reason] += 1
        return RxResult(False, reason)

    def handle_frame(self, frame: bytes | bytearray | memoryview) -> RxResult:
        """Check one received frame and, if it is a good request, write it into the next slot
        and publish it (``ring.publish(slot, length)``). Never raises for bad input: the
        reason is counted and returned (``RX_PUBLISHED`` for a request taken)."""
        self.counters["RX_FRAMES"] += 1
        n = len(frame)
        if n < _HEAD:
            return self._drop("DROP_ETH" if n < _ETH + 2 or frame[12:14] != b"\x08\x00"
                              else "DROP_IP" if n < _ETH + _IP else "DROP_UDP")
        (dst, src, ethertype, ver_ihl, _tos, total, _ident, flags_frag, _ttl, protocol, _csum,
         src_ip, dst_ip, sport, dport, udp_len, udp_csum) = UDP_FRAME_HEADERS.unpack_from(frame)
        if dst != self._local_mac_bytes or ethertype != EtherType.IPV4:
            return self._drop("DROP_ETH")
        if (ver_ihl != 0x45 or total < _IP or _ETH + total > n or flags_frag & 0x3FFF
                or dst_ip != self.local_ip or protocol != IpProtocol.UDP
                or not ipv4_header_ok(frame, _ETH)):
            return self._drop("DROP_IP")
        end = _ETH + _IP + udp_len
        if (udp_len < _UDP or _IP + udp_len > total or dport != self.local_port
                or (udp_csum and not udp_checksum_ok(src_ip, dst_ip,
                                                     memoryview(frame)[_ETH + _IP:end]))):
            return self._drop("DROP_UDP")
        if (src != self._remote_mac_bytes or src_ip != self.remote_ip
                or sport != self.remote_port):
            return self._drop("DROP_PEER")
        length = udp_len - _UDP
        ring = self.ring
        if not HEADER_BYTES <= length <= ring.slot_size:
            return self._drop("DROP_LENGTH")
        slot = self.next_slot
        if ring.ready(slot):
            return self._drop("DROP_OVERFLOW")
        offset = slot * ring.slot_size
        memoryview(ring.memory).cast("B")[offset:offset + length] = \
            memoryview(frame)[_HEAD:end]
        self.next_slot = (slot + 1) % ring.num_slots
        try:
            ring.publish(slot, length)
        except Exception:
            log.exception("ring.publish(%d, %d) raised; the request is dropped", slot, length)
            return self._drop("DROP_OVERFLOW")
        self.counters["RX_PUBLISHED"] += 1
        return RxResult(True, "RX_PUBLISHED", slot=slot, length_bytes=length)

    def response_frame(self, response: bytes | bytearray | memoryview) -> bytes:
        """The frame of one response datagram (RPCResponse and result) to the QSC, with its
        IPv4 and UDP checksums. Raises :class:`FieldRangeError` for a response that does not fit
        one datagram."""
        n = len(response)
        if n > 0xFFFF - _IP - _UDP:
            raise FieldRangeError("UDP", "length", _UDP + n, "does not fit one datagram")
        frame = bytearray(self._template)
        frame += response
        struct.pack_into("!H", frame, _ETH + 2, _IP + _UDP + n)
        frame[_ETH + 10:_ETH + 12] = b"\0\0"
        struct.pack_into("!H", frame, _ETH + 10, ~ones_complement_sum(frame[_ETH:_ETH + _IP])
                         & 0xFFFF)
        struct.pack_into("!H", frame, _ETH + _IP + 4, _UDP + n)
        struct.pack_into("!H", frame, _ETH + _IP + 6,
                         udp_checksum(self.local_ip, self.remote_ip, frame[_ETH + _IP:]))
        if len(frame) < 60:
            frame += bytes(60 - len(frame))
        self.counters["TX_FRAMES"] += 1
        return bytes(frame)
