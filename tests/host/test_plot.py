"""Tests of openqlink.plot and the commands that draw (qlink plot, qlink sim --plot) on a small
synthetic results dict of two PPUs: what lands on the Axes, the files, the errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from openqlink.cli import main
from openqlink.errors import PlotError, PlotUnavailableError

pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")

from openqlink.plot import (  # noqa: E402
    histogram_figure,
    plot_histogram,
    plot_timeline,
    timeline_figure,
)

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _ev(channel: str, kind: str, cycle: int, **extra) -> dict:
    return {"channel": channel, "kind": kind, "dtd_cycle": cycle, "time_ns": cycle * 4.0,
            **extra}


def _results() -> dict:
    """Two PPUs, as ``qlink sim --json`` writes them: PPU 0 plays twice on its qubit's drive and
    once on a coupler, measures twice, toggles marker 2 twice and makes two CALLs; PPU 1 plays
    once (a pulse still playing at the end), measures once and makes one CALL; one more CALL of
    PPU 0 has no request cycle (an older bench's results)."""
    events = [
        _ev("drive0.0", "play_start", 1000, qubit=0, p1=0.0),
        _ev("marker0.2", "marker_on", 1000),
        _ev("drive1.0", "play_start", 1000, qubit=0, p1=0.0),
        _ev("drive0.0", "play_end", 1064, qubit=0, p1=0.5),
        _ev("readout0.0", "acquire_start", 1064, qubit=0, outcome=1, p1=0.5),
        _ev("drive1.0", "play_end", 1032, qubit=0, p1=0.25),
        _ev("readout1.0", "acquire_start", 1040, qubit=0, outcome=0, p1=0.25),
        _ev("marker0.2", "marker_off", 1100),
        _ev("readout1.0", "acquire_end", 1140, qubit=0),
        _ev("readout0.0", "acquire_end", 1164, qubit=0),
        _ev("drive0.2", "play_start", 1170, qubits=[0, 1]),
        _ev("drive0.2", "play_end", 1200, qubits=[0, 1]),
        _ev("readout0.0", "acquire_start", 1210, qubit=0, outcome=0, p1=0.1),
        _ev("readout0.0", "acquire_end", 1260, qubit=0),
        _ev("marker0.2", "marker_on", 1300),
        _ev("marker0.2", "marker_off", 1310),
        _ev("drive0.0", "play_start", 1500, qubit=0, p1=1.0),
        _ev("drive0.0", "play_end", 1564, qubit=0, p1=0.0),
        _ev("drive1.0", "play_start", 1600, qubit=0, p1=0.0),
    ]
    rpc = [
        {"ppu": 0, "function": "reset_decision", "function_id": 1, "request_id": 0,
         "status": 0, "args": "01", "result": "01", "request_dtd_cycle": 1200,
         "round_trip_cycles": 269, "round_trip_ns": 1076.0},
        {"ppu": 1, "function": "reset_decision", "function_id": 1, "request_id": 0,
         "status": 0, "args": "00", "result": "00", "request_dtd_cycle": 1180,
         "round_trip_cycles": 250, "round_trip_ns": 1000.0},
        {"ppu": 0, "function": "log_it", "function_id": 2, "request_id": 1,
         "status": 3, "args": "", "result": "", "request_dtd_cycle": 1480,
         "round_trip_cycles": 10, "round_trip_ns": 40.0},
        {"ppu": 0, "function": "old", "function_id": 3, "request_id": 2,
         "status": 0, "args": "", "result": "", "round_trip_cycles": 10,
         "round_trip_ns": 40.0},
    ]
    return {"program": "firmware/a.s", "params": {"dtd_clk_hz": 250_000_000},
            "start_time_cycles": 1000, "events": events, "rpc": rpc,
            "status": {"state": "DONE"},
            "ppus": [{"ppu": 0, "program": "firmware/a.s"}, {"ppu": 1, "program": "b.s"}]}


def _containers(ax) -> dict[str, list]:
    """Each BarContainer's label -> its rectangles as (x, width, y-centre)."""
    return {c.get_label(): [(p.get_x(), p.get_width(), p.get_y() + p.get_height() / 2)
                            for p in c.patches] for c in ax.containers}


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_lanes_bars_steps_and_calls_of_every_ppu():
    fig = timeline_figure(_results())
    (ax,) = [a for a in fig.axes if a.get_yticklabels()]
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    assert lanes == ["drive0.0", "drive0.2", "readout0.0", "marker0.2", "calls0",
                     "drive1.0", "readout1.0", "calls1"]
    y = {lane: i for i, lane in enumerate(lanes)}
    bars = _containers(ax)
    assert set(bars) == {"drive0.0 plays", "drive0.2 plays", "readout0.0 windows",
                         "calls0 calls", "drive1.0 plays", "readout1.0 windows",
                         "calls1 calls"}
    # One bar per play / window, from its start over its length, on its own lane.
    assert bars["drive0.0 plays"] == [(1000, 64, y["drive0.0"]), (1500, 64, y["drive0.0"])]
    assert bars["drive0.2 plays"] == [(1170, 30, y["drive0.2"])]
    assert bars["readout0.0 windows"] == [(1064, 100, y["readout0.0"]),
                                          (1210, 50, y["readout0.0"])]
    assert bars["readout1.0 windows"] == [(1040, 100, y["readout1.0"])]
    # The pulse still playing at the end of the results runs to the picture's right edge: the
    # last event's cycle and a margin of 1/40 of the cycles drawn.
    assert bars["drive1.0 plays"] == [(1000, 32, y["drive1.0"]), (1600, 15, y["drive1.0"])]
    assert ax.get_xlim() == (1000 - 15, 1600 + 15)
    # Each CALL with a request cycle: a bar from the request to the response.
    assert bars["calls0 calls"] == [(1200, 269, y["calls0"]), (1480, 10, y["calls0"])]
    assert bars["calls1 calls"] == [(1180, 250, y["calls1"])]
    texts = _texts(ax)
    assert texts.count("reset_decision(01) -> 01") == 1
    assert texts.count("reset_decision(00) -> 00") == 1
    assert "log_it() -> - (status 3)" in texts
    assert sorted(t for t in texts if t.startswith("outcome")) == [
        "outcome 0", "outcome 0", "outcome 1"]
    assert texts.count("q0") == 4 and texts.count("q0-q1") == 1
    # The marker: a step line, high from each marker_on to its marker_off.
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "marker0.2 steps"]
    xs, ys = list(line.get_xdata()), list(line.get_ydata())
    assert xs[1:-1] == [1000, 1100, 1300, 1310]
    high, low = y["marker0.2"] - 0.25, y["marker0.2"] + 0.25
    assert ys[1:-1] == [high, low, high, low] and ys[0] == low
    assert line.get_drawstyle() == "steps-post"
    # The axes: DTD cycles below, us above; the CALL without a request cycle is counted.
    assert ax.get_xlabel().startswith("DTD cycle")
    (top,) = ax.child_axes
    assert top.get_xlabel() == "time (us)"
    assert "1 CALL(s) not drawn" in ax.get_title()
    assert ax.get_title().startswith("PPU 0: a.s, PPU 1: b.s\n")
    one = {**_results(), "ppus": [{"ppu": 0, "program": "firmware/a.s"}]}
    assert [a for a in timeline_figure(one).axes if a.get_yticklabels()][0].get_title() \
        .startswith("a.s\n")


