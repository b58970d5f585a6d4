"""Replay bench: captured frames into the simulated QSC, each frame's verdict, the regions after.

Started by :func:`openqlink.sim.runner.run_inject` (``qlink sim --inject FILE.pcap``). The bench
configures the QSC as :func:`openqlink.sim.info.sim_info` describes for the run configuration
(the host's addresses, each QP's peer QPN, the R_Keys, the expected PSN), then drives the
capture's frames into the QSC's receive port back to back (``gap_cycles`` idle rti cycles
between frames; 3, the preamble and inter-frame gap of a 10 Gb/s MAC at 64 bits, is line rate)
and records for each frame the receiver's verdict: accepted, or the drop counter that counted
it.

The verdicts are read where the gateware counts them: the receiver's counter strobes
(``net.rx.count``: in the cycle it decides on a frame, RX_FRAMES and, for a dropped frame, the
one drop counter of the first check it failed) and every counter source
(``net.regs.inc``) for the counters' increments during the replay. The receiver decides on
frames in the order they arrive, so the ``k``-th decision after the replay starts is the
capture's frame ``k``: the bench sends nothing of its own until every frame has its verdict.

After the replay the bench reads the counters through the control plane and each region of each
configured QP: the instruction ring and envelope memory from the simulator's memories (the
block RAMs' contents, laid out as :class:`openqlink.gateware.ppu.core` slices them: memory
``<name>k`` holds bytes ``k*L .. k*L+L-1`` of each word, each byte in 8 bits or, with a flag
bit, 9), the register block and the response mailbox through the control plane (RD_BLOCK).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import cocotb
from cocotb.task import bridge, resume
from cocotb.triggers import RisingEdge, Timer

from ..memory_map import COUNTERS, QSCParams
from ..pcap import read_pcap
from ..qsc import QSC
from .bench import TB
from .info import configure_extra_qps, region_rkeys, sim_info

__all__ = ["replay_capture", "read_region_memory", "SLICE_BITS"]

#: Width of one block-RAM slice of a memory deeper than 512 words (the PPU core's
#: ``_SLICE_BITS``); shallower memories are one slice of the whole word.
SLICE_BITS = 16
#: Index of RX_FRAMES and the drop counters among the counter strobes.
_INDEX = {name: i for i, (name, _) in enumerate(COUNTERS)}
_DROPS = [(i, name) for i, (name, _) in enumerate(COUNTERS) if name.startswith("DROP_")]


def _bits(value) -> int:
    """A handle's value as an integer, X and Z bits as 0."""
    text = str(value).lower().replace("x", "0").replace("z", "0")
    return int(text, 2) if text else 0


