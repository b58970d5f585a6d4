"""The GPU RoCE endpoint's host side without a GPU: the frame bridge compiles with NVRTC and links
with the kernel and handlers for sm_90, the context layout matches the .cu, the frame rings'
flow control, steering, and the refusal of HOST_CALL entries."""

from __future__ import annotations

import ctypes
import re
import struct

import pytest
from gpumodel import ADD_SRC, P, device_entries

from openqlink.dispatch import DispatchMode, FunctionEntry, FunctionTable
from openqlink.errors import DispatchError
from openqlink.gpu import BUILTIN_KERNEL_ENTRY, CudaHandler, DispatchProgram, HostMemory
from openqlink.gpu.frames import (
    CONTROL_BYTES,
    COUNTER_NAMES,
    CTX_BYTES,
    RX_FRAME_AT,
    TX_FRAME_AT,
    FrameEndpointConfig,
    FrameRings,
    GPUFramePlane,
    request_frame_bytes,
)
from openqlink.gpu.program import FRAME_BRIDGE
from openqlink.gpu.sources import headers, read_source
from openqlink.gpu.toolchain import nvrtc_compile
from openqlink.roce import UCQueuePair
from openqlink.wire.roce import slot_immediate

ARCH = "sm_90"


def config(**kw) -> FrameEndpointConfig:
    base = dict(host_mac=0x020000000001, host_ip=0xC0A80001, qsc_mac=0x020000000010,
                qsc_ip=0xC0A8000A, host_qpn=0x100, qsc_qpn=0x2, ring_rkey=0x1234,
                num_slots=8, slot_size=256)
    base.update(kw)
    return FrameEndpointConfig(**base)


def test_bridge_compiles_with_nvrtc():
    for options in ((), ("-DQLINK_FRAMES_SMEM_BYTES=0",)):
        ltoir = nvrtc_compile(read_source("roce_frame_bridge.cu"), "roce_frame_bridge.cu",
                              ARCH, headers=headers(), options=options)
        assert len(ltoir) > 100


def test_kernel_frame_bridge_and_handler_link_for_sm90():
    prog = DispatchProgram(ARCH, bridge=FRAME_BRIDGE, cache=False, inline_handlers=True)
    prog.add(FunctionEntry("add_i32", DispatchMode.DEVICE_CALL, (P.INT32, P.INT32),
                           (P.INT32,), CudaHandler(ADD_SRC)))
    linked = prog.link()
    assert linked.cubin[:4] == b"\x7fELF"
    assert {BUILTIN_KERNEL_ENTRY, "qlink_fnptr_add_i32"} <= linked.symbols


def test_frame_plane_links_without_a_gpu():
    plane = GPUFramePlane(config(), arch=ARCH, cache=False)
    for e in device_entries()[:2]:
        plane.add(e)
    assert BUILTIN_KERNEL_ENTRY in plane.link().symbols
    # The frame code is part of the module's key: another header text, another module.
    assert "roce_frames.cuh" in headers()


def test_ctx_bytes_and_control_offsets_match_the_bridge():
    """The packed context (its field offsets are checked against the C declaration with g++ in
    test_gpu_roce_frames.py) and the control block's offsets as the .cu names them."""
    rings = FrameRings(HostMemory(FrameRings.size_for(4, 256)), 4, 256)
    ctx = rings.ctx_bytes(config(), 0x1000, 0x2000)
    assert len(ctx) == CTX_BYTES and ctx[:64] == config().pack()
    assert struct.unpack_from("<Q", ctx, 64 + 24)[0] == 0x1000
    assert struct.unpack_from("<I", ctx, 104)[0] == 4
    # The control block's offsets as the .cu names them.
    cu = read_source("roce_frame_bridge.cu")
    for name, value in (("RX_CONSUMED_AT", 16), ("TX_TAKEN_AT", 24), ("STATE_AT", 64),
                        ("RX_FRAME_AT", RX_FRAME_AT), ("TX_FRAME_AT", TX_FRAME_AT)):
        assert re.search(rf"#define QLINK_FRAMES_{name} {value}u", cu), name
    assert CONTROL_BYTES >= 72 + 8 * len(COUNTER_NAMES) + 8
    assert re.search(r"#define QLINK_FRAMES_STATE_WORDS \(2u \+ QLINK_ROCE_COUNTERS\)", cu)


