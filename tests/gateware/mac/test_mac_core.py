"""openqlink.gateware.mac.core.RGMIIMAC: the interface the board top codes against, and its
parameter checks (the behaviour is tested on the Verilog in ``test_mac_cocotb.py``)."""

import pytest
from amaranth.back import verilog
from amaranth.lib import wiring

from openqlink.gateware.mac import RGMIIMAC, RX_COUNTERS, TX_COUNTERS
from openqlink.gateware.packet import packet_signature

pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")


@pytest.mark.parametrize("width", [8, 64])
def test_members(width):
    mac = RGMIIMAC(data_width_bits=width)
    members = mac.signature.members
    assert members["rx"] == wiring.Out(packet_signature(width))
    assert members["tx"] == wiring.In(packet_signature(width))
    for name in RX_COUNTERS + TX_COUNTERS:
        assert members[name] == wiring.Out(32)
    assert {n: (m.flow, m.shape) for n, m in members.items() if n.startswith("rgmii_")} == {
        "rgmii_rx_clk": (wiring.In, 1), "rgmii_rxd": (wiring.In, 4),
        "rgmii_rx_ctl": (wiring.In, 1), "rgmii_tx_clk": (wiring.Out, 1),
        "rgmii_txd": (wiring.Out, 4), "rgmii_tx_ctl": (wiring.Out, 1),
    }


def test_verilog_ports_use_rti_only():
    """The only domain the MAC leaves to its parent is ``rti``; ``eth_rx`` is its own."""
    text = verilog.convert(RGMIIMAC(counter_width=8), name="mac", emit_src=False)
    top = text[text.index("module mac("):]
    top = top[:top.index("endmodule")]
    assert "input rti_clk;" in top and "input rti_rst;" in top
    assert "eth_rx_clk" not in top.split(");")[0]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"data_width_bits": 12}, r"data_width_bits must be a positive multiple of 8, not 12"),
    ({"counter_width": 0}, r"counter_width must be a positive integer, not 0"),
    ({"ifg_bytes": 8}, r"ifg_bytes must be an integer >= 12, not 8"),
    ({"rx_fifo_depth": 24}, r"depth must be a power of 2 and at least 4, not 24"),
    ({"rx_delay_ns": -1.0}, r"rx_delay_ns must be between 0 and 3.175 ns, not -1.0"),
])
def test_parameter_checks(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RGMIIMAC(**kwargs)
