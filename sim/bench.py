"""The system bench: the QSC top's Verilog on Icarus, driven by the unchanged host package.

Started by :func:`openqlink.sim.runner.run_sim` through the cocotb runner; its configuration is
a JSON file named by ``OPENQLINK_SIM_CONFIG`` and its results go to the JSON file named in it.

Parts (cocotb's driver / monitor / model / checker split):

* :class:`~openqlink.sim.mac.PacketSource` / :class:`~openqlink.sim.mac.PacketSink`: the MAC;
  every frame in either direction goes to the pcap file with its simulated time.
* The host: :class:`openqlink.qsc.QSC` over :class:`~openqlink.sim.transport.SimTransport`, run in a
  ``cocotb.bridge`` thread (connect, configure, upload, trigger, poll status, read counters).
  With several programs, PPU ``n`` runs program ``n``: each PPU has its own QP (host QPN
  ``host_qpn + n``), request ring and dispatcher, and every PPU is triggered with one common
  start time, so their events share the one DTD timeline.
* The NIC's steering: RoCE packets for the host's QPs go to the dispatcher path, the rest (control
  plane) to the host's transport, as a RoCE NIC splits RDMA traffic from its UDP sockets.
* With ``cfg["tap"]`` (``qlink sim --tap NAME``) the QSC's port is the Linux TAP interface of
  that name instead (:class:`~openqlink.sim.tap.TapDevice`): every frame the kernel sends out of
  it goes into the QSC's receive port at line rate, every frame the QSC sends is written to it,
  and the host talks to the QSC through the kernel with the raw bridge
  (:class:`~openqlink.bridges.rawsock.RawSocketTransport` on the TAP), in a thread of its own
  and in wall-clock time: its CALLs are served as they arrive, with no modelled turnaround (see
  :meth:`TB.run`).
* With ``cfg["serve"]`` (``qlink sim --serve PATH``, :mod:`openqlink.sim.bench_serve`) the port
  is a local socket instead (:class:`~openqlink.sim.socket_port.SocketPort`), moved by the same
  pump (:meth:`TB._port_pump`), and its client is the only host: the bench has none.
* The dispatcher path: one :class:`openqlink.dispatch.Dispatcher` per PPU (its program's
  function table, its ring, its mailbox), stepped by a coroutine, each request handled
  ``host_turnaround_ns`` (modelled: PCIe, polling and handler time of a real host) after its
  last byte reached the host.
* :class:`~openqlink.sim.qubit.QubitSystem`: the PTD side of each PPU, ``cfg["qubits"]`` qubits
  (PPU ``n``'s seeded ``seed + n``, its parameters from ``cfg["model"]``), wired to the PTD
  channels as :mod:`openqlink.sim.channel_map` says: drive channel ``q`` drives qubit ``q``,
  drive channel ``Q + q`` is the coupler of qubits ``q`` and ``q + 1``, readout channel ``q``
  reads qubit ``q``.
* The monitor of the PTD outputs feeds the models every drive sample (I and Q, each lane) and
  every ADC sample, and records every channel event with its DTD cycle.

Everything is driven by simulated time, so two runs with the same inputs give the same results.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.task import bridge, resume
from cocotb.triggers import Event, First, RisingEdge, Timer, ValueChange

from ..dispatch import Dispatcher, FunctionTable, SlotRing
from ..errors import WireFormatError
from ..isa import PPUState, PPUStatus
from ..isa.asm import assemble
from ..memory_map import MAILBOX_BYTES, QSCParams
from ..pcap import PcapWriter
from ..qsc import QSC
from ..wire.packet import parse_frame
from ..wire.roce import Opcode
from ..wire.rpc import HEADER_BYTES, Request, Response
from ..wire.udp import ROCEV2_PORT, UDP_CALL_PORT_BASE
from .channel_map import channel_map, channel_roles, check_build, make_system
from .handlers import load_function_table
from .info import configure_extra_qps, region_rkeys, sim_info
from .mac import PacketSink, PacketSource
from .qubit import QubitSystem
from .report import channel_ppu
from .transport import SimTransport

__all__ = ["TB", "run_program", "status_dict"]


class _LogCollector(logging.Handler):
    """Keeps the host package's warnings and errors (with tracebacks) for the results."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = f"{record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        self.lines.append(text)


def status_dict(status) -> dict:
    """A PPUStatus constant view as ``{"state": "DONE", "underflow": 0, ...}``."""
    out = {}
    for name, _ in PPUStatus.as_shape():
        if name.startswith("_"):
            continue
        value = getattr(status, name)
        out[name] = value.name if hasattr(value, "name") else int(value)
    return out


