"""Fault-injection bench: bad RoCE packets against the QSC's Verilog must write nothing.

It begins with the QSC closed by default (:func:`closed_session`): nothing lands before the host
configures it, and a second host can neither configure it nor write through RDMA.

For each fault (a bad ICRC, a wrong R_Key, a VA range that leaves the instruction ring, a wrong
DestQP, a wrong P_Key) the host sends a UC RDMA_WRITE_ONLY built by its own UC endpoint and then
damaged; the bench then reads the drop counters and the targeted instruction-ring words back over
the control plane. Results go to the JSON file named in the configuration (see
:func:`openqlink.sim.runner.run_bench`); the pytest wrapper checks them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import cocotb
from cocotb.task import bridge
from cocotb.triggers import Timer

from ..bridges.base import FrameTransport
from ..dispatch import SlotRing
from ..errors import ClaimedError
from ..isa import PPUState, assemble
from ..memory_map import IMEM_OFFSET, ppu_base, ppu_reg, qp_reg
from ..qsc import QSC
from ..wire.arp import ARP, ArpOperation
from ..wire.ethernet import ETHERNET, EtherType
from ..wire.icmp import ICMP_ECHO, IcmpType
from ..wire.ipv4 import IPV4, IpProtocol, ipv4_checksum
from ..wire.packet import build_roce_frame, parse_frame
from ..wire.roce import Opcode
from .bench import TB

__all__ = ["inject_faults", "FAULTS"]

#: The faults injected, in order: name -> the drop counter that must count it.
FAULTS = {
    "bad_icrc": "DROP_ICRC",
    "wrong_rkey": "DROP_RKEY",
    "va_out_of_range": "DROP_VA",
    "wrong_dest_qp": "DROP_QPN",
    "wrong_p_key": "DROP_PKEY",
}

PATTERN = bytes(range(0x40, 0x50))  # one 16-byte instruction slot worth of recognisable bytes


def _read_words(qsc: QSC, addr: int, nbytes: int) -> bytes:
    return b"".join(qsc.control.read(a).to_bytes(4, "little")
                    for a in range(addr, addr + nbytes, 4))


def _rebuild(frame: bytes, **changes) -> bytes:
    """The same RDMA_WRITE_ONLY with some BTH/RETH fields changed (ICRC recomputed)."""
    f = parse_frame(frame)
    fields = {
        "dst_mac": f.eth["dst"], "src_mac": f.eth["src"], "src_ip": f.ip["src"],
        "dst_ip": f.ip["dst"], "src_port": f.udp["src_port"], "opcode": Opcode(f.bth["opcode"]),
        "dest_qp": f.bth["dest_qp"], "psn": f.bth["psn"], "p_key": f.bth["p_key"],
        "va": f.reth["va"], "r_key": f.reth["r_key"], "payload": f.payload,
    }
    fields.update(changes)
    return build_roce_frame(**fields)


class _LoseWrites(FrameTransport):
    """A frame transport that damages (flips an ICRC bit of) the next ``n`` RDMA WRITEs it
    sends, so that the QSC drops them, as a lossy link would (UC does not retransmit). A
    :class:`FrameTransport` itself, so that every way of sending (``send_frames`` too) goes
    through :meth:`send_frame`."""

    def __init__(self, inner: FrameTransport, n: int):
        self.inner = inner
        self.n = n

    def send_frame(self, frame: bytes) -> None:
        f = parse_frame(frame)
        if self.n and f.is_roce and f.reth is not None:
            self.n -= 1
            frame = frame[:-1] + bytes([frame[-1] ^ 0x01])
        self.inner.send_frame(frame)

    def recv_frame(self, timeout_s: float | None = None) -> bytes | None:
        return self.inner.recv_frame(timeout_s)

    def now_s(self) -> float:
        return self.inner.now_s()

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name):
        return getattr(self.inner, name)


#: A program of two PMTU packets (70 instructions): r1 = 5 at its end.
LOST_UPLOAD_PROGRAM = "\n".join(["nop"] * 67 + ["set r1, 5", "set r2, 6", "end"])


def lost_upload_session(tb: TB) -> dict:
    """Upload a two-packet program whose first packet is lost: unverified, its trigger is
    refused (trigger_incomplete) and nothing runs; verified, the upload is sent again and the
    program runs."""
    qsc = tb.qsc
    program = assemble(LOST_UPLOAD_PROGRAM, params=tb.params).to_bytes()
    tail = len(program) // 16
    inner = qsc.transport
    out: dict = {}
    drops = qsc.counters()["DROP_ICRC"]
    try:
        qsc.restart_upload_count(0)
        qsc.transport = _LoseWrites(inner, 1)
        qsc.upload_program(0, program, verify=False)
        qsc.trigger(0, qsc.timeline(0) + 5000, tail)
        st = qsc.status(0)
        out["unverified"] = {"state": PPUState(st.state).name,
                             "trigger_incomplete": int(st.trigger_incomplete),
                             "upload_words": qsc.read_register(0, "UPLOAD_WORDS")}
        qsc.transport = _LoseWrites(inner, 1)
        qsc.upload_program(0, program)
        qsc.transport = inner
        qsc.trigger(0, qsc.timeline(0) + 5000, tail)
        while (st := qsc.status(0)).state not in (PPUState.DONE, PPUState.ERROR):
            tb._sleep_ns(2000)
        out["verified"] = {"state": PPUState(st.state).name,
                           "trigger_incomplete": int(st.trigger_incomplete),
                           "r1": qsc.read_register(0, "R1"), "r2": qsc.read_register(0, "R2")}
    finally:
        qsc.transport = inner
    out["dropped"] = qsc.counters()["DROP_ICRC"] - drops
    out["packets"] = len(range(0, len(program), qsc.pmtu_bytes))
    return out


RECONNECT_PROGRAM = "set r1, 7\ncall f(r1:8) -> r2\nend"


def reconnect_session(tb: TB) -> dict:
    """A host that restarts: three CALLs, none answered (each run stops with call_timeout),
    take the QSC's side of PPU 0's QP to PSN 3 and slot 3; then a new host (a new QSC
    object, ring and QP) configures the QP again, and its first request must arrive with
    PSN 0 in slot 0, where the new ring and dispatcher expect it."""
    program = assemble(RECONNECT_PROGRAM, params=tb.params)

    def run(qsc: QSC) -> str:
        qsc.control.write(ppu_reg(0, "CALL_TIMEOUT_CYCLES"), 300)
        qsc.upload_program(0, program.to_bytes())
        qsc.trigger(0, qsc.timeline(0) + 2000, len(program.instructions))
        while (st := qsc.status(0)).state not in (PPUState.DONE, PPUState.ERROR):
            tb._sleep_ns(2000)
        return "call_timeout" if st.call_timeout else PPUState(st.state).name

    def psns(qsc: QSC) -> list[int]:
        return [qsc.control.read(qp_reg(0, name)) for name in ("TX_PSN", "RX_EPSN")]

    out: dict = {"first_host": [run(tb.qsc) for _ in range(3)], "psns_before": psns(tb.qsc)}
    # The bench steers the QSC's RoCE frames as a NIC would (``tb._roce_in``); the first
    # host's requests are gone with it.
    out["first_host_requests"] = len(tb._roce_in)
    tb._roce_in.clear()
    ring = SlotRing(tb.cfg["num_slots"], tb.cfg["slot_size"])
    new = QSC(tb.transport, params=tb.params, host_mac=tb.cfg["host_mac"],
              host_ip=tb.cfg["host_ip"], pmtu_bytes=tb.cfg["pmtu"])
    new.connect()
    new.configure(0, ring)
    out["psns_configured"] = psns(new)
    out["new_host"] = run(new)
    out["new_host_requests"] = len(tb._roce_in)
    for _, frame in tb._roce_in:
        new.handle_frame(frame)
    tb._roce_in.clear()
    out["new_ring_ready_slots"] = [s for s in range(ring.num_slots) if ring.ready(s)]
    out["new_qp_rx_epsn"] = new.qp(0).rx_epsn
    tb.qsc = new
    return out


#: A second host on the bench's LAN.
OTHER_HOST_MAC = "02:00:00:00:00:77"
OTHER_HOST_IP = "192.168.0.77"


def closed_session(tb: TB) -> dict:
    """Closed by default, against the gateware: straight after reset an R_Key-0 write to PPU
    0's TRIGGER runs nothing; once the host configured the QSC (claiming it), a second host can
    read but not configure it (ClaimedError), and its RoCE packets, even with the right keys,
    are dropped as not from the QP's peer (DROP_PEER); once released, the second host can claim
    it, and its own release gives it back."""
    qsc = tb.qsc
    out: dict = {}
    trigger = ppu_reg(0, "TRIGGER")
    counters = qsc.counters()
    # The host's own addresses and the QSC's QPN; R_Key 0: what an unconfigured QSC held.
    zero_key = build_roce_frame(
        dst_mac=qsc.qsc_mac, src_mac=qsc.host_mac, src_ip=qsc.host_ip, dst_ip=qsc.qsc_ip,
        src_port=qsc.roce_src_port, opcode=Opcode.RDMA_WRITE_ONLY, dest_qp=qsc.params.qpn_base,
        psn=0, va=trigger, r_key=0, payload=(1).to_bytes(4, "little"))
    tb.transport.send_frame(zero_key)
    after = qsc.counters()
    out["before_configure"] = {
        "state": PPUState(qsc.status(0).state).name,
        "drop_udp": after["DROP_UDP"] - counters["DROP_UDP"],
        "accepted": after["RX_ROCE_ACCEPTED"] - counters["RX_ROCE_ACCEPTED"],
    }
    qsc.connect()
    qp = qsc.configure(0, tb.ring)
    other = QSC(tb.transport, params=tb.params, host_mac=OTHER_HOST_MAC,
                host_ip=OTHER_HOST_IP)
    out["other_version"] = other.connect()
    out["owner"] = other.claim_owner()
    try:
        other.configure(0)
        out["other_configure"] = "ok"
    except ClaimedError as e:
        out["other_configure"] = f"ClaimedError {e.status:#04x}"
    imem = ppu_base(0) + IMEM_OFFSET
    before = _read_words(qsc, imem, 16)
    counters = qsc.counters()
    good = qp.write_frame(imem, qsc.rkeys(0).imem, PATTERN)
    tb.transport.send_frame(_rebuild(good, src_mac=other.host_mac, src_ip=other.host_ip))
    after = qsc.counters()
    out["other_write"] = {
        "drop_peer": after["DROP_PEER"] - counters["DROP_PEER"],
        "accepted": after["RX_ROCE_ACCEPTED"] - counters["RX_ROCE_ACCEPTED"],
        "unchanged": _read_words(qsc, imem, 16) == before,
    }
    qsc.release()
    out["owner_released"] = other.claim_owner()
    other.configure(0)
    out["owner_other"] = qsc.claim_owner()
    other.release()
    out["owner_end"] = qsc.claim_owner()
    return out


def ping_session(tb: TB) -> dict:
    """``arping`` and ``ping`` against the QSC's Verilog: an ARP request for its IP and ICMP
    echo requests (an odd-length payload, a short one), built from the RFC layouts; the frames
    that come back are returned as hex for the test to check with an independent decoder."""
    qsc = tb.qsc
    mine = qsc.host_mac.to_bytes(6, "big")
    arp = (ETHERNET.pack(dst=(1 << 48) - 1, src=qsc.host_mac, ethertype=EtherType.ARP) +
           ARP.pack(oper=ArpOperation.REQUEST, sha=qsc.host_mac, spa=qsc.host_ip, tha=0,
                    tpa=qsc.qsc_ip))
    requests = {"arp": arp + bytes(60 - len(arp))}
    for name, data in (("echo_odd", bytes(range(57))), ("echo_short", b"hi")):
        icmp = ICMP_ECHO.pack(type=IcmpType.ECHO_REQUEST, code=0, checksum=0, identifier=0x51,
                              sequence=len(data)) + data
        icmp = icmp[:2] + ipv4_checksum(icmp).to_bytes(2, "big") + icmp[4:]
        ip = IPV4.pack(total_length=20 + len(icmp), identification=7, ttl=33,
                       protocol=IpProtocol.ICMP, checksum=0, src=qsc.host_ip, dst=qsc.qsc_ip)
        ip = ip[:10] + ipv4_checksum(ip).to_bytes(2, "big") + ip[12:]
        frame = ETHERNET.pack(dst=qsc.qsc_mac, src=qsc.host_mac, ethertype=EtherType.IPV4)
        frame += ip + icmp
        requests[name] = frame + bytes(max(0, 60 - len(frame)))
    out: dict = {"requests": {k: v.hex() for k, v in requests.items()}, "replies": {}}
    for name, frame in requests.items():
        tb.transport.send_frame(frame)
        for _ in range(20):
            got = tb.transport.recv_frame(0.0001)
            if got is not None and got[:6] == mine:
                out["replies"][name] = got.hex()
                break
    return out


def host_session(tb: TB) -> dict:
    qsc = tb.qsc
    qsc.connect()
    qp = qsc.configure(0, tb.ring)
    rkeys = qsc.rkeys(0)
    imem = ppu_base(0) + IMEM_OFFSET
    imem_bytes = tb.params.imem_depth * 16
    # A known program image: slot 0 holds the pattern; slots 1.. are still zero.
    qsc.upload_program(0, PATTERN)
    targets = {
        "bad_icrc": imem + 16,
        "wrong_rkey": imem + 32,
        "va_out_of_range": imem + imem_bytes - 8,     # 16 bytes from 8 before the end
        "wrong_dest_qp": imem + 48,
        "wrong_p_key": imem + 64,
    }
    before = {name: _read_words(qsc, addr, 16) if name != "va_out_of_range"
              else _read_words(qsc, addr, 8) for name, addr in targets.items()}
    counters_before = qsc.counters()
    for name, addr in targets.items():
        good = qp.write_frame(addr, rkeys.imem, PATTERN)
        if name == "bad_icrc":
            frame = good[:-1] + bytes([good[-1] ^ 0x01])
        elif name == "wrong_rkey":
            frame = _rebuild(good, r_key=rkeys.imem ^ 0x1)
        elif name == "wrong_dest_qp":
            frame = _rebuild(good, dest_qp=qsc.params.qpn_base + 7)
        elif name == "wrong_p_key":
            frame = _rebuild(good, p_key=0x7FFE)
        else:
            frame = good
        tb.transport.send_frame(frame)
    counters_after = qsc.counters()
    after = {name: _read_words(qsc, addr, len(before[name])) for name, addr in targets.items()}
    # The path still works: a good write after the faults lands.
    tb.transport.send_frame(qp.write_frame(imem + 80, rkeys.imem, PATTERN))
    landed = _read_words(qsc, imem + 80, 16)
    return {
        "faults": {name: {
            "counter": FAULTS[name],
            "counted": counters_after[FAULTS[name]] - counters_before[FAULTS[name]],
            "before": before[name].hex(), "after": after[name].hex(),
        } for name in targets},
        "accepted_during_faults": counters_after["RX_ROCE_ACCEPTED"]
        - counters_before["RX_ROCE_ACCEPTED"],
        "good_write_after_faults": landed.hex(),
        "pattern": PATTERN.hex(),
    }


@cocotb.test()
async def inject_faults(dut):
    """Send each fault, read back counters and memory, write the observations as JSON."""
    cfg = json.loads(Path(os.environ["OPENQLINK_SIM_CONFIG"]).read_text())
    tb = TB(dut, cfg)
    await tb.reset()
    tb.ring = SlotRing(cfg["num_slots"], cfg["slot_size"])
    tb.qsc = QSC(tb.transport, params=tb.params, host_mac=cfg["host_mac"],
                 host_ip=cfg["host_ip"], pmtu_bytes=cfg["pmtu"])
    closed = await bridge(closed_session)(tb)
    results = await bridge(host_session)(tb)
    results["closed"] = closed
    results["ping"] = await bridge(ping_session)(tb)
    results["lost_upload"] = await bridge(lost_upload_session)(tb)
    results["reconnect"] = await bridge(reconnect_session)(tb)
    await Timer(1, "us")
    Path(cfg["results"]).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
