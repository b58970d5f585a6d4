"""The udp bridge: openqlink.bridges.udp.UdpSocketTransport through the kernel's UDP sockets,
against the software QSC on a raw socket at the other end of a veth pair, in a throw-away
network namespace (root only); and the bridge choice by name."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netns import in_netns, ip

from openqlink.bridges import BRIDGE_NAMES, TransportClosedError, open_bridge
from openqlink.bridges.udp import BridgeSetupError, UdpSocketTransport, interface_of, route_to
from openqlink.bridges.verbs import BridgeUnavailableError
from openqlink.dispatch import Dispatcher, FunctionTable, SlotRing
from openqlink.errors import FieldRangeError, QlinkError
from openqlink.isa import INSTRUCTION_BYTES
from openqlink.memory_map import IMEM_OFFSET, QSCParams, ppu_base, qp_reg
from openqlink.qsc import QSC
from openqlink.wire.ipv4 import ip_to_int
from openqlink.wire.packet import build_roce_frame, build_udp_frame
from openqlink.wire.roce import Opcode
from openqlink.wire.rpc import PayloadType, Request, Response, fnv1a32

HOST_IP, QSC_IP = "192.168.7.1", "192.168.7.2"
PARAMS = QSCParams(ip=QSC_IP, num_ppus=1)

needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("ip") is None,
    reason="needs root and iproute2 to make a veth pair in a network namespace")


@pytest.fixture
def veth_netns():
    """A namespace with veth qa (this host, HOST_IP/24) - qb (the QSC's wire, no address), the
    QSC's MAC entered for QSC_IP in qa's neighbour table."""
    name = f"oqludp{os.getpid()}"
    if ip("netns", "add", name).returncode:
        pytest.skip("cannot create a network namespace here")
    try:
        for key in ("all", "default"):
            ip("netns", "exec", name, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1")
        r = ip("-n", name, "link", "add", "qa", "type", "veth", "peer", "name", "qb")
        if r.returncode:
            pytest.skip(f"cannot create a veth pair: {r.stderr.strip()}")
        for dev in ("qa", "qb"):
            assert ip("-n", name, "link", "set", dev, "up").returncode == 0
        assert ip("-n", name, "addr", "add", f"{HOST_IP}/24", "dev", "qa").returncode == 0
        assert ip("-n", name, "neigh", "add", QSC_IP, "lladdr", PARAMS.mac, "dev",
                  "qa").returncode == 0
        # veth leaves a UDP checksum for the receiver's NIC to finish; a raw socket on qb sees
        # it unfinished. Make the kernel compute it, as it does for a real NIC's wire.
        if shutil.which("ethtool") is None:
            pytest.skip("needs ethtool (apt-get install ethtool) to turn veth's checksum "
                        "offload off")
        off = subprocess.run(["ip", "netns", "exec", name, "ethtool", "-K", "qa", "tx", "off"],
                             capture_output=True, text=True, timeout=30)
        assert off.returncode == 0, off.stderr
        yield name
    finally:
        ip("netns", "del", name)


@needs_root
def test_a_program_is_uploaded_and_a_call_answered_through_kernel_sockets(veth_netns, qsc_peer):
    """Control plane, RoCEv2 RDMA WRITEs (their ICRC over the header the kernel writes) and a
    CALL in the UDP transport, all through UDP sockets."""
    from openqlink.bridges.rawsock import RawSocketTransport

    def run():
        peer = qsc_peer(RawSocketTransport("qb", promiscuous=True), PARAMS)
        qsc = QSC(bridge="udp", qsc_ip=QSC_IP, params=PARAMS, timeout_s=0.5)
        try:
            assert qsc.transport.ifname == "qa" and qsc.call_transport == "udp"
            assert qsc.host_ip == ip_to_int(HOST_IP)
            qsc.connect()
            ring = SlotRing(num_slots=4, slot_size=256)
            qsc.configure(0, ring)
            program = bytes(range(256)) * 3          # 48 instructions, 3 PMTU packets
            assert len(program) % INSTRUCTION_BYTES == 0
            qsc.upload_program(0, program)           # verified: UPLOAD_WORDS read back
            base = ppu_base(0) + IMEM_OFFSET
            assert peer.read_memory(base, len(program)) == program
            assert peer.regs[qp_reg(0, "TRANSPORT")] == 1

            table = FunctionTable()

            @table.host_call("neg", args=(PayloadType.INT32,), results=(PayloadType.INT32,))
            def neg(a):
                return -a

            d = Dispatcher(table, ring, lambda slot, data: qsc.send_response(0, slot, data))
            req = Request(function_id=fnv1a32("neg"), request_id=5, ptp_timestamp=1,
                          payload=(9).to_bytes(4, "little")).pack()
            peer.t.send_frame(peer.udp_request_frame(0, req))
            deadline = time.monotonic() + 10
            while not peer.mailbox and time.monotonic() < deadline:
                qsc.poll_rx()
                d.poll()
                time.sleep(0.001)
            (ppu, got), = peer.mailbox
            resp = Response.unpack(got)
            assert (ppu, resp.status, resp.request_id) == (0, 0, 5)
            assert int.from_bytes(resp.result, "little", signed=True) == -9
            assert peer.udp_drops == []
        finally:
            qsc.close()
    in_netns(veth_netns, run, timeout_s=60)


@needs_root
def test_frames_the_kernel_cannot_send_as_built_are_refused(veth_netns):
    def run():
        t = UdpSocketTransport(QSC_IP)
        try:
            assert (t.host_ip, t.ifname) == (HOST_IP, "qa") and t.mac != "00:00:00:00:00:00"
            roce = dict(dst_mac=PARAMS.mac, src_mac=t.mac, src_ip=HOST_IP, dst_ip=QSC_IP,
                        opcode=Opcode.SEND_ONLY, dest_qp=1, psn=0, payload=b"x")
            with pytest.raises(FieldRangeError, match="identification"):
                t.send_frame(build_roce_frame(**roce, identification=7))
            with pytest.raises(FieldRangeError, match="src"):
                t.send_frame(build_udp_frame(dst_mac=PARAMS.mac, src_mac=t.mac,
                                             src_ip="192.168.7.9", dst_ip=QSC_IP, src_port=1,
                                             dst_port=2, payload=b"x"))
            with pytest.raises(FieldRangeError, match="ethertype"):
                t.send_frame(bytes(12) + b"\x86\xdd" + bytes(60))
            t.send_frame(build_roce_frame(**roce))          # as built: DF, identification 0
            port = t.bind_port(0)
            t2 = UdpSocketTransport(QSC_IP)
            try:
                with pytest.raises(BridgeSetupError, match=f"UDP port {port} "):
                    t2.bind_port(port)
            finally:
                t2.close()
        finally:
            t.close()
        with pytest.raises(TransportClosedError):
            t.recv_frame(0)
        with pytest.raises(BridgeSetupError, match="not an address of this host"):
            UdpSocketTransport(QSC_IP, host_ip="192.168.7.77")
    in_netns(veth_netns, run)


def test_route_and_interface_lookups():
    assert route_to("127.0.0.1") == "127.0.0.1"
    assert interface_of("127.0.0.1") == ("lo", "00:00:00:00:00:00")
    assert interface_of("203.0.113.77") is None


def test_the_bridge_is_chosen_by_name():
    assert BRIDGE_NAMES == ("raw", "udp", "verbs")
    with pytest.raises(ValueError, match="unknown bridge 'tcp'"):
        open_bridge("tcp", qsc_ip="127.0.0.1")
    with pytest.raises(ValueError, match="interface"):
        open_bridge("raw", qsc_ip="127.0.0.1")
    opened = open_bridge("udp", qsc_ip="127.0.0.1")
    try:
        assert (opened.name, opened.call_transport, opened.host_ip) == ("udp", "udp",
                                                                        "127.0.0.1")
    finally:
        opened.transport.close()
    with pytest.raises(QlinkError, match="not both"):
        QSC(opened.transport, bridge="udp", qsc_ip="127.0.0.1")
    with pytest.raises(QlinkError, match="host_mac and host_ip"):
        QSC(opened.transport)
    with pytest.raises(FieldRangeError, match="call_transport"):
        QSC(bridge="udp", qsc_ip="127.0.0.1", call_transport="roce")


def test_verbs_fails_in_one_line_without_an_rdma_device():
    if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        pytest.skip("this host has an RDMA device")
    with pytest.raises(BridgeUnavailableError) as info:
        QSC(bridge="verbs", qsc_ip="127.0.0.1")
    assert "\n" not in str(info.value) and "verbs bridge" in str(info.value)


def test_drive_qsc_with_no_board_says_so_in_one_line():
    """examples/drive_qsc.py on the udp bridge (no rights needed) towards an address where no
    QSC answers: one line naming the address and the bridge, exit status 1."""
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, str(root / "examples" / "drive_qsc.py"),
                           "--bridge", "udp", "--qsc-ip", "127.0.0.2",
                           str(root / "firmware" / "active_reset.s")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("drive_qsc: no QSC answered at 127.0.0.2 over the udp bridge")


def test_a_waiting_receiver_takes_a_port_bound_meanwhile_and_close_wakes_it():
    import socket
    import threading

    t = UdpSocketTransport("127.0.0.1")
    got: list = []

    def receive():
        try:
            got.append(t.recv_frame(None))
            got.append(t.recv_frame(None))
        except TransportClosedError as exc:
            got.append(exc)

    waiter = threading.Thread(target=receive, daemon=True)
    waiter.start()
    time.sleep(0.1)                      # the receiver waits in poll() on no port at all
    port = t.bind_port(0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"late port", ("127.0.0.1", port))
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got and got[0][42:51] == b"late port" and int.from_bytes(got[0][36:38], "big") == port
    t.close()                            # ends the second wait
    waiter.join(5)
    assert not waiter.is_alive() and isinstance(got[1], TransportClosedError)
