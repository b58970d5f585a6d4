"""System tests: the QSC top's Verilog on Icarus (cocotb) against the unchanged host package.

These build the real netlist and take a few seconds per run; they need Icarus Verilog
(``apt-get install iverilog``, done by ``.ci/setup``) and skip with that reason without it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from openqlink.memory_map import QSCParams
from openqlink.pcap import read_pcap
from openqlink.sim.bench_faults import FAULTS
from openqlink.sim.info import sim_info
from openqlink.sim.runner import SimConfig, run_bench, run_sim
from openqlink.wire.ethernet import mac_to_int
from openqlink.wire.ipv4 import ip_to_int
from openqlink.wire.packet import parse_frame
from openqlink.wire.rpc import Request, Response, fnv1a32
from openqlink.wire.udp import UDP_CALL_PORT_BASE

pytestmark = [
    pytest.mark.cocotb,
    pytest.mark.skipif(shutil.which("iverilog") is None,
                       reason="Icarus Verilog is not installed (apt-get install iverilog)"),
]

FIRMWARE = Path(__file__).resolve().parents[2] / "firmware"
PROGRAM = FIRMWARE / "active_reset.s"
#: Seeds of the qubit model whose single measurement gives 1 and 0 (checked by the tests).
SEED_ONE, SEED_ZERO = 1, 4


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sim_build")


@pytest.fixture(scope="module")
def run_one(build_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("run_one")
    results = run_sim(PROGRAM, json_path=out / "a.json", pcap_path=out / "a.pcap",
                      build_dir=build_dir, seed=SEED_ONE)
    return results, out


def _plays(results: dict) -> list[dict]:
    return [e for e in results["events"] if e["kind"] == "play_start"]


def test_active_reset_with_outcome_one_plays_the_reset_pulse(run_one):
    results, _ = run_one
    assert results["status"]["state"] == "DONE"
    assert [m["outcome"] for m in results["measurements"]] == [1]
    # The pi/2 pulse left the qubit in an even superposition (less 64 cycles of T1 decay).
    (meas,) = results["measurements"]
    assert meas["p1"] == pytest.approx(0.5, abs=0.01)
    assert (meas["qubit"], meas["channel"]) == (0, 0)
    plays = _plays(results)
    assert len(plays) == 2
    # The first pulse starts exactly at the trigger's start time (the timeline is exact).
    assert plays[0]["dtd_cycle"] == results["start_time_cycles"]
    acq = [e for e in results["events"] if e["kind"] == "acquire_start"]
    assert acq[0]["dtd_cycle"] == results["start_time_cycles"] + 64
    # One RPC, answered with status 0, after the modelled host turnaround.
    (rpc,) = results["rpc"]
    assert rpc["function"] == "reset_decision" and rpc["status"] == 0
    assert rpc["round_trip_ns"] > results["model"]["host_turnaround_ns"]
    # The reset pulse comes after the answer, and it really resets the qubit.
    assert plays[1]["dtd_cycle"] > acq[0]["dtd_cycle"] + rpc["round_trip_cycles"]
    # On the events' timeline: the request leaves after the window (its bit) closed, and the
    # answer is in before the reset pulse it decides.
    (acq_end,) = [e for e in results["events"] if e["kind"] == "acquire_end"]
    assert acq_end["dtd_cycle"] < rpc["request_dtd_cycle"]
    assert rpc["request_dtd_cycle"] + rpc["round_trip_cycles"] < plays[1]["dtd_cycle"]
    assert results["qubit_final_p1"] < 1e-3
    assert results["registers"]["R2"] == 1 and results["registers"]["CALL_COUNT"] == 1
    assert all(v == 0 for k, v in results["counters"].items() if k.startswith("DROP_"))
    for e in results["events"]:
        assert e["time_ns"] == pytest.approx(e["dtd_cycle"] * 4.0)


def test_active_reset_with_outcome_zero_skips_the_reset_pulse(build_dir):
    lines: list[str] = []
    results = run_sim(PROGRAM, build_dir=build_dir, seed=SEED_ZERO, progress=lines.append)
    # The progress callback heard each step in order, then the simulated time as it grew.
    steps = [line.split(":")[0].split(" (")[0] for line in lines]
    assert steps[:3] == ["the top's Verilog", "building the simulator", "simulating"], lines
    simulated = [float(line.split()[1]) for line in lines if "us simulated" in line]
    assert simulated and simulated == sorted(simulated) and simulated[-1] > 0, lines
    assert results["status"]["state"] == "DONE"
    assert [m["outcome"] for m in results["measurements"]] == [0]
    assert len(_plays(results)) == 1
    assert results["registers"]["R2"] == 0
    assert results["qubit_final_p1"] < 1e-3


def test_two_runs_give_identical_json_and_pcap(run_one, build_dir, tmp_path):
    _, out = run_one
    run_sim(PROGRAM, json_path=tmp_path / "b.json", pcap_path=tmp_path / "b.pcap",
            build_dir=build_dir, seed=SEED_ONE)
    assert (out / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert (out / "a.pcap").read_bytes() == (tmp_path / "b.pcap").read_bytes()


def test_pcap_frames_check_with_scapy_and_match_the_rpc(run_one):
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    results, out = run_one
    frames = read_pcap(out / "a.pcap")
    assert frames == sorted(frames, key=lambda tf: tf[0])
    roce = [f for _, f in frames if (p := parse_frame(f)).udp and p.udp["dst_port"] == 4791]
    assert len(roce) >= 4
    for frame in roce:
        pkt = Ether(frame)
        got = bytes(pkt[BTH])[-4:]
        # scapy recomputes the ICRC independently when the field is cleared.
        pkt[BTH].icrc = None
        del pkt[IP].chksum, pkt[UDP].chksum
        rebuilt = Ether(bytes(pkt))
        assert bytes(rebuilt[BTH])[-4:] == got, frame.hex()
    requests = [Request.unpack(parse_frame(f).payload) for f in roce
                if parse_frame(f).bth["opcode"] == 0x2B]
    responses = [Response.unpack(parse_frame(f).payload) for f in roce
                 if parse_frame(f).bth["opcode"] == 0x24]
    assert [r.function_id for r in requests] == [fnv1a32("reset_decision")]
    assert requests[0].payload == b"\x01"
    assert responses[0].request_id == requests[0].request_id
    assert responses[0].ptp_timestamp == requests[0].ptp_timestamp
    assert results["rpc"][0]["request_id"] == requests[0].request_id


def test_calls_over_udp_give_the_roce_runs_results(run_one, build_dir, tmp_path):
    """The same program with its CALL in the UDP transport (the QP's TRANSPORT 1, CUDA-Q
    realtime's udp format): the same measurement, answer and pulses; on the wire the request is
    one UDP datagram from the QP's port, checked by scapy, and the answer one datagram back."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    roce, _ = run_one
    results = run_sim(PROGRAM, pcap_path=tmp_path / "u.pcap", build_dir=build_dir,
                      seed=SEED_ONE, calls="udp")
    assert results["status"]["state"] == "DONE"
    # the same outcomes (the start time differs: the host's set-up takes other writes)
    drop = ("dtd_cycle",)
    assert [{k: v for k, v in m.items() if k not in drop} for m in results["measurements"]] \
        == [{k: v for k, v in m.items() if k not in drop} for m in roce["measurements"]]
    keep = ("function", "function_id", "status", "args", "result")
    assert [{k: r[k] for k in keep} for r in results["rpc"]] == \
        [{k: r[k] for k in keep} for r in roce["rpc"]]
    assert [e["kind"] for e in results["events"]] == [e["kind"] for e in roce["events"]]
    assert results["qp_contexts"][0]["TRANSPORT"] == 1
    assert all(v == 0 for k, v in results["counters"].items() if k.startswith("DROP_"))
    calls = [Ether(f) for _, f in read_pcap(tmp_path / "u.pcap")
             if (p := parse_frame(f)).udp is not None and UDP_CALL_PORT_BASE in (
                 p.udp["src_port"], p.udp["dst_port"])]
    (req, resp) = calls
    assert (req[UDP].sport, req[UDP].chksum) == (UDP_CALL_PORT_BASE, 0)
    for pkt, layers in ((req, (IP,)), (resp, (IP, UDP))):
        for layer in layers:        # scapy recomputes each checksum when it is cleared
            got, again = pkt[layer].chksum, pkt.copy()
            del again[layer].chksum
            assert Ether(bytes(again))[layer].chksum == got
    request = Request.unpack(bytes(req[UDP].payload)[:req[UDP].len - 8])
    assert request.function_id == fnv1a32("reset_decision") and request.payload == b"\x01"
    assert resp[UDP].dport == UDP_CALL_PORT_BASE and resp[UDP].chksum != 0
    response = Response.unpack(bytes(resp[UDP].payload)[:resp[UDP].len - 8])
    assert response.request_id == request.request_id and response.status == 0


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
def test_tshark_dissects_the_roce_frames_as_infiniband(run_one):
    _, out = run_one
    text = subprocess.run(
        ["tshark", "-r", str(out / "a.pcap"), "-Y", "infiniband", "-T", "fields",
         "-e", "infiniband.bth.opcode"],
        check=True, capture_output=True, text=True).stdout.split()
    assert "43" in text   # 0x2B RDMA_WRITE_ONLY_WITH_IMMEDIATE: the RPC request
    assert "36" in text   # 0x24 SEND_ONLY: the response
    assert "42" in text   # 0x2A RDMA_WRITE_ONLY: the program upload


@pytest.fixture(scope="module")
def faults(build_dir) -> dict:
    return run_bench("openqlink.sim.bench_faults", SimConfig(), build_dir=build_dir)


def test_bad_packets_are_dropped_counted_and_write_nothing(faults):
    results = faults
    for name, fault in results["faults"].items():
        assert fault["counted"] == 1, (name, fault)
        assert fault["after"] == fault["before"], name
    assert set(results["faults"]) == set(FAULTS)
    assert results["accepted_during_faults"] == 0
    assert results["good_write_after_faults"] == results["pattern"]


def test_the_qsc_is_closed_by_default_and_to_other_hosts(faults):
    """Against the gateware: an R_Key-0 write to TRIGGER straight after reset is dropped (RDMA
    receive off) and runs nothing; a second host reads but cannot configure a claimed QSC, nor
    write through RDMA with the owner's keys; releases hand the claim over."""
    closed = faults["closed"]
    assert closed["before_configure"] == {"state": "IDLE", "drop_udp": 1, "accepted": 0}
    assert closed["other_version"] != 0
    assert closed["owner"] == "192.168.0.1"
    assert closed["other_configure"] == "ClaimedError 0x21"
    assert closed["other_write"] == {"drop_peer": 1, "accepted": 0, "unchanged": True}
    assert closed["owner_released"] is None
    assert closed["owner_other"] == "192.168.0.77"
    assert closed["owner_end"] is None


def test_the_qsc_answers_arp_and_ping(faults):
    """Against the Verilog: an ARP request for the QSC's IP and two echo requests (odd and
    short payloads) are answered as an independent decoder (scapy) expects: addresses swapped,
    the request's data, checksums right, 60-byte minimum."""
    from scapy.layers.inet import ICMP, IP
    from scapy.layers.l2 import ARP, Ether
    from scapy.utils import checksum

    ping = faults["ping"]
    assert set(ping["replies"]) == {"arp", "echo_odd", "echo_short"}
    req = Ether(bytes.fromhex(ping["requests"]["arp"]))
    rep = Ether(bytes.fromhex(ping["replies"]["arp"]))
    assert len(bytes(rep)) == 60 and rep[ARP].op == 2
    assert (rep[ARP].hwdst, rep[ARP].pdst) == (req[ARP].hwsrc, req[ARP].psrc)
    assert rep.dst == req.src and (rep[ARP].hwsrc, rep[ARP].psrc) == (rep.src, req[ARP].pdst)
    for name in ("echo_odd", "echo_short"):
        req = Ether(bytes.fromhex(ping["requests"][name]))
        raw = bytes.fromhex(ping["replies"][name])
        rep = Ether(raw)
        assert len(raw) == max(60, 14 + req[IP].len)
        assert (rep.dst, rep.src) == (req.src, req.dst)
        assert (rep[IP].src, rep[IP].dst, rep[IP].ttl) == (req[IP].dst, req[IP].src, 64)
        assert (rep[ICMP].type, rep[ICMP].id, rep[ICMP].seq) == (0, req[ICMP].id, req[ICMP].seq)
        data_len = req[IP].len - 28
        assert bytes(rep[ICMP].payload)[:data_len] == bytes(req[ICMP].payload)[:data_len]
        # both checksums verify (scapy's RFC 1071 sum over the header, the ICMP message)
        assert checksum(raw[14:34]) == 0
        assert checksum(raw[34:14 + req[IP].len]) == 0


def test_a_lost_upload_packet_never_runs_a_stale_program(faults):
    """UC does not retransmit: the QSC refuses a trigger whose upload lost a packet, and a
    verified upload sends it again, against the gateware."""
    lost = faults["lost_upload"]
    assert lost["packets"] == 2 and lost["dropped"] == 2
    assert lost["unverified"]["state"] == "IDLE" and lost["unverified"]["trigger_incomplete"]
    assert lost["unverified"]["upload_words"] == 140 - 128      # the second packet's words
    assert lost["verified"] == {"state": "DONE", "trigger_incomplete": 0, "r1": 5, "r2": 6}


def test_a_restarted_host_gets_its_first_call_in_slot_0(faults):
    """Configuring a QP again (a host that restarted) restarts the QSC's side of it: after
    three requests (PSN 3, slot 3), the new host's first request arrives with PSN 0 in slot 0
    of its new ring, against the gateware."""
    rc = faults["reconnect"]
    assert rc["first_host"] == ["call_timeout"] * 3 and rc["first_host_requests"] == 3
    assert rc["psns_before"][0] == 3
    assert rc["psns_configured"] == [0, 0]
    assert rc["new_host"] == "call_timeout" and rc["new_host_requests"] == 1
    assert rc["new_ring_ready_slots"] == [0]
    assert rc["new_qp_rx_epsn"] == 1


def test_qlink_info_is_what_the_bench_configured(run_one):
    """``qlink info``'s QPs and regions are the gateware's QP context after the bench
    configured it, and every frame the host sent to the QSC is addressed with info's MAC, IP
    and ports, with a region's R_Key inside its region."""
    results, out = run_one
    info = sim_info(QSCParams(**results["params"]), num_configured=1)
    assert len(results["qp_contexts"]) == len(info["qps"]) == QSCParams().num_qps
    for qp, ctx in zip(info["qps"], results["qp_contexts"], strict=True):
        assert (qp["qpn"], qp["peer_qpn"], qp["ppu"]) == (ctx["QSC_QPN"], ctx["HOST_QPN"],
                                                          ctx["PPU"])
        assert {name: ctx[f"{name}_RKEY"] for name in qp["rkeys"]} == qp["rkeys"]
    qp, ctx = info["qps"][0], results["qp_contexts"][0]          # PPU 0's own QP
    rdma = [r for r in info["regions"] if r["rkey"] is not None]
    assert {r["name"]: r["rkey"] for r in rdma} == {
        f"ppu0_{name.lower()}": ctx[f"{name}_RKEY"] for name in ("IMEM", "ENV", "REGS")}
    writes = 0
    for _, frame in read_pcap(out / "a.pcap"):
        f = parse_frame(frame)
        if f.eth["dst"] != mac_to_int(info["mac"]):
            continue                                     # a frame from the QSC
        assert f.ip["dst"] == ip_to_int(info["ip"])
        assert f.udp["dst_port"] in (info["control_port"], info["rocev2_port"])
        if f.reth is not None:
            writes += 1
            assert f.bth["dest_qp"] == qp["qpn"] and f.bth["p_key"] == info["pkey"]
            region = next(r for r in rdma if r["rkey"] == f.reth["r_key"])
            assert region["va"] <= f.reth["va"] < region["va"] + region["length"]
    assert writes > 0


def test_results_json_has_the_documented_keys(run_one):
    """docs/simulation.md's table names every key of the JSON (and no key it lacks), and of
    each PPU's entry."""
    results, out = run_one
    data = json.loads((out / "a.json").read_text())
    doc = (Path(__file__).resolve().parents[2] / "docs" / "simulation.md").read_text()
    table = doc[doc.index("| key | what |"):doc.index("With several PPUs the printed timeline")]
    documented = set(re.findall(r"^\| `(\w+)`", table, re.M))
    documented |= {key for key in ("qubit_final_p1", "max_run_ns") if f"`{key}` is" in table}
    assert set(data) == documented, set(data) ^ documented
    ppu_row = table[table.index("| `ppus` |"):].splitlines()[0]
    assert set(data["ppus"][0]) <= set(re.findall(r"`(\w+)`", ppu_row))
    assert data["program"] == str(PROGRAM)
    assert set(data["events"][0]) >= {"channel", "kind", "dtd_cycle", "time_ns"}
    assert set(data["rpc"][0]) >= {"function", "request_id", "status", "request_dtd_cycle",
                                   "round_trip_cycles", "round_trip_ns"}


def test_qlink_sim_plot_draws_the_run(build_dir, tmp_path):
    """``qlink sim --plot`` draws the run's timeline after it: both pulses, the window with its
    outcome and the CALL's round trip where the JSON puts them; ``qlink plot`` draws the same
    picture, byte for byte, from the saved JSON."""
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    from click.testing import CliRunner

    from openqlink.cli import main
    from openqlink.plot import timeline_figure

    res = CliRunner().invoke(main, ["sim", str(PROGRAM), "--build-dir", str(build_dir),
                                    "--seed", str(SEED_ONE), "--quiet",
                                    "--json", str(tmp_path / "r.json"),
                                    "--plot", str(tmp_path / "t.png")])
    assert res.exit_code == 0, res.output
    png = (tmp_path / "t.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    res = CliRunner().invoke(main, ["plot", str(tmp_path / "r.json"), "-o",
                                    str(tmp_path / "again.png")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "again.png").read_bytes() == png
    results = json.loads((tmp_path / "r.json").read_text())
    (ax,) = [a for a in timeline_figure(results).axes if a.get_yticklabels()]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["drive0.0", "readout0.0", "calls0"]
    bars = {c.get_label(): [(p.get_x(), p.get_width()) for p in c.patches]
            for c in ax.containers}
    plays = [e["dtd_cycle"] for e in results["events"] if e["channel"] == "drive0.0"]
    window = [e["dtd_cycle"] for e in results["events"] if e["channel"] == "readout0.0"]
    (rpc,) = results["rpc"]
    assert bars == {
        "drive0.0 plays": [(plays[0], plays[1] - plays[0]), (plays[2], plays[3] - plays[2])],
        "readout0.0 windows": [(window[0], window[1] - window[0])],
        "calls0 calls": [(rpc["request_dtd_cycle"], rpc["round_trip_cycles"])]}
    texts = [t.get_text() for t in ax.texts]
    assert "outcome 1" in texts and "reset_decision(01) -> 01" in texts


MULTI_CALL = """\
; ten CALLs: the host ring of 8 slots wraps; each answer is the argument plus one
        set r1, 0
        set r3, 0
loop:   call incr(r1:8) -> r2
        add r1, r2, 0
        add r3, r3, 1
        blt r3, 10, loop
        end
"""
MULTI_CALL_HANDLERS = """\
from openqlink.dispatch import FunctionTable, TypeDesc
table = FunctionTable()
@table.host_call("incr", args=[TypeDesc.uint8()], results=[TypeDesc.uint8()])
def incr(x):
    return (x + 1) & 0xFF
"""


def test_calls_fill_the_host_ring_round_robin_and_wrap(build_dir, tmp_path):
    from openqlink.wire.roce import split_slot_immediate

    (tmp_path / "multi.s").write_text(MULTI_CALL)
    (tmp_path / "multi.py").write_text(MULTI_CALL_HANDLERS)
    results = run_sim(tmp_path / "multi.s", build_dir=build_dir, pcap_path=tmp_path / "m.pcap",
                      num_slots=8, slot_size=256)
    assert results["status"]["state"] == "DONE"
    assert results["registers"]["R1"] == 10 and results["registers"]["CALL_COUNT"] == 10
    assert [r["status"] for r in results["rpc"]] == [0] * 10
    assert [r["request_id"] for r in results["rpc"]] == list(range(10))
    writes = [parse_frame(f) for _, f in read_pcap(tmp_path / "m.pcap")]
    writes = [f for f in writes if f.bth is not None and f.bth["opcode"] == 0x2B]
    slots = [split_slot_immediate(f.immdt["imm"])[1] for f in writes]
    assert slots == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]
    assert [f.reth["va"] for f in writes] == [256 * s for s in slots]
    psns = [f.bth["psn"] for f in writes]
    assert psns == list(range(psns[0], psns[0] + 10))
    assert [split_slot_immediate(f.immdt["imm"])[0] for f in writes] == psns


