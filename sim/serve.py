"""The simulated QSC as a device: a script drives it through the same API as a board.

:func:`run_serve` (``qlink sim --serve PATH``) simulates the QSC top with no host and no
program of its own, its Ethernet port on a Unix ``SOCK_SEQPACKET`` socket listening at ``PATH``
(:mod:`openqlink.sim.bench_serve`), until the one client that connects there leaves.

:class:`SimulatedQSC` is that client for a script: it starts ``qlink sim --serve`` in a child
process, waits until the simulation listens, and is an :class:`openqlink.qsc.QSC` whose
transport is :class:`openqlink.bridges.unixsock.SocketTransport` on that socket::

    from openqlink.dispatch import Dispatcher, SlotRing
    from openqlink.sim import SimulatedQSC

    with SimulatedQSC(ppus=1, qubits=1) as qsc:
        qsc.connect()
        ring = SlotRing(8, 256)
        qsc.configure(0, ring)
        ...                                   # write_envelope, upload_program, trigger
        dispatcher = Dispatcher(table, ring, send_response=...)
        while qsc.status(0).state not in (PPUState.DONE, PPUState.ERROR):
            qsc.poll_rx()                     # the PPU's CALL requests -> ring slots
            dispatcher.poll()                 # ring slots -> handlers -> responses

The simulation runs in wall-clock time at some microseconds of simulated time per second
(Icarus, a small machine): every control-plane access takes a fraction of a second, so the
control plane's time-out is long (:data:`SIM_TIMEOUT_S`), and a program should start some
thousand DTD cycles after :meth:`~openqlink.qsc.QSC.timeline` (the trigger's RDMA WRITE must
arrive before its start time).

# Ref: docs/simulation.md ("A script against the simulated QSC").
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ..bridges.unixsock import SocketTransport
from ..memory_map import QSCParams
from ..qsc import QSC
from .channel_map import sim_params
from .runner import (
    DEFAULT_SIMULATOR,
    SimConfig,
    SimulationError,
    check_simulator,
    checked_build,
    run_bench,
    simulator_build_dir,
)

__all__ = ["run_serve", "SimulatedQSC", "READY_PREFIX", "SIM_TIMEOUT_S", "SERVE_LIMIT_S"]

#: The control plane's time-out per attempt (wall-clock seconds) against a simulated QSC: what
#: ``qlink sim --tap`` gives its host.
SIM_TIMEOUT_S = 30.0
#: How long a served simulation runs at most (wall-clock seconds) unless told otherwise.
SERVE_LIMIT_S = 3600.0
#: The start of the line ``qlink sim --serve PATH`` prints once the simulation listens at PATH
#: (the path follows).
READY_PREFIX = "qlink sim: serving the simulated QSC on "


def run_serve(path: str | os.PathLike[str], *, params: QSCParams | None = None,
              qubits: int = 1, model: Mapping | str | Path | None = None,
              json_path: str | Path | None = None, pcap_path: str | Path | None = None,
              waves_path: str | Path | None = None, build_dir: str | Path | None = None,
              verilog_path: str | Path | None = None, simulator: str = DEFAULT_SIMULATOR,
              limit_s: float = SERVE_LIMIT_S, on_ready: Callable[[str], None] | None = None,
              **bench: object) -> dict:
    """Simulate the QSC with its Ethernet port on a socket listening at ``path`` until its
    client closes the connection or ``limit_s`` seconds of wall-clock time have passed; return
    the results.

    Parameters
    ----------
    path : path
        Where the simulation listens (a Unix ``SOCK_SEQPACKET`` socket; nothing may exist
        there; removed when a client connects and at the end). One client is served.
    params : QSCParams, optional
        The build (default :func:`~openqlink.sim.channel_map.sim_params` of one PPU and
        ``qubits``). Every PPU has its qubit model.
    qubits, model
        As :func:`~openqlink.sim.runner.run_sim`'s.
    json_path, pcap_path, waves_path : path, optional
        The results as JSON; every frame on the simulated wire (pcap); the waveforms (FST).
    build_dir, verilog_path, simulator
        As :func:`~openqlink.sim.runner.run_sim`'s.
    limit_s : float
        Wall-clock seconds after which the run ends, with or without a client (> 0).
    on_ready : callable, optional
        Called with the socket's absolute path, from another thread, once the simulation
        listens there (after the build): ``qlink sim --serve`` prints its ready line.
    **bench
        Overrides of :func:`~openqlink.sim.runner.SimConfig` (``seed``; ``tap_poll_ns``: how
        often, in simulated ns, the client's frames are taken).

    Returns
    -------
    dict
        ``serve`` (``socket``, ``ended``: ``"client_closed"``, ``"limit"`` or
        ``"no_client"``, ``wall_s``, ``sim_time_ns``, ``frames_from_client``,
        ``frames_to_client``, ``write_errors``), ``params``, ``model`` (``qubits``,
        ``channel_map``), ``events`` (every PPU's channel events) and ``ppus`` (each PPU's
        ``events``, ``measurements``, ``qubits_final_p1``, ``model``).

    Raises
    ------
    SimulationError
        The path cannot take a socket (too long, something there, no such directory), a
        ``limit_s`` that is not positive, a model or build that does not fit ``qubits``, an
        unknown simulator, or the simulator or bench failed.
    """
    from .socket_port import SocketPortError, check_serve_path

    check_simulator(simulator)
    try:
        path = check_serve_path(path)
    except SocketPortError as exc:
        raise SimulationError(str(exc)) from None
    if not limit_s > 0:
        raise SimulationError(f"limit_s {limit_s}: the run's limit must be positive")
    params, model_data = checked_build(params or sim_params(1, qubits), qubits, model)
    with tempfile.TemporaryDirectory(prefix="qlink-serve-") as tmp:
        ready = Path(tmp) / "ready"
        cfg = SimConfig(**bench)
        cfg.update({"serve": path, "serve_limit_s": float(limit_s), "serve_ready": str(ready),
                    "qubits": qubits, "model": model_data,
                    "pcap": str(Path(pcap_path).resolve()) if pcap_path else None})
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.1):
                if ready.exists():
                    if on_ready is not None:
                        on_ready(path)
                    return

        watcher = threading.Thread(target=watch, name="qlink-serve-ready", daemon=True)
        watcher.start()
        try:
            results = run_bench("openqlink.sim.bench_serve", cfg, params=params,
                                build_dir=build_dir, waves_path=waves_path,
                                verilog_path=verilog_path, simulator=simulator)
        finally:
            stop.set()
            watcher.join()
            if os.path.exists(path) and not os.path.isdir(path):
                os.unlink(path)       # left by a bench that failed: nothing else was there
    if json_path is not None:
        import json

        Path(json_path).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return results


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


class SimulatedQSC(QSC):
    """An :class:`~openqlink.qsc.QSC` whose device is the cocotb simulation of the QSC top,
    run in a child process (``qlink sim --serve``) and reached through a local socket
    (:class:`~openqlink.bridges.unixsock.SocketTransport`).

    Parameters
    ----------
    ppus, qubits, samples_per_cycle : int
        The simulation build (:func:`~openqlink.sim.channel_map.sim_params`: ``--ppus``,
        ``--qubits``, ``--samples-per-cycle`` of ``qlink sim``); :attr:`params` is it.
    build_dir : path, optional
        Where the Verilog and the simulator's build go (default ``./build/sim``, as ``qlink
        sim``'s); the child's output goes to ``serve.log`` there and its results to
        ``serve.json``. One simulation at a time per build directory.
    simulator : str
        ``"icarus"`` (default) or ``"verilator"``.
    model : path or mapping, optional
        A model file (``qlink sim --model``), or its object (checked with
        :func:`~openqlink.sim.channel_map.check_model` before the child starts: a bad key
        raises :class:`~openqlink.sim.channel_map.ModelError` naming it), written to a file
        for the child: e.g. ``{"qubits": {"if_hz": 3e5, "pi_area": 30.0}, "readouts":
        {"phase0_rad": 0.4, "phase1_rad": 2.9}}`` for a qubit that the nominal calibration
        table does not fit (:mod:`openqlink.calibrate` finds its values).
    seed : int
        The qubit models' seed (PPU ``n``'s: ``seed + n``).
    startup_timeout_s : float
        Wall-clock seconds to wait for the simulation to listen (elaborating and compiling
        the top the first time take minutes).
    limit_s : float
        Wall-clock seconds after which the simulation ends on its own.
    pcap_path : path, optional
        Write every frame on the simulated wire there (at the end).
    verilog_path : path, optional
        The top's Verilog made beforehand by ``qlink verilog --sim`` for this build (``qlink
        sim --verilog``), e.g. on a GPU host without Yosys; default: elaborated here.
    **qsc_kwargs
        Passed to :class:`~openqlink.qsc.QSC` (``timeout_s`` defaults to
        :data:`SIM_TIMEOUT_S`; ``host_mac``, ``host_ip`` to the bench's host's; ``params`` is
        the build's and cannot be given).

    Attributes
    ----------
    socket_path : str
    log_path, results_path : Path
        The child's output and its results JSON (written when the simulation ends).
    results : dict | None
        After :meth:`close`: the simulation's results (:func:`run_serve`'s), or None when it
        wrote none.
    process : subprocess.Popen

    Raises :class:`~openqlink.sim.runner.SimulationError` (with the tail of the child's log)
    when the child ends before it listens or does not listen within ``startup_timeout_s``, and
    :class:`~openqlink.errors.QlinkError` for parameters the build refuses (naming the field).
    The CALLs are the script's to serve: call :meth:`poll_rx` and a
    :class:`~openqlink.dispatch.Dispatcher`'s ``poll()`` in its loop, as with a board.
    """

    def __init__(self, ppus: int = 1, qubits: int = 1, samples_per_cycle: int = 1,
                 build_dir: str | os.PathLike[str] | None = None,
                 simulator: str = DEFAULT_SIMULATOR, *,
                 model: str | os.PathLike[str] | Mapping | None = None, seed: int = 1,
                 startup_timeout_s: float = 900.0, limit_s: float = SERVE_LIMIT_S,
                 pcap_path: str | os.PathLike[str] | None = None,
                 verilog_path: str | os.PathLike[str] | None = None, **qsc_kwargs: object):
        check_simulator(simulator)
        if "params" in qsc_kwargs:
            raise SimulationError("SimulatedQSC: params is the simulation build's (ppus, "
                                  "qubits, samples_per_cycle), not given")
        try:
            params = sim_params(ppus, qubits, samples_per_cycle)
        except ValueError as exc:
            raise SimulationError(f"SimulatedQSC: {exc}") from None
        checked_model = None
        if isinstance(model, Mapping):
            from .channel_map import check_model

            checked_model = check_model(model, qubits)   # ModelError naming the key
        base = Path(build_dir).resolve() if build_dir else Path.cwd() / "build" / "sim"
        out_dir = simulator_build_dir(base, simulator)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = out_dir / "serve.log"
        self.results_path = out_dir / "serve.json"
        self.results: dict | None = None
        self._tmp = tempfile.mkdtemp(prefix="qlink-")
        self.socket_path = os.path.join(self._tmp, "qsc.sock")
        self.results_path.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "openqlink.cli", "sim", "--serve", self.socket_path,
               "--ppus", str(ppus), "--qubits", str(qubits),
               "--samples-per-cycle", str(samples_per_cycle), "--build-dir", str(base),
               "--simulator", simulator, "--seed", str(seed), "--serve-limit-s", str(limit_s),
               "--json", str(self.results_path)]
        if checked_model is not None:
            import json

            model = Path(self._tmp) / "model.json"
            model.write_text(json.dumps(checked_model))
        if model is not None:
            cmd += ["--model", str(Path(model).resolve())]
        if pcap_path is not None:
            cmd += ["--pcap", str(Path(pcap_path).resolve())]
        if verilog_path is not None:
            cmd += ["--verilog", str(Path(verilog_path).resolve())]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._log = self.log_path.open("w")
        # A session of its own: the simulator it starts ends with it (see _stop_child).
        self.process = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env,
                                        start_new_session=True)
        try:
            self._wait_ready(startup_timeout_s)
            transport = SocketTransport(self.socket_path)
            defaults = SimConfig()
            kwargs: dict = {"host_mac": defaults["host_mac"], "host_ip": defaults["host_ip"],
                            "timeout_s": SIM_TIMEOUT_S, **qsc_kwargs}
            try:
                super().__init__(transport, params=params, **kwargs)
            except BaseException:
                transport.close()
                raise
        except BaseException:
            self._stop_child(grace_s=0)
            raise
        self._closed = False

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        want = READY_PREFIX + self.socket_path
        while True:
            try:
                text = self.log_path.read_text(errors="replace")
            except OSError:
                text = ""
            if any(line.strip() == want for line in text.splitlines()):
                return
            if self.process.poll() is not None:
                raise SimulationError(f"the simulation ended (exit status "
                                      f"{self.process.returncode}) before it served "
                                      f"{self.socket_path}; {self.log_path}:\n"
                                      f"{_tail(self.log_path)}")
            if time.monotonic() >= deadline:
                raise SimulationError(f"the simulation did not serve {self.socket_path} within "
                                      f"{timeout_s:g} s; {self.log_path}:\n"
                                      f"{_tail(self.log_path)}")
            time.sleep(0.2)

    def _stop_child(self, grace_s: float) -> None:
        """Wait ``grace_s`` seconds for the child to end, then terminate its process group
        (the simulator with it; kill after 10 s more); remove the socket's directory."""
        proc = self.process
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                proc.wait()
        self._log.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass

    def close(self, grace_s: float = 60.0) -> None:
        """Close the socket (the simulation sees its client leave and ends), wait up to
        ``grace_s`` seconds for the child to finish writing its results (then end it), and
        load :attr:`results`. Idempotent."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            super().close()
        finally:
            self._stop_child(grace_s)
        if self.results_path.exists():
            import json

            self.results = json.loads(self.results_path.read_text())

    @property
    def returncode(self) -> int | None:
        """The child's exit status once it has ended (None before)."""
        return self.process.poll()
