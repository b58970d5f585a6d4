"""cocotb bench of :class:`openqlink.gateware.mac.RGMIIMAC` (simulation build, generated Verilog)
against cocotbext-eth's RGMII source (the PHY's receive side) and sink (its transmit side).

Run by ``test_mac_cocotb.py``; ``MAC_DATA_WIDTH`` names the width the Verilog was built for.
"""

from __future__ import annotations

import os
import random
import struct
import zlib

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, Timer
from cocotb.utils import get_sim_time
from cocotbext.eth import GmiiFrame, RgmiiSink, RgmiiSource

WIDTH = int(os.environ.get("MAC_DATA_WIDTH", "64"))
NBYTES = WIDTH // 8
# Offsets of the packet beat's fields in the flattened payload (data, keep, first, last, error).
KEEP_AT, FIRST_AT = WIDTH, WIDTH + NBYTES
LAST_AT, ERROR_AT = FIRST_AT + 1, FIRST_AT + 2
PERIOD_NS = 8


def fcs(frame: bytes) -> bytes:
    return struct.pack("<I", zlib.crc32(frame))


def padded(frame: bytes) -> bytes:
    return frame + bytes(max(0, 60 - len(frame)))


class TB:
    """Clocks, reset, the RGMII models, a monitor of ``rx`` and a driver of ``tx``."""

    def __init__(self, dut, *, rx_phase_ns: float = 3.0):
        self.dut = dut
        self.rx_phase_ns = rx_phase_ns
        self.rx_packets: list[tuple[bytes, int]] = []
        self.rx_ready_prob = 1.0
        self.rng = random.Random(1)
        dut.rti_rst.value = 1
        dut.rx__ready.value = 1
        dut.tx__valid.value = 0
        dut.tx__payload.value = 0
        self.source = RgmiiSource(dut.rgmii_rxd, dut.rgmii_rx_ctl, dut.rgmii_rx_clk,
                                  dut.rti_rst)
        self.sink = RgmiiSink(dut.rgmii_txd, dut.rgmii_tx_ctl, dut.rgmii_tx_clk, dut.rti_rst)

    async def reset(self) -> None:
        cocotb.start_soon(Clock(self.dut.rti_clk, PERIOD_NS, unit="ns").start())
        await Timer(self.rx_phase_ns, unit="ns")
        cocotb.start_soon(Clock(self.dut.rgmii_rx_clk, PERIOD_NS, unit="ns").start())
        self.dut.rti_rst.value = 1
        await ClockCycles(self.dut.rti_clk, 10)
        self.dut.rti_rst.value = 0
        await ClockCycles(self.dut.rti_clk, 10)
        cocotb.start_soon(self._monitor_rx())

    async def _monitor_rx(self) -> None:
        cur = bytearray()
        while True:
            ready = self.rng.random() < self.rx_ready_prob
            self.dut.rx__ready.value = int(ready)
            await RisingEdge(self.dut.rti_clk)
            if not (int(self.dut.rx__valid.value) and ready):
                continue
            beat = int(self.dut.rx__payload.value)
            keep = (beat >> KEEP_AT) & ((1 << NBYTES) - 1)
            first, last = (beat >> FIRST_AT) & 1, (beat >> LAST_AT) & 1
            assert first == (len(cur) == 0), "first out of place"
            count = keep.bit_length()
            assert keep == (1 << count) - 1 and (last or count == NBYTES), f"keep {keep:#x}"
            cur += (beat & ((1 << WIDTH) - 1)).to_bytes(NBYTES, "little")[:count]
            if last:
                self.rx_packets.append((bytes(cur), (beat >> ERROR_AT) & 1))
                cur = bytearray()

    async def send_tx(self, frame: bytes, *, error: int = 0) -> None:
        """Offer ``frame`` on ``tx`` beat after beat (valid held until ready)."""
        chunks = [frame[i:i + NBYTES] for i in range(0, len(frame), NBYTES)]
        for i, c in enumerate(chunks):
            last = i == len(chunks) - 1
            value = int.from_bytes(c, "little") | ((1 << len(c)) - 1) << KEEP_AT
            value |= int(i == 0) << FIRST_AT | int(last) << LAST_AT | (error & last) << ERROR_AT
            self.dut.tx__payload.value = value
            self.dut.tx__valid.value = 1
            while True:
                await RisingEdge(self.dut.rti_clk)
                if int(self.dut.tx__ready.value):
                    break
        self.dut.tx__valid.value = 0

    async def wait_rx(self, count: int, timeout_cycles: int = 50000) -> None:
        for _ in range(timeout_cycles):
            if len(self.rx_packets) >= count:
                return
            await RisingEdge(self.dut.rti_clk)
        raise AssertionError(f"{len(self.rx_packets)} of {count} frames received")


