"""The ``verbs`` bridge's host QP: a PPU's RPC ring on an RDMA NIC (RoCEv2), through pyverbs.

Where the ``raw`` bridge runs the UC transport in user space (:class:`openqlink.roce.UCQueuePair`
over a raw socket), here the NIC runs it, as CUDA-Q realtime's ``cpu_roce`` bridge does:

* :class:`VerbsQueuePair` owns a UC QP (``IBV_QPT_UC``), its completion queue, and the request
  ring registered as a memory region with remote write access: ``num_slots * slot_size`` bytes
  at :attr:`VerbsQueuePair.ring_va` under :attr:`VerbsQueuePair.ring_rkey`, what the QSC's QP
  context is given as its ring (RING_VA, HOST_RKEY);
* a PPU's CALL arrives as an RDMA WRITE WITH IMMEDIATE into its slot, which the NIC checks
  (PSN, R_Key, range) and completes on a receive WQE: :meth:`VerbsQueuePair.poll` takes each
  ``IBV_WC_RECV_RDMA_WITH_IMM`` completion, the slot from ImmDt[11:0] and the length from
  ``byte_len``, copies the request into the application's ring (:class:`~openqlink.dispatch.
  SlotRing` or any :class:`~openqlink.roce.SlotRingLike`) and publishes it;
* the response goes back with :meth:`VerbsQueuePair.send`: one SEND from a registered buffer into
  the PPU's mailbox.

pyverbs is the distribution's ``python3-pyverbs`` (rdma-core), imported when a QP is made, never
at import of this module. Where there is no pyverbs, no RDMA device or no such port or GID, the
constructor raises :class:`BridgeUnavailableError` with one line naming what is missing.

# Ref: IBTA Vol 1 9.4.3 (RDMA WRITE with immediate: consumes a receive WQE), 10.2.3 (UC QP
# states RESET->INIT->RTR->RTS); rdma-core pyverbs (QP, MR, CQ, WR); ibv_poll_cq(3)
# (``imm_data`` in network byte order); CUDA-Q realtime ``cpu_roce`` bridge (UC QP, ring MR,
# RDMA_WRITE_WITH_IMM in, SEND out).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from typing import Any

from ..errors import QlinkError
from ..roce import PMTU_VALUES, SlotRingLike
from ..wire.roce import path_mtu_code

__all__ = ["BridgeUnavailableError", "VerbsQueuePair", "pyverbs_or_raise", "rdma_device_or_raise",
           "roce_gid"]

_PYVERBS_DIRS = ("/usr/lib/python3/dist-packages",)


class BridgeUnavailableError(QlinkError, OSError):
    """The bridge asked for cannot run on this host: its message names what is missing (the
    library, the device, the port or the GID)."""


def pyverbs_or_raise() -> Any:
    """The ``pyverbs`` package, or :class:`BridgeUnavailableError` naming how to get it.

    Looks in the import path, then in the distribution's ``dist-packages`` when its Python
    version is this one's (Debian's ``python3-pyverbs`` is built for the system Python).
    """
    try:
        import pyverbs
        return pyverbs
    except ImportError:
        pass
    tag = f"cpython-{sys.version_info.major}{sys.version_info.minor}"
    for d in _PYVERBS_DIRS:
        pkg = os.path.join(d, "pyverbs")
        if os.path.isdir(pkg) and any(tag in f for f in os.listdir(pkg)):
            sys.path.append(d)
            try:
                import pyverbs
                return pyverbs
            except ImportError:
                sys.path.remove(d)
    raise BridgeUnavailableError(
        "verbs bridge: pyverbs is not installed for this Python "
        f"({sys.version_info.major}.{sys.version_info.minor}): install the distribution's "
        "python3-pyverbs (rdma-core) and run .ci/setup again")


def rdma_device_or_raise(device: str | None = None) -> str:
    """The name of RDMA device ``device`` (``None``: the first), or
    :class:`BridgeUnavailableError` naming what is missing (pyverbs, any device, that one)."""
    pyverbs_or_raise()
    from pyverbs.device import get_device_list
    from pyverbs.pyverbs_error import PyverbsError

    try:
        names = [d.name.decode() for d in get_device_list()]
    except PyverbsError as exc:
        raise BridgeUnavailableError(
            "verbs bridge: no RDMA device: the kernel lists none (is the NIC's RDMA "
            f"driver loaded? /sys/class/infiniband is empty or missing): {exc}") from None
    if not names:
        raise BridgeUnavailableError("verbs bridge: no RDMA device on this host "
                                     "(/sys/class/infiniband is empty)")
    name = names[0] if device is None else device
    if name not in names:
        raise BridgeUnavailableError(f"verbs bridge: no RDMA device {name!r} "
                                     f"(this host has {', '.join(names)})")
    return name


def roce_gid(ip: str | int) -> str:
    """The RoCEv2 GID of an IPv4 address: the IPv4-mapped IPv6 address ``::ffff:a.b.c.d``
    (IBTA Vol 1 Annex A17.4.5.1), as a GID string."""
    v4 = ipaddress.IPv4Address(ip)
    return str(ipaddress.IPv6Address(f"::ffff:{v4}").exploded)


class VerbsQueuePair:
    """The host's UC QP of one PPU on an RDMA NIC, with the request ring registered on it.

    Parameters
    ----------
    ring : SlotRingLike
        Where requests are copied and published (``num_slots`` 1..4096, ``slot_size`` bytes).
    local_ip, remote_ip : str
        This host's and the QSC's IPv4 addresses (their RoCEv2 GIDs address the packets).
    device : str | None
        RDMA device name (``mlx5_0``); ``None``: the first one.
    port : int
        Port number on the device (1-based).
    gid_index : int | None
        Index of the local RoCEv2 GID of ``local_ip`` in the port's GID table; ``None``: found
        by looking the address up.
    pmtu_bytes : int
        Path MTU: 256..4096 (the QP context's PMTU must agree).
    max_response_bytes : int
        Largest response sent (the registered send buffer's size).

    Attributes
    ----------
    qpn : int
        This QP's number: the HOST_QPN the QSC's QP context must be given.
    ring_va, ring_rkey : int
        The ring's address and R_Key: the QSC's RING_VA and HOST_RKEY.
    counters : dict[str, int]
        ``RX_PUBLISHED``, ``RX_DROPPED`` (completions in error, with no immediate, a slot outside
        the ring or still full), ``TX_FRAMES``, ``TX_ERRORS``.

    The QP is made in the INIT state with its receive WQEs posted: its :attr:`qpn` is the
    HOST_QPN the QSC is configured with; :meth:`connect` then takes it to RTS towards the QSC's
    QPN (QSC_QPN, read back by the configuration).

    Raises :class:`BridgeUnavailableError` (no pyverbs, no device, port or GID) and
    :class:`ValueError` for bad arguments. Not thread safe: one thread polls and sends.
    """

    def __init__(self, ring: SlotRingLike, *, local_ip: str, remote_ip: str,
                 device: str | None = None, port: int = 1, gid_index: int | None = None,
                 pmtu_bytes: int = 1024, max_response_bytes: int = 64):
        if pmtu_bytes not in PMTU_VALUES:
            raise ValueError(f"pmtu_bytes must be one of {PMTU_VALUES}, not {pmtu_bytes}")
        if not 1 <= ring.num_slots <= 4096:
            raise ValueError(f"ring.num_slots must be 1..4096, not {ring.num_slots}")
        pyverbs_or_raise()
        import pyverbs.enums as e
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.pyverbs_error import PyverbsError
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        self._e = e
        self.ring = ring
        self.counters = dict.fromkeys(("RX_PUBLISHED", "RX_DROPPED", "TX_FRAMES", "TX_ERRORS"),
                                      0)
        self._closers: list[Any] = []
        try:
            name = rdma_device_or_raise(device)
            ctx = self._keep(Context(name=name))
            gid_index = self._find_gid(ctx, port, local_ip) if gid_index is None else gid_index
            pd = self._pd = self._keep(PD(ctx))
            self._write_mr: Any = None
            self._write_mr_bytes = 0
            self._sends_done = 0
            size = ring.num_slots * ring.slot_size
            self._ring_mr = self._keep(MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE
                                          | e.IBV_ACCESS_REMOTE_WRITE))
            self._send_mr = self._keep(MR(pd, max_response_bytes, e.IBV_ACCESS_LOCAL_WRITE))
            self.max_response_bytes = max_response_bytes
            depth = ring.num_slots
            self._cq = self._keep(CQ(ctx, 2 * depth + 2))
            cap = QPCap(max_send_wr=depth, max_recv_wr=depth, max_send_sge=1, max_recv_sge=1)
            qp = self._keep(QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UC, scq=self._cq,
                                              rcq=self._cq, cap=cap)))
            attr = QPAttr(qp_state=e.IBV_QPS_INIT)
            attr.pkey_index = 0
            attr.port_num = port
            attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE
            qp.to_init(attr)
            self._qp = qp
            for wr_id in range(depth):
                self._post_recv(wr_id)
            gr = GlobalRoute(dgid=GID(roce_gid(remote_ip)), sgid_index=gid_index, hop_limit=64)
            self._ah_attr = AHAttr(gr=gr, is_global=1, port_num=port)
            self._path_mtu = path_mtu_code(pmtu_bytes)
        except PyverbsError as exc:
            self.close()
            raise BridgeUnavailableError(f"verbs bridge: {exc}") from None
        except BaseException:
            self.close()
            raise
        self.qpn = int(qp.qp_num)
        self.ring_va = int(self._ring_mr.buf)
        self.ring_rkey = int(self._ring_mr.rkey)

    def connect(self, remote_qpn: int, *, rq_psn: int = 0, sq_psn: int = 0) -> None:
        """Take the QP to RTS towards the QSC's QP ``remote_qpn`` (24 bits): ``rq_psn`` is the
        first PSN expected from it, ``sq_psn`` the first sent (0, as the QSC's QP after its
        configuration). Raises :class:`ValueError` for values that do not fit and
        :class:`BridgeUnavailableError` when the NIC refuses the transition."""
        import pyverbs.enums as e
        from pyverbs.pyverbs_error import PyverbsError
        from pyverbs.qp import QPAttr

        for what, v in (("remote_qpn", remote_qpn), ("rq_psn", rq_psn), ("sq_psn", sq_psn)):
            if not 0 <= v < 1 << 24:
                raise ValueError(f"{what} {v:#x} does not fit in 24 bits")
        try:
            attr = QPAttr(qp_state=e.IBV_QPS_RTR)
            attr.path_mtu = self._path_mtu
            attr.dest_qp_num = remote_qpn
            attr.rq_psn = rq_psn
            attr.ah_attr = self._ah_attr
            self._qp.to_rtr(attr)
            attr = QPAttr(qp_state=e.IBV_QPS_RTS)
            attr.sq_psn = sq_psn
            self._qp.to_rts(attr)
        except PyverbsError as exc:
            raise BridgeUnavailableError(f"verbs bridge: connect: {exc}") from None

    def _keep(self, obj: Any) -> Any:
        self._closers.append(obj)
        return obj

    @staticmethod
    def _find_gid(ctx: Any, port: int, local_ip: str) -> int:
        want = roce_gid(local_ip)
        try:
            table_len = ctx.query_port(port).gid_tbl_len
        except Exception as exc:
            raise BridgeUnavailableError(f"verbs bridge: no port {port}: {exc}") from None
        for index in range(table_len):
            try:
                gid = str(ctx.query_gid(port, index))
            except Exception:
                continue
            if ipaddress.IPv6Address(gid) == ipaddress.IPv6Address(want):
                return index
        raise BridgeUnavailableError(
            f"verbs bridge: port {port} has no RoCEv2 GID for {local_ip} ({want}): give the "
            "NIC's interface that address")

    def _post_recv(self, wr_id: int) -> None:
        from pyverbs.wr import RecvWR

        # A WRITE WITH IMMEDIATE consumes a receive WQE; its data goes where the RETH says.
        self._qp.post_recv(RecvWR(wr_id=wr_id, num_sge=0))

    def poll(self, max_completions: int = 16) -> int:
        """Publish the requests completed since the last call (at most ``max_completions``);
        returns how many were published. Never raises for what the QSC sent: a completion in
        error, without an immediate, or naming a slot outside the ring or still full is counted
        in ``RX_DROPPED`` and its receive WQE posted again."""
        n, wcs = self._cq.poll(max_completions)
        return sum(self._completion(wc) for wc in wcs[:n])

    def _completion(self, wc: Any) -> int:
        """Handle one work completion; 1 when it published a request."""
        e = self._e
        ring = self.ring
        if wc.opcode in (e.IBV_WC_SEND, e.IBV_WC_RDMA_WRITE):
            self._sends_done += 1
            if wc.status != e.IBV_WC_SUCCESS:
                self.counters["TX_ERRORS"] += 1
            return 0
        self._post_recv(wc.wr_id)
        imm = socket.ntohl(int(wc.imm_data))     # ibv_wc.imm_data is big-endian
        slot, length = imm & 0xFFF, int(wc.byte_len)
        if (wc.status != e.IBV_WC_SUCCESS or wc.opcode != e.IBV_WC_RECV_RDMA_WITH_IMM
                or slot >= ring.num_slots or not 1 <= length <= ring.slot_size
                or ring.ready(slot)):
            self.counters["RX_DROPPED"] += 1
            return 0
        start = slot * ring.slot_size
        data = self._ring_mr.read(length, start)
        memoryview(ring.memory).cast("B")[start:start + length] = data
        ring.publish(slot, length)
        self.counters["RX_PUBLISHED"] += 1
        return 1

    def write(self, va: int, r_key: int, data: bytes, imm: int | None = None, *,
              timeout_s: float = 1.0) -> None:
        """RDMA WRITE ``data`` to the QSC's ``va`` under ``r_key`` (an upload, an envelope,
        the trigger), WITH_IMMEDIATE ``imm`` when given; the NIC cuts the message into
        packets at the path MTU. Waits for the work request's completion (publishing requests
        that complete meanwhile) so the staging buffer can be reused.

        Raises :class:`ValueError` for a field that does not fit (``va`` 64 bits, ``r_key`` and
        ``imm`` 32 bits, ``data`` up to 2**31 bytes) and :class:`BridgeUnavailableError` when
        the NIC refuses or fails the work request or it does not complete in ``timeout_s``.
        """
        import time

        from pyverbs.mr import MR
        from pyverbs.pyverbs_error import PyverbsError
        from pyverbs.wr import SGE, SendWR

        e = self._e
        for what, v, bits in (("va", va, 64), ("r_key", r_key, 32),
                              ("imm", 0 if imm is None else imm, 32)):
            if not 0 <= v < 1 << bits:
                raise ValueError(f"{what} {v:#x} does not fit in {bits} bits")
        n = len(data)
        if not 0 < n < 1 << 31:
            raise ValueError(f"an RDMA WRITE carries 1..2**31-1 bytes, not {n}")
        if self._write_mr is None or self._write_mr_bytes < n:
            size = max(n, 1 << 16)
            mr = MR(self._pd, size, e.IBV_ACCESS_LOCAL_WRITE)
            if self._write_mr is not None:
                self._closers.remove(self._write_mr)
                self._write_mr.close()
            self._write_mr, self._write_mr_bytes = self._keep(mr), size
        mr = self._write_mr
        mr.write(bytes(data), n, 0)
        opcode = e.IBV_WR_RDMA_WRITE if imm is None else e.IBV_WR_RDMA_WRITE_WITH_IMM
        wr = SendWR(opcode=opcode, num_sge=1, sg=[SGE(mr.buf, n, mr.lkey)],
                    send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(r_key, va)
        if imm is not None:
            wr.imm_data = socket.htonl(imm)
        want = self._sends_done + 1
        errors = self.counters["TX_ERRORS"]
        try:
            self._qp.post_send(wr)
        except PyverbsError as exc:
            self.counters["TX_ERRORS"] += 1
            raise BridgeUnavailableError(f"verbs bridge: post_send (RDMA WRITE): {exc}") from None
        self.counters["TX_FRAMES"] += 1
        deadline = time.monotonic() + timeout_s
        while self._sends_done < want:
            if time.monotonic() > deadline:
                raise BridgeUnavailableError(f"verbs bridge: the RDMA WRITE of {n} bytes to "
                                             f"{va:#x} did not complete in {timeout_s} s")
            self.poll()
        if self.counters["TX_ERRORS"] != errors:
            raise BridgeUnavailableError(f"verbs bridge: the RDMA WRITE of {n} bytes to {va:#x} "
                                         "completed in error")

    def send(self, payload: bytes) -> None:
        """SEND ``payload`` (an RPC response: header and result) to the QSC's mailbox.

        Raises :class:`ValueError` when it exceeds ``max_response_bytes`` and
        :class:`BridgeUnavailableError` when the NIC refuses the work request.
        """
        from pyverbs.pyverbs_error import PyverbsError
        from pyverbs.wr import SGE, SendWR

        e = self._e
        if len(payload) > self.max_response_bytes:
            raise ValueError(f"{len(payload)} response bytes exceed the "
                             f"{self.max_response_bytes}-byte send buffer")
        self._send_mr.write(bytes(payload), len(payload), 0)
        sge = SGE(self._send_mr.buf, len(payload), self._send_mr.lkey)
        wr = SendWR(opcode=e.IBV_WR_SEND, num_sge=1, sg=[sge],
                    send_flags=e.IBV_SEND_SIGNALED)
        try:
            self._qp.post_send(wr)
        except PyverbsError as exc:
            self.counters["TX_ERRORS"] += 1
            raise BridgeUnavailableError(f"verbs bridge: post_send: {exc}") from None
        self.counters["TX_FRAMES"] += 1

    def close(self) -> None:
        """Destroy the QP, the memory regions, the CQ, the PD and the device context (in the
        reverse order they were made). Idempotent."""
        while self._closers:
            obj = self._closers.pop()
            try:
                obj.close()
            except Exception:   # closing a half-made object: the rest still goes
                pass

    def __enter__(self) -> VerbsQueuePair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
