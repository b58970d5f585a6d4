"""The report's line on what the GPU did in a ``qlink sim --gpu`` run, for both GPU modes."""

from openqlink.sim.report import gpu_line

RING = {"device": "NVIDIA H200", "arch": "sm_90", "kernel_processed": 101,
        "warmup_requests": 100, "forwarded": 1, "link_and_launch_s": 0.25,
        "service_ns": [65_000], "service_p50_ns": 65_000, "call_in_kernel_ns": [1_120]}
# --gpu-frames: the warm-up ran on a start of its own, so the run's count is the CALLs alone
# (a saved JSON from before calls_served was recorded has only kernel_processed).
FRAMES = {"mode": "frames", "device": "NVIDIA H200", "arch": "sm_90", "kernel_processed": 1,
          "warmup_requests": 100, "link_and_launch_s": 0.37, "service_ns": [40_000],
          "service_p50_ns": 40_000, "frame_in_kernel_ns": [2_500]}


def test_the_ring_mode_line_counts_the_calls_after_the_warm_up():
    line = gpu_line(RING)
    assert "the unified dispatch kernel served 1 CALL(s) after 100 warm-up requests" in line
    assert "request seen -> response published: 1.12 us" in line
    assert "host poll -> response frame sent (Python): p50 65.0 us" in line


def test_the_frames_mode_line_counts_its_own_calls_and_names_its_times():
    for gpu in (FRAMES, {**FRAMES, "calls_served": 1}):
        line = gpu_line(gpu)
        assert "the GPU RoCE endpoint served 1 CALL(s) after 100 warm-up requests" in line
        assert "frame seen -> response frame published: 2.50 us" in line
        assert "no Python per frame: p50 40.0 us" in line
        assert "Python)" not in line