def bad_fcs_frame(payload: bytes) -> GmiiFrame:
    body = padded(payload)
    check = bytearray(fcs(body))
    check[0] ^= 0x01
    return GmiiFrame.from_raw_payload(body + bytes(check))


def random_payload(rng: random.Random, n: int) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(n))


@cocotb.test()
async def rx_good_and_bad_fcs(dut):
    """Frames from the RGMII source arrive byte for byte; a bad FCS ends its frame with error."""
    tb = TB(dut)
    await tb.reset()
    rng = random.Random(2)
    payloads = [random_payload(rng, n) for n in (60, 64, 100, 1500, 61, 333, 64)]
    bad = {1, 3, 5}
    for k, p in enumerate(payloads):
        await tb.source.send(bad_fcs_frame(p) if k in bad else GmiiFrame.from_payload(p))
    await tb.wait_rx(len(payloads))
    await ClockCycles(dut.rti_clk, 20)
    assert [d for d, _ in tb.rx_packets] == [padded(p) for p in payloads]
    assert [e for _, e in tb.rx_packets] == [int(k in bad) for k in range(len(payloads))]
    assert int(dut.rx_frames.value) == len(payloads)
    assert int(dut.rx_fcs_errors.value) == len(bad)
    assert int(dut.rx_overflows.value) == 0


@cocotb.test()
async def rx_back_to_back_line_rate(dut):
    """Frames at 1 Gb/s with the minimum 12-byte gap: every byte arrives, none lost."""
    tb = TB(dut, rx_phase_ns=5.5)
    await tb.reset()
    rng = random.Random(3)
    payloads = [random_payload(rng, rng.choice((60, 64, 65, 128, 511, 1514))) for _ in range(24)]
    tb.source.ifg = 12
    for p in payloads:
        await tb.source.send(GmiiFrame.from_payload(p))
    await tb.wait_rx(len(payloads))
    await ClockCycles(dut.rti_clk, 20)
    assert tb.rx_packets == [(padded(p), 0) for p in payloads]
    assert int(dut.rx_overflows.value) == 0


@cocotb.test()
async def rx_er_and_runt_are_flagged(dut):
    """RX_ER during a frame and a runt (good FCS, 50 bytes) end their frames with error."""
    tb = TB(dut)
    await tb.reset()
    rng = random.Random(4)
    good, with_er = random_payload(rng, 80), random_payload(rng, 80)
    frame = GmiiFrame.from_payload(with_er)
    frame.error = [0] * len(frame.data)
    frame.error[30] = 1
    runt_body = random_payload(rng, 46)
    runt = GmiiFrame.from_raw_payload(runt_body + fcs(runt_body))
    for f in (GmiiFrame.from_payload(good), frame, runt, GmiiFrame.from_payload(good)):
        await tb.source.send(f)
    await tb.wait_rx(4)
    await ClockCycles(dut.rti_clk, 20)
    assert [e for _, e in tb.rx_packets] == [0, 1, 1, 0]
    assert tb.rx_packets[0][0] == tb.rx_packets[3][0] == good
    assert int(dut.rx_phy_errors.value) == 1 and int(dut.rx_runts.value) == 1
    assert int(dut.rx_fcs_errors.value) == 0


