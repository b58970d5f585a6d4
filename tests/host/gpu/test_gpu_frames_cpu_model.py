"""The GPU RoCE endpoint's bridge (``roce_frame_bridge.cu``, unchanged) compiled with g++ for the
CPU and run on a thread of its own, one lane (the bridge's single-thread path), against the host
side of ``openqlink.gpu.frames``: the rings' layout and sequence words, flow control both ways,
the checks, the response frames byte for byte, the counters, the PSN state and shutdown, with no
GPU. A few lines of CUDA vocabulary (``__shfl_sync`` of one lane, acquire loads, fences) stand in
for the device's; the loop that calls the hooks follows the unified kernel's response rules for
one function. Skips when g++ is missing."""

from __future__ import annotations

import ctypes
import shutil
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from openqlink.gpu.frames import FrameEndpointConfig, FrameRings
from openqlink.gpu.loopback import HostMemory
from openqlink.roce import UCQueuePair
from openqlink.wire.packet import parse_frame
from openqlink.wire.roce import slot_immediate
from openqlink.wire.rpc import Request, Response, fnv1a32

CUDA_DIR = Path(__file__).resolve().parents[3] / "host" / "gpu" / "cuda"

# What the bridge takes from openqlink_dispatch.cuh and the CUDA runtime, for one CPU thread.
SHIM = r'''
#pragma once
#include <stdint.h>
#include <string.h>
#include <time.h>
#define QLINK_FRAMES_CPU_MODEL 1
#define __device__
#define __shared__
#define __forceinline__ inline
#define __align__(n) __attribute__((aligned(n)))
struct uint4 { uint32_t x, y, z, w; };
static inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
    return uint4{x, y, z, w};
}
template <class T> static inline T min(T a, T b) { return a < b ? a : b; }
template <class T> static inline T __shfl_sync(uint32_t, T v, uint32_t) { return v; }
static inline void __syncwarp(uint32_t = 0xFFFFFFFFu) {}
static inline uint32_t __activemask() { return 1u; }
static inline int __popc(uint32_t v) { return __builtin_popcount(v); }
static inline int __ffs(uint32_t v) { return __builtin_ffs(static_cast<int>(v)); }
static inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

#define QLINK_RPC_REQUEST_MAGIC 0x43555152u
#define QLINK_RPC_RESPONSE_MAGIC 0x43555153u
#define QLINK_RPC_HEADER_BYTES 24u
#define QLINK_STATUS_TRUNCATED (-3)
struct qlink_rpc_header {
    uint32_t magic, function_id, arg_len, request_id;
    uint64_t ptp_timestamp;
};
struct qlink_rpc_response {
    uint32_t magic;
    int32_t status;
    uint32_t result_len, request_id;
    uint64_t ptp_timestamp;
};
#define CUDAQ_DEV_TRANSPORT_SESSION_BYTES 256
enum cudaq_rx_dev_status_t { CUDAQ_RX_DEV_READY = 0, CUDAQ_RX_DEV_SHUTDOWN = 1 };
extern "C" void* cudaq_dev_transport_attach(void* storage, void* ctx, volatile int* flag);
extern "C" cudaq_rx_dev_status_t cudaq_dev_rx_poll(void* s, void** req, void** resp);
extern "C" void cudaq_dev_tx_publish(void* s, void* resp);

static inline uint64_t qlink_globaltimer_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
}
static inline uint64_t qlink_load_acquire_sys(const volatile uint64_t* p) {
    return __atomic_load_n(const_cast<const uint64_t*>(p), __ATOMIC_ACQUIRE);
}
static inline int qlink_load_acquire_sys_s32(const volatile int* p) {
    return __atomic_load_n(const_cast<const int*>(p), __ATOMIC_ACQUIRE);
}
static inline uint4 qlink_load_acquire_sys_v4(const void* p) {
    uint4 v;
    memcpy(&v, p, 16);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return v;
}
static inline uint4 qlink_load_relaxed_sys_v4(const void* p) {
    uint4 v;
    memcpy(&v, p, 16);
    return v;
}
static inline void qlink_frames_store_v4(void* p, uint4 v) { memcpy(p, &v, 16); }
static inline void qlink_frames_store_u64(void* p, uint64_t v) {
    __atomic_store_n(static_cast<uint64_t*>(p), v, __ATOMIC_RELAXED);
}
static inline uint32_t qlink_frames_lane_id() { return 0; }
'''

