"""Small synthesis helpers shared by the gateware."""

from amaranth.hdl import Module, Signal, Value

__all__ = ["kept", "named"]


def kept(m: Module, value, name: str) -> Signal:
    """``value`` through a signal that synthesis keeps: a LUT boundary, so the logic on either
    side is mapped on its own (Yosys's abc9 otherwise trades the depth of a cone off the
    critical path for area, up to the depth of the design's longest path)."""
    sig = Signal(len(Value.cast(value)), name=name, attrs={"keep": 1})
    m.d.comb += sig.eq(value)
    return sig


def named(m: Module, value, name: str) -> Signal:
    """``value`` (an expression of any width) through a plain combinational signal.

    For a wide concatenation that is sliced many times (a frame's header words chosen by a beat
    counter): each slice of a ``Cat`` carries the whole ``Cat`` as its operand, so the
    simulator's compiler and the netlist generator walk every part of it once per slice, which
    made the network core's simulations take seconds longer to start; a slice of a signal is a
    slice of one name. Synthesis sees the same logic (the signal is not kept)."""
    sig = Signal(len(Value.cast(value)), name=name)
    m.d.comb += sig.eq(value)
    return sig
