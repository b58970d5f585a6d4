"""The verbs bridge's host QP (openqlink.bridges.verbs): clean failure where there is no RDMA
device, and requests in / responses out where there is one."""

from __future__ import annotations

import builtins
import os
import struct

import pytest

from openqlink.bridges.verbs import (
    BridgeUnavailableError,
    VerbsQueuePair,
    pyverbs_or_raise,
    roce_gid,
)
from openqlink.dispatch import SlotRing


def _rdma_devices() -> list[str]:
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


def _qp(**kw) -> VerbsQueuePair:
    args = dict(local_ip="10.77.2.1", remote_ip="10.77.2.2")
    args.update(kw)
    return VerbsQueuePair(SlotRing(4, 64), **args)


class _BadRing:
    num_slots, slot_size, memory = 5000, 64, bytearray(5000 * 64)


def test_roce_gid_is_the_ipv4_mapped_address():
    assert roce_gid("10.0.0.2") == "0000:0000:0000:0000:0000:ffff:0a00:0002"


@pytest.mark.skipif(bool(_rdma_devices()), reason="this host has an RDMA device")
def test_without_an_rdma_device_it_fails_with_one_clear_line():
    with pytest.raises(BridgeUnavailableError) as info:
        _qp()
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("verbs bridge: ")
    assert "RDMA device" in msg or "python3-pyverbs" in msg


def test_without_pyverbs_it_names_the_package(monkeypatch):
    real_import = builtins.__import__

    def no_pyverbs(name, *args, **kw):
        if name == "pyverbs" or name.startswith("pyverbs."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_pyverbs)
    monkeypatch.setattr("openqlink.bridges.verbs._PYVERBS_DIRS", ())
    with pytest.raises(BridgeUnavailableError, match="install the distribution's python3-pyverbs"):
        pyverbs_or_raise()
    with pytest.raises(BridgeUnavailableError, match="python3-pyverbs"):
        _qp()


def test_bad_arguments_are_refused_before_any_device_work():
    with pytest.raises(ValueError, match="pmtu_bytes"):
        _qp(pmtu_bytes=1000)
    with pytest.raises(ValueError, match="num_slots"):
        VerbsQueuePair(_BadRing(), local_ip="10.77.2.1", remote_ip="10.77.2.2")


@pytest.mark.skipif(not _rdma_devices(), reason="needs an RDMA device (RoCE NIC; "
                    "/sys/class/infiniband is empty or missing here)")
def test_a_request_written_with_immediate_is_published_and_answered():
    """Two UC QPs of the device's first port, connected to each other over its first RoCEv2
    GID: one stands for the QSC and writes a request into a slot with immediate data."""
    pyverbs_or_raise()
    import pyverbs.enums as e
    from pyverbs.device import Context

    name = _rdma_devices()[0]
    ctx = Context(name=name)
    ip = next(str(g)[-9:] for g in (ctx.query_gid(1, i) for i in range(8))
              if str(g).startswith("0000:0000:0000:0000:0000:ffff:"))
    a, b = (int(x, 16) for x in ip.split(":"))
    local = f"{a >> 8}.{a & 255}.{b >> 8}.{b & 255}"
    ctx.close()
    host = _qp(local_ip=local, remote_ip=local, device=name)
    qsc = _qp(local_ip=local, remote_ip=local, device=name)
    host.connect(qsc.qpn)
    qsc.connect(host.qpn)
    with pytest.raises(ValueError, match="24 bits"):
        host.connect(1 << 24)
    from pyverbs.wr import SGE, SendWR

    request = b"CUQR" + struct.pack("<IIIQ", 1, 4, 7, 0) + b"\x01\x02\x03\x04"
    qsc._send_mr.write(request, len(request), 0)
    wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1,
                sg=[SGE(qsc._send_mr.buf, len(request), qsc._send_mr.lkey)],
                imm_data=int.from_bytes((2).to_bytes(4, "big"), "little"),
                send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(host.ring_rkey, host.ring_va + 2 * 64)
    qsc._qp.post_send(wr)
    for _ in range(100000):
        if host.poll():
            break
    assert host.ring.ready(2) and host.ring.take(2) == request
    host.send(b"CUQS" + bytes(20))
    host.close()
    qsc.close()
