"""Drive a QSC board from Python over plain Ethernet: the host side of `qlink sim`, without it.

The same calls the cocotb bench makes (``openqlink/sim/bench.py``), against a board on a LAN
interface: connect and check the version, configure the QP contract and the host ring, upload
the envelopes and the program with UC RDMA WRITEs, trigger it atomically at a DTD time a little
in the future, then serve its CALLs with the dispatcher while polling its status.

    sudo python examples/drive_qsc.py --iface enp1s0 firmware/active_reset.s   # raw bridge
    python examples/drive_qsc.py --bridge udp firmware/active_reset.s          # no root

The host side is the bridge named by ``--bridge`` (``openqlink.bridges``): ``raw`` builds and
parses the RoCEv2 UC packets in this process (AF_PACKET on ``--iface``, so it needs root or
CAP_NET_RAW); ``udp`` uses the kernel's UDP sockets and takes the CALLs as UDP datagrams (the
QP's UDP transport); ``verbs`` runs the UC QP on a RoCE NIC through pyverbs. The QSC learns the
host's MAC and IP from the control plane.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from openqlink.dispatch import Dispatcher, SlotRing
from openqlink.errors import ControlPlaneError, QlinkError
from openqlink.isa import PPUState
from openqlink.isa.asm import assemble
from openqlink.memory_map import MAILBOX_BYTES, QSCParams
from openqlink.qsc import QSC
from openqlink.sim.handlers import default_handlers_path, load_function_table
from openqlink.wire.rpc import HEADER_BYTES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program", type=Path, help="PPU assembly (handlers: the .py beside it)")
    parser.add_argument("--bridge", choices=("raw", "udp", "verbs"), default="raw",
                        help="how this host reaches the board (default raw)")
    parser.add_argument("--iface", help="network interface facing the board (raw bridge)")
    parser.add_argument("--host-ip", default=None,
                        help="this host's address towards the board (default: the interface's "
                        "or the route's)")
    parser.add_argument("--qsc-ip", default=QSCParams().ip)
    parser.add_argument("--qsc-mac", default=QSCParams().mac)
    parser.add_argument("--start-margin-us", type=float, default=1000.0,
                        help="how far ahead of the board's timeline to start the program")
    parser.add_argument("--timeout-s", type=float, default=5.0)
    args = parser.parse_args()

    params = QSCParams(ip=args.qsc_ip, mac=args.qsc_mac)
    program = assemble(args.program.read_text(), filename=str(args.program), params=params)
    table = load_function_table(default_handlers_path(args.program))

    if args.bridge == "raw" and args.iface is None:
        parser.error("the raw bridge needs --iface")
    try:
        qsc = QSC(bridge=args.bridge, interface=args.iface, host_ip=args.host_ip,
                  params=params, qsc_ip=args.qsc_ip, qsc_mac=args.qsc_mac)
    except (QlinkError, OSError) as exc:
        raise SystemExit(f"drive_qsc: {exc}") from None
    with qsc:
        try:
            version = qsc.connect()
        except ControlPlaneError as exc:
            raise SystemExit(f"drive_qsc: no QSC answered at {args.qsc_ip} over the "
                             f"{args.bridge} bridge: {exc}") from None
        print(f"connected: version {version:#010x}")
        ring = SlotRing(num_slots=8, slot_size=256)
        qsc.configure(0, ring)
        # Each response is one SEND into the PPU's 64-byte mailbox.
        dispatcher = Dispatcher(table, ring,
                                send_response=lambda slot, data: qsc.send_response(0, slot, data),
                                max_result_bytes=MAILBOX_BYTES - HEADER_BYTES)
        for env in program.envelopes.values():
            qsc.write_envelope(0, env.addr, env.samples)
        qsc.upload_program(0, program.to_bytes())
        margin = round(args.start_margin_us * 1e-6 * params.dtd_clk_hz)
        start = qsc.timeline(0) + margin
        qsc.trigger(0, start, len(program.instructions))
        deadline = time.monotonic() + args.timeout_s
        next_status = 0.0
        while time.monotonic() < deadline:
            qsc.poll_rx()          # RPC requests -> ring slots
            dispatcher.poll()      # ring slots -> HOST_CALL handlers -> SEND responses
            if time.monotonic() >= next_status:
                status = qsc.status(0)
                if status.state in (PPUState.DONE, PPUState.ERROR):
                    break
                next_status = time.monotonic() + 0.01
        else:
            raise SystemExit(f"timed out after {args.timeout_s} s")
        print(f"final status: {status.state.name}, processed {dispatcher.processed} calls")
        for name, value in qsc.counters().items():
            if value:
                print(f"  {name:20s} {value}")


if __name__ == "__main__":
    main()
