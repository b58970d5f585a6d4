"""openqlink.bridges.rawsock on a veth pair inside a throw-away network namespace (root only)."""

import os
import shutil
import threading

import pytest
from netns import in_netns, ip

from openqlink.bridges import TransportClosedError
from openqlink.wire.packet import build_udp_frame

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("ip") is None,
    reason="needs root and iproute2 to make a veth pair in a network namespace")


@pytest.fixture
def netns():
    name = f"oqltest{os.getpid()}"
    if ip("netns", "add", name).returncode:
        pytest.skip("cannot create a network namespace here")
    try:
        for cmd in (["netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"],
                    ["netns", "exec", name, "sysctl", "-qw",
                     "net.ipv6.conf.default.disable_ipv6=1"]):
            ip(*cmd)
        r = ip("-n", name, "link", "add", "qa", "type", "veth", "peer", "name", "qb")
        if r.returncode:
            pytest.skip(f"cannot create a veth pair: {r.stderr.strip()}")
        for dev in ("qa", "qb"):
            assert ip("-n", name, "link", "set", dev, "up").returncode == 0
        yield name
    finally:
        ip("netns", "del", name)


def recv_matching(transport, want: bytes, timeout_s: float = 2.0) -> bytes | None:
    deadline = transport.now_s() + timeout_s
    while (left := deadline - transport.now_s()) > 0:
        got = transport.recv_frame(left)
        if got == want:
            return got
    return None


@pytest.mark.parametrize("ring", [256, 0], ids=["packet_mmap_ring", "recvfrom"])
def test_frames_cross_a_veth_pair_both_ways(netns, ring):
    from openqlink.bridges.rawsock import RawSocketTransport

    a, b = in_netns(netns, lambda: (RawSocketTransport("qa", rx_ring_frames=ring),
                                    RawSocketTransport("qb", promiscuous=True,
                                                       rx_ring_frames=ring)))
    try:
        assert a.rx_ring == b.rx_ring == bool(ring)
        assert a.mac != b.mac and len(a.mac) == 17
        small = build_udp_frame(dst_mac=b.mac, src_mac=a.mac, src_ip="10.0.0.1",
                                dst_ip="10.0.0.2", src_port=1, dst_port=8192, payload=b"ping")
        big = build_udp_frame(dst_mac=a.mac, src_mac=b.mac, src_ip="10.0.0.2",
                              dst_ip="10.0.0.1", src_port=8192, dst_port=1,
                              payload=bytes(range(256)) * 5)
        a.send_frame(small)
        assert recv_matching(b, small) == small
        b.send_frame(big)
        assert recv_matching(a, big) == big
        # a socket does not receive the frames it sent itself
        assert recv_matching(a, small, timeout_s=0.1) is None
        assert a.fileno() >= 0
    finally:
        a.close()
        b.close()
    a.close()   # idempotent
    with pytest.raises(TransportClosedError):
        a.send_frame(small)
    with pytest.raises(TransportClosedError):
        b.recv_frame(0)


def test_a_burst_arrives_whole_and_in_order_through_the_ring(netns):
    """Frames queued while nobody reads are taken from the ring in order, each once, and the
    ring's frames are handed back to the kernel (more frames than the ring holds pass)."""
    from openqlink.bridges.rawsock import RawSocketTransport

    a, b = in_netns(netns, lambda: (RawSocketTransport("qa"),
                                    RawSocketTransport("qb", rx_ring_frames=16)))
    try:
        got = []
        for burst in range(4):
            frames = [build_udp_frame(dst_mac=b.mac, src_mac=a.mac, src_ip="10.0.0.1",
                                      dst_ip="10.0.0.2", src_port=1, dst_port=2,
                                      payload=bytes([burst, i]) * 20) for i in range(12)]
            for f in frames:
                a.send_frame(f)
            while len(got) < 12 * (burst + 1):
                f = b.recv_frame(2.0)
                assert f is not None, "a frame of the burst did not arrive"
                got.append(f)
            assert got[-12:] == frames
        assert b.recv_frame(0.05) is None and b.truncated == 0
        with pytest.raises(ValueError, match="power of 2"):
            RawSocketTransport("lo", rx_ring_frames=3)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("tx_ring", [8, 0], ids=["packet_tx_ring", "send"])
def test_a_batch_sent_at_once_arrives_whole_and_in_order(netns, tx_ring):
    """send_frames: a batch longer than the transmit ring (sent in ring-sized parts, each with
    one system call) arrives whole, in order, frames of every size up to a jumbo one; a frame
    larger than a ring frame is refused before anything of it is sent."""
    from openqlink.bridges.rawsock import TX_FRAME_BYTES, RawSocketTransport

    a, b = in_netns(netns, lambda: (RawSocketTransport("qa", tx_ring_frames=tx_ring),
                                    RawSocketTransport("qb", rcvbuf_bytes=8 << 20)))
    try:
        assert a.tx_ring == bool(tx_ring)
        assert ip("-n", netns, "link", "set", "qa", "mtu", "9000").returncode == 0
        assert ip("-n", netns, "link", "set", "qb", "mtu", "9000").returncode == 0
        frames = [build_udp_frame(dst_mac=b.mac, src_mac=a.mac, src_ip="10.0.0.1",
                                  dst_ip="10.0.0.2", src_port=1, dst_port=2,
                                  payload=bytes([i]) * (1 + 97 * i % 8000)) for i in range(30)]
        a.send_frames(frames)
        a.send_frame(frames[0])
        got = []
        while len(got) < 31:
            f = b.recv_frame(2.0)
            assert f is not None, f"frame {len(got)} did not arrive"
            got.append(f)
        assert got == frames + frames[:1]
        if tx_ring:
            with pytest.raises(ValueError, match="does not fit"):
                a.send_frames([frames[1], bytes(TX_FRAME_BYTES)])
            assert b.recv_frame(0.1) is None     # refused before the batch went out
            a.send_frames(frames[2:3])           # and nothing of it goes with the next one
            assert b.recv_frame(2.0) == frames[2] and b.recv_frame(0.1) is None
        with pytest.raises(ValueError, match="power of 2"):
            RawSocketTransport("lo", tx_ring_frames=6)
    finally:
        a.close()
        b.close()
    with pytest.raises(TransportClosedError):
        a.send_frames([frames[0]])


def test_unknown_interface_raises(netns):
    from openqlink.bridges.rawsock import RawSocketTransport

    with pytest.raises(OSError):
        in_netns(netns, lambda: RawSocketTransport("nosuchif0"))


def test_close_wakes_a_receiver_waiting_without_timeout(netns):
    """close() from another thread must end a recv_frame(None) that waits on a quiet link
    (it used to wait for ever)."""
    from openqlink.bridges.rawsock import RawSocketTransport

    a = in_netns(netns, lambda: RawSocketTransport("qa"))
    got: dict = {}

    def receive():
        try:
            got["frame"] = a.recv_frame(None)
        except TransportClosedError as exc:
            got["error"] = exc

    t = threading.Thread(target=receive, daemon=True)
    t.start()
    t.join(0.2)
    assert t.is_alive(), "the receiver should be waiting"
    a.close()
    t.join(5)
    assert not t.is_alive(), "close() did not wake the receiver"
    assert isinstance(got.get("error"), TransportClosedError)
