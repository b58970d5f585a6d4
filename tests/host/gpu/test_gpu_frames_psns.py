"""The GPU RoCE endpoint's hold on its QP's PSNs (``UCQueuePair.lend_psns``) on the paths that
need no GPU: a start that fails gives them back, a second start changes nothing, a kernel that
faulted gives them back at stop and one that did not stop in time keeps them. The stream is a
stand-in with ``done()`` as the driver's ``Stream`` answers it; the rings are plain host
memory (``HostMemory``)."""

from __future__ import annotations

import pytest

from openqlink.errors import DispatchError, GPUError
from openqlink.gpu.frames import FrameEndpointConfig, FrameRings, GPUFramePlane
from openqlink.gpu.loopback import HostMemory
from openqlink.roce import UCQueuePair

NUM_SLOTS, SLOT_SIZE = 8, 128


def host_qp() -> UCQueuePair:
    return UCQueuePair("02:00:00:00:00:01", "192.168.0.1", 0x100, "02:00:00:00:00:10",
                       "192.168.0.10", 0x2, tx_psn=40, rx_epsn=7)


def plane_for(qp: UCQueuePair) -> GPUFramePlane:
    return GPUFramePlane(FrameEndpointConfig.from_qp(qp, num_slots=NUM_SLOTS,
                                                     slot_size=SLOT_SIZE, ring_rkey=0x1234))


class _Stream:
    """``done()``: False while running, True once exited, GPUError when the kernel faulted."""

    def __init__(self, state: str):
        self.state = state
        self.destroyed = False

    def done(self) -> bool:
        if self.state == "faulted":
            raise GPUError("cuStreamQuery: CUDA_ERROR_ILLEGAL_ADDRESS")
        return self.state == "exited"

    def destroy(self) -> None:
        self.destroyed = True


def running(plane: GPUFramePlane, qp: UCQueuePair, state: str, psn=(57, 9)) -> FrameRings:
    """``plane`` as a start with ``qp`` leaves it, its kernel in ``state``; the kernel's last
    stored PSNs ``psn``."""
    rings = FrameRings(HostMemory(FrameRings.size_for(NUM_SLOTS, SLOT_SIZE)), NUM_SLOTS,
                       SLOT_SIZE)
    rings.reset()
    rings.psn = psn
    plane.frames = rings
    plane._stream = _Stream(state)
    plane._qp = qp
    qp.lend_psns("the GPU RoCE endpoint")
    return rings


def test_a_start_that_fails_gives_the_psns_back():
    qp = host_qp()
    plane = plane_for(qp)
    with pytest.raises(DispatchError, match="function table is empty"):
        plane.start([], qp=qp)                 # refused before any GPU work
    assert qp.psns_held_by is None and (qp.tx_psn, qp.rx_epsn) == (40, 7)
    qp.send_frame(b"x")                        # the host sends again


def test_a_second_start_while_running_changes_nothing():
    qp = host_qp()
    plane = plane_for(qp)
    running(plane, qp, "running")
    plane._backlog.append(b"a response frame popped while stopping")
    other = host_qp()
    with pytest.raises(DispatchError, match="already running"):
        plane.start(qp=other)
    assert other.psns_held_by is None
    assert list(plane._backlog) == [b"a response frame popped while stopping"]


def test_a_kernel_that_faulted_gives_the_psns_back_at_stop():
    qp = host_qp()
    plane = plane_for(qp)
    running(plane, qp, "faulted", psn=(57, 9))
    with pytest.raises(GPUError, match="ILLEGAL_ADDRESS"):
        plane.stop(timeout_s=1)
    assert qp.psns_held_by is None and (qp.tx_psn, qp.rx_epsn) == (57, 9)


def test_a_kernel_that_does_not_stop_keeps_the_psns():
    qp = host_qp()
    plane = plane_for(qp)
    running(plane, qp, "running")
    with pytest.raises(GPUError, match="did not stop within"):
        plane.stop(timeout_s=0.01)
    assert qp.psns_held_by == "the GPU RoCE endpoint"
    with pytest.raises(DispatchError, match="held by the GPU RoCE endpoint"):
        qp.send_frame(b"x")
    plane._stream.state = "exited"             # it stopped after all
    plane.stop()
    assert qp.psns_held_by is None and (qp.tx_psn, qp.rx_epsn) == (57, 9)