class TB:
    """Bench state for one simulation run. ``cfg`` is the run configuration (see runner).

    ``cfg["programs"]`` (or, for one PPU, ``cfg["program"]``) names the program of each PPU that
    runs, PPU 0 first; ``cfg["handlers_per_ppu"]`` (or ``cfg["handlers"]``) their handlers
    files. A build may have more PPUs than programs: the others stay idle. ``self.ppu`` is
    PPU 0, and ``self.qubit``, ``self.program``, ``self.ring`` and ``self.dispatcher`` are
    PPU 0's. ``cfg["qubits"]`` (default 1) is the qubits behind each PPU, which the build's
    channels must fit (:func:`~openqlink.sim.channel_map.check_build`), and ``cfg["model"]``
    (a checked model file's object, see :mod:`openqlink.sim.channel_map`) their parameters.
    """

    def __init__(self, dut, cfg: dict):
        self.dut = dut
        self.cfg = cfg
        self.params = QSCParams(**cfg["params"])
        self.ppu = 0
        # The PPUs with a model (and, with programs, a QP, ring and dispatcher of the bench's
        # host): one per program; every PPU of the build when a client drives it (cfg["serve"]).
        self.num_run = (self.params.num_ppus if cfg.get("serve")
                        else len(cfg.get("programs") or [cfg.get("program")]))
        if self.num_run > self.params.num_ppus:
            raise ValueError(f"{self.num_run} programs for a build of {self.params.num_ppus} "
                             "PPU(s)")
        self.dtd_period_ps = round(1e12 / self.params.dtd_clk_hz)
        self.rti_period_ps = round(1e12 / self.params.rti_clk_hz)
        self.events: list[dict] = []
        self.rpc: list[dict] = []
        self._requests: dict[tuple[int, int], dict] = {}
        self.dtd_cycle = 0
        self.pcap = PcapWriter(cfg["pcap"]) if cfg.get("pcap") else None
        self.qubit_count: int = cfg.get("qubits", 1)
        check_build(self.params, self.qubit_count)
        #: Each running PPU's model of its qubits, PPU 0 first.
        self.qubits: list[QubitSystem] = [self._make_qubit(n) for n in range(self.num_run)]
        self.qubit = self.qubits[0]
        self.turnaround_ns = cfg["host_turnaround_ns"]
        self.host_qpn = cfg["host_qpn"]
        #: The PPU whose CALLs a host QPN receives, and whose mailbox a QSC QPN is.
        self._ppu_of_host_qpn = {self.host_qpn + n: n for n in range(self.num_run)}
        self._ppu_of_qsc_qpn: dict[int, int] = {}
        #: With the PPUs' CALLs in the UDP transport (cfg["calls"] "udp"): each QP's own port
        #: (the source of its requests, the destination of their responses) -> its PPU.
        self._ppu_of_call_port = ({UDP_CALL_PORT_BASE + n: n for n in range(self.num_run)}
                                  if cfg.get("calls") == "udp" else {})
        self._function_names: list[dict[int, str]] = [{} for _ in range(self.num_run)]
        self._roce_in: list[tuple[int, bytes]] = []
        self._roce_wake = Event()
        self.gpu_service_ns: list[int] = []
        self.gpu_start_s = 0.0
        self.gpu_warmup = 0
        #: With ``cfg["gpu_frames"]``: the GPU RoCE endpoint serving PPU 0's QP (started by the
        #: host session once the QP is configured and the program uploaded), and the in-kernel
        #: time of each CALL's frame (ns).
        self.frame_plane = None
        self.gpu_frame_ns: list[int] = []
        #: The TAP the QSC's port is attached to (``cfg["tap"]``), or None: the in-process wire.
        self.tap = None
        #: What the QSC's port is attached to instead of the in-process wire: the TAP, or the
        #: socket of ``cfg["serve"]`` (:class:`~openqlink.sim.socket_port.SocketPort`); None.
        self.port = None
        #: Simulated time in ns as the port's pump last saw it: the host thread's clock of the
        #: simulation (it may not call into the simulator).
        self._port_sim_ns = 0.0
        #: Wall-clock time (``time.monotonic()``) of the last frame from the port.
        self._port_last_rx_s = 0.0

    # --- time ---------------------------------------------------------------------------------

    def now_ns(self) -> float:
        return cocotb.utils.get_sim_time("ps") / 1000

    #: (simulated time in ps at which a DTD cycle starts, the timeline's value in that cycle):
    #: set when ``dtd_rst`` is released (the timeline is 0 from that edge on; a monitor that
    #: reads the timeline every cycle may move it on).
    _dtd_ref: tuple[int, int] = (0, 0)

    def dtd_cycle_at(self, t_ps: int) -> int:
        """The timeline's value (DTD cycles) in the DTD cycle under way at simulated time
        ``t_ps`` (ps; a moment on a DTD edge is in the cycle that edge starts)."""
        ref_ps, ref_cycle = self._dtd_ref
        return ref_cycle + int(t_ps - ref_ps) // self.dtd_period_ps

    # --- models -------------------------------------------------------------------------------

    def _make_qubit(self, n: int) -> QubitSystem:
        """The PTD-side model of PPU ``n``: ``cfg["qubits"]`` qubits of its own with the
        parameters of ``cfg["model"]``, seeded ``seed + n``, at the build's PTD sample rate
        (``dtd_clk_hz * samples_per_cycle`` samples per second)."""
        return make_system(self.cfg.get("model"), self.qubit_count, seed=self.cfg["seed"] + n,
                           sample_rate_hz=self.params.sample_rate_hz)

    # --- set-up -------------------------------------------------------------------------------

    async def reset(self) -> None:
        dut = self.dut
        cocotb.start_soon(Clock(dut.rti_clk, self.rti_period_ps, unit="ps").start())
        cocotb.start_soon(Clock(dut.dtd_clk, self.dtd_period_ps, unit="ps").start())
        for n in range(self.params.num_ppus):
            self._adc(n).value = 0
        dut.rti_rst.value = 1
        dut.dtd_rst.value = 1
        for _ in range(8):
            await RisingEdge(dut.rti_clk)
        dut.rti_rst.value = 0
        await RisingEdge(dut.dtd_clk)
        dut.dtd_rst.value = 0
        self._dtd_ref = (round(cocotb.utils.get_sim_time("ps")), 0)
        self.source = PacketSource(dut, "rx", dut.rti_clk, on_sent=self._on_host_frame)
        self.sink = PacketSink(dut, "tx", dut.rti_clk, on_frame=self._on_qsc_frame)
        if self.cfg.get("tap"):
            self._attach_tap(self.cfg["tap"])
        else:
            self.transport = SimTransport(self.source)
        cocotb.start_soon(self._ptd_monitor())

    def _adc(self, n: int):
        return getattr(self.dut, f"ptd__{n}__adc")

    # --- the wire -----------------------------------------------------------------------------

    def _record(self, frame: bytes) -> None:
        if self.pcap is not None:
            self.pcap.write(frame, round(self.now_ns()))

    def _on_host_frame(self, frame: bytes, _t: int) -> None:
        """A frame from the host has been taken by the QSC's rx port. Any frame may come this
        way (a replayed capture, a damaged one): one that is not a well-formed RPC response is
        only recorded."""
        self._record(frame)
        try:
            f = parse_frame(frame)
            if f.bth is not None and f.bth["opcode"] == Opcode.SEND_ONLY:
                ppu = self._ppu_of_qsc_qpn.get(f.bth["dest_qp"], 0)
            elif (f.bth is None and f.udp is not None
                  and f.udp["dst_port"] in self._ppu_of_call_port):
                ppu = self._ppu_of_call_port[f.udp["dst_port"]]     # a response over UDP
            else:
                return
            resp = Response.unpack(f.payload)
        except WireFormatError:
            return
        req = self._requests.pop((ppu, resp.request_id), None)
        if req is not None:
            rtt_ns = self.now_ns() - req["t_ns"]
            self.rpc.append({
                "ppu": ppu,
                "function": req["function"], "function_id": req["function_id"],
                "request_id": resp.request_id, "status": resp.status,
                "args": req["args"], "result": resp.result.hex(),
                "request_dtd_cycle": req["request_dtd_cycle"],
                "round_trip_cycles": round(rtt_ns * 1000 / self.dtd_period_ps),
                "round_trip_ns": round(rtt_ns, 3),
            })

    def _on_qsc_frame(self, frame: bytes, _t: int) -> None:
        """A frame left the QSC's tx port: steer it as a RoCE NIC would (with a TAP: hand it
        to the kernel, which steers it)."""
        self._record(frame)
        f = parse_frame(frame)
        roce = f.udp is not None and f.udp["dst_port"] == ROCEV2_PORT and f.bth is not None
        # A CALL in the UDP transport: a datagram from a QP's own port (the host's UDP socket
        # takes it; here it goes the dispatcher's way, as RoCE requests do).
        udp_call = (f.udp is not None and f.bth is None
                    and f.udp["src_port"] in self._ppu_of_call_port)
        if (roce and f.bth["opcode"] == Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE) or udp_call:
            req = Request.unpack(f.payload)
            ppu = (self._ppu_of_call_port[f.udp["src_port"]] if udp_call
                   else self._ppu_of_host_qpn.get(f.bth["dest_qp"], 0))
            self._requests[(ppu, req.request_id)] = {
                "function": self._function_names[ppu].get(req.function_id,
                                                          f"{req.function_id:#010x}"),
                "function_id": req.function_id, "t_ns": self.now_ns(),
                "request_dtd_cycle": self.dtd_cycle_at(round(cocotb.utils.get_sim_time("ps"))),
                "args": req.payload.hex(),
            }
        if self.port is not None:
            self.port.write(frame)
        elif roce or udp_call:
            self._roce_in.append((self.now_ns(), frame))
            self._roce_wake.set()
        else:
            self.transport.deliver(frame)

    # --- the TAP (cfg["tap"]) -----------------------------------------------------------------

    def _attach_tap(self, name: str) -> None:
        """Attach the QSC's port to the TAP interface ``name``, and the host to the same
        interface through the raw bridge. The host's MAC is the interface's: the QSC sends its
        replies and CALLs to it, and the kernel takes them as its own.

        Raises :class:`~openqlink.sim.tap.TapError` when the TAP cannot be opened and
        :class:`OSError` when the raw socket cannot (no ``CAP_NET_RAW``)."""
        from ..bridges.rawsock import RawSocketTransport
        from ..bridges.udp import UdpSocketTransport
        from .tap import TapDevice

        self.tap = TapDevice(name)
        try:
            if self.cfg.get("bridge") == "udp":
                self.transport = UdpSocketTransport(self.params.ip, host_ip=self.cfg["host_ip"])
            else:
                self.transport = RawSocketTransport(name)
        except BaseException:
            self.tap.close()
            raise
        self.cfg["host_mac"] = self.transport.mac
        self._attach_port(self.tap)

    def _attach_port(self, port) -> None:
        """Attach the QSC's port to ``port`` (a :class:`~openqlink.sim.tap.TapDevice` or a
        :class:`~openqlink.sim.socket_port.SocketPort`: non-blocking ``read()`` of one frame or
        None, ``write(frame)``, ``closed``) instead of the in-process wire: what the QSC sends
        goes to ``port.write`` (:meth:`_on_qsc_frame`), and :meth:`_port_pump` feeds the QSC
        what ``port.read`` gives."""
        self.port = port
        self._port_last_rx_s = time.monotonic()
        cocotb.start_soon(self._port_pump())

    async def _port_pump(self) -> None:
        """Every ``cfg["tap_poll_ns"]`` of simulated time: move the frames queued on the port
        (the kernel's on the TAP, the client's on the socket) to the QSC's receive port (padded
        to 60 bytes, as a NIC puts a short frame on the wire; the source drives them back to
        back at line rate), and publish the simulated time to the host thread."""
        from .tap import pad_frame

        period = self.cfg["tap_poll_ns"]
        port = self.port
        while not port.closed:
            await Timer(period, "ns")
            self._port_sim_ns = self.now_ns()
            while (frame := port.read()) is not None:
                self._port_last_rx_s = time.monotonic()
                self.source.send(pad_frame(frame))

    async def _in_host_thread(self, session: Callable[[], dict]) -> dict:
        """Run ``session`` in a thread of its own while the simulation goes on, and return what
        it returns (or raise what it raised). A host on the TAP waits for the kernel, so it
        cannot run in a ``cocotb.bridge`` thread: the simulator stands still while one runs."""
        out: dict = {}

        def target() -> None:
            try:
                out["value"] = session()
            except BaseException as exc:  # handed to the simulator's thread
                out["error"] = exc

        thread = threading.Thread(target=target, name="qlink-tap-host", daemon=True)
        thread.start()
        while thread.is_alive():
            await Timer(self.cfg["tap_poll_ns"], "ns")
        if "error" in out:
            raise out["error"]
        return out["value"]

    async def _tap_hold(self) -> None:
        """Keep the QSC on the TAP after the host's session until the kernel has sent it
        nothing for ``cfg["tap_hold_s"]`` seconds of wall-clock time (0: not at all), so that
        it can still be pinged or watched."""
        hold_s = self.cfg.get("tap_hold_s") or 0
        ended = time.monotonic()
        while time.monotonic() - max(ended, self._port_last_rx_s) < hold_s:
            await Timer(self.cfg["tap_poll_ns"], "ns")

    def _host_now_ns(self) -> float:
        """Simulated time in ns as the host's session sees it: from the simulator in a bridge
        thread (which runs while the simulator waits), from the TAP pump's last look in the
        TAP's host thread (which may not call into the simulator)."""
        return self._port_sim_ns if self.tap is not None else self.now_ns()

    def _host_wait_ns(self, ns: int) -> None:
        """Let ``ns`` of simulated time pass on the host's side. In a bridge thread: sleep in
        the simulator (the dispatcher path serves the CALLs meanwhile). With a TAP: serve what
        the QSC sends meanwhile, as a host on a NIC does: route each frame (an RPC request
        into its ring) and step every dispatcher, waiting on the socket at most 10 ms (wall
        clock) at a time."""
        if self.tap is None:
            self._sleep_ns(ns)
            return
        until_ns = self._port_sim_ns + ns
        while True:
            frame = self.transport.recv_frame(0.01)
            if frame is not None:
                self.qsc.handle_frame(frame)
                self.qsc.poll_rx()
            for dispatcher in self.dispatchers:
                dispatcher.poll()
            if self._port_sim_ns >= until_ns:
                return

    def _tap_results(self) -> dict:
        """What went through the TAP (the ``tap`` key of the results)."""
        assert self.tap is not None
        return {
            "interface": self.tap.name,
            "host_mac": self.cfg["host_mac"],
            "host_ip": self.cfg["host_ip"],
            "frames_from_kernel": self.tap.frames_read,
            "frames_to_kernel": self.tap.frames_written,
            "write_errors": self.tap.write_errors,
            "host_rx_counts": dict(self.qsc.rx_counts),
            "hold_s": self.cfg.get("tap_hold_s") or 0,
            "note": "the host ran on the raw bridge through the kernel, in wall-clock time: "
                    "its turnaround is not modelled, and two runs differ",
        }

    # --- the dispatcher path ------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while True:
            while not self._roce_in:
                self._roce_wake.clear()
                await self._roce_wake.wait()
            t_arrival, frame = self._roce_in.pop(0)
            wait_ns = t_arrival + self.turnaround_ns - self.now_ns()
            if wait_ns > 0:
                await Timer(round(wait_ns * 1000), "ps")
            plane = self.frame_plane
            if plane is not None and plane.running and plane.wants(frame):
                self._serve_frame(plane, frame)
                continue
            # The QSC routes the frame to the host QP (and ring) of the PPU it came from; each
            # PPU's dispatcher then answers what its ring holds.
            self.qsc.handle_frame(frame)
            for dispatcher in self.dispatchers:
                self._poll(dispatcher)

    def _serve_frame(self, plane, frame: bytes) -> None:
        """``--gpu-frames``: move a request frame of PPU 0's QP into the GPU's rx frame ring and
        the response frame the kernel writes back onto the wire, as a NIC would (no Python
        looks into either frame). The GPU answers in wall-clock time while simulated time
        stands still, as with ``--gpu``."""
        before = plane.counters()
        t0 = time.perf_counter_ns()
        deadline = t0 + 2_000_000_000
        while not plane.push_frame(frame):
            if time.perf_counter_ns() > deadline:
                raise TimeoutError("the GPU RoCE endpoint did not take a frame in 2 s")
        while (response := plane.pop_frame()) is None:
            now = plane.counters()
            if (now["RX_FRAMES"] > before["RX_FRAMES"]
                    and now["RX_PUBLISHED"] == before["RX_PUBLISHED"]):
                # The kernel stores its counters after the response frame: none now means the
                # frame was dropped (and counted), unanswered, as the host would drop it.
                response = plane.pop_frame()
                if response is None:
                    return
                break
            if time.perf_counter_ns() > deadline:
                raise TimeoutError("the GPU RoCE endpoint did not answer in 2 s")
        self.gpu_service_ns.append(time.perf_counter_ns() - t0)
        self.gpu_frame_ns.append(plane.frames.last_frame_ns)
        self.transport.send_frame(response)

    def _start_frame_plane(self, table) -> None:
        """``--gpu-frames``: make the GPU RoCE endpoint for PPU 0's QP (its contract as the
        host configured it), warm it up, and hand it the QP's PSNs. Called by the host session
        after the uploads and the trigger (RDMA WRITEs on the same QP): the host sends nothing
        more on the QP until :meth:`_stop_frame_plane`."""
        from ..gpu.frames import FrameEndpointConfig, GPUFramePlane
        from ..wire.roce import slot_immediate
        from .info import region_rkeys

        cfg = self.cfg
        qp = self.qsc.qp(0)
        ring = self.rings[0]
        config = FrameEndpointConfig.from_qp(
            qp, num_slots=ring.num_slots, slot_size=ring.slot_size,
            ring_rkey=region_rkeys(self.params, 0, cfg).ring)
        plane = GPUFramePlane(config, timing_capacity=1024)
        t0 = time.perf_counter()
        entries = table.entries()
        max_result = MAILBOX_BYTES - HEADER_BYTES
        # Warm-up on the QP's contract with PSNs of its own: requests for an unknown function
        # (status -1) from a stand-in of the QSC's side, their responses dropped; then the run
        # starts again from the host QP's PSNs, so the wire sees what the CPU run sends.
        try:
            plane.start(entries, max_result_bytes=max_result, psn=(0, 0))
            self.gpu_start_s = time.perf_counter() - t0
            peer = type(qp)(qp.remote_mac, qp.remote_ip, qp.remote_qpn, qp.local_mac,
                            qp.local_ip, qp.qpn, p_key=qp.p_key)
            warm = Request(function_id=0, request_id=0xFFFF_FFFF, ptp_timestamp=0,
                           payload=b"").pack()
            count = cfg.get("gpu_warmup", 100)
            for k in range(count):
                slot = k % ring.num_slots
                plane.push_frame(peer.write_frame(slot * ring.slot_size, config.ring_rkey,
                                                  warm, imm=slot_immediate(peer.tx_psn, slot)))
                deadline = time.perf_counter() + 2.0
                while plane.pop_frame() is None:
                    if time.perf_counter() > deadline:
                        raise TimeoutError("the GPU RoCE endpoint did not answer a warm-up "
                                           "frame")
            plane.stop()
            self.gpu_warmup = count
            self.gpu_warmup_counters = plane.counters()
            plane.start(entries, max_result_bytes=max_result, qp=qp)
        except BaseException:
            try:                        # the kernel stopped and its memory given back
                plane.close()
            except Exception as exc:    # pragma: no cover - the error being raised is the one
                logging.getLogger(__name__).warning(
                    "closing the GPU RoCE endpoint after a failed start: %s", exc)
            raise
        self.frame_plane = plane

    def _stop_frame_plane(self) -> None:
        """Stop the GPU RoCE endpoint: the QP's PSNs go back to the host's QP."""
        if self.frame_plane is not None and self.frame_plane.running:
            self.frame_plane.stop()

    def _poll(self, dispatcher: Dispatcher) -> None:
        forwarded = dispatcher.forwarded
        t0 = time.perf_counter_ns()
        dispatcher.poll()
        if dispatcher.forwarded > forwarded:
            # The GPU answers in wall-clock time while simulated time stands still: the
            # timeline stays deterministic (it uses the modelled turnaround) and the GPU's
            # service time is measured and reported beside it.
            deadline = t0 + 2_000_000_000
            while dispatcher.gpu_outstanding:
                if time.perf_counter_ns() > deadline:
                    raise TimeoutError("the GPU dispatch kernel did not answer in 2 s")
                dispatcher.poll()
            self.gpu_service_ns.append(time.perf_counter_ns() - t0)

    # --- the PTD side -------------------------------------------------------------------------

    def _event(self, channel: str, kind: str, **extra) -> None:
        cycle = self.dtd_cycle
        self.events.append({"channel": channel, "kind": kind, "dtd_cycle": cycle,
                            "time_ns": round(cycle * self.dtd_period_ps / 1000, 3), **extra})

    async def _ptd_monitor(self) -> None:
        """Sample the PTD outputs of every running PPU on DTD edges (see :meth:`_ptd_port`).

        ``dtd_cycle`` is the gateware's timeline value in the cycle whose outputs we see, so an
        event scheduled for DTD time T is reported at cycle T. While a pulse plays or a window
        is open somewhere, every edge is sampled; otherwise the monitor sleeps until a PPU's
        ``dac_active``, ``ro_window`` or ``marker`` changes (what it would have read on the
        edges in between is what it read last), then samples the edge that ends that cycle.
        """
        dut = self.dut
        steps = [self._ptd_port(n) for n in range(self.num_run)]
        changes = [ValueChange(getattr(dut, f"ptd__{n}__{name}"))
                   for n in range(self.num_run) for name in ("dac_active", "ro_window", "marker")]
        edge = RisingEdge(dut.dtd_clk)
        busy = False
        while True:
            if not busy:
                # Outputs change just after an edge: the next edge ends their first cycle.
                await First(*changes)
            await edge
            # Read at the edge: the timeline value and the outputs of the cycle that just ended.
            self.dtd_cycle = int(dut.timeline.value)
            busy = False
            for step in steps:
                busy = step() or busy

    def _ptd_port(self, n: int) -> Callable[[], bool]:
        """PPU ``n``'s PTD side, all in one place: finds its ports on the top
        (``ptd__<n>__*``) and returns the step the monitor runs on a DTD edge. The step reads
        the outputs of the cycle ``c`` that just ended and returns whether PPU ``n`` needs the
        next edge too (a pulse playing or a window open).

        With ``S = samples_per_cycle``, cycle ``c``'s lane ``k`` is PTD sample
        ``S * c + k``. The step, in sample order:

        * opens a readout on each ``ro_window`` bit that rose: its qubit is projected at the
          window's first sample ``S * c`` (:meth:`QubitSystem.begin_readout`);
        * feeds each playing drive channel's ``dac``/``dac_q`` lanes (``dac_active`` set),
          sample by sample across the channels: channel ``q < Q`` to
          :meth:`QubitSystem.drive` of qubit ``q``, channel ``Q + q`` to
          :meth:`QubitSystem.couple` of coupler ``q``;
        * closes the readouts whose bit fell;
        * records the channel events, and sets the ``adc`` lanes of each open window for cycle
          ``c + 1`` from :meth:`QubitSystem.adc_sample`. The ADC's answer thus starts one cycle
          after the window opens (the first cycle of a window integrates zeros), and the tone's
          time is counted from the window's first sample, where the gateware's demodulator
          starts its phase.
        """
        dut = self.dut
        system = self.qubits[n]
        S = self.params.samples_per_cycle
        q_count = self.qubit_count
        roles = channel_roles(q_count)
        dac = getattr(dut, f"ptd__{n}__dac")
        dac_q = getattr(dut, f"ptd__{n}__dac_q")
        dac_active = getattr(dut, f"ptd__{n}__dac_active")
        ro_window = getattr(dut, f"ptd__{n}__ro_window")
        marker = getattr(dut, f"ptd__{n}__marker")
        adc = self._adc(n)
        for name, port, width in (("dac", dac, 16 * self.params.drives_per_ppu * S),
                                  ("adc", adc, 16 * self.params.readouts_per_ppu * S)):
            if len(port) != width:
                raise ValueError(
                    f"the top's ptd__{n}__{name} has {len(port)} bits, not the {width} of "
                    f"{self.params.drives_per_ppu} drive and {self.params.readouts_per_ppu} "
                    f"readout channel(s) of {S} sample(s) per cycle: a Verilog file of another "
                    "build (make it with the same --ppus, --qubits and --samples-per-cycle)")
        #: Per drive channel: (coupler?, the model's drive or coupler index, lane bit offsets).
        drive_lanes = [(role == "coupler", ch if role == "drive" else ch - q_count,
                        [16 * (S * ch + k) for k in range(S)])
                       for ch, (role, _) in enumerate(roles)]
        adc_lanes = [[16 * (S * ch + k) for k in range(S)]
                     for ch in range(self.params.readouts_per_ppu)]
        window_start = [0] * self.params.readouts_per_ppu   # sample of each window's start
        prev = {"play": 0, "ro": 0, "marker": 0, "adc": 0}

        def bits(word: int) -> list[int]:
            return [b for b in range(word.bit_length()) if word >> b & 1]

        def lane(word: int, shift: int) -> int:
            v = word >> shift & 0xFFFF
            return v - ((v & 0x8000) << 1)

        def step() -> bool:
            c = self.dtd_cycle
            base = S * c
            active = int(dac_active.value)
            window = int(ro_window.value)
            marks = int(marker.value)
            opened, closed = window & ~prev["ro"], prev["ro"] & ~window
            started, ended = active & ~prev["play"], prev["play"] & ~active
            # A pulse that ended played its last sample last cycle: its P(1) before anything
            # of this cycle (a readout opening now) touches the qubit.
            plays = [(ch, "play_end", self._play_detail(system, ch, None)) for ch in bits(ended)]
            acquires = []
            for ch in bits(opened):
                outcome = system.begin_readout(ch, base)
                record = system.measurements[-1]
                window_start[ch] = base
                acquires.append((ch, "acquire_start", {"qubit": record.qubit,
                                                       "outcome": outcome,
                                                       "p1": round(record.p1, 6)}))
            for ch in bits(started):
                plays.append((ch, "play_start", self._play_detail(system, ch, base)))
            if active:
                words = int(dac.value), int(dac_q.value)
                playing = [drive_lanes[ch] for ch in bits(active)]
                for k in range(S):
                    for coupler, index, shifts in playing:
                        i, q = lane(words[0], shifts[k]), lane(words[1], shifts[k])
                        if coupler:
                            system.couple(index, base + k, i, q)
                        else:
                            system.drive(index, base + k, i, q)
            for ch in bits(closed):
                system.end_readout(ch)
                acquires.append((ch, "acquire_end", {"qubit": system.readouts[ch].qubit}))
            for ch, kind, detail in plays:
                self._event(f"drive{n}.{ch}", kind, **detail)
            for ch, kind, detail in acquires:
                self._event(f"readout{n}.{ch}", kind, **detail)
            if marks != prev["marker"]:
                for bit in range(len(marker)):
                    was, now = (prev["marker"] >> bit) & 1, (marks >> bit) & 1
                    if was != now:
                        self._event(f"marker{n}.{bit}", "marker_on" if now else "marker_off")
            samples = 0
            if window:
                nxt = base + S      # the next cycle's first sample
                for ch in bits(window):
                    first = nxt - window_start[ch]
                    for k, shift in enumerate(adc_lanes[ch]):
                        samples |= (system.adc_sample(ch, first + k) & 0xFFFF) << shift
            if samples or prev["adc"]:
                adc.value = samples
            prev.update(play=active, ro=window, marker=marks, adc=samples)
            return bool(active or window)

        return step

    def _play_detail(self, system: QubitSystem, channel: int, sample: int | None) -> dict:
        """A play event's detail on drive ``channel``: the qubit it drives and that qubit's
        P(1) at ``sample`` (None: after its latest event), or a coupler's two qubits."""
        role, targets = channel_roles(self.qubit_count)[channel]
        if role == "coupler":
            return {"qubits": list(targets)}
        return {"qubit": targets[0], "p1": round(system.p1(targets[0], sample), 6)}

    # --- the host session (runs in a bridge thread, or a thread of its own with a TAP) --------

    @resume
    async def _sleep_ns(self, ns: int) -> None:
        await Timer(ns, "ns")

    def host_session(self) -> dict:
        """The host's side of the run: connect, configure and upload every running PPU,
        trigger them all with one start time, poll until each has ended (or the run limit:
        ``cfg["max_run_ns"]`` of simulated time), read their registers and the counters."""
        cfg = self.cfg
        qsc = self.qsc
        ppus = range(self.num_run)
        info = qsc.connect()
        for n in ppus:
            # The bench's keys are the fixed ones `qlink info` reports (captures replay).
            keys = region_rkeys(self.params, n, cfg)
            qp = qsc.configure(n, self.rings[n], host_qpn=self.host_qpn + n,
                               ring_rkey=keys.ring, imem_rkey=keys.imem, env_rkey=keys.env,
                               regs_rkey=keys.regs)
            self._ppu_of_qsc_qpn[qp.remote_qpn] = n
        info_qps = sim_info(self.params, self.num_run, cfg)
        configure_extra_qps(qsc, info_qps)
        for n in ppus:
            program = self.programs[n]
            for env in program.envelopes.values():
                qsc.write_envelope(n, env.addr, env.samples)
            qsc.upload_program(n, program.to_bytes())
        # One start time for every PPU: their timelines agree from the first event on.
        start = qsc.timeline(0) + cfg["start_margin_cycles"]
        for n in ppus:
            qsc.trigger(n, start, len(self.programs[n].instructions))
        if cfg.get("gpu_frames"):
            # After the trigger, an RDMA WRITE on the same QP: from here the kernel holds the
            # QP's PSNs. Simulated time stands still until this thread waits, so the endpoint
            # runs before the first CALL.
            self._start_frame_plane(self.gpu_table)
        deadline_ns = self._host_now_ns() + cfg["max_run_ns"]
        statuses: dict[int, object] = {}
        running = list(ppus)
        while True:
            for n in list(running):
                statuses[n] = status = qsc.status(n)
                if status.state in (PPUState.DONE, PPUState.ERROR):
                    running.remove(n)
            if not running:
                limit_reached = False
                break
            if self._host_now_ns() > deadline_ns:
                limit_reached = True
                break
            self._host_wait_ns(cfg["status_poll_ns"])
        self._stop_frame_plane()
        registers = []
        for n in ppus:
            regs = qsc.read_registers(n)
            status_reg = regs["LAST_CALL_STATUS"]
            regs["LAST_CALL_STATUS"] = status_reg - (1 << 32) if status_reg >> 31 else status_reg
            registers.append(regs)
        return {
            "connect": info,
            "start_time_cycles": start,
            "statuses": [statuses[n] for n in ppus],
            "run_limit_reached": limit_reached,
            "registers": registers,
            "counters": qsc.counters(),
            # Each configured QP's context as the gateware holds it (``qlink info`` prints
            # what the bench configures).
            "qp_contexts": [qsc.read_qp_context(qp["qp"]) for qp in info_qps["qps"]],
        }

    async def run(self) -> dict:
        cfg = self.cfg
        paths = cfg.get("programs") or [cfg["program"]]
        handlers = cfg.get("handlers_per_ppu") or [cfg.get("handlers")]
        if len(handlers) != self.num_run:
            raise ValueError(f"{len(handlers)} handlers files for {self.num_run} programs")
        gpu = cfg.get("gpu", False)
        frames = bool(cfg.get("gpu_frames"))
        if frames and not gpu:
            raise ValueError("gpu_frames needs gpu: the GPU RoCE endpoint runs the GPU's table")
        if gpu and self.num_run > 1:
            raise ValueError("the GPU dispatch path serves one PPU: run one program with --gpu")
        if gpu and self.tap is not None:
            raise ValueError("the GPU dispatch path is the simulated host's: not with a TAP")
        self.programs = [assemble(Path(p).read_text(), filename=p, params=self.params)
                         for p in paths]
        self.program = self.programs[0]
        tables = [load_function_table(h, gpu=gpu) for h in handlers]
        for names, program, table in zip(self._function_names, self.programs, tables,
                                         strict=True):
            names.update({fid: name for name, fid in program.functions.items()})
            names.update({e.function_id: e.name for e in table.entries()})
        self.rings = [SlotRing(cfg["num_slots"], cfg["slot_size"]) for _ in range(self.num_run)]
        self.ring = self.rings[0]
        # On a TAP the QSC answers in simulated time, thousands of times slower than a board:
        # the control plane's time-out is cfg["tap_timeout_s"] of wall-clock time there.
        timeout = {} if self.tap is None else {"timeout_s": cfg["tap_timeout_s"]}
        self.qsc = QSC(self.transport, params=self.params, host_mac=cfg["host_mac"],
                       host_ip=cfg["host_ip"], pmtu_bytes=cfg["pmtu"],
                       call_transport=cfg.get("calls", "roce"), **timeout)
        # Results land in the PPU's 64-byte mailbox, after the 24-byte response header.
        if frames:
            # PPU 0's requests are answered by the GPU RoCE endpoint; its dispatcher (which
            # then sees no request) keeps an empty table. HOST_CALLs cannot be served there:
            # the endpoint's start refuses them, naming them.
            self.gpu_table = tables[0]
            tables[0] = FunctionTable()
        self.dispatchers = [
            Dispatcher(tables[n], self.rings[n],
                       send_response=lambda slot, data, n=n: self.qsc.send_response(n, slot,
                                                                                     data),
                       max_result_bytes=MAILBOX_BYTES - HEADER_BYTES,
                       gpu=self._gpu_plane(cfg) if n == 0 and not frames else None)
            for n in range(self.num_run)]
        self.dispatcher = self.dispatchers[0]
        if self.dispatcher.gpu is not None:
            t0 = time.perf_counter()
            self.dispatcher.start()      # NVRTC/numba -> LTO-IR -> nvJitLink -> launch
            self.gpu_start_s = time.perf_counter() - t0
            self._warm_up_gpu(cfg.get("gpu_warmup", 100))
        host_log = _LogCollector()
        logging.getLogger("openqlink").addHandler(host_log)
        try:
            if self.tap is None:
                cocotb.start_soon(self._dispatch_loop())
                host = await bridge(self.host_session)()
            else:
                host = await self._in_host_thread(self.host_session)
                await self._tap_hold()
        finally:
            logging.getLogger("openqlink").removeHandler(host_log)
            if self.tap is not None:
                self.transport.close()
                self.tap.close()
        await Timer(1, "us")
        if self.pcap is not None:
            self.pcap.close()
        gpu = self._gpu_results()
        # The programs and handlers files as the user named them (two checkouts give the same
        # JSON), else the paths the bench was given.
        names = cfg.get("program_names") or paths
        handler_names = cfg.get("handler_names") or handlers
        ppus = [self._ppu_results(n, host["statuses"][n], host["registers"][n], names[n],
                                  handler_names[n]) for n in range(self.num_run)]
        first = ppus[0]
        return {
            "program": names[0],
            "params": cfg["params"],
            "model": {
                "host_turnaround_ns": self.turnaround_ns if self.tap is None else None,
                "host_turnaround_note": "modelled: the simulated host answers this long after "
                                        "the request's last byte reaches it"
                if self.tap is None else "not modelled: the host answered through the TAP",
                "qubits": self.qubit_count,
                "channel_map": channel_map(self.qubit_count),
                "qubit": self.qubit.describe(),
            },
            "start_time_cycles": host["start_time_cycles"],
            "events": self.events,
            "measurements": first["measurements"],
            "qubit_final_p1": first["qubit_final_p1"],
            "qubits_final_p1": first["qubits_final_p1"],
            "rpc": self.rpc,
            "counters": host["counters"],
            "qp_contexts": host["qp_contexts"],
            "registers": first["registers"],
            "status": first["status"],
            "fault_location": first["fault_location"],
            "run_limit_reached": host["run_limit_reached"],
            "max_run_ns": cfg["max_run_ns"],
            "host_log": host_log.lines,
            "dispatcher": {"processed": sum(self._calls_answered(n)
                                            for n in range(self.num_run))},
            "ppus": ppus,
            **({"gpu": gpu} if gpu is not None else {}),
            **({"tap": self._tap_results()} if self.tap is not None else {}),
        }

    def _ppu_results(self, n: int, status, registers: dict, program: str,
                     handlers: str | None) -> dict:
        """What PPU ``n`` did: its program, final status and registers, its qubits'
        measurements and P(1) after their last events, its model's settings, its channel events
        and its CALLs."""
        system = self.qubits[n]
        S = self.params.samples_per_cycle
        final = [round(system.p1(q), 6) for q in range(len(system.qubits))]
        return {
            "ppu": n,
            "program": program,
            "handlers": handlers,
            "status": status_dict(status),
            "registers": registers,
            "fault_location": self._fault_location(status, registers, n),
            "measurements": [{"outcome": m.outcome, "p1": round(m.p1, 6),
                              "dtd_cycle": m.sample // S, "qubit": m.qubit,
                              "channel": m.channel} for m in system.measurements],
            "qubit_seed": system.seed,
            "qubit_final_p1": final[0],
            "qubits_final_p1": final,
            "model": system.describe(),
            "events": [e for e in self.events if channel_ppu(e["channel"]) == n],
            "rpc": [r for r in self.rpc if r["ppu"] == n],
            "calls_answered": self._calls_answered(n),
        }

    def _calls_answered(self, n: int) -> int:
        """CALLs PPU ``n``'s host answered: its dispatcher's, or, with ``--gpu-frames``, the
        GPU RoCE endpoint's for PPU 0 (the warm-up not counted)."""
        if n == 0 and self.frame_plane is not None:
            return self.frame_plane.processed
        return self.dispatchers[n].processed

    def _gpu_plane(self, cfg: dict):
        if not cfg.get("gpu"):
            return None
        from ..gpu import GPUDataPlane

        return GPUDataPlane(num_slots=cfg["num_slots"], slot_size=cfg["slot_size"],
                            timing_capacity=1024)

    def _warm_up_gpu(self, count: int) -> None:
        """Send ``count`` requests for an unknown function straight to the GPU plane (each gets
        status -1) so the program's CALLs do not pay first-touch costs; what a host does before
        it triggers a program."""
        plane = self.dispatcher.gpu
        warm = Request(function_id=0, request_id=0xFFFF_FFFF, ptp_timestamp=0,
                       payload=b"").pack()
        for _ in range(count):
            plane.submit(warm)
            deadline = time.perf_counter() + 2.0
            while plane.poll_response() is None:
                if time.perf_counter() > deadline:
                    raise TimeoutError("the GPU dispatch kernel did not answer a warm-up request")
        self.gpu_warmup = count

    def _gpu_results(self) -> dict | None:
        """What the GPU did, measured in wall-clock time (so not part of the deterministic
        results): the only section that differs between two ``--gpu`` runs."""
        if self.frame_plane is not None:
            return self._gpu_frame_results()
        d = self.dispatcher
        if d.gpu is None:
            return None
        plane = d.gpu
        d.stop()
        service = sorted(self.gpu_service_ns)
        turnaround = plane.timings_ns()
        return {
            "device": plane.device.name, "arch": plane.arch,
            "kernel_processed": plane.processed,
            "warmup_requests": self.gpu_warmup,
            "calls_served": plane.processed - self.gpu_warmup,
            "forwarded": d.forwarded,
            "link_and_launch_s": round(self.gpu_start_s, 3),
            "measured_note": "wall-clock, measured while simulated time stood still; "
                             "service_ns: host poll -> response frame handed to the MAC model, "
                             "all in Python (request decode, GPU ring, response frame build "
                             "with its ICRC); call_in_kernel_ns: request seen -> response "
                             "published inside the kernel (%globaltimer)",
            "service_ns": self.gpu_service_ns,
            "service_p50_ns": service[len(service) // 2] if service else None,
            "call_in_kernel_ns": turnaround[len(turnaround) - d.forwarded:]
            if d.forwarded else [],
            "in_kernel_turnaround_ns": turnaround,
        }

    def _gpu_frame_results(self) -> dict:
        """``--gpu-frames``: what the GPU RoCE endpoint did (wall-clock, not deterministic)."""
        plane = self.frame_plane
        self._stop_frame_plane()
        service = sorted(self.gpu_service_ns)
        return {
            "mode": "frames",
            "device": plane.device.name, "arch": plane.arch,
            "kernel_processed": plane.processed,     # this run's: the warm-up ran apart
            "warmup_requests": self.gpu_warmup,
            "calls_served": plane.processed,
            "warmup_counters": self.gpu_warmup_counters,
            "counters": plane.counters(),
            "link_and_launch_s": round(self.gpu_start_s, 3),
            "measured_note": "wall-clock, measured while simulated time stood still; "
                             "service_ns: request frame pushed -> response frame popped by "
                             "the bench (no Python looks into either); frame_in_kernel_ns: "
                             "frame seen -> response frame published inside the kernel "
                             "(%globaltimer), checks and ICRCs included",
            "service_ns": self.gpu_service_ns,
            "service_p50_ns": service[len(service) // 2] if service else None,
            "frame_in_kernel_ns": self.gpu_frame_ns,
        }

    def _fault_location(self, status, registers: dict, n: int = 0) -> str | None:
        """``file:line: source`` of the instruction at PC when PPU ``n`` stopped on an error."""
        if status.state != PPUState.ERROR:
            return None
        loc = self.programs[n].source_map.get(registers["PC"])
        if loc is None:
            return f"pc {registers['PC']} (no instruction there: past the program's end)"
        return f"{Path(loc.filename).name}:{loc.line}: {loc.text.strip()}"


#: How often the heartbeat looks at the wall clock (simulated ns), and how often it writes
#: (wall-clock s).
HEARTBEAT_CHECK_NS = 1000
HEARTBEAT_WRITE_S = 0.5


async def _heartbeat(path: Path) -> None:
    """Write the simulated time reached (``{"sim_time_ns": t}``) to ``path`` about every
    :data:`HEARTBEAT_WRITE_S` of wall-clock time, for the runner's progress display; each write
    is atomic (a temporary file renamed over ``path``)."""
    last = time.monotonic()
    tmp = path.with_name(path.name + ".tmp")
    while True:
        await Timer(HEARTBEAT_CHECK_NS, "ns")
        now = time.monotonic()
        if now - last >= HEARTBEAT_WRITE_S:
            last = now
            tmp.write_text(json.dumps({"sim_time_ns": cocotb.utils.get_sim_time("ns")}))
            os.replace(tmp, path)


async def run_configured(dut, bench_class: type[TB]) -> None:
    """Build ``bench_class`` from the configuration file ``$OPENQLINK_SIM_CONFIG`` names, run
    its program end to end and write the results JSON to the file the configuration names.
    With ``cfg["progress"]`` (a path), the simulated time reached is written there as the run
    goes (:func:`_heartbeat`)."""
    cfg = json.loads(Path(os.environ["OPENQLINK_SIM_CONFIG"]).read_text())
    if cfg.get("progress"):
        cocotb.start_soon(_heartbeat(Path(cfg["progress"])))
    tb = bench_class(dut, cfg)
    await tb.reset()
    results = await tb.run()
    Path(cfg["results"]).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


@cocotb.test()
async def run_program(dut):
    """Run the configured program end to end and write the results JSON."""
    await run_configured(dut, TB)
