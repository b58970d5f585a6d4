"""openqlink.control.ControlClient against a software QSC peer (tests/host/qsc_peer.py)."""

import pytest

from openqlink.control import ControlClient
from openqlink.errors import ControlPlaneError, FieldRangeError, PPUTimeoutError
from openqlink.isa.layout import ISA_VERSION
from openqlink.memory_map import global_reg, ppu_reg, version_word
from openqlink.wire.control import BLOCK_MAX_PAIRS, Command, Flags, Status
from openqlink.wire.packet import build_udp_frame

HOST_MAC, HOST_IP = "02:00:00:00:00:0a", "192.168.0.1"
SCRATCH = global_reg("SCRATCH")


@pytest.fixture
def link(virtual_qsc):
    host_end, peer = virtual_qsc()
    client = ControlClient(host_end, local_mac=HOST_MAC, local_ip=HOST_IP,
                           qsc_mac=peer.params.mac, qsc_ip=peer.params.ip, timeout_s=0.05,
                           retries=2)
    return client, peer


def test_works_over_a_threaded_peer(threaded_qsc):
    host_end, peer = threaded_qsc()
    client = ControlClient(host_end, local_mac=HOST_MAC, local_ip=HOST_IP,
                           qsc_mac=peer.params.mac, qsc_ip=peer.params.ip, timeout_s=1.0)
    for i in range(20):
        client.write(SCRATCH, i)
        assert client.read(SCRATCH) == i


def test_read_write_and_sequence_numbers(link):
    client, peer = link
    assert client.read(global_reg("VERSION")) == version_word(ISA_VERSION)
    client.write(SCRATCH, 0xCAFEF00D)
    assert client.read(SCRATCH) == 0xCAFEF00D
    log = peer.control_log
    assert [r["seq"] for r in log] == [0, 1, 2]
    assert [r["cmd"] for r in log] == [Command.RD_DWORD, Command.WR_DWORD, Command.RD_DWORD]
    # the first request latches the numbering; later ones ask for the sequence check
    assert log[0]["flags"] == Flags.ACK_REQUEST
    assert all(r["flags"] == Flags.ACK_REQUEST | Flags.SEQUENCE_CHECK for r in log[1:])
    assert log[1]["data"] == 0xCAFEF00D and log[1]["addr"] == SCRATCH
    assert client.counters["responses"] == 3 and client.counters["retries"] == 0


def test_sequence_error_resynchronises(link):
    client, peer = link
    client.read(SCRATCH)
    peer.latched_seq = 700          # another host talked to the QSC meanwhile
    client.write(SCRATCH, 5)
    assert peer.regs[SCRATCH] == 5
    assert client.counters["sequence_resyncs"] == 1
    assert peer.control_log[-1]["seq"] == 701


def test_bad_address_raises_naming_address_and_status(link):
    client, _ = link
    with pytest.raises(ControlPlaneError) as e:
        client.read(0x0000_0FFC)
    assert e.value.status == Status.BAD_ADDRESS and e.value.addr == 0xFFC
    assert "0x00000ffc" in str(e.value) and "BAD_ADDRESS" in str(e.value)


def test_lost_responses_are_retried_and_give_up_after_the_limit(link):
    client, peer = link
    client.write(SCRATCH, 1)
    peer.drop_responses = 2         # two attempts get no answer, the third does
    assert client.read(SCRATCH) == 1
    assert client.counters["retries"] == 2 and client.counters["timeouts"] == 2
    peer.ignore_requests = 3        # every attempt is lost
    with pytest.raises(ControlPlaneError) as e:
        client.write(SCRATCH, 2)
    assert e.value.status is None and e.value.addr == SCRATCH
    assert "3 attempts" in str(e.value)
    # the client goes on working afterwards
    client.write(SCRATCH, 3)
    assert peer.regs[SCRATCH] == 3


def test_a_write_whose_response_was_lost_runs_once(link):
    """A retry keeps the sequence number: the QSC knows it for the request it already ran (a
    TRIGGER whose acknowledgement was lost must not start the program twice)."""
    client, peer = link
    client.write(SCRATCH, 1)                 # synchronised: later requests are checked
    peer.reg_writes.clear()
    peer.drop_responses = 1                  # executed, its response lost
    client.write(SCRATCH, 2)
    assert peer.reg_writes == [(SCRATCH, 2)], "the retry ran the write again"
    seqs = [r["seq"] for r in peer.control_log[-2:]]
    assert seqs[0] == seqs[1] and client.counters["retries"] == 1
    # the next request takes the next number and runs
    client.write(SCRATCH, 3)
    assert peer.reg_writes == [(SCRATCH, 2), (SCRATCH, 3)] and peer.regs[SCRATCH] == 3


def test_stale_responses_are_dropped_and_other_frames_are_routed(link):
    client, peer = link
    client.read(SCRATCH)
    other = build_udp_frame(dst_mac=HOST_MAC, src_mac=peer.params.mac, src_ip=peer.params.ip,
                            dst_ip=HOST_IP, src_port=4791, dst_port=1234, payload=b"rpc?")
    peer.noise_before_response = [other]
    peer.stale_before_response = True
    client.write(SCRATCH, 9)
    assert client.counters["stale_responses"] == 1
    assert list(client.other_frames) == [other]
    routed = []
    client.on_frame = routed.append
    peer.noise_before_response = [other, other]
    assert client.read(SCRATCH) == 9
    assert routed == [other, other] and client.counters["routed_frames"] == 3