def test_config_from_qp_and_ranges():
    qp = UCQueuePair("02:00:00:00:00:01", "192.168.0.1", 0x100, "02:00:00:00:00:10",
                     "192.168.0.10", 0x2, p_key=0x8001, pmtu_bytes=512, udp_src_port=0xC001)
    c = FrameEndpointConfig.from_qp(qp, num_slots=4, slot_size=128, ring_rkey=7, ring_va=0x40)
    assert (c.host_qpn, c.qsc_qpn, c.p_key, c.pmtu_bytes, c.udp_src_port, c.ring_va) == (
        0x100, 0x2, 0x8001, 512, 0xC001, 0x40)
    assert len(c.pack()) == 64
    for bad in (dict(host_qpn=1 << 24), dict(num_slots=0), dict(num_slots=4097),
                dict(slot_size=8), dict(pmtu_bytes=1000)):
        with pytest.raises(DispatchError):
            config(**bad)


def test_rings_flow_control_on_host_memory():
    """The host's side of the rings against a stand-in for the kernel's stores."""
    rings = FrameRings(HostMemory(FrameRings.size_for(2, 64)), 2, 64)
    frame = bytes(range(80))
    assert rings.push(frame) and rings.push(frame)
    assert not rings.can_push() and not rings.push(frame)       # full: back-pressure
    ctypes.c_uint64.from_address(rings._base + 16).value = 1    # the kernel took frame 1
    assert rings.push(frame[:60])
    slot0 = rings._base + rings.rx_offset
    assert ctypes.c_uint64.from_address(slot0).value == 3       # frame 3 in slot 0
    assert ctypes.c_uint32.from_address(slot0 + 8).value == 60
    assert ctypes.string_at(slot0 + RX_FRAME_AT, 60) == frame[:60]
    with pytest.raises(DispatchError):
        rings.push(bytes(request_frame_bytes(64) + 1))
    assert rings.pop() is None
    tx0 = rings._base + rings.tx_offset
    ctypes.memmove(tx0 + TX_FRAME_AT, b"\xab" * 60, 60)
    ctypes.c_uint32.from_address(tx0 + 8).value = 60
    ctypes.c_uint64.from_address(tx0).value = 1
    assert rings.pop() == b"\xab" * 60 and rings.pop() is None
    assert ctypes.c_uint64.from_address(rings._base + 24).value == 1  # tx_taken
    rings.psn = (5, 9)
    assert rings.psn == (5, 9) and rings.counters() == dict.fromkeys(COUNTER_NAMES, 0)


def test_steering_takes_this_qps_requests_only():
    plane = GPUFramePlane(config(), arch=ARCH)
    qsc = UCQueuePair(0x020000000010, 0xC0A8000A, 0x2, 0x020000000001, 0xC0A80001, 0x100)
    req = qsc.write_frame(256, 0x1234, b"x" * 30, imm=slot_immediate(0, 1))
    assert plane.wants(req)
    other = UCQueuePair(0x020000000010, 0xC0A8000A, 0x2, 0x020000000001, 0xC0A80001, 0x101)
    assert not plane.wants(other.write_frame(256, 0x1234, b"x" * 30, imm=1))
    assert not plane.wants(qsc.write_frame(256, 0x1234, b"x" * 30))   # RDMA_WRITE_ONLY
    assert not plane.wants(qsc.send_frame(b"x"))
    assert not plane.wants(qsc.write_frame(0, 0x1234, b"x" * 1000, imm=0))  # beyond a slot


def test_host_calls_are_refused_naming_them():
    table = FunctionTable()
    table.device_call("add_i32", CudaHandler(ADD_SRC), args=(P.INT32, P.INT32),
                      results=(P.INT32,))

    @table.host_call("neg", args=(P.INT32,), results=(P.INT32,))
    def neg(a):
        return -a

    plane = GPUFramePlane(config(), arch=ARCH)
    with pytest.raises(DispatchError, match=r"HOST_CALL 'neg'"):
        plane.start(table.entries())
    with pytest.raises(DispatchError, match="push_frame"):
        plane.submit(b"")
