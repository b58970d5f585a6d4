"""openqlink.pcap against dpkt's reader and writer, and tshark's InfiniBand dissector."""

import io
import shutil
import struct
import subprocess

import dpkt
import pytest

from openqlink.errors import TruncatedError, WireFormatError
from openqlink.pcap import MAGIC_NANOSECONDS, PcapWriter, read_pcap
from openqlink.wire.packet import build_roce_frame, build_udp_frame
from openqlink.wire.roce import Opcode

T0_NS = 1_700_000_000_123_456_789


def frames():
    roce = build_roce_frame(dst_mac="02:00:00:00:00:0a", src_mac="02:4e:56:51:00:02",
                            src_ip="192.168.0.2", dst_ip="192.168.0.1",
                            opcode=Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE, dest_qp=0x200, psn=9,
                            va=0x300, r_key=0x52490000, imm=(9 << 12) | 3, payload=b"CUQR" * 9)
    udp = build_udp_frame(dst_mac="02:4e:56:51:00:02", src_mac="02:00:00:00:00:0a",
                          src_ip="192.168.0.1", dst_ip="192.168.0.2", src_port=0xC100,
                          dst_port=8192, payload=bytes(14))
    return [roce, udp, bytes(range(256)) * 8]


def test_round_trip_and_dpkt_reads_nanoseconds(tmp_path):
    path = tmp_path / "a.pcap"
    fs = frames()
    times = [T0_NS, T0_NS + 1, T0_NS + 1_000_000_007]
    with PcapWriter(path) as w:
        for f, t in zip(fs, times, strict=True):
            w.write(f, t)
    assert read_pcap(path) == list(zip(times, fs, strict=True))
    with open(path, "rb") as fh:
        r = dpkt.pcap.Reader(fh)
        assert r.datalink() == dpkt.pcap.DLT_EN10MB
        got = [(ts, bytes(buf)) for ts, buf in r]
    assert [buf for _, buf in got] == fs
    # dpkt returns nanosecond timestamps as exact Decimal seconds
    assert [int(ts * 1_000_000_000) for ts, _ in got] == times
    with open(path, "rb") as fh:
        assert struct.unpack("<I", fh.read(4))[0] == MAGIC_NANOSECONDS


def test_reads_dpkt_microsecond_file(tmp_path):
    path = tmp_path / "us.pcap"
    fs = frames()
    with open(path, "wb") as fh:
        w = dpkt.pcap.Writer(fh)   # classic microsecond magic
        for i, f in enumerate(fs):
            w.writepkt(f, ts=1_700_000_000 + i * 0.25)
    got = read_pcap(path)
    assert [f for _, f in got] == fs
    assert [t for t, _ in got] == [1_700_000_000_000_000_000 + i * 250_000_000
                                   for i in range(len(fs))]


def test_reads_big_endian_file_and_writes_into_a_file_object(tmp_path):
    hdr = struct.pack(">IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    rec = struct.pack(">IIII", 5, 7, 3, 60) + b"abc"
    path = tmp_path / "be.pcap"
    path.write_bytes(hdr + rec)
    assert read_pcap(path) == [(5_000_007_000, b"abc")]
    buf = io.BytesIO()
    w = PcapWriter(buf, snaplen_bytes=100)
    w.write(bytes(300), 42)
    w.close()
    w.close()
    assert not buf.closed
    path2 = tmp_path / "snap.pcap"
    path2.write_bytes(buf.getvalue())
    assert read_pcap(path2) == [(42, bytes(100))]   # cut at snaplen, orig_len 300 kept
    assert struct.unpack_from("<II", buf.getvalue(), 24 + 8) == (100, 300)
    with pytest.raises(RuntimeError):
        w.write(b"x", 0)


def test_writer_rejects_bad_times(tmp_path):
    with PcapWriter(tmp_path / "t.pcap") as w:
        with pytest.raises(ValueError):
            w.write(b"x", -1)
        with pytest.raises(ValueError):
            w.write(b"x", (1 << 32) * 1_000_000_000)


@pytest.mark.parametrize(("data", "exc", "header", "field"), [
    (b"\x0a\x0d\x0d\x0a" + bytes(28), WireFormatError, "pcap", "magic"),       # pcapng
    (bytes(10), TruncatedError, "pcap", "magic"),
    (struct.pack("<IHHiIII", MAGIC_NANOSECONDS, 2, 4, 0, 0, 65535, 101), WireFormatError,
     "pcap", "network"),
    (struct.pack("<IHHiIII", MAGIC_NANOSECONDS, 2, 4, 0, 0, 65535, 1) + bytes(10),
     TruncatedError, "record", "ts_sec"),
    (struct.pack("<IHHiIII", MAGIC_NANOSECONDS, 2, 4, 0, 0, 65535, 1)
     + struct.pack("<IIII", 0, 0, 20, 20) + bytes(5), TruncatedError, "record", "incl_len"),
    (struct.pack("<IHHiIII", MAGIC_NANOSECONDS, 2, 4, 0, 0, 65535, 1)
     + struct.pack("<IIII", 0, 0, 20, 10) + bytes(20), WireFormatError, "record", "incl_len"),
])
def test_bad_files_raise_naming_the_field(tmp_path, data, exc, header, field):
    path = tmp_path / "bad.pcap"
    path.write_bytes(data)
    with pytest.raises(exc) as e:
        read_pcap(path)
    assert (e.value.header, e.value.field) == (header, field)


@pytest.mark.parametrize("incl, orig, why", [(20, 60, "holds 20 of the frame's 60"),
                                             (0, 0, "is empty")])
def test_whole_refuses_cut_and_empty_records(tmp_path, incl, orig, why):
    path = tmp_path / "cut.pcap"
    good = build_udp_frame(dst_mac=1, src_mac=2, src_ip=3, dst_ip=4, src_port=5, dst_port=6)
    path.write_bytes(struct.pack("<IHHiIII", MAGIC_NANOSECONDS, 2, 4, 0, 0, 65535, 1)
                     + struct.pack("<IIII", 0, 0, len(good), len(good)) + good
                     + struct.pack("<IIII", 0, 0, incl, orig) + good[:incl])
    assert len(read_pcap(path)) == 2                    # as stored, by default
    with pytest.raises(WireFormatError, match=f"record 1 {why}") as e:
        read_pcap(path, whole=True)
    assert (e.value.header, e.value.field) == ("record", "incl_len")


@pytest.mark.skipif(shutil.which("tshark") is None,
                    reason="tshark is not installed (apt-get install tshark)")
def test_tshark_dissects_roce_as_infiniband(tmp_path):
    path = tmp_path / "roce.pcap"
    with PcapWriter(path) as w:
        w.write(frames()[0], T0_NS)
    out = subprocess.run(
        ["tshark", "-r", str(path), "-T", "fields", "-e", "frame.time_epoch",
         "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp", "-e",
         "infiniband.bth.psn", "-e", "infiniband.reth.va", "-e", "infiniband.reth.r_key",
         "-e", "infiniband.reth.dmalen"],
        capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    epoch, opcode, qp, psn, va, rkey, dmalen = out.split("\t")
    assert epoch == "1700000000.123456789"
    assert int(opcode) == Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE
    assert int(qp, 16) == 0x200 and int(psn) == 9
    assert int(va, 16) == 0x300 and int(rkey, 16) == 0x52490000 and int(dmalen) == 36
