"""Fixtures shared by the host and gateware tests, and the order and grouping of the tests for
pytest-xdist."""

from __future__ import annotations

from pathlib import Path

import pytest

#: Markers of the longest tests, the longest first.
_LONG_FIRST = ("verilator", "cocotb", "model_check", "experiments", "fuzz_deep")


def pytest_collection_modifyitems(config, items):
    """Order the tests longest first (:data:`_LONG_FIRST`, then the rest as collected). With
    pytest-xdist (``-n``; ``--dist loadfile --no-loadscope-reorder`` in pyproject.toml's addopts)
    each module goes whole to one worker, in the order of its first test here: the modules of
    the system tests start first, so that no worker is left with one of them at the end while
    the other idles, and a module's fixtures (a simulation each) run on one worker only."""
    def rank(item) -> int:
        for i, name in enumerate(_LONG_FIRST):
            if item.get_closest_marker(name) is not None:
                return i
        return len(_LONG_FIRST)

    items.sort(key=rank)


@pytest.fixture
def loader_without_board(tmp_path, monkeypatch):
    """``$OPENFPGALOADER`` set to a script that fails as openFPGALoader does with no cable:
    call it with the lines the tool prints (stdout first, then stderr); returns the bitstream
    file to load."""

    def make(stdout: str, stderr: str) -> Path:
        loader = tmp_path / "openFPGALoader"
        loader.write_text(f"#!/bin/sh\nprintf '%s' '{stdout}'\nprintf '%s' '{stderr}' >&2\n"
                          "exit 1\n")
        loader.chmod(0o755)
        monkeypatch.setenv("OPENFPGALOADER", str(loader))
        bit = tmp_path / "x.bit"
        bit.write_bytes(b"\xff")
        return bit

    return make