# The unified kernel's loop and response rules, for one function: add_i32 (INT32, INT32 ->
# INT32), function_id given; anything else -1, arg_len beyond the slot -3, other than 8 -2.
LOOP = r'''
#include "openqlink_dispatch.cuh"
extern "C" int64_t run_kernel(void* ctx, volatile int* shutdown, volatile uint64_t* processed,
                              uint32_t function_id, uint32_t max_arg_len) {
    alignas(16) unsigned char storage[CUDAQ_DEV_TRANSPORT_SESSION_BYTES];
    void* s = cudaq_dev_transport_attach(storage, ctx, shutdown);
    if (s == nullptr) return -1;
    uint64_t done = 0;
    for (;;) {
        void* request = nullptr;
        void* response = nullptr;
        if (cudaq_dev_rx_poll(s, &request, &response) != CUDAQ_RX_DEV_READY) break;
        const qlink_rpc_header h = *static_cast<const qlink_rpc_header*>(request);
        qlink_rpc_response* r = static_cast<qlink_rpc_response*>(response);
        int32_t status = -1;
        uint32_t result_len = 0;
        if (h.magic == QLINK_RPC_REQUEST_MAGIC && h.function_id == function_id) {
            if (h.arg_len > max_arg_len) {
                status = -3;
            } else if (h.arg_len != 8u) {
                status = -2;
            } else {
                int32_t a, b;
                memcpy(&a, static_cast<const uint8_t*>(request) + 24, 4);
                memcpy(&b, static_cast<const uint8_t*>(request) + 28, 4);
                const int32_t sum = a + b;
                memcpy(r + 1, &sum, 4);
                result_len = 4;
                status = 0;
            }
        }
        r->magic = QLINK_RPC_RESPONSE_MAGIC;
        r->status = status;
        r->result_len = result_len;
        r->request_id = h.request_id;
        r->ptp_timestamp = h.ptp_timestamp;
        cudaq_dev_tx_publish(s, response);
        __atomic_store_n(const_cast<uint64_t*>(processed), ++done, __ATOMIC_RELEASE);
    }
    return static_cast<int64_t>(done);
}
'''

HOST_MAC, QSC_MAC = 0x02_00_00_00_00_01, 0x02_00_00_00_00_10
HOST_IP, QSC_IP = "192.168.0.1", "192.168.0.10"
HOST_QPN, QSC_QPN, RKEY = 0x100, 0x2, 0x1234_5678
NUM_SLOTS, SLOT_SIZE = 4, 128
GUARD_S = 20.0


