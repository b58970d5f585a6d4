"""Raw Ethernet transport over a Linux ``AF_PACKET`` socket: the host side of a board on a NIC.

The socket is bound to one interface with protocol ``ETH_P_ALL``: it sends frames as given
(destination MAC first; the NIC or driver adds the FCS and, for short frames, padding) and
receives every frame the interface receives, minus those this host sends. It needs
``CAP_NET_RAW`` (root).

# Ref: Linux packet(7) (AF_PACKET, SOCK_RAW, PACKET_ADD_MEMBERSHIP, PACKET_IGNORE_OUTGOING);
# IEEE 802.3-2018 3.2.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
import threading

from .base import FrameTransport, TransportClosedError

__all__ = ["RawSocketTransport"]

_ETH_P_ALL = 0x0003
_SOL_PACKET = 263
_PACKET_ADD_MEMBERSHIP = 1
_PACKET_MR_PROMISC = 1
_PACKET_IGNORE_OUTGOING = 23   # Linux 4.20 and later
_PACKET_OUTGOING = 4           # sll_pkttype of frames this host sent
_MAX_FRAME_BYTES = 65535


class RawSocketTransport(FrameTransport):
    """A :class:`FrameTransport` on the Linux network interface ``ifname``.

    Parameters
    ----------
    ifname : str
        Interface name (``"eth0"``, a TAP or veth end).
    promiscuous : bool
        Also receive frames addressed to other MACs (e.g. to watch a board's traffic on a shared
        segment). Off by default: the host normally receives frames for its own MAC and broadcast.
    rcvbuf_bytes : int
        Socket receive buffer requested from the kernel (bursts of RPC requests queue there while
        the dispatcher is busy).

    Attributes
    ----------
    mac : str
        The interface's MAC address, ``"aa:bb:cc:dd:ee:ff"``.

    Raises :class:`OSError` (``PermissionError`` without ``CAP_NET_RAW``, ``OSError(ENODEV)`` for an
    unknown interface) and :class:`RuntimeError` on a system without ``AF_PACKET``.
    """

    def __init__(self, ifname: str, *, promiscuous: bool = False,
                 rcvbuf_bytes: int = 4 << 20):
        if not hasattr(socket, "AF_PACKET") or not sys.platform.startswith("linux"):
            raise RuntimeError("RawSocketTransport needs Linux AF_PACKET sockets")
        self.ifname = ifname
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
        try:
            self._sock.bind((ifname, _ETH_P_ALL))
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
            try:
                self._sock.setsockopt(_SOL_PACKET, _PACKET_IGNORE_OUTGOING, 1)
            except OSError:
                pass  # older kernels: outgoing frames are filtered by pkttype in recv_frame
            if promiscuous:
                ifindex = socket.if_nametoindex(ifname)
                mreq = struct.pack("iHH8s", ifindex, _PACKET_MR_PROMISC, 0, b"")
                self._sock.setsockopt(_SOL_PACKET, _PACKET_ADD_MEMBERSHIP, mreq)
        except BaseException:
            self._sock.close()
            raise
        addr = self._sock.getsockname()[4]
        self.mac = ":".join(f"{b:02x}" for b in addr[:6])
        self._recv_lock = threading.Lock()
        # close() writes here to wake a receiver blocked in select()
        self._wake_r, self._wake_w = os.pipe()
        self.closed = False

    def fileno(self) -> int:
        """The socket's file descriptor (for ``select``-driven loops)."""
        return self._sock.fileno()

    def send_frame(self, frame: bytes) -> None:
        if self.closed:
            raise TransportClosedError(f"send_frame on closed RawSocketTransport({self.ifname})")
        self._sock.send(bytes(frame))

    def recv_frame(self, timeout_s: float | None = None) -> bytes | None:
        """The next frame received (FCS stripped), or ``None`` after ``timeout_s`` seconds
        (``None``: wait as long as it takes). Raises :class:`TransportClosedError` when the
        transport is closed, also while a call waits here (:meth:`close` wakes it)."""
        if self.closed:
            raise TransportClosedError(f"recv_frame on closed RawSocketTransport({self.ifname})")
        deadline = None if timeout_s is None else self.now_s() + max(0.0, timeout_s)
        with self._recv_lock:
            while True:
                wait = None if deadline is None else max(0.0, deadline - self.now_s())
                ready, _, _ = select.select([self._sock, self._wake_r], [], [], wait)
                if self.closed:
                    raise TransportClosedError(f"RawSocketTransport({self.ifname}) was closed "
                                               "while receiving")
                if not ready:
                    return None
                frame, address = self._sock.recvfrom(_MAX_FRAME_BYTES)
                if address[2] != _PACKET_OUTGOING:
                    return frame
                if deadline is not None and self.now_s() >= deadline:
                    return None

    def close(self) -> None:
        """Close the socket; a receiver waiting in :meth:`recv_frame` wakes and raises
        :class:`TransportClosedError`. Idempotent."""
        if self.closed:
            return
        self.closed = True
        os.write(self._wake_w, b"x")
        with self._recv_lock:         # the receiver has left select(): the fds can go
            self._sock.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
