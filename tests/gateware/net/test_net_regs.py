"""Tests of openqlink.gateware.net.regs: NetRegisters against openqlink.memory_map."""

import gc
import random
import warnings

import pytest
from amaranth.hdl import ResetInserter, Signal, UnusedElaboratable
from amaranth.sim import Simulator

from openqlink.gateware.net.common import COUNTER_INDEX
from openqlink.gateware.net.regs import (
    CONTROL_PLANE_REGISTERS,
    COUNTER_LAG_CYCLES,
    NUM_COUNTERS,
    NUM_QP_COUNTERS,
    READ_LATENCY_CYCLES,
    REGISTER_WIDTHS,
    NetRegisters,
    qp_counter_lag_cycles,
)
from openqlink.isa.layout import ISA_VERSION
from openqlink.memory_map import (
    COUNTERS,
    GLOBAL_REGISTERS,
    QP_COUNTERS,
    QP_REGISTERS,
    Access,
    QSCParams,
    counter_addr,
    global_reg,
    qp_reg,
    version_word,
)
from openqlink.wire.ethernet import mac_to_int
from openqlink.wire.ipv4 import ip_to_int

PARAMS = QSCParams(num_ppus=3, qpn_base=0x200, mac="02:11:22:33:44:55", ip="10.1.2.3")


def simulate(testbench, params=PARAMS, **kw):
    dut = NetRegisters(params, **kw)
    sim = Simulator(dut)
    sim.add_clock(6.4e-9)

    async def bench(ctx):
        await testbench(ctx, dut)

    sim.add_testbench(bench)
    sim.run()


async def write(ctx, dut, addr, value):
    # the address is decoded into a register: it comes a cycle before the write strobe
    ctx.set(dut.port.addr, addr)
    ctx.set(dut.port.w_data, value)
    await ctx.tick()
    ctx.set(dut.port.w_en, 1)
    await ctx.tick()
    ctx.set(dut.port.w_en, 0)


async def read(ctx, dut, addr):
    ctx.set(dut.port.addr, addr)
    for _ in range(READ_LATENCY_CYCLES):
        await ctx.tick()
    return ctx.get(dut.port.hit), ctx.get(dut.port.r_data)


def test_reset_values_and_config():
    async def tb(ctx, dut):
        assert await read(ctx, dut, global_reg("VERSION")) == (1, version_word(ISA_VERSION))
        assert await read(ctx, dut, global_reg("NUM_PPUS")) == (1, 3)
        assert await read(ctx, dut, global_reg("NUM_QPS")) == (1, 4)       # max(4, num_ppus)
        assert await read(ctx, dut, global_reg("QSC_MAC_HI")) == (1, 0x0211)
        assert await read(ctx, dut, global_reg("QSC_MAC_LO")) == (1, 0x22334455)
        assert await read(ctx, dut, global_reg("QSC_IP")) == (1, ip_to_int("10.1.2.3"))
        for reg in GLOBAL_REGISTERS:
            if reg.name in CONTROL_PLANE_REGISTERS:        # not decoded here
                assert (await read(ctx, dut, global_reg(reg.name)))[0] == 0, reg.name
            elif reg.name not in ("VERSION", "NUM_PPUS", "NUM_QPS", "QSC_MAC_HI",
                                  "QSC_MAC_LO", "QSC_IP"):
                assert await read(ctx, dut, global_reg(reg.name)) == (1, reg.reset), reg.name
        for n in range(4):
            assert await read(ctx, dut, qp_reg(n, "QSC_QPN")) == (1, 0x200 + n)
            # PPU n's own QP reaches PPU n, the extra QP PPU 0
            assert await read(ctx, dut, qp_reg(n, "PPU")) == (1, n if n < 3 else 0)
            for reg in QP_REGISTERS:
                if reg.name not in ("QSC_QPN", "PPU"):
                    assert await read(ctx, dut, qp_reg(n, reg.name)) == (1, reg.reset), reg.name
            for name, _ in QP_COUNTERS:
                assert await read(ctx, dut, qp_reg(n, name)) == (1, 0), name
        cfg = ctx.get(dut.config)
        assert cfg.qsc_mac == mac_to_int("02:11:22:33:44:55")
        assert cfg.qsc_ip == ip_to_int("10.1.2.3")
        # closed from reset: RDMA receive off, no region's R_Key valid
        assert cfg.p_key == 0xFFFF and cfg.udp_src_port == 0xC000 and cfg.rx_enable == 0
        qp = ctx.get(dut.qp)
        assert qp[2].num_slots == 8 and qp[2].slot_size == 256
        for n in range(4):
            assert (qp[n].imem_rkey_valid, qp[n].env_rkey_valid, qp[n].regs_rkey_valid) == \
                (0, 0, 0)
            assert (qp[n].qsc_qpn, qp[n].response_bytes) == (0x200 + n, 64)
            assert qp[n].ppu == (n if n < 3 else 0)

    simulate(tb)


