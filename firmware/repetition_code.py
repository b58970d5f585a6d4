"""HOST_CALL handler of the repetition-code example (``firmware/repetition_code.s``): the decoder.

Every syndrome round the PPU measures ancilla 1 (the parity of data qubits 0 and 2) into ``r1``
and ancilla 3 (the parity of data qubits 2 and 4) into ``r3`` and executes
``call decode(r5:8, r1:1, r3:1) -> r7`` with the round in ``r5``: three arguments, a UINT8 and
two BIT_PACKED bits (a byte each), and one UINT8 out. The answer is the data qubit to correct
plus one (0: none), which the program turns into a pi pulse on that qubit.

The program corrects after every round, so the syndrome of a round is already measured against
the corrected state: a single X error on one data qubit since the last round flags the two
ancillas next to it (qubit 2: both, qubit 0: ancilla 1 alone, qubit 4: ancilla 3 alone), and
:func:`correction` is the minimum-weight answer to it. The decoder keeps the syndrome history
of every shot (:attr:`Decoder.shots`, a new shot at round 0) and refuses a round out of order,
which the dispatcher answers with status 1 (handler error), stopping the PPU with
``call_failed``.

Use it with ``qlink sim --qubits 5 firmware/repetition_code.s`` (``qlink sim`` loads this file,
the ``.py`` beside the program, by itself), or::

    from firmware.repetition_code import table
    dispatcher = Dispatcher(table, ring, send_response)

# Ref: docs/isa.md (CALL); cuda-quantum realtime message protocol (BIT_PACKED, UINT8 schema)
"""

from __future__ import annotations

from pathlib import Path

from openqlink.dispatch import FunctionTable, TypeDesc
from openqlink.isa import Program, assemble
from openqlink.sim.channel_map import sim_params

__all__ = ["table", "decode", "correction", "Decoder", "DECODER", "DATA_QUBITS", "SOURCE",
           "program", "arguments"]

#: The assembly source of the example.
SOURCE = Path(__file__).with_name("repetition_code.s")

#: The data qubits, in the order of the code.
DATA_QUBITS = (0, 2, 4)

#: Syndrome (bit 0: ancilla 1, bit 1: ancilla 3) -> the data qubit a single X error flips.
_FLAGGED = {0b00: None, 0b01: 0, 0b11: 2, 0b10: 4}


def arguments(round_: int, syndrome: int) -> bytes:
    """The CALL's 3 argument bytes as the PPU sends them: the round (UINT8), then ancilla 1's
    bit (``syndrome`` bit 0) and ancilla 3's (bit 1), a BIT_PACKED byte each."""
    if not (0 <= syndrome <= 3 and 0 <= round_ <= 255):
        raise ValueError(f"round must be 0..255 and syndrome 0..3, not {round_!r}, {syndrome!r}")
    return bytes([round_, syndrome & 1, syndrome >> 1])


def correction(syndrome: int) -> int | None:
    """The data qubit that a single X error flips to give ``syndrome`` (bit 0: ancilla 1 read
    1, bit 1: ancilla 3 read 1), or None for the trivial syndrome."""
    if syndrome not in _FLAGGED:
        raise ValueError(f"a syndrome is 2 bits, not {syndrome!r}")
    return _FLAGGED[syndrome]


class Decoder:
    """The decoder's state: the syndromes of each shot so far, a list per shot (round 0 starts
    a new one)."""

    def __init__(self) -> None:
        self.shots: list[list[int]] = []

    def __call__(self, round_: int, syndrome: int) -> int:
        """Decode round ``round_``'s ``syndrome`` (bit 0: ancilla 1, bit 1: ancilla 3): record
        it and return the data qubit to correct plus one, 0 for none. Raises
        :class:`ValueError` for a round out of order (not 0, nor the next of the shot)."""
        if round_ == 0:
            self.shots.append([])
        elif not self.shots or len(self.shots[-1]) != round_:
            done = len(self.shots[-1]) if self.shots else 0
            raise ValueError(f"round {round_} out of order: the shot has had {done} round(s)")
        self.shots[-1].append(syndrome)
        qubit = correction(syndrome)
        return 0 if qubit is None else qubit + 1


#: The decoder the handler serves (its history is this run's).
DECODER = Decoder()

#: The function table the real-time host serves for this program.
table = FunctionTable()


@table.host_call("decode", args=[TypeDesc.uint8(), TypeDesc.bits(1), TypeDesc.bits(1)],
                 results=[TypeDesc.uint8()])
def decode(round_: int, ancilla1: list[int], ancilla3: list[int]) -> int:
    """The ``decode`` HOST_CALL: the round (``r5``) and the two ancillas' bits (``r1``, ``r3``,
    one bit each); returns the data qubit to correct plus one, 0 for none (:class:`Decoder`)."""
    return DECODER(round_, ancilla1[0] | ancilla3[0] << 1)


def program() -> Program:
    """The assembled example program, for the simulation build of 5 qubits."""
    return assemble(SOURCE.read_text(), str(SOURCE), params=sim_params(qubits=5))
