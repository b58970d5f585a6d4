"""1 Gb/s Ethernet MAC on RGMII, in front of the network core.

# Ref: IEEE 802.3-2018 clauses 3 and 4; RGMII v2.0 (HP, 2002).

Layers, one per module: :mod:`.rgmii` (RGMII pins <-> GMII bytes: DDR I/O, clock skew),
:mod:`.ethernet` (preamble, SFD, FCS, padding, inter-frame gap), :mod:`.cdc` (receive clock
crossing, drops on overflow), :mod:`.width` (8 <-> 64-bit packet streams) and :mod:`.core`
(:class:`RGMIIMAC`, the whole MAC as the board top uses it).
"""

from .cdc import RxClockCrossing
from .core import RGMIIMAC, RX_COUNTERS, TX_COUNTERS
from .ethernet import GMIISignature, MACRx, MACTx
from .rgmii import RGMIIPort
from .width import PacketDownsizer, PacketUpsizer

__all__ = [
    "RGMIIMAC", "RX_COUNTERS", "TX_COUNTERS", "RGMIIPort", "GMIISignature", "MACRx", "MACTx",
    "RxClockCrossing", "PacketUpsizer", "PacketDownsizer",
]