def test_the_qsc_qpn_and_response_size_are_the_hosts_to_set():
    """QSC_QPN (a GPU bridge's remote QP, e.g. 0x2) and RESPONSE_BYTES: 24 and 13 bits, each
    QP its own, reaching the QP context."""
    async def tb(ctx, dut):
        await write(ctx, dut, qp_reg(1, "QSC_QPN"), 0xFF00_0002)
        await write(ctx, dut, qp_reg(1, "RESPONSE_BYTES"), 0xFFFF_0000 | 24 + 256)
        assert await read(ctx, dut, qp_reg(1, "QSC_QPN")) == (1, 0x2)
        assert await read(ctx, dut, qp_reg(1, "RESPONSE_BYTES")) == (1, (24 + 256) & 0x1FFF)
        await ctx.tick()
        qp = ctx.get(dut.qp)
        assert [q.qsc_qpn for q in qp] == [0x200, 0x2, 0x202, 0x203]
        assert [q.response_bytes for q in qp] == [64, 280, 64, 64]

    simulate(tb)


def test_writes_drive_config_and_qp_contexts():
    async def tb(ctx, dut):
        await write(ctx, dut, qp_reg(1, "PEER_MAC_HI"), 0xFFFF_0A0B)   # 16-bit register
        await write(ctx, dut, qp_reg(1, "PEER_MAC_LO"), 0x0C0D0E0F)
        await write(ctx, dut, qp_reg(1, "PEER_IP"), 0xC0A80065)
        await write(ctx, dut, qp_reg(1, "PMTU"), 5)
        await write(ctx, dut, global_reg("UDP_SRC_PORT"), 0xD001)
        await write(ctx, dut, global_reg("P_KEY"), 0x8005)
        await write(ctx, dut, global_reg("TIMESTAMP_FORMAT"), 3)         # 1-bit register
        await write(ctx, dut, global_reg("RX_ENABLE"), 0)
        await write(ctx, dut, global_reg("QSC_IP"), 0x0A000009)
        await write(ctx, dut, qp_reg(1, "HOST_QPN"), 0x00ABCDEF)
        await write(ctx, dut, qp_reg(1, "HOST_RKEY"), 0x12345678)
        await write(ctx, dut, qp_reg(1, "RING_VA_HI"), 0x1)
        await write(ctx, dut, qp_reg(1, "RING_VA_LO"), 0x8000_0000)
        await write(ctx, dut, qp_reg(1, "NUM_SLOTS"), 4096)
        await write(ctx, dut, qp_reg(1, "SLOT_SIZE"), 512)
        await write(ctx, dut, qp_reg(2, "IMEM_RKEY"), 0x11)
        await write(ctx, dut, qp_reg(2, "ENV_RKEY"), 0x22)
        await write(ctx, dut, qp_reg(2, "REGS_RKEY"), 0x33)
        cfg = ctx.get(dut.config)
        assert cfg.qsc_ip == 0x0A000009
        assert cfg.udp_src_port == 0xD001 and cfg.p_key == 0x8005
        assert cfg.timestamp_format == 1 and cfg.rx_enable == 0
        assert await read(ctx, dut, qp_reg(1, "PEER_MAC_HI")) == (1, 0x0A0B)
        qp = ctx.get(dut.qp)
        assert (qp[1].peer_mac, qp[1].peer_ip) == (0x0A0B_0C0D0E0F, 0xC0A80065)
        assert (qp[0].peer_mac, qp[0].peer_ip) == (0, 0)
        assert (qp[1].pmtu_bytes, qp[0].pmtu_bytes) == (4096, 1024)
        assert qp[1].host_qpn == 0xABCDEF and qp[1].host_rkey == 0x12345678
        assert qp[1].ring_va == 0x1_8000_0000
        assert qp[1].num_slots == 4096 and qp[1].slot_size == 512
        assert (qp[2].imem_rkey, qp[2].env_rkey, qp[2].regs_rkey) == (0x11, 0x22, 0x33)
        # a key is valid once written; a write of the QP's HOST_QPN invalidates its keys alone
        assert (qp[2].imem_rkey_valid, qp[2].env_rkey_valid, qp[2].regs_rkey_valid) == (1, 1, 1)
        assert (qp[1].imem_rkey_valid, qp[1].env_rkey_valid, qp[1].regs_rkey_valid) == (0, 0, 0)
        await write(ctx, dut, qp_reg(1, "ENV_RKEY"), 0x44)
        await write(ctx, dut, qp_reg(2, "HOST_QPN"), 0x5)
        await write(ctx, dut, qp_reg(2, "ENV_RKEY"), 0x22)
        await ctx.tick()
        qp = ctx.get(dut.qp)
        assert (qp[1].imem_rkey_valid, qp[1].env_rkey_valid, qp[1].regs_rkey_valid) == (0, 1, 0)
        assert (qp[2].imem_rkey_valid, qp[2].env_rkey_valid, qp[2].regs_rkey_valid) == (0, 1, 0)
        assert qp[0].host_qpn == 0 and qp[0].imem_rkey == 0

    simulate(tb)


