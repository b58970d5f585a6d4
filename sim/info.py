"""The simulated QSC's configuration as the bench sets it up: what ``qlink info`` prints.

The bench (:mod:`openqlink.sim.bench`) connects a host :class:`~openqlink.qsc.QSC` with the
run configuration's host MAC and IP (:func:`~openqlink.sim.runner.SimConfig`) and configures
PPU ``n``'s own QP with host QPN ``host_qpn + n`` and the default R_Keys
(:meth:`~openqlink.qsc.RKeys.fixed`), then every extra QP ``q`` (``num_ppus <= q <
num_qps``) as an upload QP of PPU ``q % configured PPUs``: host QPN ``host_qpn + q``, the IMEM
and ENV keys of :meth:`RKeys.fixed` of index ``q``, no REGS key (it can upload, not trigger;
:func:`configure_extra_qps`); the QSC's own MAC, IP and QPNs come from the build's
:class:`~openqlink.memory_map.QSCParams`. A capture made against the simulated QSC, or one to be
replayed into it, is addressed with these values.

Wire facts: RoCEv2 UDP port 4791 (IBTA Annex A17), the control plane's UDP port 8192
(``docs/wire_formats.md``), the UC opcodes each region takes (IBTA Vol 1 9.2; the receive
path's rules in :mod:`openqlink.gateware.net.rx`).
"""

from __future__ import annotations

from ..memory_map import (
    GLOBAL_REGISTERS,
    MAILBOX_BYTES,
    MAILBOX_OFFSET,
    QSCParams,
    _find,
    ppu_base,
    regions,
)
from ..qsc import DEFAULT_PMTU_BYTES, QSC, RKeys
from ..wire.roce import Opcode
from ..wire.udp import CONTROL_PORT, ROCEV2_PORT
from .runner import SimConfig

__all__ = ["sim_info", "region_rkeys", "configure_extra_qps", "WRITE_OPCODES", "SEND_OPCODES"]

#: The opcodes an RDMA region takes (ImmDt of a WRITE_WITH_IMMEDIATE into the instruction
#: ring becomes its TAIL; into other regions it is ignored).
WRITE_OPCODES = tuple(op.name for op in Opcode if not op.is_send)
#: The opcodes the response mailbox takes (it has no R_Key: SENDs carry none).
SEND_OPCODES = tuple(op.name for op in Opcode if op.is_send)


def region_rkeys(params: QSCParams, ppu: int, cfg: dict | None = None) -> RKeys:
    """The R_Keys the bench configures for PPU ``ppu``: :meth:`RKeys.fixed`, each replaced
    by ``cfg["rkeys"][name]`` where the run configuration names the region (``ppu0_imem``,
    ``ppu0_env``, ``ppu0_regs``; the names :func:`sim_info` gives; ``ppu0_ring`` for the
    host's request ring).

    Raises ``ValueError`` for a name that is no region of a PPU of ``params`` or a key that is
    not 32 bits."""
    given = dict((cfg or {}).get("rkeys") or {})
    known = {f"ppu{n}_{part}" for n in range(params.num_ppus)
             for part in ("ring", "imem", "env", "regs")}
    for name, key in given.items():
        if name not in known:
            raise ValueError(f"R_Key for {name!r}: no such region (known: ppuN_ring, "
                             f"ppuN_imem, ppuN_env, ppuN_regs with N in 0..{params.num_ppus - 1})")
        if not isinstance(key, int) or not 0 <= key < 1 << 32:
            raise ValueError(f"R_Key for {name!r}: {key!r} is not a 32-bit integer")
    d = RKeys.fixed(ppu)
    return RKeys(**{part: given.get(f"ppu{ppu}_{part}", getattr(d, part))
                    for part in ("ring", "imem", "env", "regs")})


