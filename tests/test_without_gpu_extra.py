"""Without the ``[gpu]`` extra (no ``cuda`` or ``numba`` package at all), every test module still
collects and the GPU tests skip with their reason: pytest must not stop at collection."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Runs pytest with the GPU extra's top-level packages made absent, as on a machine where
#: ``pip install -e '.[dev]'`` was all that ran.
HIDE_GPU_EXTRA = """
import sys
class NoGpuExtra:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('cuda', 'numba', 'cupy'):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
for name in [m for m in sys.modules if m.split('.')[0] in ('cuda', 'numba', 'cupy')]:
    del sys.modules[name]
sys.meta_path.insert(0, NoGpuExtra())
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def test_gpu_test_modules_collect_and_skip_without_the_gpu_extra():
    done = subprocess.run(
        [sys.executable, "-c", HIDE_GPU_EXTRA, "-q", "-p", "no:cacheprovider", "-p",
         "no:randomly", "-rs", "tests/sim/test_system_gpu.py", "tests/host/gpu",
         "tests/host/test_gpu_caches.py", "-k", "not cocotb"],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "passed" in out or "skipped" in out
    assert "cuda-python" in out or "[gpu]" in out, out      # the skips say why
