"""UDP header (RFC 768) and the well-known ports the QSC listens on.

# Ref: RFC 768; IBTA Vol 1 Annex A17.2.3 (RoCEv2 destination port 4791); Holoscan Sensor Bridge
# control port 8192.
"""

from __future__ import annotations

from .header import Header

__all__ = ["UDP", "ROCEV2_PORT", "CONTROL_PORT"]

UDP = Header("UDP", [("src_port", 16), ("dst_port", 16), ("length", 16), ("checksum", 16)],
             ref="RFC 768")

#: IANA-assigned RoCEv2 destination port (IBTA Annex A17.2.3).
ROCEV2_PORT = 4791
#: Control plane port, as Holoscan Sensor Bridge's control bus.
CONTROL_PORT = 8192
