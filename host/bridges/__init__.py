"""Transports that carry the QSC's traffic between the host and a board or a simulation.

:class:`~openqlink.bridges.base.FrameTransport` is the one abstract layer-2 transport; the host
code (:mod:`openqlink.qsc`, :mod:`openqlink.roce`, :mod:`openqlink.control`) runs unchanged over
any of them: the in-process pair (:func:`~openqlink.bridges.base.transport_pair`), raw Ethernet
(:class:`~openqlink.bridges.rawsock.RawSocketTransport`: Linux ``AF_PACKET``), the kernel's UDP
sockets (:class:`~openqlink.bridges.udp.UdpSocketTransport`), a local Unix socket to the
simulated QSC of ``qlink sim --serve`` (:class:`~openqlink.bridges.unixsock.SocketTransport`),
and the cocotb bench's ``openqlink.sim.transport.SimTransport``.

A **bridge** is how the host reaches a board, chosen by name (:data:`BRIDGE_NAMES`,
:func:`open_bridge`; ``QSC(bridge=...)``, ``--bridge`` in the CLI):

=========  ==================================================  ===========================
name       frames (control plane, uploads, trigger)            a PPU's CALLs
=========  ==================================================  ===========================
``raw``    AF_PACKET on an interface (root or CAP_NET_RAW);    RoCEv2 UC, in user space
           RoCEv2 UC built and checked in user space           (:class:`~openqlink.roce.
                                                               UCQueuePair`)
``udp``    the kernel's UDP sockets (no rights needed)         UDP datagrams, CUDA-Q's
                                                               ``udp`` format
                                                               (:mod:`openqlink.udpcall`)
``verbs``  control plane on a UDP socket; RDMA WRITEs and      RoCEv2 UC on the NIC
           SENDs on the NIC's UC QP (pyverbs)                  (:class:`~openqlink.bridges.
                                                               verbs.VerbsQueuePair`)
=========  ==================================================  ===========================

# Ref: IEEE 802.3-2018 3.2 (the frames carried); Linux packet(7), udp(7); CUDA-Q realtime
# bridges (udp, cpu_roce): realtime/docs/cudaq_realtime_network_interface.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import FrameTransport, QueueTransport, TransportClosedError, transport_pair

__all__ = ["FrameTransport", "QueueTransport", "TransportClosedError", "transport_pair",
           "BRIDGE_NAMES", "OpenedBridge", "open_bridge"]

#: The bridges :func:`open_bridge` knows.
BRIDGE_NAMES = ("raw", "udp", "verbs")


@dataclass(frozen=True)
class OpenedBridge:
    """What :func:`open_bridge` made.

    Attributes
    ----------
    name : str
        One of :data:`BRIDGE_NAMES`.
    transport : FrameTransport
        Carries the control plane (and, but for ``verbs``, the RDMA traffic); the caller owns
        it (close it, or let :class:`~openqlink.qsc.QSC` close it).
    host_mac, host_ip : str
        This host's addresses on the path to the QSC: what the QSC is told to send to.
    call_transport : str
        How the PPUs' CALLs travel with this bridge: ``"roce"`` (the host's user-space UC QP),
        ``"udp"`` (:mod:`openqlink.udpcall`) or ``"verbs"`` (the NIC's UC QP).
    device : str | None
        ``verbs``: the RDMA device.
    """

    name: str
    transport: FrameTransport
    host_mac: str
    host_ip: str
    call_transport: str
    device: str | None = None


def open_bridge(name: str, *, qsc_ip: str | int, interface: str | None = None,
                host_ip: str | int | None = None, device: str | None = None) -> OpenedBridge:
    """Open bridge ``name`` towards the QSC at ``qsc_ip``.

    ``raw`` needs ``interface`` (the NIC facing the board) and takes ``host_ip`` (default: that
    interface's IPv4 address); ``udp`` and ``verbs`` take ``host_ip`` (default: this host's
    address on the route to ``qsc_ip``); ``verbs`` takes ``device`` (default: the first RDMA
    device).

    Raises :class:`ValueError` for an unknown name or a missing interface,
    :class:`~openqlink.bridges.verbs.BridgeUnavailableError` when this host cannot run the bridge
    (one line naming what is missing: pyverbs, an RDMA device, the right to open a raw socket),
    and :class:`~openqlink.bridges.udp.BridgeSetupError` for an address or port the host lacks.
    """
    from ..wire.ipv4 import int_to_ip, ip_to_int
    from .udp import BridgeSetupError, UdpSocketTransport, interface_ip
    from .verbs import BridgeUnavailableError

    if name not in BRIDGE_NAMES:
        raise ValueError(f"unknown bridge {name!r}: one of {', '.join(BRIDGE_NAMES)}")
    if name == "raw":
        if interface is None:
            raise ValueError("the raw bridge needs the interface facing the QSC (interface=...)")
        from .rawsock import RawSocketTransport
        try:
            transport = RawSocketTransport(interface)
        except PermissionError:
            raise BridgeUnavailableError(
                "raw bridge: opening an AF_PACKET socket needs root or CAP_NET_RAW (or use the "
                "udp bridge)") from None
        if host_ip is None:
            host_ip = interface_ip(interface)
            if host_ip is None:
                transport.close()
                raise BridgeSetupError(f"raw bridge: interface {interface} has no IPv4 address: "
                                       "give host_ip")
        return OpenedBridge("raw", transport, transport.mac, int_to_ip(ip_to_int(host_ip)),
                            "roce")
    if name == "verbs":
        from .verbs import rdma_device_or_raise
        device = rdma_device_or_raise(device)
    transport = UdpSocketTransport(qsc_ip, host_ip=host_ip)
    return OpenedBridge(name, transport, transport.mac, transport.host_ip,
                        "udp" if name == "udp" else "verbs", device)

