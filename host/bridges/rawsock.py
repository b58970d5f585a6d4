"""Raw Ethernet transport over a Linux ``AF_PACKET`` socket: the host side of a board on a NIC.

The socket is bound to one interface with protocol ``ETH_P_ALL``: it sends frames as given
(destination MAC first; the NIC or driver adds the FCS and, for short frames, padding) and
receives every frame the interface receives, minus those this host sends. It needs
``CAP_NET_RAW`` (root).

Receive goes through a ``PACKET_MMAP`` ring (``TPACKET_V2``, :data:`RX_RING_FRAMES` frames of
:data:`RX_FRAME_BYTES` shared with the kernel) by default: a frame already in the ring is taken
with no system call, and a burst is read from memory as it queued; ``rx_ring_frames=0`` uses
one ``recvfrom`` per frame instead. Send goes through a ``PACKET_TX_RING`` beside it
(:data:`TX_RING_FRAMES` frames of :data:`TX_FRAME_BYTES`) by default: :meth:`send_frames`
writes a batch (an upload's packets) into the ring and hands it to the kernel with one system
call; ``tx_ring_frames=0`` uses one ``send`` per frame.

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
_PACKET_TX_RING = 13
_TP_STATUS_AVAILABLE = 0
_TP_STATUS_SEND_REQUEST = 1
_TP_STATUS_WRONG_FORMAT = 4
#: Where a TPACKET_V2 transmit frame's data starts: TPACKET_ALIGN(sizeof(tpacket2_hdr)).
_TX_DATA_AT = 32
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
#: Frames in the transmit ring and the bytes of each (frames up to TX_FRAME_BYTES - 32 bytes).
TX_RING_FRAMES = 64
TX_FRAME_BYTES = 16384


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
    tx_ring_frames : int
        Frames of the ``PACKET_TX_RING`` (a power of 2; 0: no ring, one ``send`` per frame);
        the same fallback. A batch longer than the ring goes in ring-sized parts.

    Attributes
    ----------
    mac : str
        The interface's MAC address, ``"aa:bb:cc:dd:ee:ff"``.
    rx_ring, tx_ring : bool
        Whether frames are received, and sent, through the rings.
    truncated : int
        Frames longer than the ring's frames, dropped.

    Raises :class:`OSError` (``PermissionError`` without ``CAP_NET_RAW``, ``OSError(ENODEV)`` for an
    unknown interface) and :class:`RuntimeError` on a system without ``AF_PACKET``.
    """

    def __init__(self, ifname: str, *, promiscuous: bool = False,
                 rcvbuf_bytes: int = 4 << 20, rx_ring_frames: int = RX_RING_FRAMES,
                 tx_ring_frames: int = TX_RING_FRAMES):
        for name, n in (("rx_ring_frames", rx_ring_frames), ("tx_ring_frames", tx_ring_frames)):
            if n < 0 or n & (n - 1):
                raise ValueError(f"{name} must be 0 or a power of 2, not {n}")
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
        self._map: mmap.mmap | None = None
        self._ring_frames = 0
        self._ring_at = 0
        self._tx: memoryview | None = None
        self._tx_frames = 0
        self._tx_at = 0
        self.truncated = 0
        if rx_ring_frames or tx_ring_frames:
            self._open_rings(rx_ring_frames, tx_ring_frames)
        self.rx_ring = self._ring is not None
        self.tx_ring = self._tx is not None
        self._send_lock = threading.Lock()
        addr = self._sock.getsockname()[4]
        self.mac = ":".join(f"{b:02x}" for b in addr[:6])
        self._recv_lock = threading.Lock()
        # close() writes here to wake a receiver blocked in select()
        self._wake_r, self._wake_w = os.pipe()
        self.closed = False

    def _open_rings(self, rx_frames: int, tx_frames: int) -> None:
        """Set up the TPACKET_V2 receive and transmit rings, mapped together (receive ring
        first); on a kernel that refuses them, stay on recvfrom and send."""
        def req(frame_bytes: int, frames: int) -> bytes:
            block = max(frame_bytes, mmap.PAGESIZE)
            return struct.pack("IIII", block, frames // (block // frame_bytes), frame_bytes,
                               frames)

        rx_bytes, tx_bytes = rx_frames * RX_FRAME_BYTES, tx_frames * TX_FRAME_BYTES
        try:
            self._sock.setsockopt(_SOL_PACKET, _PACKET_VERSION, _TPACKET_V2)
            if rx_frames:
                self._sock.setsockopt(_SOL_PACKET, _PACKET_RX_RING,
                                      req(RX_FRAME_BYTES, rx_frames))
            if tx_frames:
                self._sock.setsockopt(_SOL_PACKET, _PACKET_TX_RING,
                                      req(TX_FRAME_BYTES, tx_frames))
            self._map = mmap.mmap(self._sock.fileno(), rx_bytes + tx_bytes, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            return
        if rx_frames:
            self._ring = self._map
            self._ring_frames = rx_frames
        if tx_frames:
            self._tx = memoryview(self._map)[rx_bytes:]
            self._tx_frames = tx_frames

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
        self.send_frames([frame])

    def send_frames(self, frames: list[bytes]) -> None:
        """Send ``frames`` in order: through the transmit ring, one system call a batch of up
        to ``tx_ring_frames``, or one ``send`` each. Raises :class:`TransportClosedError` after
        :meth:`close`, :class:`ValueError` for a frame larger than a ring frame
        (``TX_FRAME_BYTES - 32``), :class:`OSError` when the kernel refuses a frame."""
        if self.closed:
            raise TransportClosedError(f"send_frame on closed RawSocketTransport({self.ifname})")
        too_big = next((len(f) for f in frames if len(f) > TX_FRAME_BYTES - _TX_DATA_AT), None)
        if self._tx is not None and too_big is not None:
            raise ValueError(f"a {too_big}-byte frame does not fit a {TX_FRAME_BYTES}-byte "
                             "transmit ring frame: nothing of the batch was sent")
        with self._send_lock:
            if self._tx is None:
                for frame in frames:
                    self._sock.send(bytes(frame))
                return
            for start in range(0, len(frames), self._tx_frames):
                self._ring_send(frames[start:start + self._tx_frames])

    def _ring_send(self, frames: list[bytes]) -> None:
        tx = self._tx
        assert tx is not None
        for frame in frames:
            n = len(frame)
            at = self._tx_at * TX_FRAME_BYTES
            status = _U32.unpack_from(tx, at)[0]
            if status not in (_TP_STATUS_AVAILABLE, _TP_STATUS_WRONG_FORMAT):
                # the kernel still holds it: let it send what is queued, then look again
                self._sock.send(b"")
                status = _U32.unpack_from(tx, at)[0]
                if status not in (_TP_STATUS_AVAILABLE, _TP_STATUS_WRONG_FORMAT):
                    raise OSError(f"RawSocketTransport({self.ifname}): transmit ring frame "
                                  f"{self._tx_at} still held by the kernel (status {status})")
            tx[at + _TX_DATA_AT:at + _TX_DATA_AT + n] = frame
            _U32.pack_into(tx, at + 4, n)                     # tp_len
            _U32.pack_into(tx, at, _TP_STATUS_SEND_REQUEST)   # the kernel's from here on
            self._tx_at = (self._tx_at + 1) % self._tx_frames
        self._sock.send(b"")    # sends every frame marked SEND_REQUEST; waits until they went

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
        with self._recv_lock, self._send_lock:   # the receiver has left select(): fds can go
            if self._tx is not None:
                self._tx.release()
            if self._map is not None:
                self._map.close()
            self._sock.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