def test_read_only_registers_ignore_writes():
    async def tb(ctx, dut):
        for addr in (global_reg("VERSION"), global_reg("NUM_PPUS"),
                     qp_reg(0, "TX_PSN"), qp_reg(0, "RX_EPSN"), counter_addr("RX_FRAMES")):
            before = await read(ctx, dut, addr)
            await write(ctx, dut, addr, 0x5A5A5A5A)
            assert await read(ctx, dut, addr) == before

    simulate(tb)


def test_psn_readback():
    async def tb(ctx, dut):
        ctx.set(dut.tx_psn, [0x000001, 0xABCDEF, 0xFFFFFF])
        ctx.set(dut.rx_epsn, [0x123456, 0, 7, 0x654321])
        assert await read(ctx, dut, qp_reg(1, "TX_PSN")) == (1, 0xABCDEF)
        assert await read(ctx, dut, qp_reg(2, "TX_PSN")) == (1, 0xFFFFFF)
        assert await read(ctx, dut, qp_reg(3, "TX_PSN")) == (1, 0)       # sends nothing
        assert await read(ctx, dut, qp_reg(0, "RX_EPSN")) == (1, 0x123456)
        assert await read(ctx, dut, qp_reg(2, "RX_EPSN")) == (1, 7)
        assert await read(ctx, dut, qp_reg(3, "RX_EPSN")) == (1, 0x654321)

    simulate(tb)


def test_a_host_qpn_write_restarts_that_qp_alone():
    """A write of QP ``n``'s HOST_QPN (a host configuring the QP) pulses ``qp_reset`` bit ``n``
    for one cycle, the cycle after the write; writes of other registers, of another QP's
    registers and reads pulse nothing."""
    async def tb(ctx, dut):
        seen = []

        async def step(addr, value=None):
            ctx.set(dut.port.addr, addr)
            ctx.set(dut.port.w_data, value or 0)
            await ctx.tick()
            ctx.set(dut.port.w_en, value is not None)
            seen.append(ctx.get(dut.qp_reset))
            await ctx.tick()
            ctx.set(dut.port.w_en, 0)
            for _ in range(3):
                seen.append(ctx.get(dut.qp_reset))
                await ctx.tick()

        for addr, value, pulses in ((qp_reg(1, "HOST_QPN"), 0x123, [0b010]),
                                    (qp_reg(2, "HOST_QPN"), 0x456, [0b100]),
                                    (qp_reg(3, "HOST_QPN"), 0x457, [0b1000]),
                                    (qp_reg(3, "PPU"), 1, []),
                                    (qp_reg(1, "HOST_RKEY"), 0x789, []),
                                    (qp_reg(0, "NUM_SLOTS"), 4, []),
                                    (qp_reg(1, "PEER_IP"), 1, []),
                                    (qp_reg(0, "HOST_QPN"), None, [])):
            seen.clear()
            await step(addr, value)
            assert [v for v in seen if v] == pulses, (hex(addr), seen)
    simulate(tb)


