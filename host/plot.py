"""Pictures of a run: the timeline of ``qlink sim``'s results and latency histograms.

:func:`plot_timeline` draws the JSON of ``qlink sim --json`` (docs/simulation.md): one
horizontal lane per PTD channel, grouped by PPU (drive, readout, marker), and one lane of CALLs
per PPU that made any. On the x axis the DTD timeline (cycles, the events' ``dtd_cycle``), with
its time in us on the top axis.

* a pulse is a bar from its ``play_start`` to its ``play_end``, labelled with its qubit
  (``q0``; a coupler's ``q0-q1``);
* an acquisition window is a bar from ``acquire_start`` to ``acquire_end``, labelled with the
  outcome measured in it (``outcome 1``);
* a marker is a step, low while off and high while on;
* a CALL is a bar from the DTD cycle its request left the QSC's MAC (``request_dtd_cycle``) to
  that cycle plus its ``round_trip_cycles`` (its response's last beat in), labelled
  ``function(args) -> result`` (the argument and result bytes in hex) and its status when not
  0. A CALL without ``request_dtd_cycle`` (results of an older bench) is counted in the
  title, not drawn.

matplotlib (the ``[plot]`` extra) is imported only when a picture is drawn, with its Agg
renderer (no display). The output format follows the path's suffix: ``.png``, ``.svg`` or
``.pdf``; the files carry no date or software version, so the same results give the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import PlotError, PlotUnavailableError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["FORMATS", "require_matplotlib", "check_path", "check_results", "timeline_figure",
           "plot_timeline", "histogram_figure", "plot_histogram", "save_figure"]

#: The picture formats, by the output path's suffix.
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}

#: What each format's file would otherwise carry that changes from run to run or install to
#: install (a date, the software's version): left out.
_METADATA: dict[str, dict[str, Any]] = {
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
    "pdf": {"CreationDate": None, "ModDate": None, "Creator": None, "Producer": None},
}

#: matplotlib settings for every picture: text stays text in SVG (searchable, names the
#: channels), and SVG element ids come from a fixed salt (the same file from the same input).
_RC = {"svg.fonttype": "none", "svg.hashsalt": "openqlink", "pdf.compression": 6}

_KIND_ORDER = {"drive": 0, "readout": 1, "marker": 2, "calls": 3}
_COLORS = {"drive": "tab:blue", "readout": "tab:green", "marker": "tab:purple",
           "calls": "tab:orange"}
_INSTALL_HINT = "pip install -e '.[plot]'"


def require_matplotlib() -> None:
    """Raise :class:`~openqlink.errors.PlotUnavailableError` (one line, naming the extra to
    install) unless matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise PlotUnavailableError(f"drawing needs matplotlib, which is not installed: "
                                   f"{_INSTALL_HINT}") from exc


def check_path(path: str | Path) -> str:
    """The picture format of ``path`` by its suffix (``png``, ``svg`` or ``pdf``, any case);
    :class:`~openqlink.errors.PlotError` (field ``path``) for another suffix."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise PlotError("path", f"{path}: a picture is written as "
                        f"{', '.join(FORMATS)} (by the file's suffix), not "
                        f"{suffix or 'a file without a suffix'}")
    return FORMATS[suffix]


def check_results(results: Any) -> None:
    """Raise :class:`~openqlink.errors.PlotError` naming the first key that makes ``results``
    no ``qlink sim`` result: it must be an object with the lists ``events`` (each with
    ``channel``, ``kind`` and ``dtd_cycle``) and ``rpc``, and ``params.dtd_clk_hz``."""
    if not isinstance(results, Mapping):
        raise PlotError("results", "not a qlink sim result: not a JSON object")
    for key in ("events", "rpc"):
        if not isinstance(results.get(key), list):
            raise PlotError(key, f"not a qlink sim result: no '{key}' list")
    params = results.get("params")
    if not isinstance(params, Mapping) or not isinstance(params.get("dtd_clk_hz"), int | float):
        raise PlotError("params", "not a qlink sim result: no 'params.dtd_clk_hz'")
    for i, ev in enumerate(results["events"]):
        if (not isinstance(ev, Mapping) or not isinstance(ev.get("channel"), str)
                or not isinstance(ev.get("kind"), str)
                or not isinstance(ev.get("dtd_cycle"), int)):
            raise PlotError("events", f"not a qlink sim result: events[{i}] is not "
                            "{channel, kind, dtd_cycle, ...}")
    for i, r in enumerate(results["rpc"]):
        if not isinstance(r, Mapping) or not isinstance(r.get("round_trip_cycles"), int):
            raise PlotError("rpc", f"not a qlink sim result: rpc[{i}] has no "
                            "round_trip_cycles")


def _import_pyplot_free() -> tuple[Any, Any]:
    """matplotlib's Figure and Agg canvas (no pyplot: no global figure state, no display)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    return Figure, FigureCanvasAgg


