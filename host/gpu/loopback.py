"""The host side of the GPU loopback bridge: request/response rings in mapped pinned memory.

One allocation (``cuMemHostAlloc(DEVICEMAP)``, or plain host memory for tests without a GPU),
laid out as (offsets in bytes, each region 64-byte aligned, the data rings 128-byte aligned)::

    0                 control: shutdown_flag (i32 at 0), processed (u64 at 8)
    64                rx_flags[num_slots]  u64
    ...               tx_flags[num_slots]  u64
    ...               rx_data  num_slots x slot_size   (requests: RPCHeader + arguments)
    ...               tx_data  num_slots x slot_size   (responses: RPCResponse + result)

Flag protocol (CUDA-Q's address-as-flag; 0 = empty), both sides in strict ring order from slot 0:
the host writes a request into ``rx_data[s]`` and then stores the slot's device address in
``rx_flags[s]``; the kernel (``loopback_bridge.cu``) copies the request, writes the response into
``tx_data[s]``, fences (``__threadfence_system``), stores the response slot's address in
``tx_flags[s]`` and clears ``rx_flags[s]``; the host reads the response and clears
``tx_flags[s]``. Slot ``s`` takes a new request when both flags are 0. The host's stores are
ordered (x86-64 TSO; CPython does not reorder them); on a weakly ordered CPU (Arm) a release
fence would be needed between the data and the flag (not provided here).

# Ref: cuda-quantum realtime/include/cudaq/realtime/cudaq_realtime.h (cudaq_ringbuffer_t,
# cudaq_host_ringbuffer_write_rpc_request / signal_slot / poll_tx_flag / clear_slot)
"""

from __future__ import annotations

import ctypes
import struct
from typing import Protocol

from ..errors import DispatchError
from ..wire.rpc import HEADER_BYTES

__all__ = ["RingMemory", "HostMemory", "LoopbackRing", "MAX_SLOTS", "CTX_BYTES"]

#: At most 4096 slots (the slot index travels in ImmDt[11:0]).
MAX_SLOTS = 4096
#: Size of ``qlink_loopback_ctx`` (seven pointers, four u32).
CTX_BYTES = 72


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class RingMemory(Protocol):
    """Memory the ring lives in: host address, the address the kernel uses, size."""

    host_ptr: int
    device_ptr: int
    size_bytes: int


class HostMemory:
    """Plain (ctypes) host memory standing in for pinned memory where no GPU is used: the
    "device" address is the host address. For tests and models of the kernel."""

    def __init__(self, size_bytes: int):
        self._buf = ctypes.create_string_buffer(size_bytes)
        self.size_bytes = size_bytes
        self.host_ptr = self.device_ptr = ctypes.addressof(self._buf)


