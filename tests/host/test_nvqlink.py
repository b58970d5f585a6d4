"""The library API against the software QSC of the host tests (no simulation): QPU memory
allocation and copies, what load_kernel uploads, and the errors. Launches run in the
simulation (tests/sim/test_kernels_sim.py)."""

from __future__ import annotations

import struct

import pytest

from openqlink import nvqlink
from openqlink.calibration import CalibrationTable
from openqlink.isa import INSTRUCTION_BYTES, assemble
from openqlink.kernels import h, kernel, mz, qubit, x
from openqlink.memory_map import ENV_OFFSET, IMEM_OFFSET, QSCParams, ppu_base
from openqlink.qsc import QSC

HOST_MAC, HOST_IP = "02:00:00:00:00:0a", "192.168.0.1"
PARAMS = QSCParams()


@kernel
def flip():
    q = qubit()
    x(q)
    return mz(q)


@kernel
def prepare(n: int):
    q = qubit()
    for _ in range(n):
        h(q)
        h(q)


@pytest.fixture
def device(virtual_qsc):
    link, peer = virtual_qsc(PARAMS)
    qsc = QSC(link, host_mac=HOST_MAC, host_ip=HOST_IP, params=PARAMS, timeout_s=0.05)
    dev = nvqlink.initialize(qsc)
    yield dev, peer
    nvqlink.shutdown()


def test_malloc_takes_the_envelope_memory_from_the_top_down(device):
    dev, _ = device
    top = 2 * PARAMS.env_depth
    a = nvqlink.malloc(100)
    b = nvqlink.malloc(8)
    assert (a.region, a.offset, a.nbytes) == ("envelope", top - 104, 100)
    assert b.offset == top - 112 and b.sample == b.offset // 2
    nvqlink.free(a)
    c = nvqlink.malloc(96)            # fits the hole a left
    assert c.offset == top - 96
    with pytest.raises(nvqlink.NVQLinkError, match="not a live buffer"):
        nvqlink.free(a)
    with pytest.raises(nvqlink.NVQLinkError, match="do not fit the envelope memory"):
        nvqlink.malloc(top)
    with pytest.raises(nvqlink.NVQLinkError, match="positive int"):
        nvqlink.malloc(0)
    with pytest.raises(nvqlink.NVQLinkError, match="region 'imem'"):
        nvqlink.malloc(8, region="imem")


def test_memcpy_to_qpu_writes_the_buffers_samples_by_rdma(device):
    dev, peer = device
    buf = nvqlink.malloc(16)
    data = struct.pack("<8h", 1, -2, 3, -4, 5, -6, 7, -32768)
    nvqlink.memcpy_to_qpu(buf, data)
    base = ppu_base(0) + ENV_OFFSET
    assert peer.read_memory(base + buf.offset, 16) == data
    nvqlink.memcpy_to_qpu(buf, b"\x09\x00\x0a\x00", offset=4)
    assert peer.read_memory(base + buf.offset, 8) == struct.pack("<4h", 1, -2, 9, 10)
    with pytest.raises(nvqlink.NVQLinkError, match="not inside the 16-byte buffer"):
        nvqlink.memcpy_to_qpu(buf, bytes(16), offset=4)
    with pytest.raises(nvqlink.NVQLinkError, match="whole 16-bit samples"):
        nvqlink.memcpy_to_qpu(buf, b"\x01\x02\x03")


def test_load_kernel_uploads_the_envelopes_and_the_program(device):
    dev, peer = device
    handle = nvqlink.load_kernel(flip)
    compiled = handle.compiled[()]
    env = compiled.program.envelope_bytes()
    assert peer.read_memory(ppu_base(0) + ENV_OFFSET, len(env)) == env
    code = compiled.program.to_bytes()
    assert peer.read_memory(ppu_base(0) + IMEM_OFFSET, len(code)) == code
    assert len(code) == INSTRUCTION_BYTES * len(compiled.program.instructions)
    # a kernel with parameters is compiled at launch, or at load with its arguments
    assert nvqlink.load_kernel(prepare).compiled == {}
    assert list(nvqlink.load_kernel(prepare, 3).compiled) == [(3,)]


def test_kernel_envelopes_and_buffers_do_not_overlap(device):
    dev, _ = device
    nvqlink.load_kernel(flip)                   # 64 samples (128 bytes) at the bottom
    with pytest.raises(nvqlink.NVQLinkError, match="8192 bytes, 128 used by kernel envelopes"):
        nvqlink.malloc(2 * PARAMS.env_depth - 64)
    nvqlink.malloc(2 * PARAMS.env_depth - 128)   # the rest fits
    program = assemble(".envelope big, square, length=256\nplay 0, big, amp=0.5\nend\n",
                       params=PARAMS)
    with pytest.raises(nvqlink.NVQLinkError, match="overlap a malloc'd buffer"):
        nvqlink.load_kernel(program)


def test_load_kernel_of_an_assembly_file_takes_its_handlers(device, tmp_path):
    src = tmp_path / "prog.s"
    src.write_text("call hello(r1:8) -> r2\nend\n")
    (tmp_path / "prog.py").write_text(
        "from openqlink.dispatch import FunctionTable, TypeDesc\n"
        "table = FunctionTable()\n"
        "@table.host_call('hello', args=[TypeDesc.uint8()], results=[TypeDesc.uint8()])\n"
        "def hello(b):\n    return b + 1\n")
    handle = nvqlink.load_kernel(src)
    assert handle.name == "prog" and "hello" in handle.table
    with pytest.raises(nvqlink.NVQLinkError, match="fixed program; it takes no arguments"):
        nvqlink.launch_kernel(handle, 1)
    with pytest.raises(nvqlink.NVQLinkError, match="nothing.s"):
        nvqlink.load_kernel(tmp_path / "nothing.s")


def test_calls_need_a_device_and_targets_are_checked(virtual_qsc):
    nvqlink.shutdown()
    with pytest.raises(nvqlink.NVQLinkError, match="call openqlink.nvqlink.initialize"):
        nvqlink.malloc(8)
    with pytest.raises(nvqlink.NVQLinkError, match="give 'sim', a QSC, or bridge="):
        nvqlink.initialize("board")
    link, _ = virtual_qsc(PARAMS)
    qsc = QSC(link, host_mac=HOST_MAC, host_ip=HOST_IP, params=PARAMS, timeout_s=0.05)
    with nvqlink.initialize(qsc, calibration=CalibrationTable.for_simulation(1, PARAMS)) as dev:
        assert nvqlink.current_device() is dev
    with pytest.raises(nvqlink.NVQLinkError, match="shut down"):
        dev.malloc(8)
