"""The simulated QSC on a Linux TAP interface (``qlink sim --tap``), in a throw-away network
namespace: the kernel pings the QSC, and a whole program runs with the host on the raw bridge
(:class:`openqlink.bridges.rawsock.RawSocketTransport`) through the kernel's network path, and
another with the host on the udp bridge (the kernel's UDP sockets).

The namespace holds one TAP, ``qtap0``, with the host's address of the simulation
(192.168.0.1/24: the QSC is the build's 192.168.0.2) and IPv6 off, so that no neighbour
discovery reaches the QSC. The kernel's echo requests come from a ping socket
(``SOCK_DGRAM``/``IPPROTO_ICMP``, what iputils' ``ping`` uses): the kernel resolves the QSC's
MAC with ARP and builds the requests itself. Needs root, ``/dev/net/tun``, iproute2 and Icarus
Verilog; skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from netns import in_netns, ip

from openqlink.cli import main
from openqlink.memory_map import QSCParams
from openqlink.pcap import read_pcap
from openqlink.wire.ethernet import mac_to_int
from openqlink.wire.ipv4 import IpProtocol, ip_to_int
from openqlink.wire.packet import parse_frame
from openqlink.wire.rpc import Request, fnv1a32
from openqlink.wire.udp import UDP_CALL_PORT_BASE

ROOT = Path(__file__).resolve().parents[3]
PROGRAM = ROOT / "firmware" / "active_reset.s"
TAP = "qtap0"
HOST_IP = "192.168.0.1"
QSC_IP = QSCParams().ip
#: Wall-clock limits: building the top and simulating it take about a minute on 2 cores.
RUN_LIMIT_S = 900
#: After the program, the QSC stays on the TAP until the kernel has been quiet this long.
HOLD_S = 5

needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("ip") is None,
    reason="needs root and iproute2 to make a TAP in a network namespace")


@pytest.fixture
def tap_netns():
    """A network namespace with the TAP ``qtap0`` up at 192.168.0.1/24, IPv6 off, and ping
    sockets allowed for root; yields the namespace's name and deletes it (with the TAP)."""
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("/dev/net/tun is missing (no TUN/TAP driver here)")
    name = f"oqltap{os.getpid()}"
    made = ip("netns", "add", name)
    if made.returncode:
        pytest.skip(f"cannot create a network namespace here: {made.stderr.strip()}")
    try:
        for key, value in (("net.ipv6.conf.all.disable_ipv6", "1"),
                           ("net.ipv6.conf.default.disable_ipv6", "1"),
                           ("net.ipv4.ping_group_range", "0 0")):
            done = ip("netns", "exec", name, "sysctl", "-qw", f"{key}={value}")
            assert done.returncode == 0, done.stderr
        made = ip("-n", name, "tuntap", "add", "dev", TAP, "mode", "tap")
        if made.returncode:
            pytest.skip(f"cannot create a TAP interface: {made.stderr.strip()}")
        assert ip("-n", name, "addr", "add", f"{HOST_IP}/24", "dev", TAP).returncode == 0
        assert ip("-n", name, "link", "set", TAP, "up").returncode == 0
        yield name
    finally:
        ip("netns", "del", name)


def kernel_ping(dst: str, count: int, *, stop: Callable[[], bool],
                payload: bytes = b"openqlink tap") -> dict[int, bytes]:
    """Echo requests to ``dst`` from the kernel's ping socket, one a second (the kernel picks
    the identifier and checksums), until ``count`` have been answered or ``stop()`` is true;
    returns the answered sequence numbers and each reply's payload. A request the kernel
    cannot send yet (no carrier, the QSC's MAC unresolved) is tried again a second later."""
    answered: dict[int, bytes] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP) as sock:
        seq = 0
        while len(answered) < count and not stop():
            seq += 1
            try:
                sock.sendto(struct.pack("!BBHHH", 8, 0, 0, 0, seq) + payload, (dst, 0))
            except OSError:
                pass
            until = time.monotonic() + 1.0
            while (left := until - time.monotonic()) > 0:
                if not select.select([sock], [], [], left)[0]:
                    break
                try:
                    reply = sock.recv(2048)
                except OSError:      # an ICMP error for an earlier request
                    continue
                kind, _code, _sum, _ident, got = struct.unpack("!BBHHH", reply[:8])
                if kind == 0:
                    answered[got] = reply[8:]
    return answered


@needs_root
@pytest.mark.cocotb
@pytest.mark.skipif(shutil.which("iverilog") is None,
                    reason="Icarus Verilog is not installed (apt-get install iverilog)")
