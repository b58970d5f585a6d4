"""``qlink sim --inject``: a capture replayed into the QSC's Verilog, each frame's verdict.

The capture is built here from the wire formats' layouts (the host package's frame builders, and
frames damaged on purpose); the replay must judge each frame as the receive rules say, land the
accepted writes byte for byte in the dumped regions, and record the QSC's replies.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from openqlink.cli import main
from openqlink.memory_map import (
    ENV_OFFSET,
    IMEM_OFFSET,
    REGS_OFFSET,
    QSCParams,
    global_reg,
    ppu_base,
)
from openqlink.pcap import PcapWriter, read_pcap
from openqlink.qsc import RKeys
from openqlink.sim.info import sim_info
from openqlink.sim.runner import SimConfig
from openqlink.wire.arp import ARP, ArpOperation
from openqlink.wire.control import CONTROL_REQUEST, Command, Flags
from openqlink.wire.ethernet import ETHERNET, EtherType, mac_to_int
from openqlink.wire.ipv4 import ip_to_int
from openqlink.wire.packet import build_roce_frame, build_udp_frame, parse_frame
from openqlink.wire.roce import Opcode
from openqlink.wire.udp import CONTROL_PORT

pytestmark = [
    pytest.mark.cocotb,
    pytest.mark.skipif(shutil.which("iverilog") is None,
                       reason="Icarus Verilog is not installed (apt-get install iverilog)"),
]

#: A QSC and host set up unlike the bench's defaults, as a capture from another lab would be.
QSC_MAC, QSC_IP = "02:aa:00:00:00:09", "10.1.2.9"
HOST_MAC, HOST_IP = "02:bb:00:00:00:01", "10.1.2.1"
QPN_BASE, HOST_QPN = 0x240, 0x77
IMEM_RKEY, ENV_RKEY = 0x1234_5678, 0x0BAD_F00D
EPSN = 1000
PMTU = 256
#: Two UC WRITE messages of FIRST, MIDDLE, LAST at the PMTU into the instruction ring: the first
#: loses its MIDDLE (the next one is out of sequence), the second lands whole.
MESSAGE = bytes((7 * i) & 0xFF for i in range(600))
#: What the upload QP 1 writes into the instruction ring.
QP1_WORDS = bytes(range(100, 132))


def _capture() -> tuple[list[bytes], list[tuple[bool, str | None]]]:
    """The frames and what each must come to (accepted, drop counter)."""
    imem_va = ppu_base(0) + IMEM_OFFSET
    env_va = ppu_base(0) + ENV_OFFSET

    def write(va: int, key: int, payload: bytes, **kw) -> bytes:
        fields = dict(dst_mac=QSC_MAC, src_mac=HOST_MAC, src_ip=HOST_IP, dst_ip=QSC_IP,
                      opcode=Opcode.RDMA_WRITE_ONLY, dest_qp=QPN_BASE, psn=EPSN, va=va,
                      r_key=key, payload=payload)
        fields.update(kw)
        return build_roce_frame(**fields)

    instructions = bytes(range(32, 32 + 48))             # three instruction slots
    samples = bytes(range(200, 256)) + bytes(range(8))  # 32 envelope samples
    good = write(imem_va + 32, IMEM_RKEY, instructions)
    read = CONTROL_REQUEST.pack(cmd=Command.RD_DWORD, flags=Flags.ACK_REQUEST, seq=1,
                                reserved=0, addr=global_reg("VERSION"), data=0)
    arp = (ETHERNET.pack(dst=(1 << 48) - 1, src=mac_to_int(HOST_MAC), ethertype=EtherType.ARP)
           + ARP.pack(oper=ArpOperation.REQUEST, sha=mac_to_int(HOST_MAC),
                      spa=ip_to_int(HOST_IP), tha=0, tpa=ip_to_int(QSC_IP)))
    frames = [
        (good, (True, None)),
        (good[:-1] + bytes([good[-1] ^ 0x80]), (False, "DROP_ICRC")),
        (write(imem_va + 96, IMEM_RKEY ^ 1, b"\xee" * 16), (False, "DROP_RKEY")),
        (write(imem_va + 112, IMEM_RKEY, b"\xee" * 16, src_mac="02:bb:00:00:00:02"),
         (False, "DROP_PEER")),
        (write(imem_va + 128, IMEM_RKEY, b"\xee" * 16, dest_qp=QPN_BASE + 16),
         (False, "DROP_QPN")),
        (good[:10], (False, "DROP_ETH")),
        (build_udp_frame(dst_mac=QSC_MAC, src_mac=HOST_MAC, src_ip=HOST_IP, dst_ip=QSC_IP,
                         src_port=50000, dst_port=CONTROL_PORT, payload=read), (True, None)),
        (arp + bytes(60 - len(arp)), (True, None)),
        (write(env_va + 64, ENV_RKEY, samples, psn=EPSN + 1), (True, None)),
        (write(imem_va + 256, IMEM_RKEY, MESSAGE[:PMTU], opcode=Opcode.RDMA_WRITE_FIRST,
               dma_len=len(MESSAGE), psn=EPSN + 2), (True, None)),
        (write(None, None, MESSAGE[2 * PMTU:], opcode=Opcode.RDMA_WRITE_LAST,
               psn=EPSN + 4), (False, "DROP_PSN")),
        (write(imem_va + 1024, IMEM_RKEY, MESSAGE[:PMTU], opcode=Opcode.RDMA_WRITE_FIRST,
               dma_len=len(MESSAGE), psn=EPSN + 5), (True, None)),
        (write(None, None, MESSAGE[PMTU:2 * PMTU], opcode=Opcode.RDMA_WRITE_MIDDLE,
               psn=EPSN + 6), (True, None)),
        (write(None, None, MESSAGE[2 * PMTU:], opcode=Opcode.RDMA_WRITE_LAST,
               psn=EPSN + 7), (True, None)),
        # QP 1, the bench's first upload QP: its own IMEM key is in its map, REGS is not
        (write(imem_va + 1664, RKeys.fixed(1).imem, QP1_WORDS, dest_qp=QPN_BASE + 1),
         (True, None)),
        (write(ppu_base(0) + REGS_OFFSET, RKeys.fixed(1).regs, bytes(8), dest_qp=QPN_BASE + 1,
               psn=EPSN + 1), (False, "DROP_RKEY")),
    ]
    return [f for f, _ in frames], [v for _, v in frames]


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    out = tmp_path_factory.mktemp("inject")
    frames, expected = _capture()
    with PcapWriter(out / "in.pcap") as pcap:
        for i, frame in enumerate(frames):
            pcap.write(frame, 1000 * i)
    args = ["sim", "--inject", str(out / "in.pcap"), "--json", str(out / "r.json"),
            "--pcap", str(out / "wire.pcap"), "--dump-regions", str(out / "dump" / "a"),
            "--build-dir", str(out / "build"), "--qsc-mac", QSC_MAC, "--qsc-ip", QSC_IP,
            "--host-mac", HOST_MAC, "--host-ip", HOST_IP, "--qpn-base", hex(QPN_BASE),
            "--host-qpn", hex(HOST_QPN), "--rkey", f"ppu0_imem={IMEM_RKEY:#x}",
            "--rkey", f"ppu0_env={ENV_RKEY}", "--epsn", str(EPSN), "--pmtu", str(PMTU)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return out, frames, expected, json.loads((out / "r.json").read_text()), result.output


def test_each_frame_gets_the_verdict_of_the_rules(replay):
    _, frames, expected, results, _ = replay
    assert [f["index"] for f in results["frames"]] == list(range(len(frames)))
    assert [(f["accepted"], f["reason"]) for f in results["frames"]] == expected


def test_the_counters_add_up_to_the_verdicts(replay):
    _, frames, expected, results, _ = replay
    counted = results["replay_counters"]
    assert counted["RX_FRAMES"] == len(frames)
    for reason in {r for _, r in expected if r}:
        assert counted[reason] == sum(r == reason for _, r in expected), reason
    assert counted["RX_ROCE_ACCEPTED"] == 7
    assert counted["RX_CONTROL"] == 1 and counted["RX_ARP_REQUESTS"] == 1
    # The bench's own configuration traffic is in the totals, not in the replay's.
    assert results["counters"]["RX_FRAMES"] > counted["RX_FRAMES"]
    assert all(isinstance(v, int) for v in results["counters"].values())


def test_the_overrides_configured_the_qsc(replay):
    _, _, _, results, _ = replay
    config = results["config"]
    assert (config["mac"], config["ip"], config["qpn_base"]) == (QSC_MAC, QSC_IP, QPN_BASE)
    qp, *extra = config["qps"]
    assert (qp["qp"], qp["ppu"], qp["peer_mac"], qp["peer_ip"], qp["peer_qpn"], qp["epsn"]) == \
        (0, 0, HOST_MAC, HOST_IP, HOST_QPN, EPSN)
    keys = {r["name"]: r["rkey"] for r in config["regions"]}
    assert keys["ppu0_imem"] == IMEM_RKEY and keys["ppu0_env"] == ENV_RKEY
    # the upload QPs 1..3 of the one PPU: IMEM and ENV in their maps, not REGS
    assert [(q["qp"], q["qpn"], q["ppu"], q["peer_qpn"], sorted(q["rkeys"])) for q in extra] == \
        [(n, QPN_BASE + n, 0, HOST_QPN + n, ["ENV", "IMEM"]) for n in (1, 2, 3)]
    ctx, *extra_ctx = results["qp_contexts"]
    assert ctx["QSC_QPN"] == QPN_BASE and ctx["HOST_QPN"] == HOST_QPN
    assert ctx["IMEM_RKEY"] == IMEM_RKEY and ctx["RX_EPSN"] == EPSN
    for n, c in enumerate(extra_ctx, 1):
        assert (c["QSC_QPN"], c["HOST_QPN"], c["PPU"], c["PEER_IP"], c["RX_EPSN"]) == \
            (QPN_BASE + n, HOST_QPN + n, 0, ip_to_int(HOST_IP), EPSN)
        assert (c["IMEM_RKEY"], c["REGS_RKEY"]) == (RKeys.fixed(n).imem, 0)
    assert config["pmtu"] == PMTU and ctx["PMTU"] == 1          # IBTA's code of 256 bytes


def test_the_dumped_regions_hold_exactly_the_accepted_writes(replay):
    out, frames, _, results, _ = replay
    dump = out / "dump" / "a"
    config = results["config"]
    names = sorted(p.name for p in dump.iterdir())
    assert names == sorted(f"{r['name']}.bin" for r in config["regions"])
    lengths = {r["name"]: r["length"] for r in config["regions"]}
    for name, length in lengths.items():
        assert (dump / f"{name}.bin").stat().st_size == length, name
    imem = (dump / "ppu0_imem.bin").read_bytes()
    expect = bytearray(lengths["ppu0_imem"])
    expect[32:80] = parse_frame(frames[0]).payload
    expect[256:256 + PMTU] = MESSAGE[:PMTU]              # the message that lost its MIDDLE
    expect[1024:1024 + len(MESSAGE)] = MESSAGE
    expect[1664:1664 + len(QP1_WORDS)] = QP1_WORDS
    assert imem == bytes(expect)
    env = (dump / "ppu0_env.bin").read_bytes()
    expect = bytearray(lengths["ppu0_env"])
    expect[64:128] = parse_frame(frames[8]).payload
    assert env == bytes(expect)


def test_the_wire_capture_holds_the_replay_and_the_replies(replay):
    out, frames, _, _, _ = replay
    wire = [f for _, f in read_pcap(out / "wire.pcap")]
    sent = [f for f in wire if f in frames]
    assert len(sent) == len(frames)
    host = bytes.fromhex(HOST_MAC.replace(":", ""))
    replies = [parse_frame(f) for f in wire[wire.index(frames[0]):] if f[:6] == host]
    arp_replies = [f for f in replies if f.eth["ethertype"] == EtherType.ARP]
    assert len(arp_replies) == 1
    control = [f for f in replies if f.udp is not None and f.udp["src_port"] == CONTROL_PORT]
    assert control, "the replayed RD_DWORD got no reply"


def test_the_default_setup_is_what_qlink_info_prints():
    params = QSCParams()
    info = sim_info(params, 1, SimConfig())
    assert info["qps"][0]["epsn"] == 0
    assert info["mac"] == params.mac
