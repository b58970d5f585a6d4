"""Board support: profiles of the boards the QSC is built for, the ECP5 PLL, the board tops.

``qlink build --board NAME`` (:mod:`openqlink.build`) elaborates :class:`BoardTop` for
:data:`PROFILES` ``[NAME]`` on its amaranth-boards platform. See ``docs/boards.md``.
"""

from .pll import ECP5PLL, PLLConfig, PLLOutput, ecp5_pll_config
from .profiles import PROFILES, BoardProfile, ClockTarget, MarkerPins, profile
from .top import BoardTop, SimBoardTop, VCCIOControl, board_system, sim_verilog

__all__ = [
    "BoardProfile", "ClockTarget", "MarkerPins", "PROFILES", "profile",
    "ECP5PLL", "PLLConfig", "PLLOutput", "ecp5_pll_config",
    "BoardTop", "SimBoardTop", "VCCIOControl", "board_system", "sim_verilog",
]
