"""The board bench: the board top's simulation build on Icarus, RGMII on the wire, the host
package unchanged, the qubit emulated in the gateware.

:func:`run_board_sim` converts :class:`~openqlink.gateware.boards.top.SimBoardTop` of a board
profile to Verilog and runs this module's cocotb test on it through the system bench's runner
(:func:`openqlink.sim.runner.run_bench`). What differs from the system bench
(:mod:`openqlink.sim.bench`, whose :class:`~openqlink.sim.bench.TB` this bench extends):

* The wire is RGMII: cocotbext-eth's :class:`~cocotbext.eth.RgmiiSource` plays the PHY's receive
  side (preamble, SFD, FCS, the PHY's own RXC at 125 MHz, out of phase with ``rti``) and
  :class:`~cocotbext.eth.RgmiiSink` its transmit side (a frame with a bad FCS fails the bench).
  Frames from the host are padded to 60 bytes as a NIC pads them; frames to the host keep the
  MAC's padding (the host's decoders read the IPv4 length).
* Clocks and resets are the board's: ``rti`` and ``dtd`` at the profile's frequencies, each
  domain released from its asynchronous reset by the top's own reset synchronizer.
* The PTD side is the on-board :class:`~openqlink.gateware.qubit.QubitEmulator` (seed
  ``QUBIT_SEED + n``): the bench drives no ADC. Its monitor reads the PPU's PTD signals and the
  emulator's state (``qubit<n>.phase``, ``qubit<n>.outcome``) through the simulator's hierarchy,
  for the same events, measurements and final P(1) the system bench reports.

Everything is driven by simulated time, so two runs with the same inputs give the same results.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, Timer

from ..isa.asm import assemble
from .bench import TB, run_configured
from .handlers import default_handlers_path, load_function_table
from .mac import FrameQueue
from .runner import (
    DEFAULT_SIMULATOR,
    SimConfig,
    SimulationError,
    check_simulator,
    icarus_compatible,
    run_bench,
)

__all__ = ["BoardTB", "RgmiiFrameSource", "RgmiiFrameSink", "run_board_sim", "run_board"]

#: Bytes of the smallest Ethernet frame without its FCS.
_MIN_FRAME = 60
#: The PHY's receive clock trails ``rti`` by this much (the two are not related on a board).
_RX_CLK_PHASE_NS = 3.0


class RgmiiFrameSource(FrameQueue):
    """The host's frames onto the RGMII receive pins (``rgmii_rxd``/``rx_ctl``/``rx_clk``).

    The interface of :class:`~openqlink.sim.mac.PacketSource`: ``send(frame)`` queues a frame
    (without FCS) and returns; ``on_sent(frame, time_ns)`` is called once its last byte is on
    the wire.
    """

    def __init__(self, dut, *, on_sent: Callable[[bytes, int], None] | None = None):
        from cocotbext.eth import RgmiiSource

        self.phy = RgmiiSource(dut.rgmii_rxd, dut.rgmii_rx_ctl, dut.rgmii_rx_clk)
        self.phy.log.setLevel("WARNING")
        super().__init__(on_sent)

    async def _transmit(self, frame: bytes) -> None:
        from cocotbext.eth import GmiiFrame

        await self.phy.send(GmiiFrame.from_payload(frame.ljust(_MIN_FRAME, b"\0")))
        await self.phy.wait()


class RgmiiFrameSink:
    """Frames from the RGMII transmit pins, FCS checked and stripped.

    The interface of :class:`~openqlink.sim.mac.PacketSink`: ``on_frame(frame, time_ns)`` for
    every frame. A frame with a bad preamble, FCS or TX_ER raises (the bench fails).
    """

    def __init__(self, dut, *, on_frame: Callable[[bytes, int], None] | None = None):
        from cocotbext.eth import RgmiiSink

        self.phy = RgmiiSink(dut.rgmii_txd, dut.rgmii_tx_ctl, dut.rgmii_tx_clk)
        self.phy.log.setLevel("WARNING")
        self.on_frame = on_frame
        self.frames = 0
        self._task = cocotb.start_soon(self._run())

    async def _run(self) -> None:
        while True:
            frame = await self.phy.recv()
            if frame.get_preamble() != bytes([0x55] * 7 + [0xD5]):
                raise AssertionError(f"bad preamble/SFD {frame.get_preamble().hex()}")
            if not frame.check_fcs() or frame.error is not None and any(frame.error):
                raise AssertionError(f"frame {self.frames} from the MAC has a bad FCS or TX_ER")
            self.frames += 1
            if self.on_frame is not None:
                self.on_frame(bytes(frame.get_payload()), cocotb.utils.get_sim_time("ns"))


class BoardTB(TB):
    """:class:`~openqlink.sim.bench.TB` on the board top: RGMII wire, emulated qubit."""

    def __init__(self, dut, cfg: dict):
        super().__init__(dut, cfg)
        self.emulator = getattr(dut, f"qubit{self.ppu}")
        self.emulator_seed = cfg["emulator_seed"]
        self.measurements: list[dict] = []

    async def reset(self) -> None:
        dut = self.dut
        dut.rti_arst.value = 1
        dut.dtd_arst.value = 1
        dut.rgmii_rxd.value = 0
        dut.rgmii_rx_ctl.value = 0
        cocotb.start_soon(Clock(dut.rti_clk, self.rti_period_ps, unit="ps").start())
        cocotb.start_soon(Clock(dut.dtd_clk, self.dtd_period_ps, unit="ps").start())
        await Timer(_RX_CLK_PHASE_NS, "ns")
        cocotb.start_soon(Clock(dut.rgmii_rx_clk, self.rti_period_ps, unit="ps").start())
        for _ in range(8):
            await RisingEdge(dut.rti_clk)
        dut.rti_arst.value = 0
        dut.dtd_arst.value = 0
        for _ in range(8):
            await RisingEdge(dut.rti_clk)
        self.source = RgmiiFrameSource(dut, on_sent=self._on_host_frame)
        self.sink = RgmiiFrameSink(dut, on_frame=self._on_qsc_frame)
        from .transport import SimTransport

        self.transport = SimTransport(self.source)
        cocotb.start_soon(self._ptd_monitor())

    def emulator_p1(self) -> float:
        """P(1) of the emulated qubit now, from its phase accumulator."""
        phase = self.emulator.phase
        turn = 1 << len(phase)
        return math.sin(math.pi * int(phase.value) / turn) ** 2

    async def _ptd_monitor(self) -> None:
        """The system bench's PTD monitor, reading the PPU's PTD signals inside the top.

        A measurement's P(1) is read on the cycle the emulator reads it (two cycles after the
        window opened), its outcome from the emulator when the window closes.
        """
        dut, emu, n = self.dut, self.emulator, self.ppu
        marker = dut.marker
        prev = {"play": 0, "ro": 0, "marker": 0}
        p1_in = None
        p1 = 0.0
        start = 0
        while True:
            await RisingEdge(dut.dtd_clk)
            self.dtd_cycle = int(dut.timeline.value)
            # The cycle just ended started one period ago (TB.dtd_cycle_at's reference).
            self._dtd_ref = (round(cocotb.utils.get_sim_time("ps")) - self.dtd_period_ps,
                             self.dtd_cycle)
            active = int(emu.ptd__dac_active.value) & 1
            window = int(emu.ptd__ro_window.value) & 1
            marks = int(marker.value)
            if p1_in is not None:
                p1_in -= 1
                if p1_in == 0:
                    p1, p1_in = self.emulator_p1(), None
            if active != prev["play"]:
                self._event(f"drive{n}.0", "play_start" if active else "play_end",
                            p1=round(self.emulator_p1(), 6))
            if window != prev["ro"]:
                if window:
                    start, p1_in = self.dtd_cycle, 2
                    self._event(f"readout{n}.0", "acquire_start")
                else:
                    outcome = int(emu.outcome.value)
                    self.measurements.append({"outcome": outcome, "p1": round(p1, 6),
                                              "dtd_cycle": start, "qubit": 0, "channel": 0})
                    self._event(f"readout{n}.0", "acquire_end", outcome=outcome)
            if marks != prev["marker"]:
                # The top's marker output is registered once: its edges are one cycle late.
                for bit in range(len(marker)):
                    was, now = (prev["marker"] >> bit) & 1, (marks >> bit) & 1
                    if was != now:
                        self._event(f"marker{n}.{bit}", "marker_on" if now else "marker_off")
            prev = {"play": active, "ro": window, "marker": marks}

    async def run(self) -> dict:
        results = await super().run()
        results["measurements"] = self.measurements
        results["qubit_final_p1"] = round(self.emulator_p1(), 6)
        results["qubits_final_p1"] = [results["qubit_final_p1"]]
        emulator = {
            "emulator": "openqlink.gateware.qubit.QubitEmulator (in the gateware)",
            "seed": self.emulator_seed, "phase_bits": len(self.emulator.phase),
        }
        results["ppus"][self.ppu].update(measurements=self.measurements,
                                         qubit_final_p1=results["qubit_final_p1"],
                                         qubits_final_p1=results["qubits_final_p1"],
                                         qubit_seed=self.emulator_seed, model=emulator)
        results["model"]["qubit"] = emulator
        results["wire"] = {"rgmii_frames_from_qsc": self.sink.frames}
        return results


@cocotb.test()
async def run_board(dut):
    """Run the configured program end to end on the board top and write the results JSON."""
    await run_configured(dut, BoardTB)


def run_board_sim(program: str | Path, *, board: str = "colorlight-5a-75b",
                  handlers: str | Path | None = None, build_dir: str | Path,
                  pcap_path: str | Path | None = None, simulator: str = DEFAULT_SIMULATOR,
                  **bench: object) -> dict:
    """Simulate ``program`` end to end on the board top of ``board`` and return the results.

    The results have the keys of :func:`openqlink.sim.runner.run_sim`'s, with ``measurements``
    and ``qubit_final_p1`` from the gateware's qubit emulator. ``handlers`` defaults to the
    ``.py`` file beside ``program``; ``bench`` overrides :func:`~openqlink.sim.runner.SimConfig`
    (``start_margin_cycles``, ``host_turnaround_ns``, ...; its ``seed`` and ``qubit`` are not
    used: the emulator's seed is the board top's). The Verilog is written to ``build_dir``
    (``qsc_top.v``) and rebuilt only when it changes. ``simulator`` must be ``"icarus"``: on
    Verilator, cocotbext-eth's RGMII sink reads no preamble from the board top's transmit pins
    (the first frame fails the bench), so it is refused.

    Raises :class:`~openqlink.sim.runner.SimulationError` as ``run_sim`` does, and for a
    simulator other than Icarus before anything is built.
    """
    if check_simulator(simulator) != "icarus":
        raise SimulationError(f"the board bench runs on Icarus only, not {simulator}: "
                              "cocotbext-eth's RGMII sink reads no preamble from the board "
                              "top's transmit pins on Verilator")
    from amaranth.back import verilog

    from ..gateware.boards.profiles import PROFILES
    from ..gateware.boards.top import QUBIT_SEED, SimBoardTop

    profile = PROFILES[board]
    params = profile.params
    program = Path(program).resolve()
    assemble(program.read_text(), filename=str(program), params=params)
    if handlers is None:
        handlers = default_handlers_path(program)
    load_function_table(handlers)
    build_dir = Path(build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    text = icarus_compatible(verilog.convert(SimBoardTop(profile), name="qsc_top",
                                             emit_src=False))
    source = build_dir / "board_top.v"
    if not source.exists() or source.read_text() != text:
        source.write_text(text)
    cfg = SimConfig(**bench)
    cfg.update({
        "program": str(program),
        "handlers": str(Path(handlers).resolve()) if handlers else None,
        "pcap": str(Path(pcap_path).resolve()) if pcap_path else None,
        "emulator_seed": QUBIT_SEED,
    })
    return run_bench("openqlink.sim.board_bench", cfg, params=params, build_dir=build_dir,
                     verilog_path=source, simulator=simulator)