@pytest.fixture(scope="module", params=[2048, 0], ids=["smem-stage", "device-stage"])
def lib(request, tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed: the CPU model of the frame bridge needs it")
    d = tmp_path_factory.mktemp("bridge_model")
    (d / "openqlink_dispatch.cuh").write_text(SHIM)
    (d / "loop.cpp").write_text(LOOP)
    # The bridge's own text, copied beside the shim (a quoted include looks in the including
    # file's folder first); roce_frames.cuh comes from the package's folder.
    (d / "bridge.cpp").write_text((CUDA_DIR / "roce_frame_bridge.cu").read_text())
    so = d / "libbridge.so"
    done = subprocess.run([gxx, "-std=c++17", "-O2", "-Wall", "-Werror", "-Wno-unused-function",
                           "-Wno-unknown-pragmas", "-shared", "-fPIC",
                           f"-DQLINK_FRAMES_SMEM_BYTES={request.param}u", "-I", str(d),
                           "-I", str(CUDA_DIR), str(d / "bridge.cpp"), str(d / "loop.cpp"),
                           "-o", str(so)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lib = ctypes.CDLL(str(so))
    p, u32 = ctypes.c_void_p, ctypes.c_uint32
    lib.run_kernel.argtypes = [p, p, p, u32, u32]
    lib.run_kernel.restype = ctypes.c_int64
    return lib


class Model:
    """The rings over plain memory, the bridge on a thread, the QSC's and the host's QPs."""

    def __init__(self, lib, tx_psn: int = 0, rx_epsn: int = 0):
        self.host = UCQueuePair(HOST_MAC, HOST_IP, HOST_QPN, QSC_MAC, QSC_IP, QSC_QPN,
                                tx_psn=tx_psn)
        self.qsc = UCQueuePair(QSC_MAC, QSC_IP, QSC_QPN, HOST_MAC, HOST_IP, HOST_QPN,
                               tx_psn=rx_epsn)
        self.config = FrameEndpointConfig.from_qp(self.host, num_slots=NUM_SLOTS,
                                                  slot_size=SLOT_SIZE, ring_rkey=RKEY)
        self.rings = FrameRings(HostMemory(FrameRings.size_for(NUM_SLOTS, SLOT_SIZE)),
                                NUM_SLOTS, SLOT_SIZE)
        self.rings.reset()
        self.rings.psn = (tx_psn, rx_epsn)
        self.stages = [ctypes.create_string_buffer(self.rings.rx_stride + 16),
                       ctypes.create_string_buffer(self.rings.tx_stride + 16)]
        stage = [(ctypes.addressof(b) + 15) // 16 * 16 for b in self.stages]
        self.ctx = ctypes.create_string_buffer(self.rings.ctx_bytes(self.config, *stage), 128)
        base = self.rings.memory.host_ptr
        self.result: list[int] = []
        self.thread = threading.Thread(target=lambda: self.result.append(lib.run_kernel(
            self.ctx, base, base + 8, fnv1a32("add_i32"), SLOT_SIZE - 24)), daemon=True)
        self.thread.start()
        self.slot = 0

    def request(self, rpc: bytes) -> bytes:
        slot = self.slot
        self.slot = (slot + 1) % NUM_SLOTS
        return self.qsc.write_frame(slot * SLOT_SIZE, RKEY, rpc,
                                    imm=slot_immediate(self.qsc.tx_psn, slot))

    def push(self, frame: bytes) -> None:
        deadline = time.monotonic() + GUARD_S
        while not self.rings.push(frame):
            assert time.monotonic() < deadline, "the rx ring stays full"
            time.sleep(1e-5)

    def pop(self) -> bytes:
        deadline = time.monotonic() + GUARD_S
        while (f := self.rings.pop()) is None:
            assert self.thread.is_alive(), f"the model kernel exited: {self.result}"
            assert time.monotonic() < deadline, f"no response ({self.rings.counters()})"
            time.sleep(1e-5)
        return f

    def stop(self) -> int:
        self.rings.shutdown = True
        self.thread.join(GUARD_S)
        assert not self.thread.is_alive()
        return self.result[0]


def add(a: int, b: int, rid: int) -> bytes:
    return Request(fnv1a32("add_i32"), rid, rid * 5, struct.pack("<ii", a, b)).pack()


def test_requests_get_the_hosts_frames_and_the_state_is_stored(lib):
    m = Model(lib, tx_psn=0xFFFFF0, rx_epsn=0xFFFFFE)   # both PSNs wrap
    ref = UCQueuePair(HOST_MAC, HOST_IP, HOST_QPN, QSC_MAC, QSC_IP, QSC_QPN, tx_psn=0xFFFFF0)
    n = 5 * NUM_SLOTS + 1
    for k in range(n):
        m.push(m.request(add(k, -3 * k, k)))
        assert m.pop() == ref.send_frame(Response(0, k, k * 5, struct.pack("<i", -2 * k)).pack())
    assert m.stop() == n
    c = m.rings.counters()
    assert (c["RX_FRAMES"], c["RX_ROCE_ACCEPTED"], c["RX_PUBLISHED"], c["TX_FRAMES"]) == (n,) * 4
    assert m.rings.psn == (ref.tx_psn, m.qsc.tx_psn) and m.rings.processed == n
    assert m.rings.last_frame_ns > 0


def test_back_pressure_both_ways_and_everything_posted_before_stop_is_answered(lib):
    m = Model(lib)
    # Without popping: the kernel publishes NUM_SLOTS responses, takes one more frame and waits
    # for tx_taken; NUM_SLOTS more fill the rx ring, and then the host must wait.
    for k in range(2 * NUM_SLOTS + 1):
        m.push(m.request(add(k, 1, k)))
    assert not m.rings.can_push() and not m.rings.push(m.request(add(0, 0, 0)))
    m.qsc.tx_psn -= 1                      # that frame was not posted
    m.slot = (m.slot - 1) % NUM_SLOTS
    posted = 2 * NUM_SLOTS + 1
    got = []
    while len(got) < posted:
        got.append(Response.unpack(parse_frame(m.pop()).payload))
        if posted < 3 * NUM_SLOTS:
            m.push(m.request(add(posted, 1, posted)))
            posted += 1
    assert m.stop() == posted
    assert [(r.request_id, r.result) for r in got] == [
        (k, struct.pack("<i", k + 1)) for k in range(posted)]


def test_shutdown_answers_what_was_posted_before_it(lib):
    m = Model(lib)
    for k in range(NUM_SLOTS):
        m.push(m.request(add(k, k, k)))
    m.rings.shutdown = True
    m.thread.join(GUARD_S)
    assert not m.thread.is_alive() and m.result == [NUM_SLOTS]
    got = [Response.unpack(parse_frame(f).payload).request_id
           for f in iter(m.rings.pop, None)]
    assert got == list(range(NUM_SLOTS))


def test_bad_frames_are_counted_and_short_requests_answered(lib):
    m = Model(lib)
    good = m.request(add(1, 2, 7))
    wrong_qp = bytearray(good)
    wrong_qp[49] ^= 1                      # DestQP (the ICRC no longer matches first)
    m.push(bytes(wrong_qp))
    m.push(m.qsc.send_frame(b"x" * 24))    # a SEND: not a request
    for rpc, status in ((add(1, 2, 8)[:20], -3), (add(1, 2, 9)[:28], -3),
                        (Request(fnv1a32("add_i32"), 10, 0, b"abcd").pack(), -2),
                        (Request(fnv1a32("nope"), 11, 0, b"").pack(), -1)):
        m.push(m.request(rpc))
        r = Response.unpack(parse_frame(m.pop()).payload)
        assert r.status == status and r.result == b""
    m.push(good)
    r = Response.unpack(parse_frame(m.pop()).payload)
    assert (r.status, r.request_id, r.result) == (0, 7, struct.pack("<i", 3))
    assert m.stop() == 4                   # the 20-byte one was answered by the bridge
    c = m.rings.counters()
    assert (c["RX_FRAMES"], c["DROP_ICRC"], c["DROP_OPCODE"], c["RX_PUBLISHED"],
            c["TX_FRAMES"]) == (7, 1, 1, 5, 5)


# ---- GPUFramePlane's host logic over the CPU model (no driver) ----

class _Mem:
    """Plain memory in place of pinned and device allocations (one address for both)."""

    def __init__(self, size_bytes: int):
        self._buf = ctypes.create_string_buffer(size_bytes + 128)
        self.size_bytes = size_bytes
        address = (ctypes.addressof(self._buf) + 127) // 128 * 128
        self.host_ptr = self.device_ptr = self.ptr = address

    def upload(self, data: bytes) -> None:
        ctypes.memmove(self.ptr, data, len(data))

    def free(self) -> None:
        pass


class _Stream:
    def __init__(self, thread: threading.Thread):
        self.thread = thread

    def done(self) -> bool:
        return not self.thread.is_alive()

    def destroy(self) -> None:
        self.thread.join(GUARD_S)


class _Device:
    name = "CPU model of the frame bridge"
    arch = "sm_90"

    def alloc_pinned(self, size_bytes: int) -> _Mem:
        return _Mem(size_bytes)

    def alloc(self, size_bytes: int) -> _Mem:
        return _Mem(size_bytes)

    def make_current(self) -> None:
        pass


class _Module:
    def unload(self) -> None:
        pass


def model_plane(lib, host: UCQueuePair):
    """A GPUFramePlane whose driver calls are plain memory and whose kernel is the CPU model."""
    from openqlink.gpu.frames import GPUFramePlane

    class ModelFramePlane(GPUFramePlane):
        device = _Device()

        def _load(self):
            self._module = _Module()
            return self._module

        def _launch(self, module, items, cap):
            ctx, shutdown, processed = self._make_transport()
            fid = fnv1a32("add_i32")
            thread = threading.Thread(target=lib.run_kernel, daemon=True, args=(
                ctx, shutdown, processed, fid, self.slot_size - 24))
            thread.start()
            self._stream = _Stream(thread)

    config = FrameEndpointConfig.from_qp(host, num_slots=NUM_SLOTS, slot_size=SLOT_SIZE,
                                         ring_rkey=RKEY)
    return ModelFramePlane(config, arch="sm_90")


def _entries():
    from gpumodel import device_entries
    return device_entries()[:1]   # add_i32 (the CPU model's function)


def test_plane_hands_the_psns_over_and_back(lib):
    host = UCQueuePair(HOST_MAC, HOST_IP, HOST_QPN, QSC_MAC, QSC_IP, QSC_QPN, tx_psn=10,
                       rx_epsn=3)
    qsc = UCQueuePair(QSC_MAC, QSC_IP, QSC_QPN, HOST_MAC, HOST_IP, HOST_QPN, tx_psn=3)
    plane = model_plane(lib, host)
    plane.start(_entries(), qp=host)
    assert plane.push_frame(qsc.write_frame(0, RKEY, add(2, 3, 1), imm=slot_immediate(3, 0)))
    deadline = time.monotonic() + GUARD_S
    while (f := plane.pop_frame()) is None:
        assert time.monotonic() < deadline
    assert parse_frame(f).bth["psn"] == 10
    plane.stop()
    assert (host.tx_psn, host.rx_epsn) == (11, 4)
    host.send_frame(b"the host's own packet between runs")   # PSN 11
    plane.start(_entries(), qp=host)
    assert plane.push_frame(qsc.write_frame(0, RKEY, add(2, 3, 2), imm=slot_immediate(4, 0)))
    while (f := plane.pop_frame()) is None:
        assert time.monotonic() < deadline
    assert parse_frame(f).bth["psn"] == 12
    plane.close()
    assert (host.tx_psn, host.rx_epsn) == (13, 5)
    assert plane.counters()["RX_PUBLISHED"] == 2 and plane.psn == (13, 5)


def test_stop_keeps_the_responses_the_kernel_publishes_while_it_waits(lib):
    host = UCQueuePair(HOST_MAC, HOST_IP, HOST_QPN, QSC_MAC, QSC_IP, QSC_QPN)
    qsc = UCQueuePair(QSC_MAC, QSC_IP, QSC_QPN, HOST_MAC, HOST_IP, HOST_QPN)
    plane = model_plane(lib, host)
    plane.start(_entries(), qp=host)
    n = 2 * NUM_SLOTS + 1                  # more than the tx ring holds: the kernel waits
    deadline = time.monotonic() + GUARD_S
    for k in range(n):
        slot = k % NUM_SLOTS
        frame = qsc.write_frame(slot * SLOT_SIZE, RKEY, add(k, k, k),
                                imm=slot_immediate(qsc.tx_psn, slot))
        while not plane.push_frame(frame):
            assert time.monotonic() < deadline
    assert plane.stop() == n
    got = [Response.unpack(parse_frame(f).payload).request_id
           for f in iter(plane.pop_frame, None)]
    assert got == list(range(n))
    plane.close()


def test_bench_moves_frames_and_lets_drops_go(lib):
    """``qlink sim --gpu-frames``'s frame mover (TB._serve_frame) over the CPU model: the
    response frame goes to the wire, a dropped frame returns without one."""
    from types import SimpleNamespace

    from openqlink.sim.bench import TB

    host = UCQueuePair(HOST_MAC, HOST_IP, HOST_QPN, QSC_MAC, QSC_IP, QSC_QPN)
    qsc = UCQueuePair(QSC_MAC, QSC_IP, QSC_QPN, HOST_MAC, HOST_IP, HOST_QPN)
    plane = model_plane(lib, host)
    plane.start(_entries(), qp=host)
    sent: list[bytes] = []
    tb = SimpleNamespace(gpu_service_ns=[], gpu_frame_ns=[],
                         transport=SimpleNamespace(send_frame=sent.append))
    good = qsc.write_frame(0, RKEY, add(4, 5, 1), imm=slot_immediate(0, 0))
    bad = bytearray(qsc.write_frame(SLOT_SIZE, RKEY, add(4, 5, 2), imm=slot_immediate(1, 1)))
    bad[-1] ^= 1                           # ICRC
    assert plane.wants(good) and plane.wants(bytes(bad))
    TB._serve_frame(tb, plane, good)
    TB._serve_frame(tb, plane, bytes(bad))
    plane.stop()
    ref = UCQueuePair(HOST_MAC, HOST_IP, HOST_QPN, QSC_MAC, QSC_IP, QSC_QPN)
    assert sent == [ref.send_frame(Response(0, 1, 5, struct.pack("<i", 9)).pack())]
    assert len(tb.gpu_service_ns) == 1 and plane.counters()["DROP_ICRC"] == 1
    plane.close()
