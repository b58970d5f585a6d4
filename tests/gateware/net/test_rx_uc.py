"""Tests of openqlink.gateware.net.rx: the whole UC transport (FIRST/MIDDLE/LAST, PMTU, DROP_PSN).

# Ref: IBTA Vol 1 Release 1.4 9.2 (opcodes), 9.7.6 and 9.8.3 (UC receive: a FIRST/ONLY starts a
# message whatever its PSN, a MIDDLE/LAST out of sequence is dropped with the rest of its
# message), C9-88 (zero length); rdma-core rxe ``check_psn``, ``check_op_seq``, ``check_length``.
"""

import pytest
from netbench import (
    HOST_IP,
    HOST_MAC,
    PARAMS,
    QSC_IP,
    QSC_MAC,
    expected_writes,
    mailbox_commit,
    roce_frame,
    tail_write,
)
from test_rx import (
    ENV0,
    ENV_RKEY,
    IMEM0,
    IMEM_RKEY,
    configure_rx,
    nonzero,
    payload_bytes,
    reg_write,
    run_rx,
)

from openqlink.memory_map import (
    MAILBOX_BYTES,
    MAILBOX_OFFSET,
    QSCParams,
    ppu_base,
    ppu_reg,
    qp_reg,
)
from openqlink.roce import UCQueuePair
from openqlink.wire.roce import PATH_MTU_BYTES, Opcode, path_mtu_code

MAILBOX0 = ppu_base(0) + MAILBOX_OFFSET
W_FIRST, W_MIDDLE, W_LAST, W_LAST_IMM = (Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_MIDDLE,
                                         Opcode.RDMA_WRITE_LAST,
                                         Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE)
S_FIRST, S_MIDDLE, S_LAST, S_LAST_IMM = (Opcode.SEND_FIRST, Opcode.SEND_MIDDLE, Opcode.SEND_LAST,
                                         Opcode.SEND_LAST_WITH_IMMEDIATE)


def with_qp(pmtu_bytes: int = 256, response_bytes: int | None = None):
    """A ``setup`` that sets QP 0's PMTU (and RESPONSE_BYTES)."""
    async def setup(ctx, regs):
        await reg_write(ctx, regs, qp_reg(0, "PMTU"), path_mtu_code(pmtu_bytes))
        if response_bytes is not None:
            await reg_write(ctx, regs, qp_reg(0, "RESPONSE_BYTES"), response_bytes)
    return setup


def write_message(va: int, data: bytes, *, pmtu: int = 256, psn: int = 0, imm: int | None = None,
                  r_key: int = IMEM_RKEY, dma_len: int | None = None) -> list[bytes]:
    """The frames of a WRITE message, PMTU bytes a packet, built field by field."""
    chunks = [data[i:i + pmtu] for i in range(0, len(data), pmtu)]
    assert len(chunks) >= 2
    frames = [roce_frame(W_FIRST, va=va, r_key=r_key, payload=chunks[0], psn=psn,
                         dma_len=len(data) if dma_len is None else dma_len)]
    frames += [roce_frame(W_MIDDLE, payload=c, psn=psn + 1 + i)
               for i, c in enumerate(chunks[1:-1])]
    last = W_LAST if imm is None else W_LAST_IMM
    frames.append(roce_frame(last, payload=chunks[-1], imm=imm, psn=psn + len(chunks) - 1))
    return frames


def message_writes(va: int, data: bytes, pmtu: int = 256) -> list:
    """The bus commands of a WRITE message: each packet's realigned words, in order."""
    return [c for i in range(0, len(data), pmtu) for c in expected_writes(va + i, data[i:i + pmtu])]


@pytest.mark.parametrize("pmtu", [256, 512])
@pytest.mark.parametrize("offset,length", [(0, 700), (4, 1300), (12, 1028), (8, 1025)])
def test_a_write_message_lands_packet_after_packet(pmtu, offset, length):
    data = payload_bytes(length, length + offset)
    va = IMEM0 + 0x400 + offset
    frames = write_message(va, data, pmtu=pmtu, psn=5)
    cmds, _, counters, epsn = run_rx(frames, setup=with_qp(pmtu))
    assert cmds == message_writes(va, data, pmtu)
    n = len(frames)
    assert nonzero(counters) == {"RX_FRAMES": n, "RX_ROCE_ACCEPTED": n, "PSN_GAP": 1}
    assert epsn == [5 + n]


