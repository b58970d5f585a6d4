"""A local socket as the simulated QSC's Ethernet port: the simulation's side of the socket
bridge.

``qlink sim --serve PATH`` attaches the gateware's MAC to a Unix domain ``SOCK_SEQPACKET``
socket listening at ``PATH``, as ``qlink sim --tap`` attaches it to a TAP
(:mod:`openqlink.sim.tap`): the messages of the one client that connects go into the simulated
QSC's receive port, one message per Ethernet frame, and every frame the QSC sends is written to
the client as one message. The client is
:class:`openqlink.bridges.unixsock.SocketTransport` (:class:`openqlink.sim.SimulatedQSC` makes
one), whose host code then reaches the simulated QSC as it reaches a board.

:class:`SocketPort` never waits: :meth:`SocketPort.read` takes the client's connection when it
comes and then its queued frames, one at a time, and :meth:`SocketPort.write` drops (and counts)
a frame the client's full queue cannot take, as a cable drops a frame nobody reads. Once a
client is connected the path is removed (a second client finds nothing there); when that client
closes its end, :attr:`SocketPort.client_closed` is set, and the bench ends the run.

# Ref: Linux unix(7) (SOCK_SEQPACKET), socket(7), accept(2).
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from ..bridges.unixsock import MAX_FRAME_BYTES, check_socket_path
from ..errors import QlinkError

__all__ = ["SocketPort", "SocketPortError", "check_serve_path"]


class SocketPortError(QlinkError, OSError):
    """The socket cannot be made at the path: the message says why in one line."""


def check_serve_path(path: str | os.PathLike[str]) -> str:
    """``path`` as an absolute path, if a run can listen there: it fits a socket's address,
    nothing exists there yet and its directory does. Raises :class:`SocketPortError` with a
    one-line reason otherwise."""
    from ..bridges.udp import BridgeSetupError

    text = os.path.abspath(os.fspath(path))
    try:
        check_socket_path(text)
    except BridgeSetupError as exc:
        raise SocketPortError(str(exc)) from None
    if os.path.lexists(text):
        raise SocketPortError(f"socket {text}: something exists there already (remove it, "
                              "or choose another path)")
    parent = Path(text).parent
    if not parent.is_dir():
        raise SocketPortError(f"socket {text}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise SocketPortError(f"socket {text}: directory {parent} is not writable")
    return text


class SocketPort:
    """A Unix ``SOCK_SEQPACKET`` socket listening at ``path`` for one client.

    Parameters
    ----------
    path : str | os.PathLike
        Where to listen (:func:`check_serve_path`: nothing may exist there). Removed once a
        client has connected, and by :meth:`close`.

    Attributes
    ----------
    path : str
    connected : bool
        A client is connected now.
    client_closed : bool
        The client connected and has closed its end since.
    frames_read, frames_written : int
        Frames taken from the client and sent to it.
    write_errors : int
        Frames the client could not take (no client yet, its queue full, or gone): lost.

    Raises :class:`SocketPortError` (one line) when the socket cannot be made there.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = check_serve_path(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            listener.bind(self.path)
            listener.listen(1)
        except OSError as exc:
            listener.close()
            raise SocketPortError(f"socket {self.path}: {exc.strerror or exc}") from None
        listener.setblocking(False)
        self._listener: socket.socket | None = listener
        self._client: socket.socket | None = None
        self._closed = False
        self.client_closed = False
        self.frames_read = 0
        self.frames_written = 0
        self.write_errors = 0

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def connected(self) -> bool:
        return self._client is not None

    def _accept(self) -> None:
        if self._listener is None:
            return
        try:
            client, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        client.setblocking(False)
        self._client = client
        self._stop_listening()

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def _lost(self) -> None:
        assert self._client is not None
        self._client.close()
        self._client = None
        self.client_closed = True

    def read(self) -> bytes | None:
        """The client's next frame, or ``None`` when it has queued none, no client has
        connected yet, or it has gone (see :attr:`client_closed`). Takes a waiting client's
        connection first. Never waits."""
        if self._closed:
            return None
        if self._client is None:
            self._accept()
            if self._client is None:
                return None
        try:
            frame = self._client.recv(MAX_FRAME_BYTES)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            frame = b""
        if not frame:                    # the client's end (a frame is never empty)
            self._lost()
            return None
        self.frames_read += 1
        return frame

    def write(self, frame: bytes) -> bool:
        """Send ``frame`` to the client as one message. Returns False, and counts it in
        :attr:`write_errors`, when there is no client or it cannot take the frame now."""
        if self._client is None:
            self.write_errors += 1
            return False
        try:
            self._client.send(frame)
        except (BlockingIOError, InterruptedError):
            self.write_errors += 1
            return False
        except OSError as exc:
            self.write_errors += 1
            if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                self._lost()
            return False
        self.frames_written += 1
        return True

    def close(self) -> None:
        """Close the client's connection (it sees the end) and stop listening; the path is
        removed. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._client is not None:
            self._client.close()
            self._client = None
        self._stop_listening()

    def __enter__(self) -> SocketPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