def test_frames_nobody_reads_are_kept_within_a_bound(virtual_qsc):
    """Without on_frame, the frames read while waiting are kept for the application; traffic
    it never reads must not grow the host's memory without bound."""
    host_end, peer = virtual_qsc()
    client = ControlClient(host_end, local_mac=HOST_MAC, local_ip=HOST_IP,
                           qsc_mac=peer.params.mac, qsc_ip=peer.params.ip, timeout_s=0.05,
                           max_other_frames=3)
    frames = [build_udp_frame(dst_mac=HOST_MAC, src_mac=peer.params.mac, src_ip=peer.params.ip,
                              dst_ip=HOST_IP, src_port=4791, dst_port=1234, payload=bytes([i]))
              for i in range(5)]
    peer.noise_before_response = frames
    client.read(SCRATCH)
    assert list(client.other_frames) == frames[2:]
    assert client.counters["other_frames_dropped"] == 2
    with pytest.raises(ValueError, match="max_other_frames"):
        ControlClient(host_end, local_mac=HOST_MAC, local_ip=HOST_IP, qsc_mac=peer.params.mac,
                      qsc_ip=peer.params.ip, max_other_frames=-1)


def test_write_without_ack_and_argument_checks(link):
    client, peer = link
    client.write(SCRATCH, 0x77, ack=False)
    assert client.read(SCRATCH) == 0x77
    assert peer.control_log[0]["flags"] == 0
    for bad in (2, -4, 1 << 32):
        with pytest.raises(FieldRangeError) as e:
            client.read(bad)
        assert (e.value.header, e.value.field) == ("ControlRequest", "addr")
    with pytest.raises(FieldRangeError) as e:
        client.write(SCRATCH, 1 << 32)
    assert e.value.field == "data"
    with pytest.raises(ValueError):
        ControlClient(client.transport, local_mac=HOST_MAC, local_ip=HOST_IP, qsc_mac=0,
                      qsc_ip=0, timeout_s=0)


def test_a_one_pair_block_through_transact(link):
    client, peer = link
    peer.regs[SCRATCH] = 11
    resp = client.transact(Command.RD_BLOCK, SCRATCH)
    assert (resp["status"], resp["pairs"]) == (Status.OK, [(SCRATCH, 11)])


def test_ppu_timeout_status_raises_its_own_error(link):
    client, peer = link
    start = ppu_reg(0, "START_TIME_LO")
    client.write(start, 7)
    peer.ppu_stopped = True                 # the QSC's PPU side has no clock
    with pytest.raises(PPUTimeoutError) as e:
        client.read(start)
    assert e.value.status == Status.PPU_TIMEOUT == 0x20 and e.value.addr == start
    assert "PPU_TIMEOUT (0x20)" in str(e.value) and f"{start:#010x}" in str(e.value)
    with pytest.raises(ControlPlaneError):  # a PPUTimeoutError is a ControlPlaneError
        client.write(start, 8)
    assert peer.regs[start] == 7            # not executed, and not retried
    assert client.counters["retries"] == 0
    assert client.read(SCRATCH) == 0        # the network side still answers
    peer.ppu_stopped = False
    assert client.read(start) == 7


def test_write_block_and_read_block(link):
    client, peer = link
    regs = [SCRATCH, ppu_reg(0, "START_TIME_HI"), ppu_reg(0, "START_TIME_LO")]
    client.write_block([(a, 0x100 + i) for i, a in enumerate(regs)])
    assert [peer.regs[a] for a in regs] == [0x100, 0x101, 0x102]
    assert client.read_block(regs) == [0x100, 0x101, 0x102]
    cmds = [(r["cmd"], r["pairs"]) for r in peer.control_log]
    assert cmds == [(Command.WR_BLOCK, [(a, 0x100 + i) for i, a in enumerate(regs)]),
                    (Command.RD_BLOCK, [(a, 0) for a in regs])]


def test_blocks_are_split_at_the_largest_block(link):
    client, peer = link
    addrs = [SCRATCH] * (2 * BLOCK_MAX_PAIRS + 1)
    peer.regs[SCRATCH] = 7
    assert client.read_block(addrs) == [7] * len(addrs)
    assert [len(r["pairs"]) for r in peer.control_log] == [BLOCK_MAX_PAIRS, BLOCK_MAX_PAIRS, 1]


def test_a_block_error_names_the_failing_pair(link):
    client, peer = link
    bad = ppu_reg(0, "PC") + 0x1000
    with pytest.raises(ControlPlaneError, match=f"WR_BLOCK {bad:#010x}: QSC answered "
                       "BAD_ADDRESS") as err:
        client.write_block([(SCRATCH, 3), (bad, 4), (ppu_reg(0, "START_TIME_HI"), 5)])
    assert err.value.addr == bad
    # the pairs before it were written, the ones after it were not
    assert peer.regs[SCRATCH] == 3 and peer.regs[ppu_reg(0, "START_TIME_HI")] != 5
    with pytest.raises(FieldRangeError):
        client.read_block([SCRATCH, 6])
