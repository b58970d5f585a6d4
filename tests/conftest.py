"""Fixtures shared by the host and gateware tests."""

from __future__ import annotations

from pathlib import Path

import pytest


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
