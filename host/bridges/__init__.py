"""Transports that carry the QSC's Ethernet frames between the host and a board or a simulation.

:class:`~openqlink.bridges.base.FrameTransport` is the one abstract layer-2 transport; the host
code (:mod:`openqlink.qsc`, :mod:`openqlink.roce`, :mod:`openqlink.control`) runs unchanged over
any of them: the in-process pair (:func:`~openqlink.bridges.base.transport_pair`), raw Ethernet
(:class:`~openqlink.bridges.rawsock.RawSocketTransport`, imported from its module: it needs Linux
``AF_PACKET``), and the cocotb bench's ``openqlink.sim.transport.SimTransport``.

# Ref: IEEE 802.3-2018 3.2 (the frames carried); Linux packet(7) (raw sockets).
"""

from .base import FrameTransport, QueueTransport, TransportClosedError, transport_pair

__all__ = ["FrameTransport", "QueueTransport", "TransportClosedError", "transport_pair"]