def test_counters_sum_all_sources():
    async def tb(ctx, dut):
        frames = COUNTER_INDEX["RX_FRAMES"]
        gap = COUNTER_INDEX["PSN_GAP"]
        tx = COUNTER_INDEX["TX_FRAMES"]
        ctx.set(dut.inc[0], 1 << frames | 1 << gap)
        ctx.set(dut.inc[1], 1 << frames)
        ctx.set(dut.inc[2], 1 << frames | 1 << tx)
        for _ in range(5):
            await ctx.tick()
        ctx.set(dut.inc, [0, 0, 0])
        # the read's address comes COUNTER_LAG_CYCLES after the cycle of the last strobes
        for _ in range(COUNTER_LAG_CYCLES - 1):
            await ctx.tick()
        assert await read(ctx, dut, counter_addr("RX_FRAMES")) == (1, 15)
        assert await read(ctx, dut, counter_addr("PSN_GAP")) == (1, 5)
        assert await read(ctx, dut, counter_addr("TX_FRAMES")) == (1, 5)
        for name, _ in COUNTERS:
            if name not in ("RX_FRAMES", "PSN_GAP", "TX_FRAMES"):
                assert await read(ctx, dut, counter_addr(name)) == (1, 0), name

    simulate(tb)


ALL = (1 << NUM_COUNTERS) - 1


async def preset_counters(ctx, dut, values: list[int]):
    """Write the counters' stored values (a simulation backdoor: the hardware only counts).

    The update engine reads a counter a cycle before it writes the sum back, so the counter
    in flight would write over a single preset: it is written in two cycles in a row."""
    for _ in range(2):
        for i, value in enumerate(values):
            ctx.set(dut.counter_values[i], value)
        await ctx.tick()


async def strobe_all(ctx, dut, cycles: int):
    """Every source strobes every counter for ``cycles`` cycles; then wait out the lag."""
    ctx.set(dut.inc, [ALL, ALL, ALL])
    for _ in range(cycles):
        await ctx.tick()
    ctx.set(dut.inc, [0, 0, 0])
    for _ in range(COUNTER_LAG_CYCLES - 1):
        await ctx.tick()


def test_counters_every_source_every_cycle():
    # every source strobes every counter in every cycle: the pending counts reach their bound
    async def tb(ctx, dut):
        await strobe_all(ctx, dut, 200)
        for name, _ in COUNTERS:
            assert await read(ctx, dut, counter_addr(name)) == (1, 600), name

    simulate(tb)


def test_counters_random_strobes_match_a_model():
    # Random strobes while the counters are read back to back (a new address every cycle): a
    # value read in cycle t counts every strobe up to cycle t - COUNTER_LAG_CYCLES and none of
    # cycle t or later; once the strobes stop, every counter equals the model's total.
    rng = random.Random(1)
    cycles = 400
    strobes = [[rng.getrandbits(NUM_COUNTERS) & rng.getrandbits(NUM_COUNTERS)
                for _ in range(3)] if t < cycles else [0, 0, 0]
               for t in range(cycles + COUNTER_LAG_CYCLES + READ_LATENCY_CYCLES)]
    # totals[t][i]: strobes of counter i in cycles before t
    totals = [[0] * NUM_COUNTERS]
    for vec in strobes:
        totals.append([totals[-1][i] + sum(v >> i & 1 for v in vec)
                       for i in range(NUM_COUNTERS)])
    checked = []

    async def tb(ctx, dut):
        addrs = []
        for t, vec in enumerate(strobes):
            ctx.set(dut.inc, vec)
            idx = rng.randrange(NUM_COUNTERS)
            ctx.set(dut.port.addr, counter_addr(COUNTERS[idx][0]))
            addrs.append(idx)
            await ctx.tick()
            # after the edge that ends cycle t: r_data is the value of cycle t + 1 - latency
            a = t + 1 - READ_LATENCY_CYCLES
            if a >= 0:
                i = addrs[a]
                hit, value = ctx.get(dut.port.hit), ctx.get(dut.port.r_data)
                assert hit == 1
                low = totals[max(0, a + 1 - COUNTER_LAG_CYCLES)][i]
                assert low <= value <= totals[a][i], (a, COUNTERS[i][0])
                checked.append(value)
        for i, (name, _) in enumerate(COUNTERS):
            assert await read(ctx, dut, counter_addr(name)) == (1, totals[-1][i]), name

    simulate(tb)
    assert len(set(checked)) > 20        # the reads saw the counters move


