"""HOST_CALL handlers of the active-reset example (``firmware/active_reset.s``).

The PPU measures the qubit into ``r1`` and executes ``call reset_decision(r1:1) -> r2``: an RPC
whose single argument is one BIT_PACKED measurement bit (one byte, bit 0) and whose function_id
is ``fnv1a32("reset_decision")``. The dispatcher (:class:`openqlink.dispatch.Dispatcher`) finds
the handler in :data:`table`, calls it with the decoded bits and sends back one UINT8 result,
which the PPU's CALL unit places in ``r2`` (zero-extended). The program then plays a pi pulse
only when ``r2`` is 1.

Use it with::

    from firmware.active_reset import table
    dispatcher = Dispatcher(table, ring, send_response)

# Ref: docs/isa.md (CALL); cuda-quantum realtime message protocol (BIT_PACKED, UINT8 schema)
"""

from __future__ import annotations

from pathlib import Path

from openqlink.dispatch import FunctionTable, TypeDesc
from openqlink.isa import Program, assemble

__all__ = ["table", "reset_decision", "SOURCE", "program", "device_table", "RESET_DECISION_CUDA"]

#: The assembly source of the example.
SOURCE = Path(__file__).with_name("active_reset.s")

#: The function table the real-time host serves for this program.
table = FunctionTable()


@table.host_call("reset_decision", args=[TypeDesc.bits(1)], results=[TypeDesc.uint8()])
def reset_decision(bits: list[int]) -> int:
    """Decide whether the qubit needs the conditional pi pulse.

    ``bits`` holds the one measurement bit ACQUIRE wrote to ``r1``: 1 when the integrated
    readout signal exceeded the threshold, i.e. the qubit was found in ``|1>``. Returns 1 (play
    the pi pulse, taking ``|1>`` to ``|0>``) for a 1 and 0 (already in ``|0>``, do nothing) for
    a 0. Raises :class:`ValueError` for anything but exactly one 0/1 bit, which the dispatcher
    answers with status 1 (handler error), stopping the PPU with ``call_failed``.
    """
    if len(bits) != 1 or bits[0] not in (0, 1):
        raise ValueError(f"reset_decision expects one measurement bit, got {bits!r}")
    return 1 if bits[0] == 1 else 0


def program() -> Program:
    """The assembled example program (default QSC parameters)."""
    return assemble(SOURCE.read_text(), str(SOURCE))


#: The same decision as a DEVICE_CALL handler in CUDA C++, for the GPU unified dispatch kernel
#: (``qlink sim --gpu``): one BIT_PACKED byte in, one UINT8 out; status 1 for anything but a
#: single 0/1 bit, as the Python handler.
RESET_DECISION_CUDA = r'''
#include "openqlink_dispatch.cuh"
extern "C" __device__ int reset_decision(const void* in, void* out, uint32_t arg_len,
                                         uint32_t max_result_len, uint32_t* result_len) {
    if (arg_len != 1 || max_result_len < 1) return 1;
    const uint8_t bits = *static_cast<const uint8_t*>(in);
    if (bits & 0xFEu) return 1;                 // only bit 0 is a measurement
    *static_cast<uint8_t*>(out) = bits;         // 1: play the pi pulse; 0: nothing to do
    *result_len = 1;
    return 0;
}
'''


def device_table() -> FunctionTable:
    """The function table with ``reset_decision`` as a DEVICE_CALL (CUDA C++), for ``--gpu``."""
    from openqlink.gpu import CudaHandler

    gpu = FunctionTable()
    gpu.device_call("reset_decision", CudaHandler(RESET_DECISION_CUDA),
                    args=[TypeDesc.bits(1)], results=[TypeDesc.uint8()])
    return gpu
