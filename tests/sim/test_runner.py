"""openqlink.sim.runner: the Verilog given to Icarus, and the handlers file checks."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from openqlink.errors import DispatchError
from openqlink.sim.handlers import load_function_table
from openqlink.sim.runner import icarus_compatible

# The two forms Yosys's write_verilog gives Amaranth's combinational processes.
YOSYS_LIKE = r"""module top(y, z, a);
  reg \$auto$verilog_backend.cc:2355:dump_module$1  = 0;
  input [1:0] a;
  wire [1:0] a;
  output [3:0] y;
  reg [3:0] y;
  output z;
  reg z;
  always @*
    y[1:0] = 2'h1;
  always @* begin
    if (\$auto$verilog_backend.cc:2355:dump_module$1 ) begin end
    z = 1'h0;
    casez (a)
      2'h0:
          z = 1'h1;
    endcase
  end
  always @*
    y[3:2] = a;
endmodule
"""

TB = r"""module tb;
  wire [3:0] y; wire z;
  reg [1:0] a = 2'h0;   // holds its initial value: no event at time 0
  top dut(.y(y), .z(z), .a(a));
  initial begin #1 $display("%b %b", y[1:0], z); end
endmodule
"""


def test_constant_processes_become_initial_and_dump_module_toggles():
    text = icarus_compatible(YOSYS_LIKE)
    assert "initial y[1:0] = 2'h1;" in text
    assert "initial #0 \\$auto$verilog_backend.cc:2355:dump_module$1 = 1'h1;" in text
    assert "always @*\n    y[3:2] = a;" in text      # a process with an input is left alone


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="Icarus Verilog is not installed")
@pytest.mark.parametrize(("fixed", "expected"), [(False, "xx"), (True, "01 1")])
def test_icarus_evaluates_the_processes_at_time_0_only_when_fixed(tmp_path, fixed, expected):
    """Unfixed, the constant-only process never runs (y stays x); whether a process with inputs
    runs at time 0 is a race in Icarus (it did not in the QSC top: its outputs stayed x)."""
    src = tmp_path / "top.v"
    src.write_text((icarus_compatible(YOSYS_LIKE) if fixed else YOSYS_LIKE) + TB)
    subprocess.run(["iverilog", "-o", str(tmp_path / "a.out"), "-s", "tb", str(src)],
                   check=True, capture_output=True)
    out = subprocess.run(["vvp", "-n", str(tmp_path / "a.out")], check=True,
                         capture_output=True, text=True).stdout
    assert out.splitlines()[0].startswith(expected)


def test_handlers_file_without_table_is_refused(tmp_path):
    bad = tmp_path / "h.py"
    bad.write_text("x = 1\n")
    with pytest.raises(DispatchError, match="module-level `table`"):
        load_function_table(bad)
    with pytest.raises(DispatchError, match="device_table"):
        load_function_table(bad, gpu=True)
    with pytest.raises(DispatchError, match="device_table"):
        load_function_table(None, gpu=True)
