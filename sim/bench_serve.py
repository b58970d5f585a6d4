"""Serving bench: the simulated QSC on a local socket, driven by a client in wall-clock time.

Started by :func:`openqlink.sim.runner.run_serve` (``qlink sim --serve PATH``). The bench has no
host of its own and runs no program: it resets the QSC (which then sits idle, configured as
from reset, closed to RDMA until a host configures it), attaches its Ethernet port to a Unix
``SOCK_SEQPACKET`` socket listening at ``cfg["serve"]``
(:class:`~openqlink.sim.socket_port.SocketPort`) and moves frames as ``qlink sim --tap`` does
with a TAP (the same pump, :meth:`TB._port_pump`): every ``cfg["tap_poll_ns"]`` of simulated
time the client's queued frames go into the QSC's receive port back to back at line rate, and
every frame the QSC sends goes to the client at once. The client
(:class:`openqlink.bridges.unixsock.SocketTransport`, e.g. :class:`openqlink.sim.SimulatedQSC`)
configures, uploads, triggers and serves CALLs as a host does with a board.

Every PPU of the build has its qubit model (:mod:`openqlink.sim.channel_map`), so whatever the
client's programs play and measure reaches a model. Once listening, the bench writes the file
``cfg["serve_ready"]`` (the runner's sign that the simulation is ready). The run ends when the
client closes its end, or after ``cfg["serve_limit_s"]`` seconds of wall-clock time; the
results are the frames moved, why it ended, and each PPU's channel events and measurements.
"""

from __future__ import annotations

import time
from pathlib import Path

import cocotb
from cocotb.triggers import Timer

from .bench import TB, run_configured
from .channel_map import channel_map
from .report import channel_ppu
from .socket_port import SocketPort

__all__ = ["ServeBench", "serve_socket"]

#: How often (simulated ns) the bench looks at the client's connection and the clock.
CHECK_NS = 1000


class ServeBench(TB):
    """The system bench with the QSC's port on ``cfg["serve"]``'s socket and no host."""

    async def reset(self) -> None:
        await super().reset()
        self._attach_port(SocketPort(self.cfg["serve"]))
        Path(self.cfg["serve_ready"]).write_text(self.cfg["serve"] + "\n")

    async def run(self) -> dict:
        cfg = self.cfg
        port = self.port
        assert port is not None
        limit_s = cfg["serve_limit_s"]
        t0 = time.monotonic()
        ended = "client_closed"
        while not port.client_closed:
            if time.monotonic() - t0 >= limit_s:
                ended = "limit"
                break
            await Timer(CHECK_NS, "ns")
        connected_once = port.client_closed or port.connected
        port.close()
        await Timer(1, "us")
        if self.pcap is not None:
            self.pcap.close()
        return {
            "params": cfg["params"],
            "serve": {
                "socket": cfg["serve"],
                "ended": ended if connected_once else "no_client",
                "limit_s": limit_s,
                "wall_s": round(time.monotonic() - t0, 3),
                "sim_time_ns": round(self.now_ns(), 3),
                "frames_from_client": port.frames_read,
                "frames_to_client": port.frames_written,
                "write_errors": port.write_errors,
            },
            "model": {
                "qubits": self.qubit_count,
                "channel_map": channel_map(self.qubit_count),
            },
            "events": self.events,
            "ppus": [self._serve_ppu(n) for n in range(self.num_run)],
        }

    def _serve_ppu(self, n: int) -> dict:
        """What reached PPU ``n``'s qubits: its channel events, its projections and each
        qubit's P(1) after its last event, and its model's settings."""
        system = self.qubits[n]
        S = self.params.samples_per_cycle
        return {
            "ppu": n,
            "events": [e for e in self.events if channel_ppu(e["channel"]) == n],
            "measurements": [{"outcome": m.outcome, "p1": round(m.p1, 6),
                              "dtd_cycle": m.sample // S, "qubit": m.qubit,
                              "channel": m.channel} for m in system.measurements],
            "qubits_final_p1": [round(system.p1(q), 6) for q in range(len(system.qubits))],
            "model": system.describe(),
        }


@cocotb.test()
async def serve_socket(dut):
    """Serve the simulated QSC on the configured socket until its client leaves."""
    await run_configured(dut, ServeBench)
