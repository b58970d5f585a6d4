"""The GPU RoCE endpoint: the dispatch kernel takes raw RoCEv2 request frames and writes the
complete response frames, so that no Python runs per request.

:class:`GPUFramePlane` is a :class:`~openqlink.gpu.GPUDataPlane` whose transport bridge is
``roce_frame_bridge.cu``: the kernel checks each UC RDMA_WRITE_ONLY_WITH_IMMEDIATE request frame
as the host's :class:`~openqlink.roce.UCQueuePair` does (``roce_frames.cuh``: Ethernet, IPv4
with its checksum, UDP port 4791 and checksum, ICRC computed on the GPU, opcode, TVer, P_Key,
DestQP, the peer's MAC and IP, R_Key, VA, DMA length, slot), hands the RPC request to the
handler, and builds the UC SEND_ONLY response frame (IPv4 checksum, the QP's next TX PSN, the
QSC's QPN, ICRC). A dropped frame is counted by reason (:data:`COUNTER_NAMES`, the names of
``UCQueuePair.counters``) and never reaches a handler.

Memory (:class:`FrameRings`, one mapped pinned allocation; offsets in bytes)::

    0      control   shutdown_flag i32 @0, processed u64 @8, rx_consumed u64 @16 (kernel),
                     tx_taken u64 @24 (host), PSN state @64 (tx_psn u32, rx_epsn u32),
                     counters @72 (18 x u64), last_frame_ns u64 @216
    256    rx ring   num_frames slots x rx_stride   (request frames, host -> GPU)
    ...    tx ring   num_frames slots x tx_stride   (response frames, GPU -> host), 128-aligned

A slot is ``[seq: u64][length: u32][reserved][frame]`` with the frame at byte 14 (rx) or 18
(tx), so that the RPC request and response inside start 8 mod 16 (``roce_frame_bridge.cu``).
Frame ``k`` (1, 2, ...) of a ring is in slot ``(k - 1) % num_frames``; the writer stores the
length and the frame, then ``k`` in the sequence word. The host posts request frame ``k`` only
while ``k - 1 - rx_consumed < num_frames`` (:meth:`FrameRings.push` returns ``False`` when the
ring is full: back-pressure); the kernel writes response frame ``j`` only while
``j - 1 - tx_taken < num_frames`` and waits otherwise, so the host must keep popping.

PSN hand-over: the QP's PSNs live in the control block while the kernel runs. :meth:`start`
takes ``qp.tx_psn`` and ``qp.rx_epsn`` from the host's :class:`~openqlink.roce.UCQueuePair` of
the QP, :meth:`stop` gives the kernel's back to it: the host may send its own packets on the QP
(RDMA WRITEs: uploads, envelopes) before and after a run, not during one.

Steering: :meth:`GPUFramePlane.wants` tells the frames the kernel serves (RoCEv2 to the host's
QPN, opcode RDMA_WRITE_ONLY_WITH_IMMEDIATE, within a slot's capacity); every other frame stays
with the host's normal path (``QSC.handle_frame``).

# Ref: IBTA Vol 1 Release 1.4 9.2-9.8, 7.8.1, Annex A17.4 (frames: roce_frames.cuh);
# cuda-quantum realtime's gpu_roce transport (a GPU-resident RoCE endpoint; here without a
# NIC-specific library: the rings are plain mapped pinned memory);
# realtime/include/cudaq/realtime/daemon/dispatcher/unified_device_transport.cuh (hooks)
"""

from __future__ import annotations

import ctypes
import struct
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..dispatch import DispatchMode, FunctionEntry
from ..errors import DispatchError, GPUError
from ..roce import PMTU_VALUES, RX_COUNTER_NAMES, UCQueuePair
from ..wire.ethernet import mac_to_int
from ..wire.ipv4 import ip_to_int
from ..wire.packet import DEFAULT_ROCE_SRC_PORT
from ..wire.roce import DEFAULT_P_KEY, Opcode
from .dataplane import GPUDataPlane
from .loopback import HostMemory, RingMemory, check_host_order
from .program import FRAME_BRIDGE, DispatchKernel, TransportBridge
from .toolchain import LinkCache