def test_the_hosts_own_write_message_is_taken_with_its_tail():
    """A message as the host package's UC QP builds it (FIRST, MIDDLE, LAST_WITH_IMMEDIATE)."""
    qp = UCQueuePair(HOST_MAC, HOST_IP, 0x11, QSC_MAC, QSC_IP, PARAMS.qpn_base, pmtu_bytes=512)
    data = payload_bytes(16 * 100, 3)
    frames = qp.write_frames(IMEM0, IMEM_RKEY, data, imm=100)
    assert [f[42] for f in frames] == [W_FIRST, W_MIDDLE, W_MIDDLE, W_LAST_IMM]
    cmds, _, counters, epsn = run_rx(frames, setup=with_qp(512))
    assert cmds == message_writes(IMEM0, data, 512) + [tail_write(ppu_reg(0, "TAIL"), 100)]
    assert nonzero(counters) == {"RX_FRAMES": 4, "RX_ROCE_ACCEPTED": 4}
    assert epsn == [4]


def test_a_write_message_elsewhere_ignores_its_immediate():
    data = payload_bytes(600, 9)
    cmds, _, _, _ = run_rx(write_message(ENV0, data, imm=0xDEAD, r_key=ENV_RKEY),
                           setup=with_qp())
    assert cmds == message_writes(ENV0, data)


@pytest.mark.parametrize("last", [S_LAST, S_LAST_IMM])
def test_a_send_message_fills_the_mailbox_from_its_first_packet(last):
    data = payload_bytes(256 * 2 + 40, 4)
    frames = [roce_frame(S_FIRST, payload=data[:256], psn=0),
              roce_frame(S_MIDDLE, payload=data[256:512], psn=1),
              roce_frame(last, payload=data[512:], psn=2,
                         imm=7 if last is S_LAST_IMM else None)]
    cmds, _, counters, _ = run_rx(frames, setup=with_qp(256, response_bytes=1024))
    assert cmds == (expected_writes(MAILBOX0, data[:MAILBOX_BYTES]) +
                    [mailbox_commit(MAILBOX0, MAILBOX_BYTES)])
    assert nonzero(counters) == {"RX_FRAMES": 3, "RX_ROCE_ACCEPTED": 3, "RX_RPC_RESPONSES": 1}


@pytest.mark.parametrize("imm", [None, 0xC0FFEE])
def test_the_hosts_own_send_message_is_a_response(imm):
    """A response longer than a packet, as the host package's UC QP sends it (as CUDA-Q's GPU
    bridge would with a payload size over the PMTU)."""
    qp = UCQueuePair(HOST_MAC, HOST_IP, 0x11, QSC_MAC, QSC_IP, PARAMS.qpn_base, pmtu_bytes=256)
    data = payload_bytes(24 + 600, 16)
    frames = qp.send_frames(data, imm=imm)
    last = S_LAST if imm is None else S_LAST_IMM
    assert [f[42] for f in frames] == [S_FIRST, S_MIDDLE, last]
    cmds, _, counters, epsn = run_rx(frames, setup=with_qp(256, response_bytes=1024))
    assert cmds == (expected_writes(MAILBOX0, data[:MAILBOX_BYTES]) +
                    [mailbox_commit(MAILBOX0, MAILBOX_BYTES)])
    assert nonzero(counters) == {"RX_FRAMES": 3, "RX_ROCE_ACCEPTED": 3, "RX_RPC_RESPONSES": 1}
    assert epsn == [3]


def test_a_send_message_longer_than_response_bytes_is_dropped_at_its_end():
    frames = [roce_frame(S_FIRST, payload=bytes(256), psn=0),
              roce_frame(S_LAST, payload=bytes(200), psn=1)]
    cmds, _, counters, _ = run_rx(frames, setup=with_qp(256, response_bytes=400))
    assert cmds == expected_writes(MAILBOX0, bytes(MAILBOX_BYTES))     # no commit
    assert counters["DROP_LENGTH"] == 1 and counters["RX_RPC_RESPONSES"] == 0


def test_a_send_with_immediate_only_packet_is_a_response():
    data = payload_bytes(40, 8)
    cmds, _, counters, _ = run_rx([roce_frame(Opcode.SEND_ONLY_WITH_IMMEDIATE, payload=data,
                                              imm=0x1234)])
    assert cmds == expected_writes(MAILBOX0, data) + [mailbox_commit(MAILBOX0, 40)]
    assert counters["RX_RPC_RESPONSES"] == 1


def test_a_middle_out_of_sequence_abandons_its_message():
    data = payload_bytes(256 * 3 + 16, 5)
    frames = write_message(IMEM0, data, psn=10)
    lost_middle = [frames[0], frames[2], frames[3]]          # PSN 10, 12, 13: 11 was lost
    again = write_message(IMEM0 + 0x1000, data, psn=20)
    cmds, _, counters, epsn = run_rx(lost_middle + again, setup=with_qp())
    assert cmds == expected_writes(IMEM0, data[:256]) + message_writes(IMEM0 + 0x1000, data)
    assert counters["DROP_PSN"] == 2                 # the MIDDLE after the gap and the LAST
    assert counters["RX_ROCE_ACCEPTED"] == 1 + len(again)
    assert epsn == [24]