def sim_info(params: QSCParams, num_configured: int | None = None,
             cfg: dict | None = None) -> dict:
    """The simulated QSC's configuration after the bench configured ``num_configured`` PPUs
    (default: every PPU of ``params``; the bench configures one per program), with the run
    configuration ``cfg`` (default :func:`SimConfig`'s).

    Returns a JSON-ready dict: ``mac``, ``ip`` (strings), ``control_port``, ``rocev2_port``,
    ``pkey``, ``pmtu`` (bytes), ``qpn_base`` (integers), ``qps`` (one ``{"qp", "qpn", "ppu",
    "peer_mac", "peer_ip", "peer_qpn", "epsn", "rkeys"}`` per configured QP: each configured
    PPU's own, then every extra QP; ``epsn`` the PSN the QSC expects next, 0 after configuring;
    ``rkeys`` the QP's map, ``{"IMEM": key, ...}`` for each region it may write) and
    ``regions`` (every remotely writable region of a
    configured PPU: ``{"name", "ppu", "va", "length", "rkey", "opcodes"}``, ``length`` in
    bytes, ``rkey`` the PPU's own QP's, ``None`` for the SEND-only mailbox, ``opcodes`` IBTA
    names; ``name`` is unique and filename-safe, e.g. ``ppu0_imem``).

    ``cfg`` may override what the bench configures (``qlink sim --inject``'s options): the
    host's ``host_mac``, ``host_ip`` and ``host_qpn``, ``rkeys`` (see :func:`region_rkeys`) and
    ``epsn`` (the PSN each QP expects next; default 0).

    Raises ``ValueError`` for a ``num_configured`` outside 1..``params.num_ppus``, an unknown
    region in ``rkeys`` or a key or PSN out of range.
    """
    cfg = SimConfig() if cfg is None else cfg
    n_cfg = params.num_ppus if num_configured is None else num_configured
    if not 1 <= n_cfg <= params.num_ppus:
        raise ValueError(f"num_configured must be 1..{params.num_ppus}, not {n_cfg}")
    p_key = _find(GLOBAL_REGISTERS, "P_KEY").reset
    epsn = cfg.get("epsn") or 0
    if not 0 <= epsn < 1 << 24:
        raise ValueError(f"epsn {epsn} is not a 24-bit PSN")
    qps, areas = [], []
    for n in range(n_cfg):
        keys = region_rkeys(params, n, cfg)
        qps.append({"qp": n, "qpn": params.qpn_base + n, "ppu": n, "peer_mac": cfg["host_mac"],
                    "peer_ip": cfg["host_ip"], "peer_qpn": cfg["host_qpn"] + n, "epsn": epsn,
                    "rkeys": {"IMEM": keys.imem, "ENV": keys.env, "REGS": keys.regs}})
        for r in regions(params, n):
            areas.append({"name": f"ppu{n}_{r.name.lower()}", "ppu": n, "va": r.va,
                          "length": r.length_bytes,
                          # IMEM_RKEY -> RKeys.imem, ...
                          "rkey": getattr(keys, r.rkey_register.removesuffix("_RKEY").lower()),
                          "opcodes": list(WRITE_OPCODES)})
        areas.append({"name": f"ppu{n}_mailbox", "ppu": n, "va": ppu_base(n) + MAILBOX_OFFSET,
                      "length": MAILBOX_BYTES, "rkey": None, "opcodes": list(SEND_OPCODES)})
    for q in range(params.num_ppus, params.num_qps):
        d = RKeys.fixed(q)
        qps.append({"qp": q, "qpn": params.qpn_base + q, "ppu": q % n_cfg,
                    "peer_mac": cfg["host_mac"], "peer_ip": cfg["host_ip"],
                    "peer_qpn": cfg["host_qpn"] + q, "epsn": epsn,
                    "rkeys": {"IMEM": d.imem, "ENV": d.env}})
    return {
        "mac": params.mac,
        "ip": params.ip,
        "control_port": CONTROL_PORT,
        "rocev2_port": ROCEV2_PORT,
        "pkey": p_key,
        "pmtu": cfg.get("pmtu", DEFAULT_PMTU_BYTES),
        "qpn_base": params.qpn_base,
        "qps": qps,
        "regions": areas,
    }


def configure_extra_qps(qsc: QSC, info: dict) -> None:
    """Configure the extra QPs (``qp >= num_ppus``) of ``info["qps"]`` (:func:`sim_info`) on
    ``qsc`` as the bench does: each with this host as its peer, its PPU and its map of R_Keys
    (:meth:`QSC.configure_qp`). Raises what that raises."""
    for qp in info["qps"]:
        if qp["qp"] >= qsc.num_ppus:
            qsc.configure_qp(qp["qp"], qp["ppu"], host_qpn=qp["peer_qpn"], rkeys=qp["rkeys"])
