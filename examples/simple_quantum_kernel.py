"""The NVQLink paper's first kernel, end to end on the simulated QSC.

The kernel (arXiv 2510.25213, "the NVQLink programming model") allocates a qubit, puts it in
superposition, measures it, and returns ``device_call(gpu_adder, i, r)``: the PPU sends the
measured bit and ``i`` to the real-time host, which runs ``gpu_adder(i, r) = i + r`` and
answers; the result lands in a PPU register, read back once the program is DONE.

The kernel is lowered through the simulation's calibration table to a PPU program; the library
API (:mod:`openqlink.nvqlink`) starts the cocotb simulation of the QSC in a child process
(``initialize("sim")``), uploads the program, triggers it and serves its CALL: in Python as a
HOST_CALL, or with ``--gpu`` as a DEVICE_CALL in the GPU dispatch kernel (``gpu_adder``
compiled by numba-cuda; needs the ``[gpu]`` extra and a CUDA GPU).

    python examples/simple_quantum_kernel.py [--i N] [--gpu] [--build-dir DIR]

It takes a minute or two (the first run also builds the simulation). The last line printed is
``device_call gpu_adder(i=<i>, readout=<bit>) = <value> [HOST_CALL]`` (``[DEVICE_CALL]``
with ``--gpu``). With ``--gpu`` and no GPU it prints why on one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import openqlink
from openqlink import nvqlink
from openqlink.errors import GPUUnavailableError


def gpu_adder(i: int, r: int) -> int:
    """The real-time host's side of the kernel's ``device_call``: ``i + r``."""
    return i + r


@openqlink.kernel
def simple_kernel(i: int):
    q = openqlink.qubit()
    openqlink.h(q)
    r = openqlink.mz(q)
    return openqlink.device_call(gpu_adder, i, r)


def run(i: int = 1, *, gpu: bool = False, build_dir: str | Path | None = None,
        seed: int = 1, verilog_path: str | Path | None = None) -> dict:
    """Run the kernel once with ``i`` on a new simulated QSC; return ``value``, ``readout``
    (the measured bit, read from its register), ``mode`` (HOST_CALL or DEVICE_CALL),
    ``assembly`` (the compiled program), ``calls`` and ``simulation`` (the simulation's
    results: its measurements). ``verilog_path``: the top's Verilog made beforehand by ``qlink
    verilog --sim`` (on a GPU host without Yosys). Raises
    :class:`~openqlink.errors.GPUUnavailableError` with ``gpu`` where there is no CUDA GPU."""
    if gpu:
        from openqlink.gpu import gpu_available

        ok, why = gpu_available()
        if not ok:      # before the simulation starts: a minute saved
            raise GPUUnavailableError(f"--gpu: no CUDA GPU: {why}")
    device = nvqlink.initialize("sim", qubits=1, build_dir=build_dir, seed=seed, gpu=gpu,
                                verilog_path=verilog_path)
    try:
        handle = nvqlink.load_kernel(simple_kernel)
        value = nvqlink.launch_kernel(handle, i)
        launch = device.last_launch
        assert launch is not None and launch.compiled is not None
    finally:
        nvqlink.shutdown()
    return {"value": value, "readout": launch.measurements["r"], "mode": launch.mode,
            "assembly": launch.compiled.assembly, "calls": launch.calls,
            "simulation": device.simulation_results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--i", type=int, default=1, help="the kernel's argument [1]")
    parser.add_argument("--gpu", action="store_true",
                        help="serve gpu_adder on the GPU (DEVICE_CALL) instead of in Python")
    parser.add_argument("--build-dir", type=Path, default=None,
                        help="the simulation's build directory [./build/sim]")
    parser.add_argument("--verilog", type=Path, default=None,
                        help="the top's Verilog from `qlink verilog --sim` (a host without "
                             "Yosys)")
    args = parser.parse_args(argv)
    try:
        out = run(args.i, gpu=args.gpu, build_dir=args.build_dir, verilog_path=args.verilog)
    except GPUUnavailableError as exc:
        print(f"simple_quantum_kernel: {exc}", file=sys.stderr)
        return 2
    print(out["assembly"], end="")
    for call in out["calls"]:
        print(f"CALL {call['name']}: args {call['args'].hex()} -> status {call.get('status')}, "
              f"result {call.get('result', b'').hex()}")
    print(f"device_call gpu_adder(i={args.i}, readout={out['readout']}) = {out['value']} "
          f"[{out['mode']}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
