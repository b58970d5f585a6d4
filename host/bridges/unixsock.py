"""Socket bridge: whole Ethernet frames over a local Unix domain ``SOCK_SEQPACKET`` socket.

:class:`SocketTransport` is a :class:`~openqlink.bridges.base.FrameTransport` whose wire is a
connected ``AF_UNIX``/``SOCK_SEQPACKET`` socket: one message is one Ethernet frame (destination
MAC first, no FCS), in order, never split or merged. Its peer is the simulated QSC of ``qlink
sim --serve PATH`` (:class:`openqlink.sim.socket_port.SocketPort` attaches the QSC's Ethernet
port to the socket at ``PATH``: every message goes into the QSC's receive port, every frame the
QSC sends comes back as a message), or another :class:`SocketTransport` (:meth:`pair`). No
address is looked at on the way: the host code above it (control plane, RoCEv2 UC, UDP calls)
builds and checks its frames as on any other bridge.

Time is wall-clock (:meth:`~openqlink.bridges.base.FrameTransport.now_s`): a simulated QSC
answers thousands of times slower than a board, so its client's control-plane time-out must be
long (:class:`openqlink.sim.SimulatedQSC` sets it).

# Ref: Linux unix(7) (SOCK_SEQPACKET: connection-oriented, message boundaries kept, a read of
# 0 bytes is the peer's end), socket(7), poll(2).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import threading
import time

from .base import FrameTransport, TransportClosedError
from .udp import BridgeSetupError

__all__ = ["SocketTransport", "MAX_FRAME_BYTES", "SUN_PATH_BYTES", "check_socket_path"]

#: The largest frame a message may carry (a jumbo frame of a 4096-byte path MTU fits).
MAX_FRAME_BYTES = 65535
#: ``sun_path``'s room in ``struct sockaddr_un`` on Linux, the terminating NUL included.
SUN_PATH_BYTES = 108


def check_socket_path(path: str | os.PathLike[str]) -> str:
    """``path`` as a string, if it can name a Unix socket (1..107 bytes as the file system
    encodes it). Raises :class:`BridgeSetupError` naming the path otherwise."""
    text = os.fspath(path)
    raw = os.fsencode(text)
    if not raw or len(raw) >= SUN_PATH_BYTES or b"\0" in raw:
        raise BridgeSetupError(f"socket {text!r}: a Unix socket's path is 1 to "
                               f"{SUN_PATH_BYTES - 1} bytes (this one is {len(raw)})")
    return text


class SocketTransport(FrameTransport):
    """A :class:`FrameTransport` over a connected Unix ``SOCK_SEQPACKET`` socket.

    Parameters
    ----------
    path : str | os.PathLike | None
        The listening socket to connect to (``qlink sim --serve PATH``). Give it or ``sock``.
    sock : socket.socket | None
        An already connected ``AF_UNIX``/``SOCK_SEQPACKET`` socket to take over (owned: closed
        by :meth:`close`), e.g. one end of :func:`socket.socketpair`.
    connect_timeout_s : float
        With ``path``: keep trying for this many seconds while nothing listens there yet (the
        path is missing or refuses); 0 (default) tries once.

    Attributes
    ----------
    path : str | None
    mac : str
        ``"00:00:00:00:00:00"``: the socket has no link-layer address; the host's MAC is any
        the QSC is told to send to (every frame comes back through the socket).
    sent, received : int
        Frames sent and returned by :meth:`recv_frame`.
    peer_closed : bool
        The peer ended the connection (then every call raises :class:`TransportClosedError`).

    Back-pressure: :meth:`send_frame` waits while the peer's receive queue is full (a
    simulation takes frames at its own pace); :meth:`close` ends that wait. Thread safety:
    one thread may send while another receives; :meth:`close` from any thread wakes both.

    Raises :class:`~openqlink.bridges.udp.BridgeSetupError` (one line naming the path) when
    the path is too long, nothing listens there, or it is not a socket.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 sock: socket.socket | None = None, connect_timeout_s: float = 0.0):
        if (path is None) == (sock is None):
            raise ValueError("SocketTransport: give a path or a connected socket, not "
                             + ("both" if sock is not None else "neither"))
        self.path: str | None = None
        if sock is None:
            self.path = check_socket_path(path)  # type: ignore[arg-type]
            sock = self._connect(self.path, connect_timeout_s)
        elif sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
            raise ValueError("SocketTransport takes an AF_UNIX SOCK_SEQPACKET socket")
        sock.setblocking(False)
        self._sock = sock
        self._fd = sock.fileno()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._rx_lock = threading.Lock()
        self._tx_lock = threading.Lock()
        self._closed = False
        self.peer_closed = False
        self.mac = "00:00:00:00:00:00"
        self.sent = 0
        self.received = 0

    @staticmethod
    def _connect(path: str, timeout_s: float) -> socket.socket:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                sock.connect(path)
                return sock
            except OSError as exc:
                sock.close()
                waiting = exc.errno in (errno.ENOENT, errno.ECONNREFUSED)
                if not waiting or time.monotonic() >= deadline:
                    why = ("nothing listens there" if waiting
                           else "not a socket" if exc.errno in (errno.ENOTSOCK,
                                                                errno.EPROTOTYPE)
                           else exc.strerror or str(exc))
                    raise BridgeSetupError(f"socket {path}: {why}") from None
            time.sleep(0.05)

    @classmethod
    def pair(cls) -> tuple[SocketTransport, SocketTransport]:
        """Two connected transports (:func:`socket.socketpair`): what one sends, the other
        receives."""
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        return cls(sock=a), cls(sock=b)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _check(self, what: str) -> None:
        if self._closed:
            raise TransportClosedError(f"{what} on a closed SocketTransport")
        if self.peer_closed:
            raise TransportClosedError(f"{what}: the peer closed the socket"
                                       + (f" {self.path}" if self.path else ""))

    def _wait(self, events: int, deadline: float | None) -> bool:
        """Wait until the socket has ``events`` (True), the deadline passes (False), or
        :meth:`close` wakes this wait (raises)."""
        poller = select.poll()
        poller.register(self._fd, events)
        poller.register(self._wake_r, select.POLLIN)
        wait_ms = -1 if deadline is None else max(0, round((deadline - time.monotonic()) * 1e3))
        ready = poller.poll(wait_ms)
        if self._closed:
            raise TransportClosedError("the SocketTransport was closed while waiting")
        return any(fd == self._fd for fd, _ in ready)

    def send_frame(self, frame: bytes) -> None:
        """Send ``frame`` as one message; waits while the peer's queue is full.

        Raises :class:`TransportClosedError` after :meth:`close` (also when it ends the wait)
        or once the peer has closed the socket, and :class:`ValueError` for an empty frame or
        one over :data:`MAX_FRAME_BYTES`."""
        if not 0 < len(frame) <= MAX_FRAME_BYTES:
            raise ValueError(f"a frame is 1..{MAX_FRAME_BYTES} bytes, not {len(frame)}")
        with self._tx_lock:
            self._check("send_frame")
            while True:
                try:
                    self._sock.send(frame)
                    break
                except (BlockingIOError, InterruptedError):
                    self._wait(select.POLLOUT, None)
                except OSError as exc:
                    if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                        self.peer_closed = True
                        self._check("send_frame")
                    raise
            self.sent += 1

    def recv_frame(self, timeout_s: float | None = None) -> bytes | None:
        """The next message, or ``None`` when none arrives within ``timeout_s`` seconds
        (``None``: no limit; 0: never waits).

        Raises :class:`TransportClosedError` after :meth:`close` (also when it ends the wait)
        and once the peer has closed the socket (its queued frames are received first)."""
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        with self._rx_lock:
            self._check("recv_frame")
            while True:
                try:
                    frame = self._sock.recv(MAX_FRAME_BYTES)
                except (BlockingIOError, InterruptedError):
                    if not self._wait(select.POLLIN, deadline):
                        return None     # the deadline passed
                    continue
                except OSError as exc:
                    if exc.errno != errno.ECONNRESET:
                        raise
                    frame = b""
                if not frame:           # the peer's end (a frame is never empty)
                    self.peer_closed = True
                    self._check("recv_frame")
                self.received += 1
                return frame

    def close(self) -> None:
        """Close the socket (the peer sees the end of the connection) and wake a sender or
        receiver waiting in another thread, which then raises
        :class:`TransportClosedError`. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            os.write(self._wake_w, b"x")      # stays unread: every later wait wakes at once
        except BlockingIOError:
            pass
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        with self._rx_lock, self._tx_lock:
            self._sock.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def __repr__(self) -> str:
        where = self.path or "socket pair"
        state = "closed" if self._closed else "peer closed" if self.peer_closed else "open"
        return f"<SocketTransport {where} ({state})>"