WIDE_CALL = """\
; one CALL of four arguments (1, 8, 12 and 32 bits: 8 bytes) with a 64-bit result
        set r1, 0xFF
        set r2, 0x1234
        set r3, 0xABCDE
        set r4, -2
        call mix(r1:1, r2:8, r3:12, r4) -> r5, r6
        end
"""
WIDE_CALL_HANDLERS = """\
from openqlink.dispatch import FunctionTable, TypeDesc
table = FunctionTable()
@table.host_call("mix", args=[TypeDesc.bits(1), TypeDesc.uint8(), TypeDesc.bits(12),
                              TypeDesc.int32()], results=[TypeDesc.int64()])
def mix(a, b, c, d):
    c = sum(bit << k for k, bit in enumerate(c))
    return (a[0] << 62) | (b << 48) | (c << 32) | (d & 0xFFFFFFFF)
"""


def test_a_call_of_four_arguments_and_a_64_bit_result_end_to_end(build_dir, tmp_path):
    """The gateware packs the four arguments one after another (8 bytes, a 110-byte frame
    whose ICRC scapy recomputes), the host's HOST_CALL decodes them by its schema, and the
    int64 result lands in r5 (low word) and r6 (high word)."""
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    (tmp_path / "wide.s").write_text(WIDE_CALL)
    (tmp_path / "wide.py").write_text(WIDE_CALL_HANDLERS)
    results = run_sim(tmp_path / "wide.s", build_dir=build_dir, pcap_path=tmp_path / "w.pcap")
    assert results["status"]["state"] == "DONE"
    want = (1 << 62) | (0x34 << 48) | (0xCDE << 32) | 0xFFFFFFFE
    assert results["registers"]["R5"] == want & 0xFFFFFFFF
    assert results["registers"]["R6"] == want >> 32
    (rpc,) = results["rpc"]
    assert rpc["status"] == 0 and bytes.fromhex(rpc["args"]) == bytes.fromhex("0134de0cfeffffff")
    (frame,) = [f for _, f in read_pcap(tmp_path / "w.pcap")
                if (p := parse_frame(f)).bth is not None and p.bth["opcode"] == 0x2B]
    assert len(frame) == 110
    assert Request.unpack(parse_frame(frame).payload).payload == bytes.fromhex("0134de0cfeffffff")
    pkt = Ether(frame)
    got = bytes(pkt[BTH])[-4:]
    pkt[BTH].icrc = None
    del pkt[IP].chksum, pkt[UDP].chksum
    assert bytes(Ether(bytes(pkt))[BTH])[-4:] == got