def test_one_ppu_only():
    (ax,) = [a for a in timeline_figure(_results(), ppu=1).axes if a.get_yticklabels()]
    assert ax.get_title() == "PPU 1: b.s"
    fig = timeline_figure(_results(), ppu=1, title="PPU one")
    (ax,) = [a for a in fig.axes if a.get_yticklabels()]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["drive1.0", "readout1.0", "calls1"]
    assert ax.get_title() == "PPU one"
    assert sum(len(c.patches) for c in ax.containers) == 2 + 1 + 1
    with pytest.raises(PlotError) as err:
        timeline_figure(_results(), ppu=2)
    assert err.value.field == "ppu" and "PPUs with any: 0, 1" in str(err.value)


def test_png_svg_pdf_files_and_the_same_bytes_twice(tmp_path):
    from PIL import Image

    results = _results()
    a = plot_timeline(results, tmp_path / "a.png")
    b = plot_timeline(json.loads(json.dumps(results)), tmp_path / "b.png")
    assert a == tmp_path / "a.png"
    assert a.read_bytes()[:8] == PNG_MAGIC
    assert a.read_bytes() == b.read_bytes()
    with Image.open(a) as im:
        assert im.format == "PNG" and im.size[0] > 1000
    svg = plot_timeline(results, tmp_path / "t.SVG").read_text()
    assert svg.startswith("<?xml") and "<svg" in svg
    for name in ("drive0.0", "readout1.0", "marker0.2", "calls1", "reset_decision(01) -&gt; 01"):
        assert name in svg, name
    assert plot_timeline(results, tmp_path / "t2.svg").read_text() == svg
    pdf = plot_timeline(results, tmp_path / "t.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and b"CreationDate" not in pdf
    assert plot_timeline(results, tmp_path / "t2.pdf").read_bytes() == pdf


def test_results_without_anything_to_draw(tmp_path):
    results = {"params": {"dtd_clk_hz": 250_000_000}, "events": [], "rpc": []}
    fig = timeline_figure(results)
    assert "no channel events and no CALLs" in _texts(fig.axes[0])
    assert plot_timeline(results, tmp_path / "e.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize("name", ["t.gif", "t", "t.png.txt"])
def test_an_unknown_suffix_is_refused_before_drawing(tmp_path, name):
    with pytest.raises(PlotError) as err:
        plot_timeline(_results(), tmp_path / name)
    assert err.value.field == "path" and ".png, .svg, .pdf" in str(err.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("results", "field"), [
    ([], "results"),
    ({"rpc": [], "params": {"dtd_clk_hz": 1}}, "events"),
    ({"events": [], "params": {"dtd_clk_hz": 1}}, "rpc"),
    ({"events": [], "rpc": []}, "params"),
    ({"events": [{"channel": "drive0.0", "kind": "play_start"}], "rpc": [],
      "params": {"dtd_clk_hz": 1}}, "events"),
    ({"events": [], "rpc": [{"function": "f"}], "params": {"dtd_clk_hz": 1}}, "rpc"),
])
def test_not_a_sim_result_names_the_field(tmp_path, results, field):
    with pytest.raises(PlotError) as err:
        plot_timeline(results, tmp_path / "x.png")
    assert err.value.field == field and "not a qlink sim result" in str(err.value)
    assert not (tmp_path / "x.png").exists()


def test_histogram_bars_medians_and_the_tail(tmp_path):
    samples = {"udp": [5000.0, 5200.0, 6000.0, 9000.0] * 25 + [90_000.0],
               "roce": [3000.0, 3100.0, 3200.0]}
    fig = histogram_figure(samples, title="t", bins=10)
    (ax,) = fig.axes
    counts = {c.get_label(): sum(p.get_height() for p in c.patches) for c in ax.containers}
    # The one sample beyond the larger series' p99 is counted in the title, not drawn.
    assert counts == {"udp": 100, "roce": 3}
    assert ax.get_title() == "t\n1 request(s) beyond 9.0 us (each series' p99) not drawn"
    medians = {ln.get_label(): list(ln.get_xdata()) for ln in ax.get_lines()}
    assert medians == {"udp p50 6.0 us": [6.0, 6.0], "roce p50 3.1 us": [3.1, 3.1]}
    assert ax.get_xlim()[0] <= 3.0 and ax.get_xlim()[1] >= 9.0
    assert ax.get_xlabel() == "latency per request (us)"
    assert plot_histogram(samples, tmp_path / "h.png").read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(PlotError):
        plot_histogram(samples, tmp_path / "h.jpeg")


# --- the commands ---------------------------------------------------------------------------

def test_qlink_plot_draws_a_saved_run(tmp_path):
    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(_results(), indent=2, sort_keys=True))
    res = CliRunner().invoke(main, ["plot", str(saved)])
    assert res.exit_code == 0, res.output
    default = tmp_path / "result.png"
    assert res.output == f"wrote {default}\n"
    assert default.read_bytes() == plot_timeline(_results(), tmp_path / "api.png").read_bytes()
    res = CliRunner().invoke(main, ["plot", str(saved), "-o", str(tmp_path / "p1.svg"),
                                    "--ppu", "1"])
    assert res.exit_code == 0, res.output
    svg = (tmp_path / "p1.svg").read_text()
    assert "drive1.0" in svg and "drive0.0" not in svg


def test_qlink_plot_user_errors_are_one_line_and_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(_results()))
    (tmp_path / "other.json").write_text(json.dumps({"frames": [], "counters": {}}))
    (tmp_path / "text.json").write_text("final PPU status: DONE\n")
    for args, line in (
            (["other.json"], "qlink plot: other.json: not a qlink sim result: no 'events' list"),
            (["text.json"], "qlink plot: text.json: not JSON (Expecting value, line 1)"),
            (["result.json", "-o", "t.gif"], "qlink plot: -o: t.gif: a picture is written as "
                                             ".png, .svg, .pdf"),
            (["result.json", "-o", "no/dir/t.png"],
             "qlink plot: -o no/dir/t.png: directory no/dir does not exist"),
            (["result.json", "--ppu", "5", "-o", "t.png"],
             "qlink plot: PPU 5 has no events and no CALLs")):
        res = CliRunner().invoke(main, ["plot", *args])
        assert res.exit_code == 2, (args, res.output)
        assert res.output.count("\n") == 1 and res.output.startswith(line), (args, res.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.json", "result.json",
                                                            "text.json"]