@pytest.mark.parametrize("opcode", [W_MIDDLE, W_LAST, W_LAST_IMM, S_MIDDLE, S_LAST, S_LAST_IMM])
def test_a_middle_or_last_with_no_message_open_is_dropped(opcode):
    frame = roce_frame(opcode, payload=bytes(256 if opcode in (W_MIDDLE, S_MIDDLE) else 8),
                       psn=0, imm=1 if opcode.has_immdt else None)
    cmds, _, counters, epsn = run_rx([frame], setup=with_qp(256, response_bytes=1024))
    assert cmds == []
    assert nonzero(counters) == {"RX_FRAMES": 1, "DROP_PSN": 1}
    assert epsn == [0]


def test_a_packet_of_the_other_kind_breaks_the_message():
    data = payload_bytes(600, 6)
    frames = write_message(IMEM0, data)
    frames[1] = roce_frame(S_MIDDLE, payload=data[256:512], psn=1)   # a SEND inside a WRITE
    cmds, _, counters, _ = run_rx(frames, setup=with_qp(256, response_bytes=1024))
    assert cmds == expected_writes(IMEM0, data[:256])
    assert counters["DROP_PSN"] == 2


def test_a_first_abandons_the_open_message():
    a = payload_bytes(600, 1)
    b = payload_bytes(300, 2)
    fa = write_message(IMEM0, a, psn=0)
    fb = write_message(IMEM0 + 0x2000, b, psn=2)
    # A's FIRST and MIDDLE, then B whole, then A's LAST (no message open any more)
    fa_last = roce_frame(W_LAST, payload=a[512:], psn=4)
    cmds, _, counters, _ = run_rx(fa[:2] + fb + [fa_last], setup=with_qp())
    assert cmds == message_writes(IMEM0, a[:512]) + message_writes(IMEM0 + 0x2000, b)
    assert counters["DROP_PSN"] == 1 and counters["RX_ROCE_ACCEPTED"] == 4


@pytest.mark.parametrize("case", ["first_short", "first_dma_len_is_payload", "middle_long",
                                  "last_longer_than_left", "last_shorter_than_left",
                                  "last_empty", "only_over_pmtu"])
def test_lengths_of_a_message(case):
    data = payload_bytes(600, 7)
    frames = write_message(IMEM0, data)
    bad = {
        "first_short": 0, "first_dma_len_is_payload": 0, "middle_long": 1,
        "last_longer_than_left": 2, "last_shorter_than_left": 2, "last_empty": 2,
        "only_over_pmtu": 0,
    }[case]
    if case == "first_short":
        frames[0] = roce_frame(W_FIRST, va=IMEM0, r_key=IMEM_RKEY, payload=data[:252],
                               dma_len=600, psn=0)
    elif case == "first_dma_len_is_payload":
        frames[0] = roce_frame(W_FIRST, va=IMEM0, r_key=IMEM_RKEY, payload=data[:256],
                               dma_len=256, psn=0)
    elif case == "middle_long":
        frames[1] = roce_frame(W_MIDDLE, payload=data[256:516], psn=1)
    elif case == "last_longer_than_left":
        frames[2] = roce_frame(W_LAST, payload=data[512:] + bytes(4), psn=2)
    elif case == "last_shorter_than_left":
        frames[2] = roce_frame(W_LAST, payload=data[512:596], psn=2)
    elif case == "last_empty":
        frames[2] = roce_frame(W_LAST, payload=b"", psn=2)
    else:
        frames = [roce_frame(Opcode.RDMA_WRITE_ONLY, va=IMEM0, r_key=IMEM_RKEY,
                             payload=data[:260], psn=0)]
    cmds, _, counters, _ = run_rx(frames, setup=with_qp())
    assert counters["DROP_LENGTH"] == 1
    # nothing of the bad packet, and (the message abandoned) nothing after it
    assert cmds == message_writes(IMEM0, data[:256 * bad])
    assert counters["DROP_PSN"] == len(frames) - bad - 1


def test_a_first_is_checked_for_the_whole_dma_len():
    """R_Key and range once, for the DMALen: a FIRST whose message would leave the region is
    dropped whole (DROP_VA), and so is the rest of its message (DROP_PSN)."""
    imem_end = IMEM0 + PARAMS.imem_depth * 16
    data = payload_bytes(512, 8)
    frames = write_message(imem_end - 256, data)
    cmds, _, counters, _ = run_rx(frames, setup=with_qp())
    assert cmds == []
    assert nonzero(counters) == {"RX_FRAMES": 2, "DROP_VA": 1, "DROP_PSN": 1}
    frames = write_message(IMEM0, data, r_key=IMEM_RKEY ^ 1)
    cmds, _, counters, _ = run_rx(frames, setup=with_qp())
    assert cmds == []
    assert nonzero(counters) == {"RX_FRAMES": 2, "DROP_RKEY": 1, "DROP_PSN": 1}


