"""openqlink.sim.runner: the Verilog given to Icarus, and the handlers file checks."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from openqlink.errors import DispatchError
from openqlink.sim.handlers import load_function_table
from openqlink.sim.runner import icarus_compatible

# The two forms Yosys's write_verilog gives Amaranth's combinational processes.
YOSYS_LIKE = r"""module top(y, z, a);
  reg \$auto$verilog_backend.cc:2355:dump_module$1  = 0;
  input [1:0] a;
  wire [1:0] a;
  output [3:0] y;
  reg [3:0] y;
  output z;
  reg z;
  always @*
    y[1:0] = 2'h1;
  always @* begin
    if (\$auto$verilog_backend.cc:2355:dump_module$1 ) begin end
    z = 1'h0;
    casez (a)
      2'h0:
          z = 1'h1;
    endcase
  end
  always @*
    y[3:2] = a;
endmodule
"""

TB = r"""module tb;
  wire [3:0] y; wire z;
  reg [1:0] a = 2'h0;   // holds its initial value: no event at time 0
  top dut(.y(y), .z(z), .a(a));
  initial begin #1 $display("%b %b", y[1:0], z); end
endmodule
"""


def test_constant_processes_become_initial_and_dump_module_toggles():
    text = icarus_compatible(YOSYS_LIKE)
    assert "initial y[1:0] = 2'h1;" in text
    assert "initial #0 \\$auto$verilog_backend.cc:2355:dump_module$1 = 1'h1;" in text
    assert "always @*\n    y[3:2] = a;" in text      # a process with an input is left alone


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="Icarus Verilog is not installed")
@pytest.mark.parametrize(("fixed", "expected"), [(False, "xx"), (True, "01 1")])
def test_icarus_evaluates_the_processes_at_time_0_only_when_fixed(tmp_path, fixed, expected):
    """Unfixed, the constant-only process never runs (y stays x); whether a process with inputs
    runs at time 0 is a race in Icarus (it did not in the QSC top: its outputs stayed x)."""
    src = tmp_path / "top.v"
    src.write_text((icarus_compatible(YOSYS_LIKE) if fixed else YOSYS_LIKE) + TB)
    subprocess.run(["iverilog", "-o", str(tmp_path / "a.out"), "-s", "tb", str(src)],
                   check=True, capture_output=True)
    out = subprocess.run(["vvp", "-n", str(tmp_path / "a.out")], check=True,
                         capture_output=True, text=True).stdout
    assert out.splitlines()[0].startswith(expected)


def test_handlers_file_without_table_is_refused(tmp_path):
    bad = tmp_path / "h.py"
    bad.write_text("x = 1\n")
    with pytest.raises(DispatchError, match="module-level `table`"):
        load_function_table(bad)
    with pytest.raises(DispatchError, match="device_table"):
        load_function_table(bad, gpu=True)
    with pytest.raises(DispatchError, match="device_table"):
        load_function_table(None, gpu=True)


def test_run_sim_refuses_program_lists_that_do_not_fit_before_building(tmp_path, monkeypatch):
    """More programs than the build's PPUs, a handlers list of another length, --gpu with
    several programs and gpu_frames without gpu stop run_sim before anything is built or
    simulated."""
    import openqlink.sim.runner as runner
    from openqlink.memory_map import QSCParams

    def no_bench(*args, **kwargs):
        raise AssertionError("run_sim went on to build and simulate")

    monkeypatch.setattr(runner, "run_bench", no_bench)
    programs = []
    for n in range(3):
        (tmp_path / f"p{n}.s").write_text("end\n")
        programs.append(tmp_path / f"p{n}.s")
    with pytest.raises(runner.SimulationError, match="3 programs for a build of 2 PPU"):
        runner.run_sim(programs, params=QSCParams(num_ppus=2))
    with pytest.raises(runner.SimulationError, match="2 handlers files for 3 programs"):
        runner.run_sim(programs, handlers=[None, None])
    with pytest.raises(runner.SimulationError, match="serves one PPU, not 2"):
        runner.run_sim(programs[:2], gpu=True)
    with pytest.raises(runner.SimulationError, match="gpu_frames .* needs gpu"):
        runner.run_sim(programs[:1], gpu_frames=True)
    with pytest.raises(runner.SimulationError, match="no program"):
        runner.run_sim([])
    # the CALLs' transport and the TAP's bridge
    with pytest.raises(runner.SimulationError, match="calls 'tcp'"):
        runner.run_sim(programs[:1], calls="tcp")
    with pytest.raises(runner.SimulationError, match="udp bridge .* only with a TAP"):
        runner.run_sim(programs[:1], bridge="udp")
    with pytest.raises(runner.SimulationError, match="not with calls 'roce'"):
        runner.run_sim(programs[:1], tap="qtap9", bridge="udp", calls="roce")
    with pytest.raises(runner.SimulationError, match="gpu_frames takes RoCEv2"):
        runner.run_sim(programs[:1], gpu=True, gpu_frames=True, calls="udp")


def test_run_sim_gives_the_bench_one_program_and_handlers_file_per_ppu(tmp_path, monkeypatch):
    import openqlink.sim.runner as runner

    seen = {}

    def fake_bench(module, cfg, *, params, **kwargs):
        seen.update(cfg=cfg, params=params)
        return {}

    monkeypatch.setattr(runner, "run_bench", fake_bench)
    for name in ("a", "b"):
        (tmp_path / f"{name}.s").write_text("end\n")
        (tmp_path / f"{name}.py").write_text("from openqlink.dispatch import FunctionTable\n"
                                             "table = FunctionTable()\n")
    (tmp_path / "h.py").write_text((tmp_path / "a.py").read_text())
    runner.run_sim([tmp_path / "a.s", tmp_path / "b.s"], handlers=[tmp_path / "h.py", None],
                   seed=5)
    cfg = seen["cfg"]
    assert seen["params"].num_ppus == 2
    assert cfg["programs"] == [str(tmp_path / "a.s"), str(tmp_path / "b.s")]
    assert cfg["handlers_per_ppu"] == [str(tmp_path / "h.py"), str(tmp_path / "b.py")]
    assert (cfg["program"], cfg["handlers"], cfg["seed"]) == (cfg["programs"][0],
                                                               cfg["handlers_per_ppu"][0], 5)
    # the results name the files as the caller did (relative paths stay relative: two
    # checkouts give the same JSON); the bench gets them resolved
    monkeypatch.chdir(tmp_path)
    runner.run_sim(["a.s", "b.s"], handlers=["h.py", None])
    cfg = seen["cfg"]
    assert cfg["program_names"] == ["a.s", "b.s"] and cfg["handler_names"] == ["h.py", "b.py"]
    assert cfg["programs"] == [str(tmp_path / "a.s"), str(tmp_path / "b.s")]


def test_the_tops_verilog_is_made_again_only_when_what_it_depends_on_changes(tmp_path,
                                                                            monkeypatch):
    """build_verilog elaborates the top once per parameters and sources: a second run with the
    same ones takes qsc_top.v as it is; other parameters, or an edited source, make it again."""
    import openqlink.sim.runner as runner
    from openqlink.memory_map import QSCParams

    made: list[QSCParams] = []

    def generate(params):
        made.append(params)
        return f"module qsc_top(); // {params.num_ppus}\nendmodule\n"

    monkeypatch.setattr(runner, "generate_top_verilog", generate)
    monkeypatch.setenv(runner.VERILOG_CACHE_ENV, "off")     # this build folder's key alone
    one, two = QSCParams(num_ppus=1), QSCParams(num_ppus=2)
    path = runner.build_verilog(one, tmp_path)
    assert runner.build_verilog(one, tmp_path) == path and made == [one]
    runner.build_verilog(two, tmp_path)
    assert made == [one, two] and "// 2" in path.read_text()
    runner.build_verilog(two, tmp_path)
    assert made == [one, two]
    # an edited source changes the key
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("X = 1\n")
    before = runner.verilog_cache_key(one, roots=[src])
    (src / "a.py").write_text("X = 2\n")
    assert runner.verilog_cache_key(one, roots=[src]) != before
    assert runner.verilog_cache_key(one) != runner.verilog_cache_key(two)
    # a key recorded for other sources makes it again
    (tmp_path / "qsc_top.v.key").write_text("0" * 64 + "\n")
    runner.build_verilog(two, tmp_path)
    assert made == [one, two, two]


def _counting_generate(monkeypatch, made: list):
    """Make runner.generate_top_verilog a quick stand-in that records each elaboration."""
    import openqlink.sim.runner as runner

    def generate(params):
        made.append(params)
        return f"module qsc_top(); // {params.num_ppus}\nendmodule\n"

    monkeypatch.setattr(runner, "generate_top_verilog", generate)


def test_the_shared_cache_elaborates_a_top_once_for_every_build_folder(tmp_path, monkeypatch):
    """A second build folder with the same parameters takes the top from the shared cache;
    other parameters elaborate their own."""
    import openqlink.sim.runner as runner
    from openqlink.memory_map import QSCParams

    made: list = []
    _counting_generate(monkeypatch, made)
    cache = tmp_path / "cache"
    monkeypatch.setenv(runner.VERILOG_CACHE_ENV, str(cache))
    one, two = QSCParams(num_ppus=1), QSCParams(num_ppus=2)
    a = runner.build_verilog(one, tmp_path / "a")
    b = runner.build_verilog(one, tmp_path / "b")
    assert made == [one] and a.read_text() == b.read_text()
    assert "// 1" in b.read_text() and "openqlink verilog cache" not in b.read_text()
    assert (tmp_path / "b" / "qsc_top.v.key").read_text().strip() == \
        runner.verilog_cache_key(one)
    assert sorted(p.name for p in cache.glob("*.v")) == [runner.verilog_cache_key(one) + ".v"]
    c = runner.build_verilog(two, tmp_path / "c")
    assert made == [one, two] and "// 2" in c.read_text()
    runner.build_verilog(two, tmp_path / "d")
    assert made == [one, two] and len(list(cache.glob("*.v"))) == 2
    assert not list(cache.glob("*.tmp"))


@pytest.mark.parametrize("damage", ["cut short", "altered", "no trailer", "empty"])
def test_a_damaged_cache_entry_is_not_used(tmp_path, monkeypatch, damage):
    """An entry cut short (a writer stopped), altered or without its digest is elaborated
    again and rewritten, never copied into a build folder."""
    import openqlink.sim.runner as runner
    from openqlink.memory_map import QSCParams

    made: list = []
    _counting_generate(monkeypatch, made)
    monkeypatch.setenv(runner.VERILOG_CACHE_ENV, str(tmp_path / "cache"))
    params = QSCParams()
    good = runner.build_verilog(params, tmp_path / "a").read_text()
    entry = tmp_path / "cache" / f"{runner.verilog_cache_key(params)}.v"
    data = entry.read_bytes()
    entry.write_bytes({"cut short": data[:len(data) // 2],
                       "altered": data.replace(b"// 1", b"// 7"),
                       "no trailer": data[:data.rindex(b"// openqlink")],
                       "empty": b""}[damage])
    assert runner.build_verilog(params, tmp_path / "b").read_text() == good
    assert len(made) == 2 and entry.read_bytes() == data


def test_the_shared_cache_folder_comes_from_the_environment(tmp_path, monkeypatch):
    import openqlink.sim.runner as runner

    monkeypatch.delenv(runner.VERILOG_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert runner.verilog_cache_dir() == tmp_path / "xdg" / "openqlink" / "verilog"
    monkeypatch.setenv(runner.VERILOG_CACHE_ENV, str(tmp_path / "mine"))
    assert runner.verilog_cache_dir() == tmp_path / "mine"
    for off in ("off", ""):
        monkeypatch.setenv(runner.VERILOG_CACHE_ENV, off)
        assert runner.verilog_cache_dir() is None


def test_the_shared_cache_keeps_the_most_recently_used_entries(tmp_path):
    import openqlink.sim.runner as runner

    for i in range(5):
        (tmp_path / f"{i}.v").write_text("x")
        (tmp_path / f"{i}.lock").write_text("")
        os.utime(tmp_path / f"{i}.v", (1000 + i, 1000 + i))
    runner._prune_cache(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3.lock", "3.v", "4.lock", "4.v"]


def _build_in_child(build_dir: str, made_log: str) -> None:
    """One racing process: a slow stand-in elaboration that logs each call, then a build."""
    import time

    import openqlink.sim.runner as runner
    from openqlink.memory_map import QSCParams

    def generate(params):
        with open(made_log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.3)                 # widen the window in which the others ask too
        return "module qsc_top();\n" + "// filler\n" * 20000 + "endmodule\n"

    runner.generate_top_verilog = generate
    runner.build_verilog(QSCParams(), Path(build_dir))


def test_processes_racing_for_one_top_elaborate_it_once(tmp_path, monkeypatch):
    """pytest-xdist workers wanting the same top at once: one elaborates, the others wait for
    its entry; every build folder gets the whole text and no temporary file is left."""
    import multiprocessing

    import openqlink.sim.runner as runner

    monkeypatch.setenv(runner.VERILOG_CACHE_ENV, str(tmp_path / "cache"))
    made_log = tmp_path / "made.log"
    ctx = multiprocessing.get_context("fork")
    children = [ctx.Process(target=_build_in_child, args=(str(tmp_path / f"b{i}"), str(made_log)))
                for i in range(4)]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    assert [child.exitcode for child in children] == [0] * 4
    assert len(made_log.read_text().split()) == 1
    texts = {(tmp_path / f"b{i}" / "qsc_top.v").read_text() for i in range(4)}
    assert len(texts) == 1 and texts.pop().endswith("endmodule\n")
    assert not list((tmp_path / "cache").glob("*.tmp"))


def test_the_verilog_key_reads_the_gateware_and_the_host_modules_it_imports_alone():
    """The key follows the gateware's imports: the memory map, the ISA layout and the wire
    layouts are in; the dispatcher, the bridges, the GPU package and the CLI are not, so
    editing those keeps the cached Verilog."""
    from openqlink.sim import runner

    host = Path(runner.__file__).resolve().parents[1] / "host"
    names = {str(p.relative_to(p.parents[1])) if p.parent.name in ("wire", "isa") else p.name
             for p in runner.verilog_sources() if host in p.parents}
    assert {"memory_map.py", "errors.py", "isa/layout.py", "wire/rpc.py", "wire/roce.py",
            "wire/control.py"} <= names
    assert not names & {"dispatch.py", "qsc.py", "roce.py", "cli.py", "control.py",
                        "calibration.py"}
    assert not any("gpu" in str(p) or "bridges" in str(p) for p in runner.verilog_sources())


def test_every_module_the_elaboration_loads_is_in_the_verilog_key():
    """What the static reading of the imports finds covers what elaborating the tops really
    loads (a fresh interpreter imports every gateware module and elaborates the QSC top and a
    board's simulation top): a dependency it missed would let a stale cached top through."""
    import json
    import sys

    from openqlink.sim import runner

    script = (
        "import json, pkgutil, sys, importlib\n"
        "import openqlink.gateware as g\n"
        "for m in pkgutil.walk_packages(g.__path__, 'openqlink.gateware.'):\n"
        "    importlib.import_module(m.name)\n"
        "from amaranth.hdl import Fragment\n"
        "from openqlink.memory_map import QSCParams\n"
        "from openqlink.gateware.top import QSCTop\n"
        "from openqlink.gateware.boards import PROFILES\n"
        "from openqlink.gateware.boards.top import SimBoardTop\n"
        "Fragment.get(QSCTop(QSCParams(num_ppus=2, imem_depth=64, env_depth=64)), None)\n"
        "Fragment.get(SimBoardTop(PROFILES['ecpix5-85']), None)\n"
        "print(json.dumps(sorted(m.__file__ for n, m in list(sys.modules.items())\n"
        "      if (n == 'openqlink' or n.startswith('openqlink.'))\n"
        "      and getattr(m, '__file__', None))))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout
    loaded = {Path(f).resolve() for f in json.loads(out.splitlines()[-1])}
    assert loaded, "nothing loaded"
    missing = loaded - set(runner.verilog_sources())
    assert not missing, f"loaded by the elaboration, not in the key: {sorted(missing)}"


def test_the_sources_digest_is_kept_until_a_source_changes(tmp_path, monkeypatch):
    """The key's sources part is not read again while its files keep their size and time, and
    is read again when one of them changes (an edit of the same size included)."""
    import os

    from openqlink.sim import runner

    src = tmp_path / "a.py"
    src.write_text("X = 1\n")
    calls = []

    def sources():
        calls.append(1)
        return [src]

    monkeypatch.setattr(runner, "verilog_sources", sources)
    monkeypatch.setattr(runner, "_SOURCES_MEMO", None)
    first = runner._sources_digest()
    assert runner._sources_digest() == first and len(calls) == 1
    src.write_text("X = 2\n")                      # same size: its time tells
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    second = runner._sources_digest()
    assert second != first and len(calls) == 2
    src.write_text("X = 22\n")
    assert runner._sources_digest() not in (first, second) and len(calls) == 3


def test_a_source_changed_while_it_is_read_is_read_again(tmp_path, monkeypatch):
    from openqlink.sim import runner

    src = tmp_path / "a.py"
    src.write_text("X = 1\n")
    calls = []
    monkeypatch.setattr(runner, "verilog_sources", lambda: [src])
    monkeypatch.setattr(runner, "_SOURCES_MEMO", None)
    files_digest = runner._files_digest

    def saved_meanwhile(files):
        calls.append(1)
        digest = files_digest(files)
        if len(calls) == 1:
            src.write_text("X = 22\n")         # saved between the read and the memo
        return digest

    monkeypatch.setattr(runner, "_files_digest", saved_meanwhile)
    first = runner._sources_digest()
    second = runner._sources_digest()          # not the memo of the old text
    assert len(calls) == 2 and second != first


def test_a_source_that_does_not_parse_is_a_simulation_error(monkeypatch):
    import ast

    from openqlink.sim import runner

    def broken(source, filename="<unknown>", *args, **kwargs):
        raise SyntaxError("invalid syntax", (filename, 3, 1, "x ="))

    monkeypatch.setattr(ast, "parse", broken)
    with pytest.raises(runner.SimulationError, match=r"the top's sources: .*\.py"):
        runner.verilog_sources()


def test_the_key_follows_amaranths_choice_of_yosys(monkeypatch):
    from openqlink.memory_map import QSCParams
    from openqlink.sim import runner

    monkeypatch.delenv("AMARANTH_USE_YOSYS", raising=False)
    bundled = runner.verilog_cache_key(QSCParams())
    monkeypatch.setenv("AMARANTH_USE_YOSYS", "system")
    assert runner.verilog_cache_key(QSCParams()) != bundled