def test_the_kernel_pings_the_qsc_and_the_raw_bridge_runs_a_program(tap_netns, tmp_path):
    """One simulation: ``qlink sim --tap qtap0 firmware/active_reset.s`` in the namespace while
    the kernel pings the QSC; the program ends DONE with its CALL answered through the kernel,
    and three echo requests are answered."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = tmp_path / "qlink.log"
    cmd = ["ip", "netns", "exec", tap_netns, sys.executable, "-m", "openqlink.cli", "sim",
           "--tap", TAP, "--tap-hold-s", str(HOLD_S), str(PROGRAM),
           "--json", str(tmp_path / "run.json"), "--pcap", str(tmp_path / "wire.pcap"),
           "--build-dir", str(tmp_path / "build"), "--quiet"]
    with log.open("w") as out:
        sim = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        try:
            answered = in_netns(tap_netns, lambda: kernel_ping(
                QSC_IP, 3, stop=lambda: sim.poll() is not None), timeout_s=RUN_LIMIT_S)
            rc = sim.wait(timeout=RUN_LIMIT_S)
        finally:
            if sim.poll() is None:
                sim.kill()
                sim.wait()
    output = log.read_text()
    assert rc == 0, output

    # (a) the kernel's pings: three answered, each with the request's payload
    assert len(answered) == 3, output
    assert set(answered.values()) == {b"openqlink tap"}
    (link,) = json.loads(ip("-n", tap_netns, "-j", "link", "show", TAP).stdout)
    tap_mac = mac_to_int(link["address"])
    frames = [parse_frame(f) for _, f in read_pcap(tmp_path / "wire.pcap")]
    qsc_mac = mac_to_int(QSCParams().mac)
    replies = [f for f in frames if f.ip is not None and f.ip["protocol"] == IpProtocol.ICMP
               and f.eth["src"] == qsc_mac and f.payload[:1] == b"\x00"]
    assert len(replies) >= 3
    assert all(f.eth["dst"] == tap_mac for f in replies)

    # (b) the program, with the host on the raw bridge through the kernel
    results = json.loads((tmp_path / "run.json").read_text())
    assert output.strip().endswith("final PPU status: DONE (no error bits)")
    assert results["status"]["state"] == "DONE" and not results["run_limit_reached"]
    tap = results["tap"]
    assert (tap["interface"], tap["host_ip"]) == (TAP, HOST_IP)
    assert mac_to_int(tap["host_mac"]) == tap_mac
    assert tap["write_errors"] == 0 and tap["frames_from_kernel"] > 0
    # Every QP's peer is the TAP's MAC: the QSC sends its CALLs to the kernel's interface.
    assert {(q["PEER_MAC_HI"] << 32 | q["PEER_MAC_LO"]) for q in results["qp_contexts"]} == {
        tap_mac}
    (meas,) = results["measurements"]
    (rpc,) = results["rpc"]
    assert rpc["function"] == "reset_decision" and rpc["status"] == 0
    # reset_decision answers the measured bit: 1 plays the reset pulse, 0 does not.
    assert rpc["args"] == rpc["result"] == f"{meas['outcome']:02x}"
    assert results["registers"]["R2"] == meas["outcome"]
    assert results["registers"]["CALL_COUNT"] == 1
    plays = [e for e in results["events"] if e["kind"] == "play_start"]
    assert len(plays) == 1 + meas["outcome"]
    assert results["qubit_final_p1"] < 1e-3
    assert results["dispatcher"]["processed"] == 1
    # The kernel answers the QSC's UDP to the host's address (no socket of its own listens
    # there) with ICMP port unreachable, which the QSC counts in DROP_ICMP; nothing else drops.
    drops = {k: v for k, v in results["counters"].items()
             if k.startswith("DROP_") and k != "DROP_ICMP" and v}
    assert drops == {}


@needs_root
@pytest.mark.cocotb
@pytest.mark.skipif(shutil.which("iverilog") is None,
                    reason="Icarus Verilog is not installed (apt-get install iverilog)")
def test_the_udp_bridge_runs_a_program_through_the_kernels_udp_sockets(tap_netns, tmp_path):
    """``qlink sim --tap qtap0 --bridge udp firmware/active_reset.s``: the host on the kernel's
    UDP sockets (no raw socket), the kernel resolving the QSC's MAC with ARP, the uploads as
    RoCEv2 through a UDP socket, and the CALL in the UDP transport, its response carrying the
    UDP checksum the kernel computed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = ["ip", "netns", "exec", tap_netns, sys.executable, "-m", "openqlink.cli", "sim",
           "--tap", TAP, "--bridge", "udp", str(PROGRAM), "--json", str(tmp_path / "run.json"),
           "--pcap", str(tmp_path / "wire.pcap"), "--build-dir", str(tmp_path / "build"),
           "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=RUN_LIMIT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "run.json").read_text())
    assert results["status"]["state"] == "DONE" and not results["run_limit_reached"]
    (meas,) = results["measurements"]
    (rpc,) = results["rpc"]
    assert rpc["function"] == "reset_decision" and rpc["status"] == 0
    assert rpc["args"] == rpc["result"] == f"{meas['outcome']:02x}"
    assert results["registers"]["R2"] == meas["outcome"]
    assert [q["TRANSPORT"] for q in results["qp_contexts"]][:1] == [1]
    frames = [parse_frame(f) for _, f in read_pcap(tmp_path / "wire.pcap")]
    qsc_ip = ip_to_int(QSC_IP)
    requests = [f for f in frames if f.udp is not None and f.ip["src"] == qsc_ip
                and f.udp["src_port"] == UDP_CALL_PORT_BASE]
    responses = [f for f in frames if f.udp is not None and f.ip["dst"] == qsc_ip
                 and f.udp["dst_port"] == UDP_CALL_PORT_BASE]
    assert len(requests) == len(responses) == 1
    assert requests[0].bth is None and Request.unpack(requests[0].payload).function_id == \
        fnv1a32("reset_decision")
    assert responses[0].udp["checksum"] != 0      # the kernel's, checked by the QSC
    # ARP resolved the QSC for the kernel; the uploads went as RoCEv2 from a UDP socket
    assert any(f.eth["ethertype"] == 0x0806 for f in frames)
    assert any(f.bth is not None and f.ip["dst"] == qsc_ip for f in frames)
    drops = {k: v for k, v in results["counters"].items()
             if k.startswith("DROP_") and k != "DROP_ICMP" and v}
    assert drops == {}


@needs_root
def test_tap_errors_name_the_reason(tap_netns):
    """An interface that is no TAP, a TAP held by another program and one that is down are
    refused before anything runs, each with its reason."""
    from openqlink.sim.tap import TapDevice, TapError, check_tap

    def attempts() -> list[str]:
        got = []
        with TapDevice(TAP):
            try:
                TapDevice(TAP)
            except TapError as exc:
                got.append(str(exc))
        for name in ("lo", "nosuchtap0"):
            try:
                TapDevice(name)
            except TapError as exc:
                got.append(str(exc))
        subprocess.run(["ip", "link", "set", TAP, "down"], check=True)
        try:
            check_tap(TAP)
        except TapError as exc:
            got.append(str(exc))
        return got

    assert in_netns(tap_netns, attempts) == [
        f"TAP {TAP}: another program has it open",
        "TAP lo: lo is not a TAP interface (ip tuntap add dev lo mode tap)",
        "TAP nosuchtap0: no interface of that name here; make it first (ip tuntap add dev "
        "nosuchtap0 mode tap), in this network namespace",
        f"TAP {TAP}: the interface is down (ip link set {TAP} up)",
    ]


def test_qlink_sim_tap_fails_in_one_line_without_the_tap(tmp_path):
    """``--tap`` naming no interface stops before the build, with one line and status 2;
    ``--tap`` with ``--inject`` or ``--gpu``, and ``--tap-hold-s`` alone, are usage errors."""
    res = CliRunner().invoke(main, ["sim", "--tap", "nosuchtap0", str(PROGRAM),
                                    "--build-dir", str(tmp_path)])
    assert res.exit_code == 2
    assert res.output.splitlines() == [
        "qlink sim: TAP nosuchtap0: no interface of that name here; make it first (ip tuntap "
        "add dev nosuchtap0 mode tap), in this network namespace"]
    assert list(tmp_path.iterdir()) == []
    capture = tmp_path / "c.pcap"
    capture.write_bytes(b"")
    for args, message in (
            (["--tap", "t0", "--inject", str(capture)], "--tap runs a PROGRAM"),
            (["--tap", "t0", "--gpu", str(PROGRAM)], "--gpu serves the simulated host's"),
            (["--tap-hold-s", "3", str(PROGRAM)], "--tap-hold-s: only with --tap")):
        res = CliRunner().invoke(main, ["sim", *args])
        assert res.exit_code == 2 and message in res.output, res.output