class LoopbackRing:
    """The request and response rings of ``num_slots`` x ``slot_size`` bytes over ``memory``.

    :meth:`submit` / :meth:`poll_response` keep the strict ring order (at most ``num_slots``
    requests outstanding); :meth:`post`, :meth:`response_ready`, :meth:`read_response` and
    :meth:`release` are the per-slot steps under them.

    Raises :class:`DispatchError` for ``num_slots`` outside 1..4096, ``slot_size`` not a
    multiple of 16 or below 32, or ``memory`` smaller than :meth:`size_for`.
    """

    CONTROL_BYTES = 64

    def __init__(self, memory: RingMemory, num_slots: int, slot_size: int):
        self.check_geometry(num_slots, slot_size)
        need = self.size_for(num_slots, slot_size)
        if memory.size_bytes < need:
            raise DispatchError(f"ring memory of {memory.size_bytes} bytes, {need} needed")
        self.memory = memory
        self.num_slots = num_slots
        self.slot_size = slot_size
        self.rx_flags_offset, self.tx_flags_offset, self.rx_data_offset, self.tx_data_offset = \
            self._offsets(num_slots, slot_size)
        base = memory.host_ptr
        self._shutdown = ctypes.c_int32.from_address(base)
        self._processed = ctypes.c_uint64.from_address(base + 8)
        self.rx_flags = (ctypes.c_uint64 * num_slots).from_address(base + self.rx_flags_offset)
        self.tx_flags = (ctypes.c_uint64 * num_slots).from_address(base + self.tx_flags_offset)
        self._rx_host = base + self.rx_data_offset
        self._tx_host = base + self.tx_data_offset
        self._rx_dev = memory.device_ptr + self.rx_data_offset
        self._tx_dev = memory.device_ptr + self.tx_data_offset
        self.next_post = 0
        self.next_take = 0
        self.outstanding = 0

    @staticmethod
    def check_geometry(num_slots: int, slot_size: int) -> None:
        if not 1 <= num_slots <= MAX_SLOTS:
            raise DispatchError(f"num_slots must be 1..{MAX_SLOTS}, not {num_slots}")
        if slot_size < 32 or slot_size % 16:
            raise DispatchError(f"slot_size must be a multiple of 16 bytes, at least 32, not "
                                f"{slot_size}")

    @classmethod
    def _offsets(cls, num_slots: int, slot_size: int) -> tuple[int, int, int, int]:
        rx_flags = cls.CONTROL_BYTES
        tx_flags = rx_flags + _align(8 * num_slots, 64)
        rx_data = _align(tx_flags + 8 * num_slots, 128)
        tx_data = _align(rx_data + num_slots * slot_size, 128)
        return rx_flags, tx_flags, rx_data, tx_data

    @classmethod
    def size_for(cls, num_slots: int, slot_size: int) -> int:
        """Bytes of memory a ring of this geometry needs."""
        return cls._offsets(num_slots, slot_size)[3] + num_slots * slot_size

    # ---- device-side addresses ----
    @property
    def shutdown_device_ptr(self) -> int:
        return self.memory.device_ptr

    @property
    def processed_device_ptr(self) -> int:
        return self.memory.device_ptr + 8

    def ctx_bytes(self, rx_stage_ptr: int, tx_stage_ptr: int, trace_ptr: int = 0,
                  trace_capacity: int = 0) -> bytes:
        """The 72-byte ``qlink_loopback_ctx`` for the kernel: flag and data device addresses,
        the request and response staging buffers (``slot_size`` bytes of device memory each),
        the optional trace buffer (8 u64 per request, ``trace_capacity`` requests) and the
        geometry."""
        d = self.memory.device_ptr
        return struct.pack("<QQQQQQQIIII", d + self.rx_flags_offset, d + self.tx_flags_offset,
                           self._rx_dev, self._tx_dev, rx_stage_ptr, tx_stage_ptr, trace_ptr,
                           self.num_slots, self.slot_size, trace_capacity, 0)

    def request_address(self, slot: int) -> int:
        """Device address of request slot ``slot`` (the value of its rx flag)."""
        return self._rx_dev + slot * self.slot_size

    def response_address(self, slot: int) -> int:
        """Device address of response slot ``slot`` (the value the kernel puts in its tx flag)."""
        return self._tx_dev + slot * self.slot_size

    def request_host_address(self, slot: int) -> int:
        return self._rx_host + slot * self.slot_size

    def response_host_address(self, slot: int) -> int:
        return self._tx_host + slot * self.slot_size

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
        return self.rx_flags[slot] == 0 and self.tx_flags[slot] == 0

    def post(self, slot: int, request: bytes) -> None:
        """Write ``request`` into slot ``slot`` and set its rx flag. Raises
        :class:`DispatchError` when it is longer than a slot or the slot is not free."""
        if len(request) > self.slot_size:
            raise DispatchError(f"request of {len(request)} bytes does not fit a "
                                f"{self.slot_size}-byte slot")
        if not self.slot_free(slot):
            raise DispatchError(f"GPU ring slot {slot} is not free")
        ctypes.memmove(self._rx_host + slot * self.slot_size, request, len(request))
        self.rx_flags[slot] = self._rx_dev + slot * self.slot_size

    def response_ready(self, slot: int) -> bool:
        return self.tx_flags[slot] != 0

    def read_response(self, slot: int) -> bytes:
        """The response in slot ``slot``: 24-byte header + result (``result_len``, bounded by
        the slot)."""
        addr = self._tx_host + slot * self.slot_size
        result_len = ctypes.c_uint32.from_address(addr + 8).value
        return ctypes.string_at(addr, HEADER_BYTES + min(result_len,
                                                         self.slot_size - HEADER_BYTES))

    def release(self, slot: int) -> None:
        """Clear slot ``slot``'s tx flag (the response has been read)."""
        self.tx_flags[slot] = 0

    # ---- strict ring order ----
    def can_submit(self) -> bool:
        """True when the next slot in ring order can take a request."""
        return self.outstanding < self.num_slots and self.slot_free(self.next_post)

    def submit(self, request: bytes) -> int:
        """Post ``request`` into the next slot in ring order; returns the slot. Raises
        :class:`DispatchError` when the ring is full (check :meth:`can_submit`)."""
        if not self.can_submit():
            raise DispatchError(f"GPU ring full ({self.outstanding} of {self.num_slots} "
                                "requests outstanding)")
        slot = self.next_post
        self.post(slot, request)
        self.next_post = (slot + 1) % self.num_slots
        self.outstanding += 1
        return slot

    def poll_response(self) -> tuple[int, bytes] | None:
        """The next response in ring order as ``(slot, bytes)``, released; ``None`` when it is
        not there yet (never blocks)."""
        if self.outstanding == 0:
            return None
        slot = self.next_take
        if not self.tx_flags[slot]:
            return None
        data = self.read_response(slot)
        self.tx_flags[slot] = 0
        self.next_take = (slot + 1) % self.num_slots
        self.outstanding -= 1
        return slot, data

    def reset_cursors(self) -> None:
        """Forget outstanding requests (after the kernel stopped) and clear every flag."""
        for s in range(self.num_slots):
            self.rx_flags[s] = 0
            self.tx_flags[s] = 0
        self.next_post = self.next_take = self.outstanding = 0
