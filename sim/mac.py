"""cocotb models of the MAC side of the QSC: a frame source (into ``rx``) and sink (from ``tx``).

The packet stream convention is :mod:`openqlink.gateware.packet`: one beat carries ``data``
(byte ``i`` = ``i``-th byte on the wire at bits ``[8i+7:8i]``), ``keep``, ``first`` and ``last``,
flattened by Amaranth into one ``<name>__payload`` vector in the layout's field order.

The source models a 10GBASE-R MAC: back-to-back frames are separated by ``ifg_cycles`` idle
cycles (preamble + inter-frame gap, 20 bytes = 2.5 beats at 64 bits, rounded up to 3).
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import cocotb
from cocotb.triggers import Event, RisingEdge

from ..gateware.packet import beat_layout

__all__ = ["frame_to_beats", "beats_to_frame", "PacketSource", "PacketSink"]


def _offsets(data_width: int) -> dict[str, tuple[int, int]]:
    layout = beat_layout(data_width)
    return {name: (field.offset, field.width) for name, field in layout}


def frame_to_beats(frame: bytes, data_width: int = 64) -> list[int]:
    """Pack ``frame`` into the integer payload values of its beats."""
    if not frame:
        raise ValueError("cannot send an empty frame")
    nbytes = data_width // 8
    off = _offsets(data_width)
    beats = []
    chunks = [frame[i:i + nbytes] for i in range(0, len(frame), nbytes)]
    for i, chunk in enumerate(chunks):
        value = int.from_bytes(chunk, "little") << off["data"][0]
        value |= ((1 << len(chunk)) - 1) << off["keep"][0]
        value |= int(i == 0) << off["first"][0]
        value |= int(i == len(chunks) - 1) << off["last"][0]
        beats.append(value)
    return beats


def beats_to_frame(beats: list[int], data_width: int = 64) -> bytes:
    """Inverse of :func:`frame_to_beats`; checks first/last and that keep is contiguous."""
    nbytes = data_width // 8
    off = _offsets(data_width)
    out = bytearray()
    for i, value in enumerate(beats):
        first = (value >> off["first"][0]) & 1
        last = (value >> off["last"][0]) & 1
        keep = (value >> off["keep"][0]) & ((1 << nbytes) - 1)
        if first != (i == 0) or last != (i == len(beats) - 1):
            raise ValueError(f"beat {i}: first={first} last={last} out of place")
        count = keep.bit_length()
        if keep != (1 << count) - 1 or (not last and count != nbytes):
            raise ValueError(f"beat {i}: keep {keep:#x} not contiguous from lane 0")
        data = (value >> off["data"][0]) & ((1 << data_width) - 1)
        out += data.to_bytes(nbytes, "little")[:count]
    return bytes(out)


def stream_port(dut, name: str) -> tuple:
    """The ``valid``, ``ready`` and ``payload`` handles of the stream port ``name`` of ``dut``
    (Amaranth's Verilog names them ``<name>__valid``, ``<name>__ready``, ``<name>__payload``)."""
    return tuple(getattr(dut, f"{name}__{part}") for part in ("valid", "ready", "payload"))


class FrameQueue:
    """Queues frames for a transmitting coroutine: ``send(frame)`` returns at once (it never
    blocks) and ``on_sent(frame, time_ns)`` is called once the frame has left.

    Subclasses put one frame on their bus in ``_transmit(frame)``.
    """

    def __init__(self, on_sent: Callable[[bytes, int], None] | None = None):
        self.on_sent = on_sent
        self.queue: collections.deque[bytes] = collections.deque()
        self._busy = False
        self._wake = Event()
        self._task = cocotb.start_soon(self._run())

    def send(self, frame: bytes) -> None:
        self.queue.append(bytes(frame))
        self._wake.set()

    @property
    def idle(self) -> bool:
        """No frame queued or on the bus."""
        return not self.queue and not self._busy

    async def _transmit(self, frame: bytes) -> None:
        raise NotImplementedError

    async def _woken(self) -> None:
        """Waits after the queue has gone from empty to not empty."""

    async def _after(self) -> None:
        """Waits between frames (the inter-frame gap), after ``on_sent``."""

    async def _run(self) -> None:
        while True:
            if not self.queue:
                self._wake.clear()
                await self._wake.wait()
                await self._woken()
            frame = self.queue.popleft()
            self._busy = True
            await self._transmit(frame)
            self._busy = False
            if self.on_sent is not None:
                self.on_sent(frame, cocotb.utils.get_sim_time("ns"))
            await self._after()


class PacketSource(FrameQueue):
    """Drives frames into a stream sink port (``<name>__valid/ready/payload``).

    ``send(frame)`` queues a frame and returns at once (it never blocks); the driver coroutine
    puts it on the bus at the next free cycle. ``on_sent(frame, time_ns)`` is called when the
    last beat has been accepted.
    """

    def __init__(self, dut, name: str, clock, *, data_width: int = 64, ifg_cycles: int = 3,
                 on_sent: Callable[[bytes, int], None] | None = None):
        self.valid, self.ready, self.payload = stream_port(dut, name)
        self.clock = clock
        self.data_width = data_width
        self.ifg_cycles = ifg_cycles
        self.valid.value = 0
        super().__init__(on_sent)

    async def _woken(self) -> None:
        await RisingEdge(self.clock)

    async def _transmit(self, frame: bytes) -> None:
        for beat in frame_to_beats(frame, self.data_width):
            self.payload.value = beat
            self.valid.value = 1
            # Values read right after the edge are those the design saw at the edge: the
            # beat was transferred on this edge iff ready was high.
            while True:
                await RisingEdge(self.clock)
                if int(self.ready.value):
                    break
        self.valid.value = 0

    async def _after(self) -> None:
        for _ in range(self.ifg_cycles):
            await RisingEdge(self.clock)


class PacketSink:
    """Collects frames from a stream source port, ``ready`` held high (a MAC at line rate).

    ``on_frame(frame, time_ns)`` is called for every complete frame, at the cycle its last beat
    is accepted.
    """

    def __init__(self, dut, name: str, clock, *, data_width: int = 64,
                 on_frame: Callable[[bytes, int], None] | None = None):
        self.valid, self.ready, self.payload = stream_port(dut, name)
        self.clock = clock
        self.data_width = data_width
        self.on_frame = on_frame
        self.ready.value = 1
        self._task = cocotb.start_soon(self._run())

    async def _run(self) -> None:
        beats: list[int] = []
        last_bit = _offsets(self.data_width)["last"][0]
        while True:
            await RisingEdge(self.clock)
            if int(self.valid.value) and int(self.ready.value):
                value = int(self.payload.value)
                beats.append(value)
                if (value >> last_bit) & 1:
                    frame = beats_to_frame(beats, self.data_width)
                    beats = []
                    if self.on_frame is not None:
                        self.on_frame(frame, cocotb.utils.get_sim_time("ns"))
