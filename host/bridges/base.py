"""The abstract layer-2 transport of the host, and an in-process transport pair for tests.

A transport moves whole Ethernet frames (destination MAC through padding, no FCS): the same
frames :mod:`openqlink.wire.packet` builds and parses. Implementations: :class:`QueueTransport`
(in process), :class:`openqlink.bridges.rawsock.RawSocketTransport` (Linux ``AF_PACKET``),
:class:`openqlink.bridges.udp.UdpSocketTransport` (the kernel's UDP sockets),
:class:`openqlink.bridges.unixsock.SocketTransport` (a local socket to ``qlink sim --serve``), and
the cocotb bench's ``openqlink.sim.transport.SimTransport``.

# Ref: IEEE 802.3-2018 3.2 (the frame a transport carries); Glasgow ``abstract.py`` (one abstract
# interface with hardware and simulation implementations).
"""

from __future__ import annotations

import abc
import queue
import threading
import time
from types import TracebackType

from ..errors import QlinkError

__all__ = ["FrameTransport", "QueueTransport", "TransportClosedError", "transport_pair"]


class TransportClosedError(QlinkError, ConnectionError):
    """A frame was sent or received on a transport after its :meth:`~FrameTransport.close`."""


class FrameTransport(abc.ABC):
    """Sends and receives layer-2 frames.

    Implementations must be safe to call from two threads at once (one sending while another
    receives), as the dispatcher's loop and the user's API calls may share one transport.
    """

    @abc.abstractmethod
    def send_frame(self, frame: bytes) -> None:
        """Queue ``frame`` for transmission; returns without waiting for the wire.

        Raises :class:`TransportClosedError` after :meth:`close` (the sim transport raises
        :class:`RuntimeError`).
        """

    def send_frames(self, frames: list[bytes]) -> None:
        """Queue ``frames`` for transmission, in order; a transport that can hand the kernel a
        batch in one call (the raw bridge's ``PACKET_TX_RING``) does. Raises as
        :meth:`send_frame`."""
        for frame in frames:
            self.send_frame(frame)

    @abc.abstractmethod
    def recv_frame(self, timeout_s: float | None = None) -> bytes | None:
        """The next received frame, or ``None`` when none arrives within ``timeout_s``.

        ``timeout_s`` is in seconds of the transport's clock (:meth:`now_s`): ``None`` waits
        without limit (an implementation may cap one wait and return ``None``), ``0`` never waits.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the transport; idempotent."""

    def now_s(self) -> float:
        """The transport's clock in seconds, against which time-outs are measured.

        Wall-clock monotonic time by default; a simulation transport may return simulated time.
        """
        return time.monotonic()

    def __enter__(self) -> FrameTransport:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class QueueTransport(FrameTransport):
    """One end of an in-process frame link; make a connected pair with :func:`transport_pair`.

    Frames sent on one end arrive, in order, at the other end's :meth:`recv_frame`. Backed by
    :class:`queue.Queue` (thread safe, unbounded: no back-pressure, no loss). Frames sent to an
    end that has been closed are discarded and counted in ``dropped``, as on a cable whose far
    end is down.

    Attributes
    ----------
    sent, received, dropped : int
        Frames sent by this end, returned by :meth:`recv_frame`, and sent here after close.
    """

    def __init__(self) -> None:
        self._inbox: queue.Queue[bytes] = queue.Queue()
        self._peer: QueueTransport | None = None
        self._lock = threading.Lock()
        self.closed = False
        self.sent = 0
        self.received = 0
        self.dropped = 0

    def _deliver(self, frame: bytes) -> None:
        with self._lock:
            if self.closed:
                self.dropped += 1
                return
            self._inbox.put(frame)

    def send_frame(self, frame: bytes) -> None:
        if self.closed:
            raise TransportClosedError("send_frame on a closed QueueTransport")
        if self._peer is None:
            raise TransportClosedError("QueueTransport has no peer: use transport_pair()")
        self.sent += 1
        self._peer._deliver(bytes(frame))

    def recv_frame(self, timeout_s: float | None = None) -> bytes | None:
        if self.closed:
            raise TransportClosedError("recv_frame on a closed QueueTransport")
        try:
            if timeout_s is not None and timeout_s <= 0:
                frame = self._inbox.get_nowait()
            else:
                frame = self._inbox.get(timeout=timeout_s)
        except queue.Empty:
            return None
        self.received += 1
        return frame

    def pending(self) -> int:
        """Frames waiting to be received at this end."""
        return self._inbox.qsize()

    def close(self) -> None:
        with self._lock:
            self.closed = True


def transport_pair() -> tuple[QueueTransport, QueueTransport]:
    """Two connected :class:`QueueTransport` ends: what one sends, the other receives."""
    a, b = QueueTransport(), QueueTransport()
    a._peer, b._peer = b, a
    return a, b