@cocotb.test()
async def rx_stalled_consumer_drops_and_counts(dut):
    """A consumer that is ready one cycle in 40 loses frames, but every frame delivered without
    error is byte-exact, and each loss is counted."""
    tb = TB(dut)
    await tb.reset()
    tb.rx_ready_prob = 1 / 40
    rng = random.Random(5)
    payloads = [random_payload(rng, 200) for _ in range(6)]
    for p in payloads:
        await tb.source.send(GmiiFrame.from_payload(p))
    await tb.source.wait()
    await ClockCycles(dut.rti_clk, 400)
    tb.rx_ready_prob = 1.0
    await ClockCycles(dut.rti_clk, 400)
    good = [d for d, e in tb.rx_packets if not e]
    assert int(dut.rx_overflows.value) > 0
    assert all(g in [padded(p) for p in payloads] for g in good)
    assert len(good) + int(dut.rx_overflows.value) == len(payloads)


@cocotb.test()
async def tx_frames_to_rgmii_sink(dut):
    """Frames offered on ``tx`` back to back leave with preamble, padding and a good FCS, at
    line rate with exactly the 12-byte minimum gap."""
    tb = TB(dut)
    await tb.reset()
    rng = random.Random(6)
    payloads = [random_payload(rng, n) for n in (64, 14, 1500, 60, 61, 100, 59, 256)]
    for p in payloads:
        await tb.send_tx(p)
    frames = [await tb.sink.recv() for _ in payloads]
    for p, f in zip(payloads, frames, strict=True):
        assert f.get_preamble() == bytes([0x55] * 7 + [0xD5])
        assert bytes(f.get_payload()) == padded(p)
        assert bytes(f.get_fcs()) == fcs(padded(p))
        assert f.check_fcs()
        assert f.error is None
    gaps = [round((b.sim_time_start - a.sim_time_end) / 1000) for a, b in zip(frames, frames[1:],
                                                                            strict=False)]
    assert gaps == [12 * PERIOD_NS] * (len(frames) - 1), gaps
    assert int(dut.tx_frames.value) == len(payloads)


@cocotb.test()
async def loopback_through_the_wire_models(dut):
    """What the MAC sends, fed back by the RGMII source, comes out of ``rx`` unchanged."""
    tb = TB(dut)
    await tb.reset()
    rng = random.Random(7)
    payloads = [random_payload(rng, n) for n in (80, 1000, 20)]
    for p in payloads:
        await tb.send_tx(p)
    for _ in payloads:
        frame = await tb.sink.recv()
        await tb.source.send(GmiiFrame(frame.data))
    await tb.wait_rx(len(payloads))
    assert tb.rx_packets == [(padded(p), 0) for p in payloads]


@cocotb.test()
async def latency_cycles(dut):
    """Receive: last FCS nibble on RXD -> last beat on ``rx``; transmit: first beat offered on
    ``tx`` -> first preamble nibble sampled by the sink. Bounds of the MAC's docstring."""
    tb = TB(dut, rx_phase_ns=4.0)
    await tb.reset()
    ends: list[int] = []
    rx_seen: list[int] = []
    payload = random_payload(random.Random(8), 100)
    frame = GmiiFrame.from_payload(payload, tx_complete=lambda f: ends.append(f.sim_time_end))

    async def watch_last():
        while True:
            await RisingEdge(dut.rti_clk)
            beat = int(dut.rx__payload.value)
            if int(dut.rx__valid.value) and (beat >> LAST_AT) & 1:
                rx_seen.append(get_sim_time("ns"))
                return

    watcher = cocotb.start_soon(watch_last())
    await tb.source.send(frame)
    await tb.wait_rx(1)
    await watcher
    rx_cycles = (rx_seen[0] - ends[0] / 1000) / PERIOD_NS
    await RisingEdge(dut.rti_clk)
    offered = get_sim_time("ns")
    await tb.send_tx(payload)
    sent = await tb.sink.recv()
    # send_tx drives valid after the edge at ``offered``: the MAC sees it at the next edge. The
    # sink stamps a frame after the falling edge that follows the sampling edge (+4 ns).
    tx_cycles = (sent.sim_time_start / 1000 - 4 - offered) / PERIOD_NS - 1
    dut._log.info("latency: receive %.1f cycles, transmit %.1f cycles", rx_cycles, tx_cycles)
    assert rx_cycles <= (8.5 if WIDTH == 64 else 7.5), rx_cycles
    assert tx_cycles == (5 if WIDTH == 64 else 3), tx_cycles
