"""Small synthesis helpers shared by the gateware."""

from amaranth.hdl import Module, Signal, Value

__all__ = ["kept"]


def kept(m: Module, value, name: str) -> Signal:
    """``value`` through a signal that synthesis keeps: a LUT boundary, so the logic on either
    side is mapped on its own (Yosys's abc9 otherwise trades the depth of a cone off the
    critical path for area, up to the depth of the design's longest path)."""
    sig = Signal(len(Value.cast(value)), name=name, attrs={"keep": 1})
    m.d.comb += sig.eq(value)
    return sig