def read_region_memory(ppu_handle, name: str, width_bits: int, depth: int,
                       *, flagged: bool) -> bytes:
    """The bytes of the sliced memory ``name`` (``imem``, ``env``) in a PPU's Verilog.

    ``width_bits``: the memory's word width (128 for the instruction ring, 64 for the envelope
    memory); ``depth``: its words; ``flagged``: each byte is stored with a flag bit (9 bits).
    Returns ``depth * width_bits // 8`` bytes, word 0 first, each word's byte 0 first (the
    order of the bus's byte lanes, which is the order of the region's VAs).
    """
    slice_bits = SLICE_BITS if depth > 512 else width_bits
    lanes = slice_bits // 8
    unit = 9 if flagged else 8
    words = [bytearray(width_bits // 8) for _ in range(depth)]
    for k in range(width_bits // slice_bits):
        mem = getattr(ppu_handle, f"{name}{k}")
        for addr in range(depth):
            stored = _bits(mem[addr].value)
            for g in range(lanes):
                words[addr][k * lanes + g] = (stored >> (g * unit)) & 0xFF
    return b"".join(words)


class ReplayBench(TB):
    """The system bench with the replay's host session (configure, replay, read back)."""

    def __init__(self, dut, cfg: dict):
        super().__init__(dut, cfg)
        self.num_configured: int = cfg["num_configured"]
        self.info = sim_info(self.params, self.num_configured, cfg)
        self.frames = [frame for _, frame in read_pcap(cfg["inject"])]
        self.gap_cycles: int = cfg["gap_cycles"]
        self.verdicts: list[dict] = []
        self.increments = [0] * len(COUNTERS)
        self._counting = False

    async def _monitor(self) -> None:
        """Sample the counter strobes every rti cycle (each is high for one cycle)."""
        dut = self.dut
        count = dut.net.rx.count
        inc = dut.net.regs.inc
        n = len(COUNTERS)
        sources = len(inc) // n
        while True:
            await RisingEdge(dut.rti_clk)
            if not self._counting:
                continue
            strobes = _bits(count.value)
            if strobes >> _INDEX["RX_FRAMES"] & 1:
                reason = next((name for i, name in _DROPS if strobes >> i & 1), None)
                self.verdicts.append({"index": len(self.verdicts), "accepted": reason is None,
                                      "reason": reason})
            incs = _bits(inc.value)
            if incs:
                for s in range(sources):
                    word = incs >> (s * n) & ((1 << n) - 1)
                    for i in range(n):
                        self.increments[i] += word >> i & 1

    @resume
    async def _replay(self) -> None:
        """Send every frame and wait until each has its verdict, then let the QSC settle
        (replies, bus commands)."""
        wait_limit_ns = self.cfg["max_run_ns"]
        self.source.ifg_cycles = self.gap_cycles
        self._counting = True
        for frame in self.frames:
            self.source.send(frame)
        waited = 0
        while len(self.verdicts) < len(self.frames):
            await Timer(1, "us")
            waited += 1000
            if waited > wait_limit_ns + len(self.frames) * 2000:
                missing = len(self.verdicts)
                raise RuntimeError(
                    f"frame {missing} of the capture got no verdict within {waited // 1000} us "
                    f"of simulated time ({missing} of {len(self.frames)} decided): the receive "
                    "path did not take or decide it")
        await Timer(4, "us")
        self._counting = False

    @resume
    async def _set_epsn(self, epsn: int) -> None:
        """Start every configured QP at ePSN ``epsn``: the receiver's per-QP expected PSN
        register, set in the simulator (as if the QP had received PSN ``epsn - 1``)."""
        handle = self.dut.net.rx.epsn
        value = _bits(handle.value)
        for n in (qp["qp"] for qp in self.info["qps"]):
            value = value & ~(0xFF_FFFF << (24 * n)) | epsn << (24 * n)
        handle.value = value
        await RisingEdge(self.dut.rti_clk)

    def _dump(self, qsc: QSC) -> dict[str, bytes]:
        """Every configured region's bytes after the replay."""
        params: QSCParams = self.params
        out: dict[str, bytes] = {}
        for region in self.info["regions"]:
            n, name = region["ppu"], region["name"]
            part = name.split("_", 1)[1]
            ppu = getattr(self.dut.ppus, f"ppu{n}")
            if part == "imem":
                data = read_region_memory(ppu, "imem", 128, params.imem_depth, flagged=False)
            elif part == "env":
                data = read_region_memory(ppu, "env", 64, params.env_depth // 4, flagged=True)
            else:
                va, length = region["va"], region["length"]
                words = qsc.control.read_block(range(va, va + length, 4))
                data = b"".join(w.to_bytes(4, "little") for w in words)
            if len(data) != region["length"]:
                raise RuntimeError(f"region {name}: read {len(data)} bytes, it has "
                                   f"{region['length']}")
            out[name] = data
        return out

    def replay_session(self) -> dict:
        cfg = self.cfg
        qsc = QSC(self.transport, params=self.params, host_mac=cfg["host_mac"],
                  host_ip=cfg["host_ip"], pmtu_bytes=cfg["pmtu"])
        qsc.connect()
        for qp in self.info["qps"][:self.num_configured]:
            n = qp["ppu"]
            keys = region_rkeys(self.params, n, cfg)
            qsc.configure(n, host_qpn=qp["peer_qpn"], ring_rkey=keys.ring,
                          imem_rkey=keys.imem, env_rkey=keys.env, regs_rkey=keys.regs)
        configure_extra_qps(qsc, self.info)
        if cfg.get("epsn"):
            self._set_epsn(cfg["epsn"])
        contexts = [qsc.read_qp_context(qp["qp"]) for qp in self.info["qps"]]
        self._replay()
        counters = qsc.counters()
        regions = self._dump(qsc)
        return {"counters": counters, "regions": {k: v.hex() for k, v in regions.items()},
                "qp_contexts": contexts}


@cocotb.test()
async def replay_capture(dut):
    """Configure the QSC, replay the capture, write the verdicts, counters and regions."""
    cfg = json.loads(Path(os.environ["OPENQLINK_SIM_CONFIG"]).read_text())
    tb = ReplayBench(dut, cfg)
    await tb.reset()
    cocotb.start_soon(tb._monitor())
    host = await bridge(tb.replay_session)()
    await Timer(1, "us")
    results = {
        "config": tb.info,
        "frames": tb.verdicts,
        "counters": host["counters"],
        "replay_counters": {name: tb.increments[i] for i, (name, _) in enumerate(COUNTERS)},
        "qp_contexts": host["qp_contexts"],
        "regions": host["regions"],
        "gap_cycles": tb.gap_cycles,
    }
    if tb.pcap is not None:
        tb.pcap.close()
    Path(cfg["results"]).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
