"""Raw Ethernet transport over a Linux ``AF_PACKET`` socket: the host side of a board on a NIC.

The socket is bound to one interface with protocol ``ETH_P_ALL``: it sends frames as given
(destination MAC first; the NIC or driver adds the FCS and, for short frames, padding) and
receives every frame the interface receives, minus those this host sends. It needs
``CAP_NET_RAW`` (root).

Receive goes through a ``PACKET_MMAP`` ring (``TPACKET_V2``, :data:`RX_RING_FRAMES` frames of
:data:`RX_FRAME_BYTES` shared with the kernel) by default: a frame already in the ring is taken
with no system call, and a burst is read from memory as it queued; ``rx_ring_frames=0`` uses
one ``recvfrom`` per frame instead.

# Ref: Linux packet(7) (AF_PACKET, SOCK_RAW, PACKET_ADD_MEMBERSHIP, PACKET_IGNORE_OUTGOING);
# Linux Documentation/networking/packet_mmap.rst (PACKET_RX_RING, TPACKET_V2, tp_status);
# IEEE 802.3-2018 3.2.
"""

from __future__ import annotations

import mmap
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
_PACKET_RX_RING = 5
_PACKET_VERSION = 10
_TPACKET_V2 = 1
_TP_STATUS_KERNEL = 0
_TP_STATUS_USER = 1
# struct tpacket2_hdr: tp_status, tp_len, tp_snaplen (u32), tp_mac, tp_net (u16), ...; the
# sockaddr_ll after it (TPACKET_ALIGN(32)) has sll_pkttype at byte 10.
_TPACKET2_HDR = struct.Struct("IIIHH")
_PKTTYPE_AT = 32 + 10
_U32 = struct.Struct("I")

#: Frames in the receive ring, and the bytes of each (tpacket2 header included: frames up to
#: RX_FRAME_BYTES - 64 bytes arrive whole, longer ones are dropped and counted).
RX_RING_FRAMES = 256
RX_FRAME_BYTES = 16384


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
        the dispatcher is busy), for ``rx_ring_frames=0``.
    rx_ring_frames : int
        Frames of the ``PACKET_MMAP`` receive ring (a power of 2; 0: no ring, one ``recvfrom``
        per frame). Where the kernel refuses the ring, the socket falls back to ``recvfrom``.

    Attributes
    ----------
    mac : str
        The interface's MAC address, ``"aa:bb:cc:dd:ee:ff"``.
    rx_ring : bool
        Whether frames are received through the ring.
    truncated : int
        Frames longer than the ring's frames, dropped.

    Raises :class:`OSError` (``PermissionError`` without ``CAP_NET_RAW``, ``OSError(ENODEV)`` for an
    unknown interface) and :class:`RuntimeError` on a system without ``AF_PACKET``.
    """

    def __init__(self, ifname: str, *, promiscuous: bool = False,
                 rcvbuf_bytes: int = 4 << 20, rx_ring_frames: int = RX_RING_FRAMES):
        if rx_ring_frames < 0 or rx_ring_frames & (rx_ring_frames - 1):
            raise ValueError(f"rx_ring_frames must be 0 or a power of 2, not {rx_ring_frames}")
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
        self._ring: mmap.mmap | None = None
        self._ring_frames = 0
        self._ring_at = 0
        self.truncated = 0
        if rx_ring_frames:
            self._open_ring(rx_ring_frames)
        self.rx_ring = self._ring is not None
        addr = self._sock.getsockname()[4]
        self.mac = ":".join(f"{b:02x}" for b in addr[:6])
        self._recv_lock = threading.Lock()
        # close() writes here to wake a receiver blocked in select()
        self._wake_r, self._wake_w = os.pipe()
        self.closed = False

    def _open_ring(self, frames: int) -> None:
        """Set up the TPACKET_V2 receive ring; on a kernel that refuses it, stay on recvfrom."""
        block = max(RX_FRAME_BYTES, mmap.PAGESIZE)
        per_block = block // RX_FRAME_BYTES
        try:
            self._sock.setsockopt(_SOL_PACKET, _PACKET_VERSION, _TPACKET_V2)
            req = struct.pack("IIII", block, frames // per_block, RX_FRAME_BYTES, frames)
            self._sock.setsockopt(_SOL_PACKET, _PACKET_RX_RING, req)
            self._ring = mmap.mmap(self._sock.fileno(), frames * RX_FRAME_BYTES,
                                   mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            self._ring = None
            return
        self._ring_frames = frames

    def _ring_take(self) -> bytes | None:
        """The next frame in the ring, released to the kernel; ``None`` when it is empty."""
        ring = self._ring
        assert ring is not None
        while True:
            at = self._ring_at * RX_FRAME_BYTES
            status, length, snaplen, mac, _net = _TPACKET2_HDR.unpack_from(ring, at)
            if not status & _TP_STATUS_USER:
                return None
            outgoing = ring[at + _PKTTYPE_AT] == _PACKET_OUTGOING
            frame = None if outgoing or snaplen < length else ring[at + mac:at + mac + snaplen]
            if not outgoing and snaplen < length:
                self.truncated += 1
            _U32.pack_into(ring, at, _TP_STATUS_KERNEL)
            self._ring_at = (self._ring_at + 1) % self._ring_frames
            if frame is not None:
                return frame

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
                if self._ring is not None:
                    frame = self._ring_take()
                    if frame is not None:
                        return frame
                wait = None if deadline is None else max(0.0, deadline - self.now_s())
                ready, _, _ = select.select([self._sock, self._wake_r], [], [], wait)
                if self.closed:
                    raise TransportClosedError(f"RawSocketTransport({self.ifname}) was closed "
                                               "while receiving")
                if not ready:
                    return None
                if self._ring is not None:
                    continue
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
            if self._ring is not None:
                self._ring.close()
            self._sock.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
