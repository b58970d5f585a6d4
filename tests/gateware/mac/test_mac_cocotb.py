"""RGMIIMAC's generated Verilog on Icarus against cocotbext-eth's RGMII source and sink (the
bench is ``mac_cocotb_bench.py``), for the network core's 64-bit stream and for 8 bits."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

pytest.importorskip("cocotbext.eth")
pytestmark = [
    pytest.mark.cocotb,
    pytest.mark.skipif(shutil.which("iverilog") is None, reason="Icarus Verilog is not installed"),
]

TOPLEVEL = "rgmii_mac"


def build(width: int, build_dir: Path) -> Path:
    from amaranth.back import verilog

    from openqlink.gateware.mac import RGMIIMAC
    from openqlink.sim.runner import icarus_compatible

    text = verilog.convert(RGMIIMAC(data_width_bits=width), name=TOPLEVEL, emit_src=False)
    path = build_dir / f"{TOPLEVEL}.v"
    path.write_text(icarus_compatible(text))
    return path


@pytest.mark.parametrize("width", [64, 8])
def test_rgmii_mac_against_cocotbext_eth(tmp_path, width):
    from cocotb_tools.runner import get_results, get_runner

    source = build(width, tmp_path)
    runner = get_runner("icarus")
    runner.log.setLevel(logging.ERROR)
    runner.build(sources=[source], hdl_toplevel=TOPLEVEL, build_dir=tmp_path,
                 timescale=("1ns", "1ps"), log_file=tmp_path / "build.log")
    results = tmp_path / "results.xml"
    try:
        runner.test(test_module="mac_cocotb_bench", hdl_toplevel=TOPLEVEL, build_dir=tmp_path,
                    test_dir=tmp_path, extra_env={"MAC_DATA_WIDTH": str(width)},
                    results_xml=str(results), log_file=tmp_path / "sim.log")
    except SystemExit:
        pass
    total, failed = get_results(results)
    log = (tmp_path / "sim.log").read_text(errors="replace")
    assert total == 7, log[-4000:]
    assert failed == 0, log[-8000:]