__all__ = ["FrameEndpointConfig", "FrameRings", "GPUFramePlane", "COUNTER_NAMES",
           "CTX_BYTES", "CONTROL_BYTES", "RX_FRAME_AT", "TX_FRAME_AT", "request_frame_bytes",
           "response_frame_bytes"]

#: The counters of the endpoint, in the kernel's order: ``UCQueuePair.counters``' names.
COUNTER_NAMES = RX_COUNTER_NAMES
#: Size of ``qlink_frame_ctx`` (the 64-byte endpoint, five pointers, six u32).
CTX_BYTES = 128
#: The control block before the rings.
CONTROL_BYTES = 256
#: Where a frame starts in an rx / tx slot (after the sequence word and the length).
RX_FRAME_AT = 14
TX_FRAME_AT = 18
SEQ_BYTES = 8
_PSN_AT = 64
_COUNTERS_AT = 72
_LAST_NS_AT = _COUNTERS_AT + 8 * len(COUNTER_NAMES)   # 216
#: Ethernet + IPv4 + UDP + BTH + RETH + ImmDt, then pad (<= 3) and ICRC: a request frame's
#: bytes around its RPC request.
_REQUEST_OVERHEAD = 14 + 20 + 8 + 12 + 16 + 4 + 3 + 4
_MIN_FRAME = 60
_ROCE_PORT = (4791).to_bytes(2, "big")


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def request_frame_bytes(slot_size: int) -> int:
    """The largest request frame the endpoint takes for ``slot_size``-byte request slots."""
    return max(_MIN_FRAME, _REQUEST_OVERHEAD + slot_size)


def response_frame_bytes(slot_size: int) -> int:
    """The largest response frame (a SEND_ONLY of at most ``slot_size`` payload bytes)."""
    return max(_MIN_FRAME, 54 + _align(slot_size, 4) + 4)


