"""Makes the shared helpers of this folder (``gpumodel``) importable by the tests here, whatever
pytest's import mode, and skips the whole folder when the ``[gpu]`` extra is not installed."""

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

pytest.importorskip("cuda.bindings", reason="openqlink[gpu] (cuda-python) is not installed")