def test_counter_lag_bound():
    # One strobe at every phase of the update engine (the strobe cycles step by 2n + 1): it
    # shows in a value read COUNTER_LAG_CYCLES after its cycle, never earlier than the next.
    name = "DROP_VA"
    idx = COUNTER_INDEX[name]
    lags = []

    async def tb(ctx, dut):
        ctx.set(dut.port.addr, counter_addr(name))
        t = 0
        for k in range(NUM_COUNTERS + 1):
            strobe = t
            ctx.set(dut.inc[k % 3], 1 << idx)
            await ctx.tick()
            ctx.set(dut.inc[k % 3], 0)
            t += 1
            while t < strobe + 2 * NUM_COUNTERS + 1:
                a = t - READ_LATENCY_CYCLES        # the cycle whose value r_data shows now
                if a > strobe and ctx.get(dut.port.r_data) == k + 1 and len(lags) == k:
                    lags.append(a - strobe)
                if a <= strobe:
                    assert ctx.get(dut.port.r_data) == k
                await ctx.tick()
                t += 1

    simulate(tb)
    assert len(lags) == NUM_COUNTERS + 1
    assert max(lags) <= COUNTER_LAG_CYCLES
    assert len(set(lags)) == NUM_COUNTERS    # every phase seen


def test_counters_wrap_at_32_bits():
    # the values are preset near 2**32
    async def tb(ctx, dut):
        for _ in range(NUM_COUNTERS + 3):          # the clearing pass after reset ends
            await ctx.tick()
        await preset_counters(ctx, dut, [2**32 - 7 - i for i in range(NUM_COUNTERS)])
        await strobe_all(ctx, dut, 5)
        for i, (name, _) in enumerate(COUNTERS):
            assert await read(ctx, dut, counter_addr(name)) == (1, (15 - 7 - i) % 2**32), name

    simulate(tb)


def test_reset_clears_the_counters():
    # A reset clears the stored values by one pass of the update engine; the reads of that
    # pass return zero, not the values from before the reset.
    rst = Signal()
    dut = NetRegisters(PARAMS)
    sim = Simulator(ResetInserter(rst)(dut))
    sim.add_clock(6.4e-9)
    frames = COUNTER_INDEX["RX_FRAMES"]

    async def tb(ctx):
        for _ in range(NUM_COUNTERS + 3):          # the clearing pass after power-up ends
            await ctx.tick()
        await preset_counters(ctx, dut, [1000 + i for i in range(NUM_COUNTERS)])
        last = COUNTERS[-1][0]
        assert await read(ctx, dut, counter_addr(last)) == (1, 1000 + NUM_COUNTERS - 1)
        ctx.set(rst, 1)
        ctx.set(dut.port.addr, counter_addr(last))
        await ctx.tick()
        ctx.set(rst, 0)
        ctx.set(dut.inc[1], 1 << frames)              # counted: after the reset
        for k in range(NUM_COUNTERS + COUNTER_LAG_CYCLES):
            await ctx.tick()
            ctx.set(dut.inc[1], (1 << frames) if k < 2 else 0)
            assert ctx.get(dut.port.r_data) == 0
        for i, (name, _) in enumerate(COUNTERS):
            assert await read(ctx, dut, counter_addr(name)) == (1, 3 if i == frames else 0), name

    sim.add_testbench(tb)
    sim.run()


def test_unmapped_addresses_miss():
    async def tb(ctx, dut):
        past_qp0 = qp_reg(0, QP_REGISTERS[-1].name) + 4
        past_qp_counters = qp_reg(0, QP_COUNTERS[-1][0]) + 4
        for addr in (0x020, 0x03C, 0x0F0, 0x100 + 4 * len(COUNTERS), past_qp0,
                     past_qp_counters, qp_reg(1, QP_COUNTERS[0][0]) - 4,
                     0x1000 + 0x100 * 4, qp_reg(4, QP_COUNTERS[0][0]), 0x2000, 0x1000_0000,
                     0xFFFF_FFFC):
            assert await read(ctx, dut, addr) == (0, 0), hex(addr)

    simulate(tb)