def _channel_key(channel: str) -> tuple[int, int, int, str]:
    """Sort key of a lane: PPU, then drive / readout / marker / calls, then channel number."""
    head, _, tail = channel.partition(".")
    kind = head.rstrip("0123456789")
    ppu = head[len(kind):]
    return (int(ppu) if ppu.isdigit() else 1 << 30, _KIND_ORDER.get(kind, 9),
            int(tail) if tail.isdigit() else 0, channel)


def _ppu_of(channel: str) -> int | None:
    head = channel.partition(".")[0]
    digits = head[len(head.rstrip("0123456789")):]
    return int(digits) if digits else None


def _qubit_label(ev: Mapping) -> str:
    if "qubits" in ev and isinstance(ev["qubits"], Sequence):
        return "q" + "-q".join(str(q) for q in ev["qubits"])
    if "qubit" in ev:
        return f"q{ev['qubit']}"
    return ""


def _windows(events: list[Mapping], start: str, end: str,
             last_cycle: int) -> list[tuple[int, int, Mapping]]:
    """(first cycle, cycles, the start event) of each start/end pair of one channel, in order;
    a start without its end (still under way when the run ended) lasts to ``last_cycle``, the
    right edge of the picture."""
    out: list[tuple[int, int, Mapping]] = []
    opened: Mapping | None = None
    for ev in events:
        if ev["kind"] == start:
            opened = ev
        elif ev["kind"] == end and opened is not None:
            out.append((opened["dtd_cycle"], ev["dtd_cycle"] - opened["dtd_cycle"], opened))
            opened = None
    if opened is not None:
        out.append((opened["dtd_cycle"], max(last_cycle - opened["dtd_cycle"], 1), opened))
    return out


