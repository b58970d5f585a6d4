"""UDP bridge: the host side of a QSC over the kernel's UDP/IPv4 sockets (no root, no RDMA NIC).

:class:`UdpSocketTransport` is a :class:`~openqlink.bridges.base.FrameTransport` whose frames
travel through ordinary ``AF_INET``/``SOCK_DGRAM`` sockets, so the host code above it (the
control client, the host UC QPs' RDMA WRITEs and SENDs, the UDP call ports) runs unchanged:

* **Send**: the frame must be Ethernet II + IPv4 (no options, from this host's address) + UDP;
  its UDP payload goes out with ``sendto`` from a socket bound to the frame's source port, to
  its destination address and port. The kernel writes the Ethernet, IPv4 and UDP headers again:
  it resolves the QSC's MAC by ARP (the QSC answers ARP), and sends with DF set and
  identification 0 (an unconnected socket with ``IP_PMTUDISC_DO``), the header the host's frame
  builders make (:func:`openqlink.wire.packet.build_udp_frame`). That matters for RoCEv2: the
  ICRC of an RDMA WRITE or SEND covers the IPv4 identification and flags (IBTA Vol 1 Annex
  A17.4.4 masks only TOS, TTL and the checksums), so a RoCEv2 frame whose header is not DF with
  identification 0 is refused (:class:`~openqlink.errors.FieldRangeError`), as the QSC would drop
  it. Sockets that carry RoCEv2 (destination port 4791) send a UDP checksum of 0
  (``SO_NO_CHECK``), as RoCE NICs do.
* **Receive**: every datagram to one of the bound ports (:meth:`bind_port`, and every source
  port this transport has sent from) is handed up as a frame rebuilt around it: Ethernet from
  the QSC's MAC (``qsc_mac``, else the destination MAC of the frames sent to that address) to
  this host's, IPv4 and UDP with the addresses and ports the kernel reported, UDP checksum 0 (the
  kernel has verified the one that came). The source MAC is therefore not checked here: the
  kernel's neighbour table is what ties the QSC's IP to its MAC.

The QSC's RPC requests reach such a host only in its UDP transport (the QP's TRANSPORT register,
CUDA-Q realtime's ``udp`` bridge format; :mod:`openqlink.udpcall`): RoCEv2 requests arrive at UDP
port 4791, which a RoCE NIC's driver owns, and their ICRC covers the QSC's IPv4 header, which a
socket does not report.

# Ref: Linux udp(7), ip(7) (IP_MTU_DISCOVER, IP_PMTUDISC_DO), socket(7) (SO_NO_CHECK); Linux
# net/ipv4 ip_select_ident_segs (identification 0 for DF datagrams of unconnected sockets);
# RFC 768; RFC 791; IBTA Vol 1 Annex A17.4.4 (ICRC's masked fields).
"""

from __future__ import annotations

import fcntl
import os
import select
import socket
import struct
import threading
import time
from collections import deque

from ..errors import FieldRangeError, QlinkError
from ..wire.ethernet import EtherType, int_to_mac, mac_to_int
from ..wire.ipv4 import IpProtocol, int_to_ip, ip_to_int
from ..wire.packet import UDP_FRAME_HEADERS, build_udp_frame
from ..wire.udp import ROCEV2_PORT
from .base import FrameTransport, TransportClosedError

__all__ = ["UdpSocketTransport", "route_to", "interface_of", "interface_ip", "BridgeSetupError"]

_SO_NO_CHECK = 11
_IP_MTU_DISCOVER = 10
_IP_PMTUDISC_DO = 2
_SIOCGIFADDR = 0x8915
_SIOCGIFHWADDR = 0x8927
_MAX_DATAGRAM_BYTES = 65535


class BridgeSetupError(QlinkError, OSError):
    """A bridge could not be set up: a socket, address or interface the host lacks (the
    message names it)."""


def route_to(ip: str | int) -> str:
    """This host's IPv4 address on the route to ``ip`` (what the kernel would send from), as a
    dotted string. Raises :class:`BridgeSetupError` when there is no route."""
    dst = int_to_ip(ip_to_int(ip))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((dst, 9))
        except OSError as e:
            raise BridgeSetupError(f"no route to {dst}: {e.strerror or e}") from None
        return s.getsockname()[0]


