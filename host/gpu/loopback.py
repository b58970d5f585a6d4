"""The host side of the GPU loopback bridge: request/response rings in mapped pinned memory.

One allocation (``cuMemHostAlloc(DEVICEMAP)``, or plain host memory for tests without a GPU),
laid out as (offsets in bytes)::

    0                 control: shutdown_flag (i32 at 0), processed (u64 at 8)
    128               rx_data  num_slots x stride   (requests)
    ...               tx_data  num_slots x stride   (responses), 128-byte aligned

``stride`` is ``8 + slot_size`` rounded up to 64 bytes, and every slot is
``[seq: u64][message]``: an 8-byte sequence word, then the RPC message (RPCHeader + arguments,
or RPCResponse + result; at most ``slot_size`` bytes). The word and the first 56 message bytes
share the slot's first 64-byte line, which the kernel reads in one PCIe read
(``loopback_bridge.cu``).

Sequence protocol, both sides in strict ring order from slot 0: request ``k`` (1, 2, ... since
the ring was made; the kernel counts from its start) goes into slot ``(k - 1) % num_slots``: the
host writes the message, then stores ``k`` in the slot's sequence word; the kernel waits for
``k`` there, answers into the same response slot, fences (``__threadfence_system``) and stores
``k`` in the response slot's word; the host waits for ``k`` there and reads the response. No one
clears a word (a slot's older value never equals the awaited one); a slot takes a new request
once its previous response has been read. The host's stores rely on x86-64 ordering (TSO;
CPython does not reorder them): the word is stored after the message. On a weakly ordered CPU
(aarch64, as on GH200/GB200) a release fence would be needed between them, which CPython's
stores cannot give: :func:`check_host_order` refuses such a host
(:class:`~openqlink.errors.HostOrderError`), and a ring over memory the GPU reads (anything but
:class:`HostMemory`) is only made on an x86 host.

# Ref: cuda-quantum realtime/include/cudaq/realtime/cudaq_realtime.h (cudaq_ringbuffer_t,
# cudaq_host_ringbuffer_write_rpc_request / signal_slot / poll_tx_flag / clear_slot: the same
# steps, with sequence words in the slots instead of separate address flags)
"""

from __future__ import annotations

import ctypes
import platform
import struct
from typing import Protocol

from ..errors import DispatchError, HostOrderError
from ..wire.rpc import HEADER_BYTES

__all__ = ["RingMemory", "HostMemory", "LoopbackRing", "MAX_SLOTS", "CTX_BYTES", "SEQ_BYTES",
           "slot_stride", "check_host_order", "TSO_MACHINES"]

#: At most 4096 slots (the slot index travels in ImmDt[11:0]).
MAX_SLOTS = 4096
#: Size of ``qlink_loopback_ctx`` (five pointers, four u32).
CTX_BYTES = 56
#: The sequence word at the start of every slot.
SEQ_BYTES = 8


#: ``platform.machine()`` names (lower case) of CPUs whose stores other agents see in program
#: order (x86 TSO): the hosts the ring's plain stores are correct on.
TSO_MACHINES = frozenset({"x86_64", "amd64", "x86", "i386", "i486", "i586", "i686"})


def check_host_order() -> None:
    """Refuse a host CPU whose stores the GPU may see out of program order.

    The ring's host side stores a request's bytes, then its sequence word, with plain stores and
    no fence; only a TSO CPU (x86-64) keeps them in that order for the GPU. Raises
    :class:`~openqlink.errors.HostOrderError` naming the machine on any other
    (``platform.machine()`` ``aarch64``/``arm64`` on GH200/GB200, ``ppc64le``, ``riscv64``).
    """
    machine = platform.machine()
    if machine.lower() not in TSO_MACHINES:
        raise HostOrderError(machine)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def slot_stride(slot_size: int) -> int:
    """Bytes a slot of ``slot_size`` message bytes takes in a ring: the sequence word and the
    message, rounded up to a whole number of 64-byte lines."""
    return _align(SEQ_BYTES + slot_size, 64)


class RingMemory(Protocol):
    """Memory the ring lives in: host address, the address the kernel uses, size."""

    host_ptr: int
    device_ptr: int
    size_bytes: int


class HostMemory:
    """Plain (ctypes) host memory standing in for pinned memory where no GPU is used: the
    "device" address is the host address. 128-byte aligned, zeroed. For tests and models of
    the kernel."""

    def __init__(self, size_bytes: int):
        self._buf = ctypes.create_string_buffer(size_bytes + 128)
        self.size_bytes = size_bytes
        self.host_ptr = self.device_ptr = _align(ctypes.addressof(self._buf), 128)


