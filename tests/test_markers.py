"""The test markers: every one the tests use is declared in pyproject.toml, and the README's
quick test command leaves out the slow sets by declared markers only (pytest takes an undeclared
name in ``-m`` as a marker no test has, and would silently run the set it meant to leave out)."""

import re
import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Markers pytest and its plugins declare themselves.
_BUILTIN = {"parametrize", "skip", "skipif", "xfail", "filterwarnings", "usefixtures",
            "xdist_group"}
#: The slow sets the quick command leaves out (the README says which each is).
_SLOW = {"board", "verilator", "experiments", "fuzz_deep", "model_check"}


def _declared() -> set[str]:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return {line.split(":")[0].strip() for line in ini["markers"]}


def _readme_pytest_commands() -> list[list[str]]:
    """The options of the README's pytest command lines (``.venv/bin/python -m pytest ...``), as
    the shell splits them."""
    prefix = ".venv/bin/python -m pytest"
    return [shlex.split(line[len(prefix):])
            for line in (ROOT / "README.md").read_text().splitlines() if line.startswith(prefix)]


def test_every_marker_the_tests_use_is_declared():
    used = set()
    for path in (ROOT / "tests").rglob("*.py"):
        used |= set(re.findall(r"pytest\.mark\.(\w+)", path.read_text()))
    assert used - _BUILTIN - _declared() == set()
    assert _SLOW <= _declared()


def test_the_readmes_quick_command_leaves_out_the_slow_sets_by_declared_markers():
    commands = _readme_pytest_commands()
    quick = [c for c in commands if "-m" in c]
    assert len(commands) == 2 and len(quick) == 1, commands
    expression = quick[0][quick[0].index("-m") + 1]
    names = set(re.findall(r"\w+", expression)) - {"and", "or", "not"}
    assert names <= _declared(), names - _declared()
    # -m on the command line replaces addopts' -m 'not board': the quick one names board too
    assert {m for m in _SLOW if re.search(rf"\bnot {m}\b", expression)} == _SLOW, expression


def test_the_readmes_full_command_is_what_ci_runs():
    full = [c for c in _readme_pytest_commands() if "-m" not in c]
    assert len(full) == 1
    assert shlex.join([".venv/bin/python", "-m", "pytest", *full[0]]) + "\n" in \
        (ROOT / ".ci" / "run").read_text()
