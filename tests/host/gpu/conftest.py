"""Makes the shared helpers of this folder (``gpumodel``) importable by the tests here, whatever
pytest's import mode, and skips every module of the folder, with the reason, when the ``[gpu]``
extra is not installed (also when the folder is named on the command line)."""

import importlib.util
import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


def _installed(name: str) -> bool:
    """Whether module ``name`` can be imported (find_spec raises when its parent is missing)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


if not _installed("cuda.bindings"):
    class _SkippedModule(pytest.Module):
        def _getobj(self):
            pytest.skip("openqlink[gpu] (cuda-python) is not installed", allow_module_level=True)

    def pytest_pycollect_makemodule(module_path, parent):
        return _SkippedModule.from_parent(parent, path=module_path)
