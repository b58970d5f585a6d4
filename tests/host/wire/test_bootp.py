"""The BOOTP announcement's wire format (openqlink.wire.bootp) and ``qlink discover``.

scapy (an independent BOOTP implementation; GPL: tests only) decodes what the host builds.
"""

import socket
import threading
import time

import pytest
from scapy.layers.dhcp import BOOTP
from scapy.layers.l2 import Ether

from openqlink.discover import discover
from openqlink.errors import TruncatedError, WireFormatError
from openqlink.wire.bootp import (
    ANNOUNCE_FRAME_BYTES,
    OPENQLINK_FPGA_UUID,
    build_announcement,
    parse_announcement,
    parse_bootp_request,
)
from openqlink.wire.ethernet import mac_to_int
from openqlink.wire.ipv4 import ip_to_int

MAC, IP = "02:4e:56:51:00:02", "192.168.0.2"


def test_the_announcement_is_a_bootp_request_scapy_reads():
    frame = build_announcement(mac_to_int(MAC), ip_to_int(IP), 0x1234)
    assert len(frame) == ANNOUNCE_FRAME_BYTES == 342
    pkt = Ether(frame)
    assert pkt["IP"].dst == "255.255.255.255" and pkt["IP"].src == IP
    assert (pkt["UDP"].sport, pkt["UDP"].dport) == (12268, 12267)
    bootp = BOOTP(bytes(pkt["UDP"].payload))   # scapy binds BOOTP to ports 67/68 only
    assert (bootp.op, bootp.htype, bootp.hlen, bootp.ciaddr) == (1, 1, 6, IP)
    assert bootp.chaddr[:6] == bytes.fromhex(MAC.replace(":", ""))
    vendor = bytes(pkt["UDP"].payload)[236:]
    assert vendor[:8] == b"\xe0\x38NVDA\x00\x02"
    assert vendor[10:26] == OPENQLINK_FPGA_UUID.bytes
    assert vendor[51:53] == b"\x12\x34"                 # the sequence, big-endian
    # the IPv4 checksum verifies (scapy recomputes it from the header)
    ip = pkt["IP"]
    chksum = ip.chksum
    del ip.chksum
    assert Ether(bytes(pkt))["IP"].chksum == chksum


def test_parse_gives_what_an_enumerator_reads_and_names_bad_fields():
    frame = build_announcement(mac_to_int(MAC), ip_to_int(IP), 7)
    info = parse_announcement(frame)
    assert info == {"mac": MAC, "ip": IP, "ciaddr": IP, "data_plane": 0, "enum_version": 2,
                    "fpga_uuid": str(OPENQLINK_FPGA_UUID),
                    "serial_number": MAC.replace(":", "") + "00", "hsb_ip_version": 0,
                    "sequence": 7}
    payload = frame[42:]
    for at, value, field in ((0, 2, "op"), (2, 16, "hlen"), (236, 0xE1, "tag"),
                             (238, ord("X"), "vendor_id")):
        bad = bytearray(payload)
        bad[at] = value
        with pytest.raises(WireFormatError) as e:
            parse_bootp_request(bytes(bad), IP)
        assert e.value.field == field
    with pytest.raises(TruncatedError):
        parse_bootp_request(payload[:250], IP)


def test_discover_lists_each_board_once():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    found: list = []
    listener = threading.Thread(target=lambda: found.extend(discover(1.0, port=port)))
    listener.start()
    time.sleep(0.2)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        for seq in (1, 2):
            tx.sendto(build_announcement(mac_to_int(MAC), ip_to_int(IP), seq)[42:],
                      ("127.0.0.1", port))
        tx.sendto(b"not a bootp request", ("127.0.0.1", port))
    listener.join()
    assert len(found) == 1
    assert found[0]["mac"] == MAC and found[0]["ip"] == "127.0.0.1" and found[0]["sequence"] == 2
