"""Fixtures shared by the host and gateware tests, and the order and grouping of the tests for
pytest-xdist."""

from __future__ import annotations

from pathlib import Path

import pytest

#: Markers of the longest tests, the longest first: they start first, so that no worker is left
#: with one of them at the end while the other idles.
_LONG_FIRST = ("verilator", "cocotb", "model_check", "experiments", "fuzz_deep")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Put each cocotb module's tests in one pytest-xdist group (``--dist loadgroup``, in
    pyproject.toml's addopts), so that its module fixtures (a simulation each, a minute or
    more) run on one worker only, and order the tests longest first (:data:`_LONG_FIRST`).
    Runs before pytest-xdist's own hook, which reads the groups."""
    def rank(item) -> int:
        for i, name in enumerate(_LONG_FIRST):
            if item.get_closest_marker(name) is not None:
                return i
        return len(_LONG_FIRST)

    for item in items:
        if item.get_closest_marker("cocotb") is not None \
                and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
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