@dataclass(frozen=True)
class FrameEndpointConfig:
    """The QP contract the GPU endpoint serves (``qlink_roce_endpoint``, 64 bytes).

    ``host_mac``/``host_ip``: this host (the requests' destination, the responses' source);
    ``qsc_mac``/``qsc_ip``: the QSC (peer); ``host_qpn``/``qsc_qpn`` (24 bits): the DestQP
    accepted / sent; ``ring_rkey`` (32 bits) and ``ring_va`` (64 bits): the request ring's R_Key
    and the VA of its slot 0; ``num_slots`` (1..4096, ImmDt[11:0]) x ``slot_size`` bytes;
    ``pmtu_bytes``; ``p_key`` (16 bits) and ``udp_src_port`` of the responses.
    """

    host_mac: int
    host_ip: int
    qsc_mac: int
    qsc_ip: int
    host_qpn: int
    qsc_qpn: int
    ring_rkey: int
    num_slots: int
    slot_size: int
    ring_va: int = 0
    pmtu_bytes: int = 1024
    p_key: int = DEFAULT_P_KEY
    udp_src_port: int = DEFAULT_ROCE_SRC_PORT

    def __post_init__(self) -> None:
        for name, bits in (("host_mac", 48), ("qsc_mac", 48), ("host_ip", 32), ("qsc_ip", 32),
                           ("host_qpn", 24), ("qsc_qpn", 24), ("ring_rkey", 32),
                           ("ring_va", 64), ("p_key", 16), ("udp_src_port", 16)):
            value = getattr(self, name)
            if not 0 <= value < 1 << bits:
                raise DispatchError(f"{name} {value:#x} does not fit in {bits} bits")
        if not 1 <= self.num_slots <= 4096:
            raise DispatchError(f"num_slots must be 1..4096, not {self.num_slots}")
        if self.slot_size < 24:
            raise DispatchError(f"slot_size must be at least 24 bytes, not {self.slot_size}")
        if self.pmtu_bytes not in PMTU_VALUES:
            raise DispatchError(f"pmtu_bytes must be one of {PMTU_VALUES}, not "
                                f"{self.pmtu_bytes}")

    @classmethod
    def from_qp(cls, qp: UCQueuePair, *, num_slots: int, slot_size: int, ring_rkey: int,
                ring_va: int = 0) -> FrameEndpointConfig:
        """The contract of the host's QP ``qp`` (addresses, QPNs, P_Key, PMTU, UDP source port)
        with the request ring it registered (``register_ring(ring, ring_rkey, ring_va)``)."""
        return cls(host_mac=qp.local_mac, host_ip=qp.local_ip, qsc_mac=qp.remote_mac,
                   qsc_ip=qp.remote_ip, host_qpn=qp.qpn, qsc_qpn=qp.remote_qpn,
                   ring_rkey=ring_rkey, num_slots=num_slots, slot_size=slot_size,
                   ring_va=ring_va, pmtu_bytes=qp.pmtu_bytes, p_key=qp.p_key,
                   udp_src_port=qp.udp_src_port)

    @classmethod
    def of(cls, *, host_mac: str | bytes | int, host_ip: str | int, qsc_mac: str | bytes | int,
           qsc_ip: str | int, **rest: Any) -> FrameEndpointConfig:
        """Like the constructor, with MACs as ``"aa:bb:..."``/bytes and IPs dotted."""
        return cls(host_mac=mac_to_int(host_mac), host_ip=ip_to_int(host_ip),
                   qsc_mac=mac_to_int(qsc_mac), qsc_ip=ip_to_int(qsc_ip), **rest)

    def pack(self) -> bytes:
        """The 64-byte ``qlink_roce_endpoint`` (little-endian, as the GPU reads it)."""
        return struct.pack("<QQQIIIIIIIIHHI", self.host_mac, self.qsc_mac, self.ring_va,
                           self.host_ip, self.qsc_ip, self.host_qpn, self.qsc_qpn,
                           self.ring_rkey, self.num_slots, self.slot_size, self.pmtu_bytes,
                           self.p_key, self.udp_src_port, 0)


