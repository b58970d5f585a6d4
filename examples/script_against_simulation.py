"""Drive the simulated QSC from a plain script, through the same API as a board.

``openqlink.sim.SimulatedQSC`` starts the cocotb simulation of the QSC top in a child process
(``qlink sim --serve``) and is an ``openqlink.qsc.QSC`` whose frames travel to it over a local
socket. This script runs the active-reset example (``firmware/active_reset.s``) on it as
``examples/drive_qsc.py`` runs it on a board: connect and check the version, configure PPU 0's
QP and the host's ring, upload the envelope and the program with UC RDMA WRITEs, trigger it a
little ahead of the QSC's timeline, serve its CALL with the dispatcher (the handlers of
``firmware/active_reset.py``) while polling its status, and read its registers back.

    python examples/script_against_simulation.py [--build-dir build/sim]

The simulation runs some microseconds of simulated time per wall-clock second, so each
control-plane access takes a fraction of a second, and the whole run a minute or more (the
first run also elaborates and compiles the top). It prints the VERSION word, the final status,
the CALL's argument and result, and what the simulated qubit did.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from openqlink.dispatch import Dispatcher, SlotRing
from openqlink.isa import PPUState
from openqlink.isa.asm import assemble
from openqlink.memory_map import MAILBOX_BYTES
from openqlink.sim import SimulatedQSC
from openqlink.sim.handlers import default_handlers_path, load_function_table
from openqlink.wire.rpc import HEADER_BYTES, Request, Response

PROGRAM = Path(__file__).resolve().parents[1] / "firmware" / "active_reset.s"
#: How far ahead of the QSC's timeline the program starts (DTD cycles, 8 us at 250 MHz): the
#: trigger's RDMA WRITE must reach the PPU before then.
START_MARGIN_CYCLES = 2000


def run(build_dir: str | Path | None = None, *, run_limit_s: float = 900.0,
        pcap_path: str | Path | None = None) -> dict:
    """Run ``firmware/active_reset.s`` on a :class:`SimulatedQSC` and return what happened:
    ``version``, ``status`` (the final PPUStatus), ``registers`` (PPU 0's, read over the
    control plane), ``calls_answered`` (by this script's dispatcher), ``calls`` (request id ->
    ``{"args", "status", "result"}`` of each CALL, bytes) and ``simulation`` (the
    simulation's results: its channel events and measurements). Raises :class:`TimeoutError`
    when the PPU has not ended within ``run_limit_s`` seconds of wall-clock time."""
    calls: dict[int, dict] = {}      # request_id -> the CALL's argument and result bytes
    with SimulatedQSC(ppus=1, qubits=1, build_dir=build_dir, pcap_path=pcap_path) as qsc:
        program = assemble(PROGRAM.read_text(), filename=str(PROGRAM), params=qsc.params)
        table = load_function_table(default_handlers_path(PROGRAM))
        version = qsc.connect()
        ring = SlotRing(num_slots=8, slot_size=256)
        qsc.configure(0, ring)

        def send_response(slot: int, data: bytes) -> None:
            response = Response.unpack(data)
            calls[response.request_id].update(status=response.status, result=response.result)
            qsc.send_response(0, slot, data)

        dispatcher = Dispatcher(table, ring, send_response=send_response,
                                max_result_bytes=MAILBOX_BYTES - HEADER_BYTES)
        for env in program.envelopes.values():
            qsc.write_envelope(0, env.addr, env.samples)
        qsc.upload_program(0, program.to_bytes())
        qsc.trigger(0, qsc.timeline(0) + START_MARGIN_CYCLES, len(program.instructions))
        deadline = time.monotonic() + run_limit_s
        while True:
            qsc.poll_rx()          # the PPU's CALL requests -> ring slots
            for slot in filter(ring.ready, range(ring.num_slots)):   # note each CALL's args
                request = Request.unpack(ring.take(slot))
                calls[request.request_id] = {"args": request.payload}
            dispatcher.poll()      # ring slots -> HOST_CALL handler -> SEND responses
            status = qsc.status(0)  # one control-plane read: a fraction of a second here
            if status.state in (PPUState.DONE, PPUState.ERROR):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"PPU 0 did not end within {run_limit_s:g} s")
        registers = qsc.read_registers(0)
    return {"version": version, "status": status, "registers": registers,
            "calls_answered": dispatcher.processed, "calls": calls,
            "simulation": qsc.results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=Path, default=None,
                        help="the simulation's build directory [default: ./build/sim]")
    parser.add_argument("--pcap", type=Path, default=None,
                        help="write every frame on the simulated wire there")
    args = parser.parse_args()
    out = run(args.build_dir, pcap_path=args.pcap)
    regs = out["registers"]
    print(f"connected: version {out['version']:#010x}")
    print(f"final status: {out['status'].state.name}, {out['calls_answered']} CALL(s) answered")
    for call in out["calls"].values():
        print(f"reset_decision({call['args'].hex()}) -> status {call['status']}, result "
              f"{call['result'].hex()}: "
              f"R2 = {regs['R2']}, LAST_CALL_STATUS = {regs['LAST_CALL_STATUS']}, "
              f"CALL_COUNT = {regs['CALL_COUNT']}")
    sim = out["simulation"] or {}
    for ppu in sim.get("ppus", []):
        for m in ppu["measurements"]:
            print(f"measured qubit {m['qubit']} at DTD cycle {m['dtd_cycle']}: {m['outcome']} "
                  f"(P(1) {m['p1']:.3f}); P(1) at the end {ppu['qubits_final_p1'][0]:.4f}")


if __name__ == "__main__":
    main()