def interface_ip(ifname: str) -> str | None:
    """The IPv4 address of interface ``ifname`` (``SIOCGIFADDR``), or ``None`` when it has
    none or does not exist."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            res = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", ifname.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(res[20:24])


def interface_of(ip: str | int) -> tuple[str, str] | None:
    """``(interface name, MAC "aa:bb:..")`` of the interface that holds IPv4 address ``ip``, or
    ``None`` when no interface holds it. Interfaces without a MAC (loopback) give
    ``"00:00:00:00:00:00"``."""
    want = int_to_ip(ip_to_int(ip))
    for _, name in socket.if_nameindex():
        if interface_ip(name) != want:
            continue
        # SIOCGIFHWADDR answers for the socket's network namespace (/sys/class/net may show
        # another one's)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                res = fcntl.ioctl(s.fileno(), _SIOCGIFHWADDR,
                                  struct.pack("256s", name.encode()[:15]))
                mac = int.from_bytes(res[18:24], "big")
            except OSError:
                mac = 0
        return name, int_to_mac(mac)
    return None


class UdpSocketTransport(FrameTransport):
    """A :class:`FrameTransport` to the QSC at ``qsc_ip`` through the kernel's UDP sockets.

    Parameters
    ----------
    qsc_ip : str | int
        The QSC's IPv4 address.
    host_ip : str | int | None
        This host's address, the source of every datagram (sockets bind to it). ``None``: the
        address on the kernel's route to ``qsc_ip``.
    qsc_mac : str | bytes | int | None
        Source MAC of the frames handed up. ``None``: the destination MAC of the last frame
        sent to the datagram's source address (the host always speaks first: the control
        plane's VERSION read), else the all-zero MAC.
    rcvbuf_bytes : int
        Receive buffer requested for every socket.

    Attributes
    ----------
    host_ip : str
    mac : str
        This host's MAC (of the interface that holds ``host_ip``; all zero for loopback): what
        the QSC is told to send to.
    ifname : str | None
        That interface.
    sent, received : int
        Datagrams sent and handed up.

    Raises :class:`BridgeSetupError` when ``host_ip`` is not this host's or a port is taken.
    Thread safety: one thread may send while another receives.
    """

    def __init__(self, qsc_ip: str | int, *, host_ip: str | int | None = None,
                 qsc_mac: str | bytes | int | None = None, rcvbuf_bytes: int = 1 << 20):
        self.qsc_ip = int_to_ip(ip_to_int(qsc_ip))
        self.host_ip = route_to(self.qsc_ip) if host_ip is None else int_to_ip(ip_to_int(host_ip))
        found = interface_of(self.host_ip)
        if found is None:
            raise BridgeSetupError(f"host_ip {self.host_ip} is not an address of this host "
                                   "(ip -4 addr)")
        self.ifname, self.mac = found
        self._host_ip_int = ip_to_int(self.host_ip)
        self._host_mac_int = mac_to_int(self.mac)
        self._qsc_mac = None if qsc_mac is None else mac_to_int(qsc_mac)
        self._peer_macs: dict[int, int] = {}
        self._rcvbuf_bytes = rcvbuf_bytes
        self._socks: dict[int, socket.socket] = {}
        self._by_fd: dict[int, tuple[socket.socket, int]] = {}
        self._lock = threading.Lock()
        self._poll = select.poll()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poll.register(self._wake_r, select.POLLIN)
        self._pending: deque[bytes] = deque()
        self._closed = False
        self.sent = 0
        self.received = 0

    # --- sockets --------------------------------------------------------------------------------

    def bind_port(self, port: int) -> int:
        """Receive the datagrams sent to ``port`` of ``host_ip`` (0: a free port); return the
        port. Idempotent. Raises :class:`BridgeSetupError` when the port is taken."""
        if self._closed:
            raise TransportClosedError("bind_port on a closed UdpSocketTransport")
        if not 0 <= port <= 0xFFFF:
            raise FieldRangeError("UDP", "port", port, "a UDP port is 0..65535")
        with self._lock:
            if port and port in self._socks:
                return port
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                s.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_DO)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._rcvbuf_bytes)
                s.bind((self.host_ip, port))
            except OSError as e:
                s.close()
                raise BridgeSetupError(f"UDP port {port} on {self.host_ip}: "
                                       f"{e.strerror or e}") from None
            s.setblocking(False)
            port = s.getsockname()[1]
            self._socks[port] = s
            self._by_fd[s.fileno()] = (s, port)
            self._poll.register(s.fileno(), select.POLLIN)
        self._wake()                     # a receiver waiting in poll() takes the new port
        return port

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass                         # already woken

    def _socket(self, port: int) -> socket.socket:
        s = self._socks.get(port)
        if s is None:
            self.bind_port(port)
            s = self._socks[port]
        return s

    # --- FrameTransport -------------------------------------------------------------------------

    def send_frame(self, frame: bytes) -> None:
        """Send the UDP payload of ``frame`` from its source port to its destination.

        Raises :class:`FieldRangeError` naming the field of a frame the kernel cannot send as
        built (not IPv4 + UDP, IPv4 options, another source address, a RoCEv2 frame whose
        header is not DF with identification 0, a UDP length beyond the frame), and
        :class:`TransportClosedError` after :meth:`close`.
        """
        if self._closed:
            raise TransportClosedError("send_frame on a closed UdpSocketTransport")
        if len(frame) < 42:
            raise FieldRangeError("Ethernet", "length", len(frame),
                                  "shorter than Ethernet + IPv4 + UDP headers (42 bytes)")
        (dst_mac, _, ethertype, vihl, _tos, _total, ident, flags_frag, _ttl, proto, _csum, src,
         dst, sport, dport, ulen, _ucsum) = UDP_FRAME_HEADERS.unpack_from(frame)
        if ethertype != EtherType.IPV4:
            raise FieldRangeError("Ethernet", "ethertype", ethertype, "only IPv4 goes by UDP")
        if vihl != 0x45:
            raise FieldRangeError("IPv4", "ihl", vihl & 0xF, "no IPv4 options on a UDP socket")
        if proto != IpProtocol.UDP:
            raise FieldRangeError("IPv4", "protocol", proto, "only UDP goes by a UDP socket")
        if src != self._host_ip_int:
            raise FieldRangeError("IPv4", "src", int_to_ip(src),
                                  f"this transport sends from {self.host_ip}")
        if dport == ROCEV2_PORT and (ident != 0 or flags_frag != 0x4000):
            raise FieldRangeError("IPv4", "identification" if ident else "flags",
                                  ident or flags_frag >> 13,
                                  "the kernel sends DF with identification 0: the ICRC must "
                                  "cover that header")
        if not 8 <= ulen <= len(frame) - 34:
            raise FieldRangeError("UDP", "length", ulen, f"a {len(frame)}-byte frame holds "
                                  f"8..{len(frame) - 34} bytes of UDP")
        dst_ip = int_to_ip(dst)
        self._peer_macs[dst] = int.from_bytes(dst_mac, "big")
        s = self._socket(sport)
        if dport == ROCEV2_PORT:
            s.setsockopt(socket.SOL_SOCKET, _SO_NO_CHECK, 1)
        try:
            s.sendto(memoryview(frame)[42:34 + ulen], (dst_ip, dport))
        except BlockingIOError:
            # A full send buffer: wait for room (the kernel drains it at line rate).
            select.select([], [s], [], 1.0)
            s.sendto(memoryview(frame)[42:34 + ulen], (dst_ip, dport))
        self.sent += 1

    def _frame(self, payload: bytes, src: tuple[str, int], port: int) -> bytes:
        src_ip = ip_to_int(src[0])
        src_mac = self._qsc_mac if self._qsc_mac is not None else \
            self._peer_macs.get(src_ip, 0)
        return build_udp_frame(dst_mac=self._host_mac_int, src_mac=src_mac, src_ip=src_ip,
                               dst_ip=self._host_ip_int, src_port=src[1], dst_port=port,
                               payload=payload)

    def _drain(self, fd: int) -> None:
        entry = self._by_fd.get(fd)
        if entry is None:
            return
        s, port = entry
        while True:
            try:
                payload, src = s.recvfrom(_MAX_DATAGRAM_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return      # e.g. ICMP port unreachable reported on this socket
            self._pending.append(self._frame(payload, src, port))

    def recv_frame(self, timeout_s: float | None = None) -> bytes | None:
        """The next datagram to a bound port as a frame, or ``None`` after ``timeout_s``
        seconds. A port bound while this waits is waited on too. Raises
        :class:`TransportClosedError` after :meth:`close` (also when :meth:`close` ends the
        wait)."""
        if self._closed:
            raise TransportClosedError("recv_frame on a closed UdpSocketTransport")
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        while not self._pending:
            wait_ms = -1 if deadline is None else \
                max(0, round((deadline - time.monotonic()) * 1000))
            for fd, _ in self._poll.poll(wait_ms):
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)    # a port bound, or close()
                    except BlockingIOError:
                        pass
                else:
                    self._drain(fd)
            if self._closed:
                raise TransportClosedError("recv_frame: the transport was closed")
            if not self._pending and deadline is not None and time.monotonic() >= deadline:
                return None
        self.received += 1
        return self._pending.popleft()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake()
        with self._lock:
            for s in self._socks.values():
                s.close()
            self._socks.clear()
            self._by_fd.clear()
        os.close(self._wake_w)

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
            os.close(self._wake_r)
        except (AttributeError, OSError):
            pass