class FrameRings:
    """The request and response frame rings of ``num_frames`` slots over ``memory`` (see the
    module docstring for the layout), and the host's side of their flow control.

    Raises :class:`DispatchError` for ``num_frames`` outside 1..4096 or ``memory`` smaller than
    :meth:`size_for`; :class:`~openqlink.errors.HostOrderError` for memory a GPU reads on a host
    that is not x86 (the host's stores must be seen in program order).
    """

    def __init__(self, memory: RingMemory, num_frames: int, slot_size: int):
        if not 1 <= num_frames <= 4096:
            raise DispatchError(f"num_frames must be 1..4096, not {num_frames}")
        if not isinstance(memory, HostMemory):
            check_host_order()
        need = self.size_for(num_frames, slot_size)
        if memory.size_bytes < need:
            raise DispatchError(f"frame ring memory of {memory.size_bytes} bytes, {need} needed")
        self.memory = memory
        self.num_frames = num_frames
        self.slot_size = slot_size
        self.rx_frame_bytes = request_frame_bytes(slot_size)
        self.tx_frame_bytes = response_frame_bytes(slot_size)
        self.rx_stride, self.tx_stride, self.rx_offset, self.tx_offset = self._geometry(
            num_frames, slot_size)
        base = memory.host_ptr
        self._base = base
        self._shutdown = ctypes.c_int32.from_address(base)
        self._processed = ctypes.c_uint64.from_address(base + 8)
        self._rx_consumed = ctypes.c_uint64.from_address(base + 16)
        self._tx_taken = ctypes.c_uint64.from_address(base + 24)
        self._psn = (ctypes.c_uint32 * 2).from_address(base + _PSN_AT)
        self._counters = (ctypes.c_uint64 * len(COUNTER_NAMES)).from_address(base + _COUNTERS_AT)
        self._last_ns = ctypes.c_uint64.from_address(base + _LAST_NS_AT)
        self.next_rx_seq = 1   # the next request frame's sequence number
        self.next_tx_seq = 1   # the next response frame's

    @staticmethod
    def _geometry(num_frames: int, slot_size: int) -> tuple[int, int, int, int]:
        rx_stride = _align(RX_FRAME_AT + request_frame_bytes(slot_size), 64)
        tx_stride = _align(TX_FRAME_AT + response_frame_bytes(slot_size), 64)
        rx_offset = CONTROL_BYTES
        tx_offset = _align(rx_offset + num_frames * rx_stride, 128)
        return rx_stride, tx_stride, rx_offset, tx_offset

    @classmethod
    def size_for(cls, num_frames: int, slot_size: int) -> int:
        """Bytes of memory the rings need."""
        _rx, tx_stride, _ro, tx_offset = cls._geometry(num_frames, slot_size)
        return tx_offset + num_frames * tx_stride

    # ---- device side ----
    @property
    def shutdown_device_ptr(self) -> int:
        return self.memory.device_ptr

    @property
    def processed_device_ptr(self) -> int:
        return self.memory.device_ptr + 8

    def ctx_bytes(self, config: FrameEndpointConfig, rx_stage_ptr: int,
                  tx_stage_ptr: int) -> bytes:
        """The 128-byte ``qlink_frame_ctx``: the endpoint, the rings' and the control block's
        device addresses, the staging buffers (``rx_stride`` / ``tx_stride`` bytes of device
        memory, used when a slot is too large for shared memory) and the geometry."""
        dev = self.memory.device_ptr
        return config.pack() + struct.pack(
            "<QQQQQIIIIII", dev + self.rx_offset, dev + self.tx_offset, dev, rx_stage_ptr,
            tx_stage_ptr, self.num_frames, self.rx_stride, self.tx_stride, self.rx_frame_bytes,
            self.tx_frame_bytes, 0)

    # ---- control ----
    @property
    def shutdown(self) -> bool:
        return self._shutdown.value != 0

    @shutdown.setter
    def shutdown(self, value: bool) -> None:
        self._shutdown.value = 1 if value else 0

    @property
    def processed(self) -> int:
        """Requests the dispatch kernel has answered."""
        return int(self._processed.value)

    @property
    def rx_consumed(self) -> int:
        """Request frames the kernel has taken (checked or being checked)."""
        return int(self._rx_consumed.value)

    @property
    def last_frame_ns(self) -> int:
        """The last frame's time in the kernel, ns (``%globaltimer``): from its sequence word
        seen to its response frame published (or its drop decided), stored after the
        response."""
        return int(self._last_ns.value)

    @property
    def psn(self) -> tuple[int, int]:
        """``(tx_psn, rx_epsn)`` as the kernel last stored them (24 bits each)."""
        return int(self._psn[0]), int(self._psn[1])

    @psn.setter
    def psn(self, value: tuple[int, int]) -> None:
        self._psn[0], self._psn[1] = (v & 0xFFFFFF for v in value)

    def counters(self) -> dict[str, int]:
        """The endpoint's counters (:data:`COUNTER_NAMES`) as the kernel last stored them."""
        return dict(zip(COUNTER_NAMES, (int(c) for c in self._counters), strict=True))

    def reset(self) -> None:
        """Forget both rings' positions (before a new kernel, which counts from 1 again):
        every sequence word, rx_consumed, tx_taken and the shutdown flag to zero. The PSN
        state and the counters are kept."""
        for k in range(self.num_frames):
            ctypes.c_uint64.from_address(self._rx_slot(k)).value = 0
            ctypes.c_uint64.from_address(self._tx_slot(k)).value = 0
        self._rx_consumed.value = 0
        self._tx_taken.value = 0
        self._processed.value = 0
        self._shutdown.value = 0
        self.next_rx_seq = self.next_tx_seq = 1

    def _rx_slot(self, k: int) -> int:
        return self._base + self.rx_offset + k * self.rx_stride

    def _tx_slot(self, k: int) -> int:
        return self._base + self.tx_offset + k * self.tx_stride

    # ---- frames ----
    def can_push(self) -> bool:
        """True when the next request slot is free (the kernel has taken what was there)."""
        return self.next_rx_seq - 1 - self.rx_consumed < self.num_frames

    def push(self, frame: bytes | bytearray | memoryview) -> bool:
        """Post one request frame; ``False`` (nothing posted) when the ring is full. Raises
        :class:`DispatchError` for a frame longer than :attr:`rx_frame_bytes` (it cannot be a
        request for this ring: give it to the host's QP) or an empty one."""
        n = len(frame)
        if not 0 < n <= self.rx_frame_bytes:
            raise DispatchError(f"a request frame of {n} bytes does not fit a frame slot "
                                f"(1..{self.rx_frame_bytes} bytes)")
        if not self.can_push():
            return False
        seq = self.next_rx_seq
        addr = self._rx_slot((seq - 1) % self.num_frames)
        ctypes.c_uint32.from_address(addr + 8).value = n
        ctypes.memmove(addr + RX_FRAME_AT, bytes(frame), n)
        ctypes.c_uint64.from_address(addr).value = seq  # last (x86-64: stores in order)
        self.next_rx_seq = seq + 1
        return True

    def pop(self) -> bytes | None:
        """The next response frame, or ``None`` when the kernel has not published it yet
        (never blocks); its slot is handed back to the kernel (tx_taken)."""
        seq = self.next_tx_seq
        addr = self._tx_slot((seq - 1) % self.num_frames)
        if ctypes.c_uint64.from_address(addr).value != seq:
            return None
        n = min(ctypes.c_uint32.from_address(addr + 8).value, self.tx_frame_bytes)
        frame = ctypes.string_at(addr + TX_FRAME_AT, n)
        self._tx_taken.value = seq
        self.next_tx_seq = seq + 1
        return frame


