"""openqlink.bridges.base: the in-process transport pair."""

import threading

import pytest

from openqlink.bridges import FrameTransport, TransportClosedError, transport_pair


def test_pair_carries_frames_both_ways_in_order():
    a, b = transport_pair()
    assert isinstance(a, FrameTransport)
    for i in range(5):
        a.send_frame(bytes([i]) * 60)
    b.send_frame(b"back")
    assert [b.recv_frame(0) for _ in range(5)] == [bytes([i]) * 60 for i in range(5)]
    assert b.recv_frame(0) is None
    assert a.recv_frame(timeout_s=1.0) == b"back"
    assert (a.sent, b.received, b.pending()) == (5, 5, 0)


def test_recv_times_out_and_blocks_until_a_frame_arrives():
    a, b = transport_pair()
    assert b.recv_frame(timeout_s=0.01) is None
    got = []
    t = threading.Thread(target=lambda: got.append(b.recv_frame()))
    t.start()
    a.send_frame(b"late")
    t.join(timeout=10)
    assert got == [b"late"]


def test_close():
    a, b = transport_pair()
    with b:
        pass
    a.send_frame(b"into the void")
    assert b.dropped == 1
    with pytest.raises(TransportClosedError):
        b.send_frame(b"x")
    with pytest.raises(TransportClosedError):
        b.recv_frame(0)
    b.close()
    assert a.now_s() <= a.now_s()
