"""Tests of the BOOTP announcer (openqlink.gateware.net.announce).

The expected frame is built by scapy (an independent BOOTP, IPv4 and UDP implementation; GPL:
tests only) with the vendor area laid out byte by byte as the Holoscan Sensor Bridge enumerator
reads it (enumeration version 2), and compared byte for byte with what the announcer sends.
"""

import uuid

from amaranth.hdl import Module
from amaranth.sim import Simulator
from netbench import StreamSink, beat_tuple, frames_of
from scapy.layers.dhcp import BOOTP
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from openqlink.gateware.net.announce import ANNOUNCE_BEATS, BootpAnnouncer
from openqlink.wire.bootp import OPENQLINK_FPGA_UUID, build_announcement, parse_announcement
from openqlink.wire.ethernet import int_to_mac, mac_to_int
from openqlink.wire.ipv4 import ip_to_int

MAC, IP_ADDR = "02:4e:56:51:00:02", "192.168.0.2"
#: 100 rti cycles a millisecond: the intervals below are a few hundred cycles.
CLK_HZ = 100_000


def expected(mac: str, ip: str, sequence: int) -> bytes:
    """The announcement, from RFC 951 (scapy) and the sensor bridge's vendor area."""
    vendor = (b"\xe0\x38" + b"NVDA" + bytes([0, 2]) + bytes(2)
              + uuid.UUID("577fd696-560f-49f6-ae0a-c294e7ae3b23").bytes + bytes(4)
              + bytes.fromhex(mac.replace(":", "")) + b"\x00"      # serial number
              + bytes(2) + bytes(2) + bytes(10)                    # IP version, CRC, PTP
              + sequence.to_bytes(2, "big") + b"\x00" + bytes(4) + b"\xff" + bytes(5))
    assert len(vendor) == 64
    return bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src=mac) /
                 IP(src=ip, dst="255.255.255.255", ttl=64, id=0, flags="DF") /
                 UDP(sport=12268, dport=12267, chksum=0) /
                 BOOTP(op=1, htype=1, hlen=6, xid=0, ciaddr=ip,
                       chaddr=bytes.fromhex(mac.replace(":", "")) + bytes(10),
                       options=vendor))


def run(cycles: int, *, interval_ms: int, ready=lambda c: True, changes=()):
    """Run an announcer for ``cycles``; ``changes``: (cycle, mac, ip, interval_ms) to apply.
    Returns the frames sent and the cycle each began."""
    dut = BootpAnnouncer(CLK_HZ)
    m = Module()
    m.submodules.dut = dut
    sink = StreamSink(dut.tx, ready, convert=beat_tuple)
    starts: list[int] = []

    async def bench(ctx):
        ctx.set(dut.config.qsc_mac, mac_to_int(MAC))
        ctx.set(dut.config.qsc_ip, ip_to_int(IP_ADDR))
        ctx.set(dut.config.bootp_interval_ms, interval_ms)
        todo = sorted(changes)
        was_first = False
        for cycle in range(cycles):
            while todo and todo[0][0] == cycle:
                _, mac, ip, ms = todo.pop(0)
                ctx.set(dut.config.qsc_mac, mac_to_int(mac))
                ctx.set(dut.config.qsc_ip, ip_to_int(ip))
                ctx.set(dut.config.bootp_interval_ms, ms)
            first = bool(ctx.get(dut.tx.valid)) and bool(ctx.get(dut.tx.payload.first))
            if first and not was_first:
                starts.append(cycle)
            was_first = first
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-5)
    sim.add_testbench(bench)
    sim.add_testbench(sink.run, background=True)
    sim.run()
    return frames_of(sink.items), starts


def test_announcements_are_the_sensor_bridge_bootp_request_every_interval():
    frames, starts = run(720, interval_ms=2)
    assert [f == expected(MAC, IP_ADDR, k) for k, f in enumerate(frames)] == [True] * 3
    # one every 2 ms (200 cycles), beats back to back
    assert [b - a for a, b in zip(starts, starts[1:], strict=False)] == [200, 200]
    assert frames[0] == build_announcement(mac_to_int(MAC), ip_to_int(IP_ADDR), 0)
    info = parse_announcement(frames[2])
    assert (info["mac"], info["ip"], info["ciaddr"], info["sequence"]) == \
        (MAC, IP_ADDR, IP_ADDR, 2)
    assert info["fpga_uuid"] == str(OPENQLINK_FPGA_UUID) and info["enum_version"] == 2
    assert len(frames[0]) == 342 and -(-342 // 8) == ANNOUNCE_BEATS


def test_back_pressure_new_addresses_and_stopping():
    """Under back-pressure each frame is whole; a new MAC and IP are in the next announcement
    (the IPv4 checksum follows); interval 0 stops them."""
    other_mac, other_ip = "02:aa:bb:cc:dd:ee", "10.20.30.40"
    frames, _ = run(900, interval_ms=1, ready=lambda c: c % 3 != 0,
                    changes=[(250, other_mac, other_ip, 1), (520, other_mac, other_ip, 0)])
    assert len(frames) == 5
    assert frames[:2] == [expected(MAC, IP_ADDR, 0), expected(MAC, IP_ADDR, 1)]
    assert frames[2:] == [expected(other_mac, other_ip, k) for k in (2, 3, 4)]
    assert int_to_mac(mac_to_int(other_mac)) == parse_announcement(frames[-1])["mac"]


def test_the_network_core_announces_through_its_mac_port():
    """In the network core: BOOTP_INTERVAL_MS (1000 from reset) written 1 over the control
    plane, the QSC announces itself every millisecond beside its control replies, from its
    MAC and IP; written 0, it stops."""
    from dataclasses import replace

    from netbench import PARAMS, QSC_IP, QSC_MAC
    from test_net_core import CoreBench

    from openqlink.memory_map import global_reg

    b = CoreBench(replace(PARAMS, rti_clk_hz=200_000))       # 200 cycles a millisecond
    announcements: list[bytes] = []

    async def tb(ctx, b):
        assert await b.read(ctx, global_reg("BOOTP_INTERVAL_MS")) == 1000
        await b.write(ctx, global_reg("BOOTP_INTERVAL_MS"), 1)
        while len(b.tx_frames) < 4:                  # two replies, two announcements
            await ctx.tick()
        announcements.extend(b.tx_frames[2:])
        await b.write(ctx, global_reg("BOOTP_INTERVAL_MS"), 0)
        await b.settle(ctx, 600)

    b.run(tb)
    assert announcements == [build_announcement(QSC_MAC, QSC_IP, k) for k in (0, 1)]
    assert len(b.tx_frames) == 5                     # the last reply, and no announcement more