def test_a_last_with_immediate_not_a_tail_is_dropped_whole():
    data = payload_bytes(300, 9)
    frames = write_message(IMEM0, data, imm=PARAMS.imem_depth)
    cmds, _, counters, _ = run_rx(frames, setup=with_qp())
    assert cmds == expected_writes(IMEM0, data[:256])
    assert counters["DROP_IMMDT"] == 1


def test_a_qp_restart_closes_its_message():
    """FIRST, MIDDLE; the host configures the QP again (HOST_QPN, then its R_Keys); the LAST
    (PSN 2, expected 0 now) finds no message open."""
    data = payload_bytes(600, 10)
    frames = write_message(IMEM0, data)

    async def reconfigure(ctx, regs):
        await reg_write(ctx, regs, qp_reg(0, "HOST_QPN"), 0x22)
        await configure_rx(ctx, regs, PARAMS)

    cmds, _, counters, epsn = run_rx(frames[:2], setup=with_qp(),
                                     then=(reconfigure, frames[2:]))
    assert cmds == message_writes(IMEM0, data[:512])
    assert counters["DROP_PSN"] == 1 and counters["RX_ROCE_ACCEPTED"] == 2
    assert epsn == [0]


def test_the_pmtu_register_decodes_every_code():
    """Each PathMTU code sets the FIRST's size; a code outside 1..5 acts as 256."""
    for code, size in list(PATH_MTU_BYTES.items()) + [(0, 256), (7, 256)]:
        data = payload_bytes(size + 8, code)

        async def setup(ctx, regs, code=code):
            await reg_write(ctx, regs, qp_reg(0, "PMTU"), code)

        frames = write_message(IMEM0, data, pmtu=size)
        cmds, _, counters, _ = run_rx(frames, setup=setup)
        assert cmds == message_writes(IMEM0, data, size), code
        assert counters["RX_ROCE_ACCEPTED"] == 2, code


def test_the_pmtu_resets_to_1024():
    data = payload_bytes(1024 + 16, 11)
    cmds, _, counters, _ = run_rx(write_message(IMEM0, data, pmtu=1024))
    assert cmds == message_writes(IMEM0, data, 1024)


def test_the_buffer_holds_two_frames_of_the_largest_pmtu():
    """Two 4096-byte WRITE_ONLY frames arrive back to back while the bus is stalled: both are
    kept and land once the bus takes."""
    a = payload_bytes(4096, 12)
    b = payload_bytes(4096, 13)
    frames = [roce_frame(Opcode.RDMA_WRITE_ONLY, va=IMEM0, r_key=IMEM_RKEY, payload=a, psn=0),
              roce_frame(Opcode.RDMA_WRITE_ONLY, va=IMEM0 + 4096, r_key=IMEM_RKEY, payload=b,
                         psn=1)]
    stall_cycles = 2 * len(frames[0]) // 8 + 40
    cmds, _, counters, _ = run_rx(frames, setup=with_qp(4096),
                                  ready=lambda c: c > stall_cycles)
    assert cmds == expected_writes(IMEM0, a) + expected_writes(IMEM0 + 4096, b)
    assert nonzero(counters) == {"RX_FRAMES": 2, "RX_ROCE_ACCEPTED": 2}


def test_messages_of_two_qps_interleave():
    params = QSCParams(num_ppus=2)
    imem1 = ppu_base(1) + (IMEM0 - ppu_base(0))
    a = payload_bytes(600, 14)
    b = payload_bytes(520, 15)
    fa = write_message(IMEM0, a)
    fb = [roce_frame(W_FIRST, dest_qp=params.qpn_base + 1, va=imem1, r_key=IMEM_RKEY + 1,
                     payload=b[:256], dma_len=len(b), psn=0),
          roce_frame(W_MIDDLE, dest_qp=params.qpn_base + 1, payload=b[256:512], psn=1),
          roce_frame(W_LAST, dest_qp=params.qpn_base + 1, payload=b[512:], psn=2)]

    async def setup(ctx, regs):
        for n in range(2):
            await reg_write(ctx, regs, qp_reg(n, "PMTU"), 1)

    frames = [fa[0], fb[0], fa[1], fb[1], fb[2], fa[2]]
    cmds, _, counters, epsn = run_rx(frames, params=params, setup=setup)
    expect = {IMEM0: message_writes(IMEM0, a), imem1: message_writes(imem1, b)}
    got = {va: [c for c in cmds if (c[1] << 3) >> 24 == va >> 24] for va in expect}
    assert got == expect
    assert counters["RX_ROCE_ACCEPTED"] == 6 and epsn == [3, 3]
