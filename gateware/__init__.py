"""The QSC gateware in Amaranth HDL: ``net`` (rti domain), ``ppu`` (dtd domain), ``top``.

See ``docs/architecture.md``.
"""