class LoopbackRing:
    """The request and response rings of ``num_slots`` slots (``slot_size`` message bytes
    each) over ``memory``.

    :meth:`submit` / :meth:`poll_response` keep the strict ring order (at most ``num_slots``
    requests outstanding); :meth:`post`, :meth:`response_ready`, :meth:`read_response` and
    :meth:`release` are the per-slot steps under them.

    Raises :class:`DispatchError` for ``num_slots`` outside 1..4096, ``slot_size`` not a
    multiple of 16 or below 32, or ``memory`` smaller than :meth:`size_for`;
    :class:`~openqlink.errors.HostOrderError` (:func:`check_host_order`) for memory a GPU reads
    (anything but :class:`HostMemory`) on a host that is not x86.
    """

    CONTROL_BYTES = 128

    def __init__(self, memory: RingMemory, num_slots: int, slot_size: int):
        self.check_geometry(num_slots, slot_size)
        if not isinstance(memory, HostMemory):
            check_host_order()
        need = self.size_for(num_slots, slot_size)
        if memory.size_bytes < need:
            raise DispatchError(f"ring memory of {memory.size_bytes} bytes, {need} needed")
        self.memory = memory
        self.num_slots = num_slots
        self.slot_size = slot_size
        self.stride = slot_stride(slot_size)
        self.rx_data_offset, self.tx_data_offset = self._offsets(num_slots, slot_size)
        base = memory.host_ptr
        self._shutdown = ctypes.c_int32.from_address(base)
        self._processed = ctypes.c_uint64.from_address(base + 8)
        self._rx_host = base + self.rx_data_offset
        self._tx_host = base + self.tx_data_offset
        self._rx_dev = memory.device_ptr + self.rx_data_offset
        self._tx_dev = memory.device_ptr + self.tx_data_offset
        #: The sequence word of each request / response slot (``ctypes.c_uint64``).
        self.rx_seq = [ctypes.c_uint64.from_address(self._rx_host + s * self.stride)
                       for s in range(num_slots)]
        self.tx_seq = [ctypes.c_uint64.from_address(self._tx_host + s * self.stride)
                       for s in range(num_slots)]
        self._pending = [0] * num_slots  # sequence number posted in the slot, 0: free
        self.next_post = 0
        self.next_take = 0
        self.outstanding = 0
        self.next_seq = 1

    @staticmethod
    def check_geometry(num_slots: int, slot_size: int) -> None:
        if not 1 <= num_slots <= MAX_SLOTS:
            raise DispatchError(f"num_slots must be 1..{MAX_SLOTS}, not {num_slots}")
        if slot_size < 32 or slot_size % 16:
            raise DispatchError(f"slot_size must be a multiple of 16 bytes, at least 32, not "
                                f"{slot_size}")

    @classmethod
    def _offsets(cls, num_slots: int, slot_size: int) -> tuple[int, int]:
        rx_data = cls.CONTROL_BYTES
        tx_data = _align(rx_data + num_slots * slot_stride(slot_size), 128)
        return rx_data, tx_data

    @classmethod
    def size_for(cls, num_slots: int, slot_size: int) -> int:
        """Bytes of memory a ring of this geometry needs."""
        return cls._offsets(num_slots, slot_size)[1] + num_slots * slot_stride(slot_size)

    # ---- device-side addresses ----
    @property
    def shutdown_device_ptr(self) -> int:
        return self.memory.device_ptr

    @property
    def processed_device_ptr(self) -> int:
        return self.memory.device_ptr + 8

    def ctx_bytes(self, rx_stage_ptr: int, tx_stage_ptr: int, trace_ptr: int = 0,
                  trace_capacity: int = 0) -> bytes:
        """The 56-byte ``qlink_loopback_ctx`` for the kernel: the rings' device addresses, the
        request and response staging buffers (``stride`` bytes of device memory each, used for
        slots too large for shared memory), the optional trace buffer (8 u64 per request,
        ``trace_capacity`` requests) and the geometry."""
        return struct.pack("<QQQQQIIII", self._rx_dev, self._tx_dev, rx_stage_ptr, tx_stage_ptr,
                           trace_ptr, self.num_slots, self.slot_size, self.stride,
                           trace_capacity)

    def request_address(self, slot: int) -> int:
        """Device address of request slot ``slot`` (its sequence word; the message follows)."""
        return self._rx_dev + slot * self.stride

    def response_address(self, slot: int) -> int:
        """Device address of response slot ``slot`` (its sequence word; the message follows)."""
        return self._tx_dev + slot * self.stride

    def request_host_address(self, slot: int) -> int:
        """Host address of the request message in slot ``slot`` (after its sequence word)."""
        return self._rx_host + slot * self.stride + SEQ_BYTES

    def response_host_address(self, slot: int) -> int:
        """Host address of the response message in slot ``slot`` (after its sequence word)."""
        return self._tx_host + slot * self.stride + SEQ_BYTES

    # ---- control ----
    @property
    def shutdown(self) -> bool:
        return self._shutdown.value != 0

    @shutdown.setter
    def shutdown(self, value: bool) -> None:
        self._shutdown.value = 1 if value else 0

    @property
    def processed(self) -> int:
        """Requests the kernel has answered (it updates this after each response)."""
        return int(self._processed.value)

    # ---- per-slot steps ----
    def slot_free(self, slot: int) -> bool:
        """True when slot ``slot`` holds no request whose response is still unread."""
        return self._pending[slot] == 0

    def post(self, slot: int, request: bytes, seq: int) -> None:
        """Write ``request`` into slot ``slot``, then ``seq`` into its sequence word. Raises
        :class:`DispatchError` when it is longer than a slot, ``seq`` is not positive, or the
        slot is not free."""
        if len(request) > self.slot_size:
            raise DispatchError(f"request of {len(request)} bytes does not fit a "
                                f"{self.slot_size}-byte slot")
        if seq <= 0:
            raise DispatchError(f"sequence number must be positive, not {seq}")
        if not self.slot_free(slot):
            raise DispatchError(f"GPU ring slot {slot} is not free")
        ctypes.memmove(self.request_host_address(slot), request, len(request))
        self.rx_seq[slot].value = seq  # after the message (x86-64: stores in order)
        self._pending[slot] = seq

    def response_ready(self, slot: int) -> bool:
        """True when the response to the request pending in slot ``slot`` is there."""
        seq = self._pending[slot]
        return seq != 0 and self.tx_seq[slot].value == seq

    def read_response(self, slot: int) -> bytes:
        """The response in slot ``slot``: 24-byte header + result (``result_len``, bounded by
        the slot)."""
        addr = self.response_host_address(slot)
        result_len = ctypes.c_uint32.from_address(addr + 8).value
        return ctypes.string_at(addr, HEADER_BYTES + min(result_len,
                                                         self.slot_size - HEADER_BYTES))

    def release(self, slot: int) -> None:
        """Free slot ``slot`` (its response has been read)."""
        self._pending[slot] = 0

    # ---- strict ring order ----
    def can_submit(self) -> bool:
        """True when the next slot in ring order can take a request."""
        return self.outstanding < self.num_slots and self.slot_free(self.next_post)

    def submit(self, request: bytes) -> int:
        """Post ``request`` into the next slot in ring order with the next sequence number;
        returns the slot. Raises :class:`DispatchError` when the ring is full (check
        :meth:`can_submit`)."""
        if not self.can_submit():
            raise DispatchError(f"GPU ring full ({self.outstanding} of {self.num_slots} "
                                "requests outstanding)")
        slot = self.next_post
        self.post(slot, request, self.next_seq)
        self.next_seq += 1
        self.next_post = (slot + 1) % self.num_slots
        self.outstanding += 1
        return slot

    def poll_response(self) -> tuple[int, bytes] | None:
        """The next response in ring order as ``(slot, bytes)``, released; ``None`` when it is
        not there yet (never blocks)."""
        if self.outstanding == 0:
            return None
        slot = self.next_take
        if not self.response_ready(slot):
            return None
        data = self.read_response(slot)
        self.release(slot)
        self.next_take = (slot + 1) % self.num_slots
        self.outstanding -= 1
        return slot, data

    def reset_cursors(self) -> None:
        """Forget outstanding requests (after the kernel stopped; a new kernel counts from 1
        again) and clear every sequence word."""
        for s in range(self.num_slots):
            self.rx_seq[s].value = 0
            self.tx_seq[s].value = 0
        self._pending = [0] * self.num_slots
        self.next_post = self.next_take = self.outstanding = 0
        self.next_seq = 1
