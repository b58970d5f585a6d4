"""The socket bridge (:class:`openqlink.bridges.unixsock.SocketTransport`) and the simulation's
side of it (:class:`openqlink.sim.socket_port.SocketPort`), in process: frames both ways, one
message per frame, time-outs, a receiver or sender woken by ``close``, errors after it, the
peer's end, and the one-line errors of a path that cannot serve."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from openqlink.bridges.base import TransportClosedError
from openqlink.bridges.udp import BridgeSetupError
from openqlink.bridges.unixsock import MAX_FRAME_BYTES, SocketTransport
from openqlink.sim.socket_port import SocketPort, SocketPortError, check_serve_path


@pytest.fixture
def pair():
    a, b = SocketTransport.pair()
    yield a, b
    a.close()
    b.close()


def test_frames_travel_both_ways_one_message_each_in_order(pair):
    a, b = pair
    frames = [bytes([n]) * (60 + n) for n in range(20)] + [b"\x55" * 4154]
    for f in frames:
        a.send_frame(f)
    assert [b.recv_frame(1.0) for _ in frames] == frames
    b.send_frames([b"back" * 20, b"again" * 20])
    assert a.recv_frame(1.0) == b"back" * 20
    assert a.recv_frame(1.0) == b"again" * 20
    assert (a.sent, a.received, b.sent, b.received) == (len(frames), 2, 2, len(frames))


def test_recv_times_out_with_none_and_zero_never_waits(pair):
    a, _ = pair
    assert a.recv_frame(0) is None
    assert a.recv_frame(0.2) is None
    assert a.received == 0


def test_close_wakes_a_waiting_receiver_which_raises(pair):
    a, _ = pair
    got: list[BaseException | bytes | None] = []

    def receive() -> None:
        try:
            got.append(a.recv_frame(None))
        except BaseException as exc:    # handed to the test's thread
            got.append(exc)

    t = threading.Thread(target=receive)
    t.start()
    time.sleep(0.2)
    assert t.is_alive()
    a.close()
    t.join(10)
    assert not t.is_alive()
    assert len(got) == 1 and isinstance(got[0], TransportClosedError)


def test_close_wakes_a_sender_held_by_back_pressure(pair):
    a, _ = pair          # nobody reads b: a's sends fill b's queue, then wait
    got: list[BaseException] = []

    def flood() -> None:
        try:
            while True:
                a.send_frame(b"\x00" * 1500)
        except BaseException as exc:
            got.append(exc)

    t = threading.Thread(target=flood)
    t.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:          # until the sender is held
        sent = a.sent
        time.sleep(0.2)
        if a.sent == sent:
            break
    assert t.is_alive() and a.sent > 0
    a.close()
    t.join(10)
    assert not t.is_alive()
    assert len(got) == 1 and isinstance(got[0], TransportClosedError)


def test_every_call_after_close_raises_and_close_is_idempotent(pair):
    a, _ = pair
    a.close()
    a.close()
    assert a.closed
    with pytest.raises(TransportClosedError):
        a.send_frame(b"x" * 60)
    with pytest.raises(TransportClosedError):
        a.recv_frame(0)


def test_the_peers_end_is_raised_after_its_queued_frames(pair):
    a, b = pair
    a.send_frame(b"last" * 15)
    a.close()
    assert b.recv_frame(1.0) == b"last" * 15
    with pytest.raises(TransportClosedError, match="peer closed"):
        b.recv_frame(1.0)
    assert b.peer_closed
    with pytest.raises(TransportClosedError, match="peer closed"):
        b.send_frame(b"x" * 60)


def test_bad_frames_and_bad_sockets_are_refused(pair):
    a, _ = pair
    for frame in (b"", b"\x00" * (MAX_FRAME_BYTES + 1)):
        with pytest.raises(ValueError):
            a.send_frame(frame)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s, pytest.raises(ValueError):
        SocketTransport(sock=s)
    with pytest.raises(ValueError):
        SocketTransport()


def test_connecting_where_nothing_listens_names_the_path(tmp_path):
    missing = tmp_path / "none.sock"
    with pytest.raises(BridgeSetupError, match=f"socket {missing}: nothing listens there"):
        SocketTransport(missing)
    with pytest.raises(BridgeSetupError, match="1 to 107 bytes"):
        SocketTransport("/tmp/" + "x" * 120)


def test_the_port_serves_one_client_and_sees_it_leave(tmp_path):
    """The simulation's side: a client connects (the path goes), frames go both ways, a
    second client finds nothing, and the first one's close is seen."""
    path = tmp_path / "qsc.sock"
    with SocketPort(path) as port:
        assert path.exists() and not port.connected
        assert port.write(b"nobody" * 10) is False and port.write_errors == 1
        client = SocketTransport(path)
        client.send_frame(b"to the qsc" * 6)
        deadline = time.monotonic() + 5
        frame = None
        while frame is None and time.monotonic() < deadline:
            frame = port.read()
        assert frame == b"to the qsc" * 6
        assert port.connected and not path.exists()
        with pytest.raises(BridgeSetupError, match="nothing listens there"):
            SocketTransport(path)
        assert port.write(b"from the qsc" * 5) is True
        assert client.recv_frame(1.0) == b"from the qsc" * 5
        assert port.read() is None and not port.client_closed
        client.close()
        while not port.client_closed and time.monotonic() < deadline:
            port.read()
        assert port.client_closed and not port.connected
        assert (port.frames_read, port.frames_written) == (1, 1)
    assert port.closed and not path.exists()


def test_the_port_closing_ends_the_clients_connection(tmp_path):
    path = tmp_path / "qsc.sock"
    port = SocketPort(path)
    client = SocketTransport(path)
    while not port.connected:
        port.read()
    port.close()
    with pytest.raises(TransportClosedError, match="peer closed"):
        client.recv_frame(5.0)
    client.close()


def test_a_path_that_cannot_serve_is_refused_in_one_line(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("")
    with pytest.raises(SocketPortError, match="something exists there already"):
        check_serve_path(taken)
    with pytest.raises(SocketPortError, match="does not exist"):
        SocketPort(tmp_path / "no" / "such.sock")
    with pytest.raises(SocketPortError, match="1 to 107 bytes"):
        check_serve_path(tmp_path / ("x" * 120))
    assert check_serve_path(os.path.relpath(tmp_path / "ok.sock")) == str(tmp_path / "ok.sock")