def timeline_figure(results: Mapping, *, ppu: int | None = None,
                    title: str | None = None) -> Figure:
    """The timeline of ``results`` (``qlink sim``'s results, as its JSON holds them) as a
    matplotlib Figure, for :func:`save_figure` or further drawing.

    One lane per channel that has events and one ``calls<ppu>`` lane per PPU that made CALLs,
    PPU by PPU (only PPU ``ppu``'s with ``ppu`` given). Each lane's bars are one
    ``BarContainer`` of the Axes labelled ``"<lane> plays"``, ``"<lane> windows"`` or
    ``"<lane> calls"``; a marker lane is one Line2D labelled ``"<lane> steps"``.

    Raises :class:`~openqlink.errors.PlotError` for results that are no ``qlink sim`` result
    (:func:`check_results`) or a ``ppu`` that has no lane in them (field ``ppu``), and
    :class:`~openqlink.errors.PlotUnavailableError` without matplotlib.
    """
    check_results(results)
    Figure, FigureCanvasAgg = _import_pyplot_free()
    from matplotlib import rc_context

    period_ns = 1e9 / results["params"]["dtd_clk_hz"]
    events = [ev for ev in results["events"] if ppu is None or _ppu_of(ev["channel"]) == ppu]
    calls = [r for r in results["rpc"] if ppu is None or r.get("ppu", 0) == ppu]
    placed = [r for r in calls if isinstance(r.get("request_dtd_cycle"), int)]
    if ppu is not None and not events and not calls:
        known = sorted({p for p in (_ppu_of(e["channel"]) for e in results["events"])
                        if p is not None} | {r.get("ppu", 0) for r in results["rpc"]})
        raise PlotError("ppu", f"PPU {ppu} has no events and no CALLs in these results "
                        f"(PPUs with any: {', '.join(map(str, known)) or 'none'})")

    by_lane: dict[str, list[Mapping]] = {}
    for ev in events:
        by_lane.setdefault(ev["channel"], []).append(ev)
    call_lanes: dict[str, list[Mapping]] = {}
    for r in placed:
        call_lanes.setdefault(f"calls{r.get('ppu', 0)}", []).append(r)
    lanes = sorted([*by_lane, *call_lanes], key=_channel_key)

    cycles = [ev["dtd_cycle"] for ev in events]
    cycles += [r["request_dtd_cycle"] for r in placed]
    cycles += [r["request_dtd_cycle"] + r["round_trip_cycles"] for r in placed]
    first = min(cycles, default=results.get("start_time_cycles", 0))
    last = max(cycles, default=first + 1)
    pad = max((last - first) // 40, 1)

    with rc_context(_RC):
        fig = Figure(figsize=(11, 1.6 + 0.5 * max(len(lanes), 1)), layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for y, lane in enumerate(lanes):
            kind = lane.partition(".")[0].rstrip("0123456789")
            color = _COLORS.get(kind, "tab:gray")
            if kind == "calls":
                rs = call_lanes[lane]
                ax.barh([y] * len(rs), [r["round_trip_cycles"] for r in rs],
                        left=[r["request_dtd_cycle"] for r in rs], height=0.6, color=color,
                        alpha=0.8, hatch="//", edgecolor="black", linewidth=0.5,
                        label=f"{lane} calls")
                for r in rs:
                    text = (f"{r.get('function', '?')}({r.get('args', '')}) -> "
                            f"{r.get('result') or '-'}")
                    if r.get("status", 0):
                        text += f" (status {r['status']})"
                    ax.annotate(text, (r["request_dtd_cycle"], y - 0.35), fontsize=7,
                                va="bottom", ha="left", annotation_clip=False)
                continue
            evs = by_lane[lane]
            if kind == "marker":
                xs, ys = [first - pad], [y + 0.25]
                for ev in evs:
                    if ev["kind"] in ("marker_on", "marker_off"):
                        xs.append(ev["dtd_cycle"])
                        ys.append(y - 0.25 if ev["kind"] == "marker_on" else y + 0.25)
                xs.append(last + pad)
                ys.append(ys[-1])
                ax.plot(xs, ys, drawstyle="steps-post", color=color, linewidth=1.5,
                        label=f"{lane} steps")
                continue
            if kind == "readout":
                spans = _windows(evs, "acquire_start", "acquire_end", last + pad)
                name = "windows"
            else:
                spans = _windows(evs, "play_start", "play_end", last + pad)
                name = "plays"
            ax.barh([y] * len(spans), [w for _, w, _ in spans], left=[s for s, _, _ in spans],
                    height=0.6, color=color, alpha=0.85, edgecolor="black", linewidth=0.5,
                    label=f"{lane} {name}")
            for s, w, ev in spans:
                text = (f"outcome {ev['outcome']}" if kind == "readout" and "outcome" in ev
                        else _qubit_label(ev))
                if text:
                    ax.annotate(text, (s + w / 2, y), fontsize=7, ha="center", va="center",
                                color="white" if kind != "readout" else "black",
                                annotation_clip=False)

        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_ylim(len(lanes) - 0.4, -0.6)
        ax.set_xlim(first - pad, last + pad)
        ax.set_xlabel(f"DTD cycle (timeline; {period_ns:g} ns per cycle)")
        ax.set_ylabel("channel")
        top = ax.secondary_xaxis("top", functions=(lambda c: c * period_ns / 1000,
                                                   lambda us: us * 1000 / period_ns))
        top.set_xlabel("time (us)")
        ax.grid(axis="x", linewidth=0.3, alpha=0.5)
        previous = None
        for y, lane in enumerate(lanes):
            p = _ppu_of(lane)
            if previous is not None and p != previous:
                ax.axhline(y - 0.5, color="black", linewidth=0.6)
            previous = p
        if not lanes:
            ax.text(0.5, 0.5, "no channel events and no CALLs", transform=ax.transAxes,
                    ha="center", va="center")
        unplaced = len(calls) - len(placed)
        heading = title if title is not None else _default_title(results, ppu)
        if unplaced:
            heading += (f"\n{unplaced} CALL(s) not drawn: their request's DTD cycle is not in "
                        "these results (request_dtd_cycle)")
        ax.set_title(heading, fontsize=10)
    return fig


def _default_title(results: Mapping, ppu: int | None) -> str:
    """The program's file name; with several PPUs each PPU's (or PPU ``ppu``'s)."""
    ppus = [p for p in results.get("ppus") or [] if isinstance(p, Mapping)]
    if ppu is not None:
        named = [p for p in ppus if p.get("ppu") == ppu and p.get("program")]
        program = named[0]["program"] if named else None
        return f"PPU {ppu}" + (f": {Path(str(program)).name}" if program else "")
    if len(ppus) > 1:
        return ", ".join(f"PPU {p.get('ppu')}: {Path(str(p.get('program', '?'))).name}"
                         for p in ppus)
    program = results.get("program")
    return Path(str(program)).name if program else "qlink sim"


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` in the format of its suffix (:func:`check_path`), without a
    date or software version in the file. Returns the path; OSError when it cannot be
    written."""
    fmt = check_path(path)
    from matplotlib import rc_context

    path = Path(path)
    with rc_context(_RC):
        fig.savefig(path, format=fmt, dpi=150, metadata=_METADATA[fmt])
    return path


def plot_timeline(results: Mapping, path: str | Path, *, ppu: int | None = None,
                  title: str | None = None) -> Path:
    """Draw the timeline of ``results`` (:func:`timeline_figure`) to ``path``: PNG, SVG or PDF
    by its suffix. Returns the path.

    Raises :class:`~openqlink.errors.PlotError` for another suffix (field ``path``, checked
    first), results that are no ``qlink sim`` result or a ``ppu`` without lanes;
    :class:`~openqlink.errors.PlotUnavailableError` without matplotlib; OSError when the file
    cannot be written.
    """
    check_path(path)
    return save_figure(timeline_figure(results, ppu=ppu, title=title), path)


def histogram_figure(samples_ns: Mapping[str, Sequence[float]], *, title: str = "",
                     xlabel: str = "latency per request (us)", bins: int = 80,
                     upper_quantile: float = 0.99) -> Figure:
    """Histograms of latencies, one per named series (ns each; drawn in us), on one shared
    axis of ``bins`` bins from the smallest sample to the largest series' ``upper_quantile``
    (the tail beyond it is counted in the title, not drawn), with each series' median as a
    dashed vertical line of its colour. Each series is one BarContainer labelled with its name,
    its median a Line2D labelled ``"<name> p50 <us> us"``. Raises
    :class:`~openqlink.errors.PlotUnavailableError` without matplotlib."""
    Figure, FigureCanvasAgg = _import_pyplot_free()
    import numpy as np
    from matplotlib import rc_context

    series = {name: np.asarray(v, dtype=float) / 1000 for name, v in samples_ns.items()}
    filled = [v for v in series.values() if v.size]
    low = min((float(v.min()) for v in filled), default=0.0)
    high = max((float(np.quantile(v, upper_quantile)) for v in filled), default=1.0)
    if high <= low:
        high = low + 1.0
    edges = np.linspace(low, high, bins + 1)
    beyond = sum(int((v > high).sum()) for v in filled)
    with rc_context(_RC):
        fig = Figure(figsize=(9, 4.5), layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for i, (name, v) in enumerate(series.items()):
            color = f"C{i}"
            counts, _ = np.histogram(v, bins=edges)
            ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", alpha=0.5,
                   color=color, edgecolor=color, label=name)
            if v.size:
                p50 = float(np.median(v))
                ax.axvline(p50, color=color, linestyle="--", linewidth=1.2,
                           label=f"{name} p50 {p50:.1f} us")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("requests per bin")
        heading = title
        if beyond:
            heading += (("\n" if heading else "") + f"{beyond} request(s) beyond "
                        f"{high:.1f} us (each series' p{upper_quantile * 100:g}) not drawn")
        if heading:
            ax.set_title(heading, fontsize=10)
        if series:
            ax.legend(fontsize=8)
    return fig


def plot_histogram(samples_ns: Mapping[str, Sequence[float]], path: str | Path, *,
                   title: str = "", xlabel: str = "latency per request (us)") -> Path:
    """Draw :func:`histogram_figure` to ``path`` (PNG, SVG or PDF by its suffix;
    :class:`~openqlink.errors.PlotError`, field ``path``, for another, checked first). Returns
    the path."""
    check_path(path)
    return save_figure(histogram_figure(samples_ns, title=title, xlabel=xlabel), path)