def test_qlink_sim_plot_draws_after_the_run(tmp_path, fake_run_sim, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("p.s").write_text("set r1, 1\nend\n")
    results = _results()
    results["ppus"][1]["status"] = {"state": "DONE"}
    results["ppus"][0]["status"] = {"state": "DONE"}
    fake_run_sim["results"] = results
    res = CliRunner().invoke(main, ["sim", "p.s", "--quiet", "--plot", "t.png"])
    assert res.exit_code == 0, res.output
    assert Path("t.png").read_bytes() == plot_timeline(results, tmp_path / "a.png").read_bytes()


def test_qlink_sim_plot_errors_come_before_the_run(tmp_path, fake_run_sim, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("p.s").write_text("set r1, 1\nend\n")
    for args, line in (
            (["--plot", "no/dir/t.png"], "qlink sim: --plot no/dir/t.png: directory no/dir "
                                         "does not exist"),
            (["--plot", "t.jpg"], "qlink sim: --plot: t.jpg: a picture is written as "
                                  ".png, .svg, .pdf")):
        res = CliRunner().invoke(main, ["sim", "p.s", *args])
        assert res.exit_code == 2, (args, res.output)
        assert res.output.count("\n") == 1 and res.output.startswith(line), (args, res.output)
    assert "programs" not in fake_run_sim


#: Runs Python with matplotlib made absent, as after ``pip install -e '.[sim]'`` alone.
HIDE_MATPLOTLIB = """
import sys
class NoMatplotlib:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'matplotlib':
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
for name in [m for m in sys.modules if m.split('.')[0] == 'matplotlib']:
    del sys.modules[name]
sys.meta_path.insert(0, NoMatplotlib())
"""


def test_without_matplotlib_one_line_names_the_extra(tmp_path):
    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(_results()))
    (tmp_path / "p.s").write_text("set r1, 1\nend\n")
    script = HIDE_MATPLOTLIB + f"""
import openqlink.plot, openqlink.cli          # importing needs no matplotlib
from openqlink.errors import PlotUnavailableError
try:
    openqlink.plot.plot_timeline({{"events": [], "rpc": [], "params": {{"dtd_clk_hz": 1}}}},
                                 {str(tmp_path / 'api.png')!r})
except PlotUnavailableError as exc:
    print("API:", exc)
from click.testing import CliRunner
import openqlink.sim.runner
def no_sim(*a, **k):
    raise AssertionError("simulated")
openqlink.sim.runner.run_sim = no_sim
for args in (["plot", {str(saved)!r}], ["sim", {str(tmp_path / 'p.s')!r}, "--plot",
                                        {str(tmp_path / 't.png')!r}]):
    res = CliRunner().invoke(openqlink.cli.main, args)
    print("CLI:", res.exit_code, res.output, end="")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    hint = "drawing needs matplotlib, which is not installed: pip install -e '.[plot]'"
    assert lines == [f"API: {hint}", f"CLI: 2 qlink plot: -o: {hint}",
                     f"CLI: 2 qlink sim: --plot: {hint}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.s", "result.json"]


def test_plot_unavailable_is_an_import_error():
    assert issubclass(PlotUnavailableError, ImportError)
