"""Synchronous read ports of block RAMs, written so that synthesis puts no logic after the RAM.

``Memory.read_port()`` (a synchronous port) and an asynchronous port read into a register are
the same circuit, but Yosys maps them differently when the memory also has a write port in the
same clock domain. For the synchronous port it emulates Amaranth's read-first collision rule
(a word read in the cycle it is written returns the old value) with a bypass register and a
multiplexer after the block RAM's output, and it does so even where the memory carries the
``no_rw_check`` attribute: every path out of the RAM then starts with that multiplexer, after
the block RAM's slow clock-to-output (ECP5 DP16KD: about 5.8 ns of an 8 ns period). For an
asynchronous read into a register, Yosys merges the register into the RAM's port itself and
honours ``no_rw_check`` (collisions return undefined data): the RAM's outputs reach their
consumers directly. :func:`read_port` builds that form.

Simulation is unchanged: in Amaranth's simulator the register samples the word before the
write of the same edge lands, the read-first rule.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib.memory import Memory

__all__ = ["ReadPort", "read_port"]


class ReadPort:
    """The signals of a synchronous read port made by :func:`read_port`.

    Attributes
    ----------
    addr : Signal(range(depth))
        Word address, sampled at the clock edge while ``en`` is high.
    en : Signal(1), init 1
        Read enable; while low, ``data`` holds.
    data : Signal(width)
        The word at ``addr`` of the last edge at which ``en`` was high: 1 cycle of latency.
        Not reset (a block RAM's output register is not).
    """

    def __init__(self, addr: Signal, en: Signal, data: Signal):
        self.addr = addr
        self.en = en
        self.data = data


def read_port(m: Module, mem: Memory, *, name: str, domain: str = "sync") -> ReadPort:
    """A synchronous read port of ``mem`` in ``domain`` (see the module's docstring).

    ``mem`` should carry ``attrs={"no_rw_check": True}`` where a read of a word written in the
    same cycle is never used; without it Yosys still emulates the read-first rule.
    """
    r = mem.read_port(domain="comb")
    addr = Signal.like(r.addr, name=f"{name}_addr")
    en = Signal(name=f"{name}_en", init=1)
    data = Signal(len(r.data), name=f"{name}_data", reset_less=True)
    m.d.comb += r.addr.eq(addr)
    with m.If(en):
        m.d[domain] += data.eq(r.data)
    return ReadPort(addr, en, data)