def test_the_ppu_register_maps_the_extra_qps_alone():
    """A PPU's own QP reaches that PPU whatever is written; an extra QP reaches the PPU its
    register names, and a write of a PPU the build lacks (3, 15 of 3 PPUs) is ignored."""
    async def tb(ctx, dut):
        for n in range(3):
            await write(ctx, dut, qp_reg(n, "PPU"), (n + 1) % 3)
            assert await read(ctx, dut, qp_reg(n, "PPU")) == (1, n)
        await write(ctx, dut, qp_reg(3, "PPU"), 2)
        assert await read(ctx, dut, qp_reg(3, "PPU")) == (1, 2)
        for bad in (3, 15, 0x12):
            await write(ctx, dut, qp_reg(3, "PPU"), bad)
            assert await read(ctx, dut, qp_reg(3, "PPU")) == (1, 2), bad
        await ctx.tick()
        assert [q.ppu for q in ctx.get(dut.qp)] == [0, 1, 2, 2]
        await write(ctx, dut, qp_reg(3, "PPU"), 0x10)     # bit 4 is beyond the register
        assert await read(ctx, dut, qp_reg(3, "PPU")) == (1, 2)

    simulate(tb)


def test_qp_counters_count_their_strobes_each_qp_its_own():
    """``qp_inc`` bit NUM_QP_COUNTERS * q + k counts in QP q's counter k, read at the QP's
    context, within qp_counter_lag_cycles."""
    async def tb(ctx, dut):
        strobes = {(0, 0): 3, (1, 1): 5, (3, 3): 2, (3, 0): 7, (2, 2): 1}
        for cycle in range(7):
            bits = 0
            for (q, k), times in strobes.items():
                if cycle < times:
                    bits |= 1 << (NUM_QP_COUNTERS * q + k)
            ctx.set(dut.qp_inc, bits)
            await ctx.tick()
        ctx.set(dut.qp_inc, 0)
        for _ in range(qp_counter_lag_cycles(4) - 1):
            await ctx.tick()
        for q in range(4):
            for k, (name, _) in enumerate(QP_COUNTERS):
                want = strobes.get((q, k), 0)
                assert await read(ctx, dut, qp_reg(q, name)) == (1, want), (q, name)

    simulate(tb)


def test_every_writable_register_has_a_width():
    for reg in GLOBAL_REGISTERS + QP_REGISTERS:
        if reg.access is not Access.RO and reg.name not in CONTROL_PLANE_REGISTERS:
            assert 1 <= REGISTER_WIDTHS[reg.name] <= 32


def test_parameter_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="num_inc_sources must be at least 1, not 0"):
            NetRegisters(QSCParams(), num_inc_sources=0)
        gc.collect()


def test_transport_and_peer_udp_port():
    """TRANSPORT (1 bit) and PEER_UDP_PORT (16 bits) read back on a PPU's own QP and reach its
    context; an extra QP's TRANSPORT reads 0 whatever is written (it sends no CALLs)."""
    async def tb(ctx, dut):
        for n in range(4):
            assert await read(ctx, dut, qp_reg(n, "TRANSPORT")) == (1, 0)
            assert await read(ctx, dut, qp_reg(n, "PEER_UDP_PORT")) == (1, 0)
        for n in range(4):
            await write(ctx, dut, qp_reg(n, "TRANSPORT"), 0xFFFF_FFFF)   # bit 0 kept
            await write(ctx, dut, qp_reg(n, "PEER_UDP_PORT"), 0xABCD_0000 | (40000 + n))
        for n in range(4):
            assert await read(ctx, dut, qp_reg(n, "TRANSPORT")) == (1, 1 if n < 3 else 0), n
            assert await read(ctx, dut, qp_reg(n, "PEER_UDP_PORT")) == (1, 40000 + n), n
        await ctx.tick()
        assert [q.transport for q in ctx.get(dut.qp)] == [1, 1, 1, 0]
        assert [q.peer_udp_port for q in ctx.get(dut.qp)] == [40000 + n for n in range(4)]
        await write(ctx, dut, qp_reg(1, "TRANSPORT"), 2)                  # bit 0 clear
        assert await read(ctx, dut, qp_reg(1, "TRANSPORT")) == (1, 0)
        assert await read(ctx, dut, qp_reg(0, "TRANSPORT")) == (1, 1)

    simulate(tb)
