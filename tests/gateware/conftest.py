"""Makes the helpers of this folder (``simreuse``) importable by the tests below it, whatever
pytest's import mode."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
