"""The simulation bridge: a :class:`FrameTransport` whose wire is the cocotb bench's MAC models.

The host package's blocking API (``QSC.connect()``, ``upload_program()``, ...) runs unchanged in a
``cocotb.bridge`` thread. While the simulator is paused that thread runs; when it waits for a
frame, :meth:`SimTransport.recv_frame` hands control back to the simulator through
``cocotb.resume`` and waits in *simulated* time. Time-outs are simulated seconds, capped by
``max_wait_ns`` so a lost frame costs little simulation time. Called from the simulator's own
thread (a coroutine), ``recv_frame`` never waits: it returns a queued frame or ``None``.

Frames reach the host through :meth:`deliver` (called by the bench's sink monitor); frames the
host sends go to the bench's :class:`~openqlink.sim.mac.PacketSource`.
"""

from __future__ import annotations

import collections
import threading

import cocotb
from cocotb.task import resume
from cocotb.triggers import Event, First, Timer

from ..bridges.base import FrameTransport, TransportClosedError

__all__ = ["SimTransport"]


class SimTransport(FrameTransport):
    """Layer-2 transport over the simulated MAC.

    Parameters
    ----------
    source : PacketSource
        Drives frames into the QSC's ``rx`` port.
    max_wait_ns : int
        Upper bound of one ``recv_frame`` wait in simulated ns.
    """

    def __init__(self, source, *, max_wait_ns: int = 200_000):
        self.source = source
        self.max_wait_ns = max_wait_ns
        self._rx: collections.deque[bytes] = collections.deque()
        self._arrived = Event()
        self._main_thread = threading.main_thread()
        self.closed = False

    def deliver(self, frame: bytes) -> None:
        """Called by the bench for every frame the host should receive."""
        self._rx.append(frame)
        self._arrived.set()

    def send_frame(self, frame: bytes) -> None:
        if self.closed:
            raise TransportClosedError("the simulation transport is closed")
        self.source.send(frame)

    def recv_frame(self, timeout_s: float | None = None) -> bytes | None:
        if self._rx:
            return self._rx.popleft()
        if threading.current_thread() is self._main_thread or timeout_s == 0:
            return None
        wait_ns = self.max_wait_ns if timeout_s is None else min(
            self.max_wait_ns, max(1, int(timeout_s * 1e9)))
        return self._wait(wait_ns)

    @resume
    async def _wait(self, wait_ns: int) -> bytes | None:
        if not self._rx:
            self._arrived.clear()
            await First(self._arrived.wait(), Timer(wait_ns, "ns"))
        return self._rx.popleft() if self._rx else None

    def now_s(self) -> float:
        """Simulated time in seconds: host time-outs run on the simulator's clock."""
        return cocotb.utils.get_sim_time("ps") * 1e-12

    def close(self) -> None:
        self.closed = True
