"""Control-plane client: 32-bit register reads and writes on the QSC over UDP port 8192.

Requests and responses are those of Holoscan Sensor Bridge's control bus
(:mod:`openqlink.wire.control`; WR_DWORD/RD_DWORD for one register, WR_BLOCK/RD_BLOCK for up to
183 in one round trip): one request outstanding at a time, each with a 16-bit sequence
number and the flags ACK_REQUEST and SEQUENCE_CHECK. With SEQUENCE_CHECK the QSC executes a
request only if its sequence number is the last one it latched plus 1 (mod 2**16); otherwise it
answers status SEQUENCE_ERROR with ``latched_seq``, and the client resynchronises to
``latched_seq + 1`` and sends again. The first request of a client carries no SEQUENCE_CHECK, so
that it latches the client's numbering whatever the QSC saw before.

A request not answered within ``timeout_s`` is sent again with a new sequence number, at most
``retries`` times; a late response to any attempt of the current request is accepted (reads have
no side effects; a repeated write writes the same value). A write whose response was lost may
therefore be executed twice: do not use the control plane for registers with side effects per
write (the trigger goes by RDMA, see :meth:`openqlink.qsc.QSC.trigger`).

Frames received while waiting that are not this client's responses are handed to ``on_frame``
(or kept in :attr:`ControlClient.other_frames`), never dropped. Stale responses (a sequence
number of an earlier request) are counted and dropped.

# Ref: Holoscan Sensor Bridge control plane (ECB): docs/user_guide/controlplane.mdx and
# src/hololink/core/hololink.cpp.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence

from .bridges.base import FrameTransport
from .errors import (
    ClaimedError,
    ControlPlaneError,
    FieldRangeError,
    PPUTimeoutError,
    WireFormatError,
)
from .wire.control import (
    BLOCK_MAX_PAIRS,
    CONTROL_REQUEST,
    RESPONSE_BIT,
    Command,
    Flags,
    Status,
    pack_block_request,
)
from .wire.ethernet import mac_to_int
from .wire.ipv4 import ip_to_int
from .wire.packet import build_udp_frame, parse_frame
from .wire.udp import CONTROL_PORT

__all__ = ["ControlClient", "DEFAULT_LOCAL_PORT", "status_name"]

#: UDP source port of the client's requests unless told otherwise.
DEFAULT_LOCAL_PORT = 0xC100


def status_name(status: int) -> str:
    """``"BAD_ADDRESS (0x03)"`` for a known status byte, ``"0x42"`` otherwise."""
    try:
        return f"{Status(status).name} ({status:#04x})"
    except ValueError:
        return f"{status:#04x}"


class ControlClient:
    """Reads and writes QSC registers through the control plane.

    Parameters
    ----------
    transport : FrameTransport
        Sends the requests and receives the responses (and the other frames, see ``on_frame``).
    local_mac, local_ip, local_port
        This host's addresses and UDP port (responses come back to them).
    qsc_mac, qsc_ip, qsc_port
        The QSC's addresses and control port (8192).
    timeout_s : float
        Time to wait for each attempt's response, in seconds of ``transport.now_s()``.
    retries : int
        Attempts after the first when a response does not come, or reports SEQUENCE_ERROR.
    sequence_check : bool
        Set SEQUENCE_CHECK on requests (after the first).
    on_frame : callable(bytes) | None
        Receives every frame read while waiting that is not a control response to this client.
        ``None``: such frames are appended to :attr:`other_frames`.
    max_other_frames : int
        How many of those it keeps (default 1024): beyond that the oldest go, counted in
        ``counters["other_frames_dropped"]``, so that traffic nobody reads cannot grow the
        host's memory without bound.

    Attributes
    ----------
    lock : threading.RLock
        Held for the whole of a transaction; a receive loop sharing the transport (e.g.
        :meth:`openqlink.qsc.QSC.poll_rx`) must not read from it while another thread holds it.
    counters : dict[str, int]
        ``requests``, ``responses``, ``timeouts`` (attempts that got no response), ``retries``,
        ``sequence_resyncs``, ``stale_responses``, ``routed_frames``,
        ``other_frames_dropped``.
    other_frames : collections.deque[bytes]
        Frames kept when ``on_frame`` is ``None``, the latest ``max_other_frames``.
    """

    def __init__(self, transport: FrameTransport, *, local_mac: str | bytes | int,
                 local_ip: str | int, qsc_mac: str | bytes | int, qsc_ip: str | int,
                 local_port: int = DEFAULT_LOCAL_PORT, qsc_port: int = CONTROL_PORT,
                 timeout_s: float = 0.2, retries: int = 3, sequence_check: bool = True,
                 on_frame: Callable[[bytes], None] | None = None, first_seq: int = 0,
                 max_other_frames: int = 1024):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s}")
        if retries < 0:
            raise ValueError(f"retries must be at least 0, not {retries}")
        for name, port in (("local_port", local_port), ("qsc_port", qsc_port)):
            if not 0 < port < 1 << 16:
                raise FieldRangeError("UDP", name, port, f"{port} is not a UDP port")
        self.transport = transport
        self.local_mac = mac_to_int(local_mac)
        self.local_ip = ip_to_int(local_ip)
        self.local_port = local_port
        self.qsc_mac = mac_to_int(qsc_mac)
        self.qsc_ip = ip_to_int(qsc_ip)
        self.qsc_port = qsc_port
        self.timeout_s = timeout_s
        self.retries = retries
        self.sequence_check = sequence_check
        self.on_frame = on_frame
        if max_other_frames < 0:
            raise ValueError(f"max_other_frames must be at least 0, not {max_other_frames}")
        self.other_frames: collections.deque[bytes] = collections.deque(
            maxlen=max_other_frames)
        self.lock = threading.RLock()
        self.counters: dict[str, int] = dict.fromkeys(
            ("requests", "responses", "timeouts", "retries", "sequence_resyncs",
             "stale_responses", "routed_frames", "other_frames_dropped"), 0)
        self._seq = first_seq & 0xFFFF
        self._synced = False

    # --- public API ---------------------------------------------------------------------------

    def write(self, addr: int, value: int, *, ack: bool = True) -> None:
        """WR_DWORD ``value`` (32 bits) at byte address ``addr`` (32 bits, 4-byte aligned).

        With ``ack`` (default) waits for the acknowledgement as :meth:`transact` does; without,
        sends once and returns.

        Raises :class:`~openqlink.errors.ControlPlaneError` (non-OK status, or no response after
        the retries) and :class:`~openqlink.errors.FieldRangeError` for a bad ``addr``/``value``.
        """
        if not ack:
            self._check(addr, value)
            with self.lock:
                self._send(Command.WR_DWORD, self._take_seq(), 0, [(addr, value)])
            return
        self.transact(Command.WR_DWORD, addr, value)

    def read(self, addr: int) -> int:
        """RD_DWORD at byte address ``addr``: the 32-bit value. Errors as :meth:`write`."""
        return self.transact(Command.RD_DWORD, addr)["value"]

    def write_block(self, pairs: Sequence[tuple[int, int]]) -> None:
        """WR_BLOCK: write each (addr, value) of ``pairs`` in order, up to
        :data:`~openqlink.wire.control.BLOCK_MAX_PAIRS` per request (as the Holoscan Sensor
        Bridge host writes in block mode). The QSC stops a block at its first failing pair;
        the error names that pair's address (the pairs before it were written).

        Raises as :meth:`transact`.
        """
        pairs = list(pairs)
        for k in range(0, len(pairs), BLOCK_MAX_PAIRS):
            self._transact(Command.WR_BLOCK, pairs[k:k + BLOCK_MAX_PAIRS])

    def read_block(self, addrs: Sequence[int]) -> list[int]:
        """RD_BLOCK: the 32-bit value at each byte address of ``addrs``, in order, up to
        :data:`~openqlink.wire.control.BLOCK_MAX_PAIRS` per request (one round trip each).

        Raises as :meth:`transact` (the error names the first address that failed).
        """
        addrs = list(addrs)
        out: list[int] = []
        for k in range(0, len(addrs), BLOCK_MAX_PAIRS):
            resp = self._transact(Command.RD_BLOCK,
                                  [(a, 0) for a in addrs[k:k + BLOCK_MAX_PAIRS]])
            out += [v for _, v in resp["pairs"]]
        return out

    def transact(self, cmd: Command, addr: int, data: int = 0) -> dict[str, int]:
        """Send one request and return its decoded OK response (``CONTROL_RESPONSE`` fields).

        Raises
        ------
        PPUTimeoutError
            The QSC answered PPU_TIMEOUT: the PPU side did not answer (not retried: the QSC
            already waited its bound; a write so answered was not executed).
        ControlPlaneError
            ``status`` set: the QSC answered a non-OK status (other than a SEQUENCE_ERROR it could
            resynchronise from); ``status`` ``None``: no response after ``1 + retries`` attempts.
            The message names the command, the address and the status.
        FieldRangeError
            ``addr`` not a 4-byte aligned 32-bit address, or ``data`` not 32 bits.
        """
        return self._transact(Command(cmd), [(addr, data)])

    def _transact(self, cmd: Command, pairs: list[tuple[int, int]]) -> dict:
        for addr, data in pairs:
            self._check(addr, data)
        addr = pairs[0][0]
        with self.lock:
            seqs: set[int] = set()
            seq = None
            for attempt in range(self.retries + 1):
                if attempt:
                    self.counters["retries"] += 1
                if seq is None:
                    # A retry after a time-out keeps its sequence number: if the request did
                    # arrive and only its response was lost, the QSC answers the retransmission
                    # without running its writes again.
                    seq = self._take_seq()
                    seqs.add(seq)
                check = self.sequence_check and self._synced
                flags = Flags.ACK_REQUEST | (Flags.SEQUENCE_CHECK if check else 0)
                self._send(cmd, seq, flags, pairs)
                resp = self._await(cmd, pairs, seqs)
                if resp is None:
                    self.counters["timeouts"] += 1
                    continue
                if resp["status"] == Status.SEQUENCE_ERROR:
                    self.counters["sequence_resyncs"] += 1
                    self._seq = (resp["latched_seq"] + 1) & 0xFFFF
                    self._synced = True
                    seq = None          # the next attempt takes the QSC's next number
                    continue
                # a block stops at its failing pair: the response's last
                at = resp["pairs"][-1][0]
                if resp["status"] == Status.PPU_TIMEOUT:
                    raise PPUTimeoutError(
                        f"{cmd.name} {at:#010x}: QSC answered {status_name(resp['status'])}: "
                        "the PPU side (dtd clock domain) did not answer: no clock or held in "
                        "reset (a write so answered was not executed)",
                        status=resp["status"], addr=at)
                if resp["status"] == Status.CLAIMED:
                    raise ClaimedError(
                        f"{cmd.name} {at:#010x}: QSC answered {status_name(resp['status'])}: "
                        "another host claimed this QSC (read its CLAIM register for the "
                        "owner's address; the owner writes 0 there to release it, or reset "
                        "the QSC)", status=resp["status"], addr=at)
                if resp["status"] != Status.OK:
                    raise ControlPlaneError(
                        f"{cmd.name} {at:#010x}: QSC answered {status_name(resp['status'])}",
                        status=resp["status"], addr=at)
                self._synced = True
                return resp
        raise ControlPlaneError(
            f"{cmd.name} {addr:#010x}: no valid response after {self.retries + 1} attempts "
            f"of {self.timeout_s} s", status=None, addr=addr)

    def route(self, frame: bytes) -> None:
        """Hand a frame that is not a response of this client to ``on_frame``."""
        self.counters["routed_frames"] += 1
        if self.on_frame is None:
            if len(self.other_frames) == self.other_frames.maxlen:
                self.counters["other_frames_dropped"] += 1
            self.other_frames.append(frame)
        else:
            self.on_frame(frame)

    def is_response(self, frame: bytes) -> bool:
        """Whether ``frame`` is a control-plane response from the QSC to this client."""
        return self._response(frame) is not None

    # --- internals ----------------------------------------------------------------------------

    @staticmethod
    def _check(addr: int, data: int) -> None:
        if not 0 <= addr < 1 << 32 or addr % 4:
            raise FieldRangeError("ControlRequest", "addr", addr,
                                  f"{addr:#x} is not a 4-byte aligned 32-bit address")
        if not 0 <= data < 1 << 32:
            raise FieldRangeError("ControlRequest", "data", data,
                                  f"{data:#x} does not fit in 32 bits")

    def _take_seq(self) -> int:
        seq = self._seq
        self._seq = (seq + 1) & 0xFFFF
        return seq

    def _send(self, cmd: Command, seq: int, flags: int, pairs: list[tuple[int, int]]) -> None:
        if cmd in (Command.WR_BLOCK, Command.RD_BLOCK):
            payload = pack_block_request(cmd, int(flags), seq, pairs)
        else:
            (addr, data), = pairs
            payload = CONTROL_REQUEST.pack(cmd=cmd, flags=int(flags), seq=seq, addr=addr,
                                           data=data)
        self.counters["requests"] += 1
        self.transport.send_frame(build_udp_frame(
            dst_mac=self.qsc_mac, src_mac=self.local_mac, src_ip=self.local_ip,
            dst_ip=self.qsc_ip, src_port=self.local_port, dst_port=self.qsc_port,
            payload=payload))

    def _response(self, frame: bytes) -> dict[str, int] | None:
        try:
            f = parse_frame(frame)
        except WireFormatError:
            return None
        if (not f.is_control_response or f.ip is None or f.udp is None
                or f.eth["dst"] != self.local_mac or f.ip["src"] != self.qsc_ip
                or f.ip["dst"] != self.local_ip or f.udp["src_port"] != self.qsc_port
                or f.udp["dst_port"] != self.local_port):
            return None
        return f.control

    def _await(self, cmd: Command, pairs: list[tuple[int, int]], seqs: set[int]) -> dict | None:
        deadline = self.transport.now_s() + self.timeout_s
        while True:
            remaining = deadline - self.transport.now_s()
            if remaining <= 0:
                return None
            frame = self.transport.recv_frame(remaining)
            if frame is None:
                continue
            resp = self._response(frame)
            if resp is None:
                self.route(frame)
                continue
            # the response's pairs are the request's addresses, all of them when it is OK
            got = [a for a, _ in resp["pairs"]]
            want = [a for a, _ in pairs]
            if (resp["seq"] not in seqs or resp["cmd"] != cmd | RESPONSE_BIT
                    or got != want[:len(got)]
                    or (resp["status"] == Status.OK and len(got) != len(want))):
                self.counters["stale_responses"] += 1
                continue
            self.counters["responses"] += 1
            return resp