class GPUFramePlane(GPUDataPlane):
    """The GPU data plane as a RoCE endpoint: the dispatch kernel linked with the frame bridge.

    Parameters
    ----------
    config : FrameEndpointConfig
        The QP contract (:meth:`FrameEndpointConfig.from_qp` for the host's QP).
    num_frames : int, optional
        Slots per frame ring (default ``config.num_slots``).
    device, arch, kernel, inline_handlers, cache, timing_capacity
        As :class:`~openqlink.gpu.GPUDataPlane`.
    bridge : TransportBridge, optional
        Default :data:`~openqlink.gpu.program.FRAME_BRIDGE` (other compile-time options).

    Only DEVICE_CALL entries are served: the kernel answers every request frame itself, so a
    HOST_CALL entry cannot be (:meth:`start` refuses it, naming it). :meth:`submit` and
    :meth:`poll_response` of the loopback plane do not exist here: frames go in with
    :meth:`push_frame` and come out with :meth:`pop_frame`.
    """

    def __init__(self, config: FrameEndpointConfig, *, num_frames: int | None = None,
                 device: int = 0, arch: str | None = None, kernel: DispatchKernel | None = None,
                 inline_handlers: bool = True, cache: LinkCache | bool = True,
                 timing_capacity: int = 0, bridge: TransportBridge | None = None):
        slot_size = _align(max(config.slot_size, 32), 16)
        super().__init__(num_slots=config.num_slots, slot_size=slot_size, device=device,
                         arch=arch, kernel=kernel, inline_handlers=inline_handlers,
                         cache=cache, timing_capacity=timing_capacity,
                         bridge=bridge if bridge is not None else FRAME_BRIDGE)
        self.config = config
        self.num_frames = config.num_slots if num_frames is None else num_frames
        if not 1 <= self.num_frames <= 4096:
            raise DispatchError(f"num_frames must be 1..4096, not {self.num_frames}")
        # The request's own bound: a request fills at most one slot of the QSC's ring.
        self.max_result_len = config.slot_size - 24
        self.frames: FrameRings | None = None
        self._qp: UCQueuePair | None = None
        self._backlog: deque[bytes] = deque()
        self._final_counters: dict[str, int] = dict.fromkeys(COUNTER_NAMES, 0)
        self._final_psn = (0, 0)
        self._start_psn = (0, 0)

    # ---- steering ----
    def wants(self, frame: bytes | bytearray | memoryview) -> bool:
        """True for a frame the kernel serves: RoCEv2 (IPv4 without options, UDP port 4791) to
        the host's QPN, opcode RDMA_WRITE_ONLY_WITH_IMMEDIATE, no longer than a request frame
        slot. Read at fixed offsets, as ``QSC.handle_frame`` steers; the kernel checks the rest.
        Every other frame belongs to the host's own path."""
        return (54 <= len(frame) <= request_frame_bytes(self.config.slot_size)
                and frame[12:14] == b"\x08\x00" and frame[14] == 0x45 and frame[23] == 17
                and frame[36:38] == _ROCE_PORT
                and frame[42] == Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE
                and int.from_bytes(frame[47:50], "big") == self.config.host_qpn)

    # ---- start / stop ----
    def start(self, entries: Iterable[FunctionEntry] | None = None, *,
              max_result_bytes: int | None = None, qp: UCQueuePair | None = None,
              psn: tuple[int, int] | None = None) -> None:
        """Link, allocate the frame rings, hand the QP's PSNs over and launch the kernel.

        ``entries``: the function table (a :class:`~openqlink.dispatch.FunctionTable`'s
        entries, or any iterable); a HOST_CALL entry raises :class:`DispatchError` naming it
        (the kernel answers every request frame; no host handler can run in this mode).
        ``qp``: the host's UCQueuePair of the QP, whose ``tx_psn`` and ``rx_epsn`` the kernel
        continues from and :meth:`stop` gives back (:meth:`UCQueuePair.lend_psns`: until then
        a send on ``qp`` raises, as it would reuse the kernel's PSNs: send a program's trigger
        before the start); or ``psn=(tx_psn, rx_epsn)``; default
        the PSNs the last run ended with (0, 0 at first). ``max_result_bytes`` caps a
        handler's result (default ``slot_size - 24``). Raises as
        :meth:`GPUDataPlane.start`.
        """
        if self.running:     # before anything is lent or changed
            raise DispatchError("the GPU data plane is already running")
        items = list(entries) if entries is not None else None
        if items is not None:
            host = [e for e in items if e.mode == DispatchMode.HOST_CALL]
            if host:
                names = ", ".join(repr(e.name) for e in host)
                raise DispatchError(f"HOST_CALL {names} cannot be served by the GPU RoCE "
                                    "endpoint: the kernel answers every request frame itself; "
                                    "make it a DEVICE_CALL or serve this QP on the host")
        if qp is not None and psn is not None:
            raise DispatchError("give qp or psn, not both")
        if qp is not None:
            if qp.qpn != self.config.host_qpn or qp.remote_qpn != self.config.qsc_qpn:
                raise DispatchError(f"QP {qp.qpn:#x} -> {qp.remote_qpn:#x} is not the "
                                    f"endpoint's ({self.config.host_qpn:#x} -> "
                                    f"{self.config.qsc_qpn:#x})")
            psn = qp.lend_psns("the GPU RoCE endpoint")
        self._start_psn = psn if psn is not None else self._final_psn
        self._backlog.clear()
        cap = self.config.slot_size - 24
        try:
            super().start(items, max_result_bytes=cap if max_result_bytes is None
                          else min(cap, max_result_bytes))
        except BaseException:
            if qp is not None:
                qp.take_back_psns(*psn)
            raise
        self._qp = qp

    def _make_transport(self) -> tuple[int, int, int]:
        dev = self.device
        self._pinned = dev.alloc_pinned(FrameRings.size_for(self.num_frames,
                                                            self.config.slot_size))
        frames = FrameRings(self._pinned, self.num_frames, self.config.slot_size)
        ctypes.memset(self._pinned.host_ptr, 0, CONTROL_BYTES)
        frames.reset()
        frames.psn = self._start_psn
        for i, name in enumerate(COUNTER_NAMES):
            frames._counters[i] = self._final_counters[name]
        self.frames = frames
        rx_stage = self._dev_alloc(frames.rx_stride)
        tx_stage = self._dev_alloc(frames.tx_stride)
        ctx = self._dev_alloc(CTX_BYTES)
        ctx.upload(frames.ctx_bytes(self.config, rx_stage.ptr, tx_stage.ptr))
        return ctx.ptr, frames.shutdown_device_ptr, frames.processed_device_ptr

    def stop(self, timeout_s: float = 10.0) -> int:
        """Set the shutdown flag and wait for the kernel to exit, keeping the response frames
        it publishes meanwhile (:meth:`pop_frame` returns them); then give the PSNs back to
        the QP given to :meth:`start`. Every request frame pushed before the call is checked
        and, when accepted, answered. Returns the processed count. Raises :class:`GPUError`
        when the kernel has not exited after ``timeout_s`` (the QP's PSNs stay with it: it may
        still send) or faulted (the QP gets back the PSNs the kernel stored last)."""
        frames = self.frames
        if self._stream is None or frames is None:
            return self._final_processed
        frames.shutdown = True
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                finished = self._stream.done()
            except GPUError:
                # The kernel faulted: it sends nothing more, so the QP continues from the PSNs
                # it stored last (a kernel that did not stop in time keeps them: it may send).
                if self._qp is not None:
                    self._qp.take_back_psns(*frames.psn)
                    self._qp = None
                raise
            if finished:
                break
            while (f := frames.pop()) is not None:
                self._backlog.append(f)
            if time.monotonic() > deadline:
                raise GPUError(f"the dispatch kernel did not stop within {timeout_s} s")
            time.sleep(1e-4)
        while (f := frames.pop()) is not None:
            self._backlog.append(f)
        self._final_processed = frames.processed
        self._final_counters = frames.counters()
        self._final_psn = frames.psn
        self._stream.destroy()
        self._stream = None
        if self._qp is not None:
            self._qp.take_back_psns(*self._final_psn)
            self._qp = None
        return self._final_processed

    def _free_buffers(self) -> None:
        self.frames = None
        super()._free_buffers()

    # ---- frames ----
    @property
    def processed(self) -> int:
        return self.frames.processed if self.frames is not None else self._final_processed

    @property
    def outstanding(self) -> int:
        return 0

    def push_frame(self, frame: bytes | bytearray | memoryview) -> bool:
        """Post one request frame into the rx ring; ``False`` when the ring is full (push it
        again after the kernel has taken some). Raises :class:`DispatchError` when not
        running, or for a frame longer than a slot (:meth:`wants` is false for it)."""
        if self.frames is None or self._stream is None:
            raise DispatchError("the GPU frame plane is not running: start() it first")
        return self.frames.push(frame)

    def pop_frame(self) -> bytes | None:
        """The next response frame (a complete UC SEND_ONLY, no FCS), or ``None``; also after
        :meth:`stop`."""
        if self._backlog:
            return self._backlog.popleft()
        return self.frames.pop() if self.frames is not None else None

    def counters(self) -> dict[str, int]:
        """The endpoint's counters by :data:`COUNTER_NAMES` (live while running): frames,
        accepted, published, sent, and each drop reason."""
        return self.frames.counters() if self.frames is not None else dict(self._final_counters)

    @property
    def psn(self) -> tuple[int, int]:
        """``(tx_psn, rx_epsn)``: the kernel's while running, the last run's after it."""
        return self.frames.psn if self.frames is not None else self._final_psn

    def can_submit(self) -> bool:
        raise DispatchError("the GPU frame plane takes frames: push_frame()")

    def submit(self, request: bytes) -> int:
        raise DispatchError("the GPU frame plane takes frames: push_frame()")

    def poll_response(self) -> tuple[int, bytes] | None:
        raise DispatchError("the GPU frame plane returns frames: pop_frame()")
