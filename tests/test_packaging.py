"""The distribution's package list covers every folder of the three source trees that holds
files (setuptools warns about, and a future release drops, data folders not listed), and the
GPU carry script pins what amaranth requires."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_source_folder_is_a_listed_package():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    missing = []
    for package, folder in setup["package-dir"].items():
        base = ROOT / folder
        for d in [base, *(p for p in base.rglob("*") if p.is_dir())]:
            if d.name == "__pycache__" or not any(f.is_file() for f in d.iterdir()):
                continue
            name = ".".join([package, *d.relative_to(base).parts])
            if name not in listed:
                missing.append(name)
    assert missing == []


def test_gpu_carry_pins_pyvcd_as_amaranth_requires():
    carry = (ROOT / ".ci" / "gpu-carry").read_text()
    assert re.search(r'"pyvcd>=[\d.]+,<0\.5"', carry)
    assert "TOOLCHAIN" not in carry


def test_the_repository_cites_no_notes_outside_it():
    """Docs, scripts and code describe the product and cite public sources only: no file of the
    repository points at notes it does not hold."""
    import subprocess

    names = ("../shared", "TOOLCHAIN.md", "DESIGN.md", "STYLE.md")
    found = subprocess.run(["git", "grep", "-n", "-F", *sum((["-e", n] for n in names), []),
                            "--", ".", ":!tests/test_packaging.py"],
                           capture_output=True, text=True, cwd=ROOT)
    if found.returncode == 128:
        import pytest
        pytest.skip("not a git checkout")
    assert found.stdout == ""
