"""docs/tutorial.md, run: every command of its ``sh`` blocks, in order, in a fresh directory
laid out like a checkout (copies of ``firmware/`` and ``examples/``), with this Python's
``bin`` directory first on ``PATH`` (so ``qlink`` and ``python`` are the venv's, as after
``. .venv/bin/activate``).

The tutorial's markdown drives the test:

* a ```` ```sh ```` block is a list of commands (a trailing ``\\`` continues a line, ``#``
  lines are comments); each must exit with status 0;
* a ```` ```text ```` block right after an ``sh`` block (nothing but blank lines between)
  is what those commands print: each of its lines must be found in their output, ``...``
  standing for any text (a line that is ``...`` alone is skipped);
* ``<!-- tutorial-test: ANNOTATION -->`` right before a block says how to treat it:
  ``file NAME`` (a ``python`` block the reader saves as ``NAME``; the test writes it there
  before the next command), ``needs REASON`` (skipped with that reason, e.g. a board on the
  LAN), ``done by .ci/run`` (the set-up, which CI runs itself) and ``marker board`` (run only
  with ``-m board``: a bitstream build). Another annotation, an annotation before no block,
  and an ``sh`` block without commands are errors.

The blocks run in one directory, so the simulation's Verilog (``build/sim``) is elaborated
once; a block's test first runs the blocks before it that have not run yet (in this process).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial.md"
#: What the tutorial's directory gets from the checkout (copied: the reader edits files).
CHECKOUT_DIRS = ("firmware", "examples")
#: Wall-clock limit of one command, s (a simulation takes one to two minutes on 2 cores, the
#: first one more: it elaborates the top and compiles it; a board build 15-35 minutes).
COMMAND_TIMEOUT_S = 1200
BOARD_TIMEOUT_S = 3600

_ANNOTATION = re.compile(r"^<!--\s*tutorial-test:\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^```\s*([\w-]*)")


class TutorialError(ValueError):
    """A block or an annotation of the tutorial that the test cannot take, with its line."""


@dataclass
class Block:
    """One fenced block: ``lang``, its ``lines``, the markdown ``line`` it starts on (1-based),
    its ``annotation`` (or None), the ``section`` heading above it, and for an ``sh`` block
    the ``output`` shown after it (lines, or None)."""

    lang: str
    lines: list[str]
    line: int
    section: str
    annotation: str | None = None
    output: list[str] | None = None
    commands: list[str] = field(default_factory=list)

    @property
    def skip_reason(self) -> str | None:
        if self.annotation is None:
            return None
        if self.annotation == "done by .ci/run":
            return "the set-up: .ci/run runs .ci/setup itself"
        if self.annotation.startswith("needs "):
            return self.annotation
        return None

    @property
    def marker(self) -> str | None:
        if self.annotation is not None and self.annotation.startswith("marker "):
            return self.annotation.removeprefix("marker ")
        return None

    @property
    def file_name(self) -> str | None:
        if self.annotation is not None and self.annotation.startswith("file "):
            return self.annotation.removeprefix("file ")
        return None


def _check_annotation(text: str, line: int) -> str:
    if text == "done by .ci/run" or text == "marker board":
        return text
    if re.fullmatch(r"needs \S.*", text):
        return text
    if re.fullmatch(r"file [\w.-]+", text):
        return text
    raise TutorialError(f"tutorial.md:{line}: unknown annotation {text!r} (known: 'file NAME', "
                        "'needs REASON', 'done by .ci/run', 'marker board')")


def shell_commands(lines: list[str]) -> list[str]:
    """The commands of an ``sh`` block: ``#`` lines and blank lines dropped, lines ending in
    ``\\`` joined with the next."""
    commands: list[str] = []
    pending = ""
    for raw in lines:
        text = raw.strip()
        if not pending and (not text or text.startswith("#")):
            continue
        if text.endswith("\\"):
            pending += text[:-1].rstrip() + " "
            continue
        commands.append(pending + text)
        pending = ""
    if pending:
        commands.append(pending.strip())
    return commands


def parse(text: str) -> list[Block]:
    """The fenced blocks of the tutorial's markdown ``text``, with their annotations, commands
    and shown output. Raises :class:`TutorialError` naming the line of an unknown annotation,
    an annotation before no block, before an output block or on a block it does not fit
    (``file`` on another block than ``python``, the others on another than ``sh``), or an
    ``sh`` block without commands."""
    blocks: list[Block] = []
    section = "start"
    pending: tuple[str, int] | None = None
    lines = text.splitlines()
    i = 0
    blank_since_sh = False      # only blank lines since the last sh block closed
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        match = _ANNOTATION.match(line.strip())
        if match:
            if pending is not None:
                raise TutorialError(f"tutorial.md:{pending[1]}: annotation {pending[0]!r} "
                                    "before no block")
            pending = (_check_annotation(match.group(1), i + 1), i + 1)
            i += 1
            continue
        fence = _FENCE.match(line)
        if not fence:
            if line.strip():
                blank_since_sh = False
            i += 1
            continue
        lang = fence.group(1)
        start = i + 1
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise TutorialError(f"tutorial.md:{start}: block not closed")
        i += 1
        if lang == "text" and blank_since_sh and blocks and blocks[-1].lang == "sh":
            if pending is not None:
                raise TutorialError(f"tutorial.md:{pending[1]}: annotation {pending[0]!r} "
                                    "before a command's output")
            blocks[-1].output = body
            blank_since_sh = False
            continue
        block = Block(lang, body, start, section)
        if pending is not None:
            block.annotation = pending[0]
            pending = None
        wants = "python" if block.file_name is not None else "sh"
        if block.annotation is not None and lang != wants:
            raise TutorialError(f"tutorial.md:{start}: annotation {block.annotation!r} on a "
                                f"{lang or 'plain'!r} block (it goes on {wants!r} blocks)")
        if lang == "sh":
            block.commands = shell_commands(body)
            if not block.commands:
                raise TutorialError(f"tutorial.md:{start}: sh block without commands")
        blank_since_sh = lang == "sh"
        blocks.append(block)
    if pending is not None:
        raise TutorialError(f"tutorial.md:{pending[1]}: annotation {pending[0]!r} before no "
                            "block")
    return blocks


def output_missing(shown: list[str], output: str) -> list[str]:
    """The lines of ``shown`` that ``output`` lacks: each shown line must be part of one
    output line, whitespace runs compared as one space, ``...`` matching any text; a line
    that is ``...`` alone matches nothing and is skipped."""
    out_lines = [" ".join(x.split()) for x in output.splitlines()]
    missing = []
    for line in shown:
        norm = " ".join(line.split())
        if not norm or norm == "...":
            continue
        pattern = re.compile(".*?".join(re.escape(part) for part in norm.split("...")))
        if not any(pattern.search(x) for x in out_lines):
            missing.append(line)
    return missing


# --- the parser's own rules ---------------------------------------------------------------

def test_parse_blocks_annotations_and_output():
    text = ("# One\n\n<!-- tutorial-test: needs a board on the LAN -->\n```sh\n"
            "# a comment\nqlink discover \\\n    --timeout-s 5\n\necho hi\n```\n\n"
            "```text\nhi\n```\n\nSave it as `k.py`:\n<!-- tutorial-test: file k.py -->\n"
            "```python\nprint(1)\n```\n\n```text\nnot an output\n```\n")
    blocks = parse(text)
    assert [b.lang for b in blocks] == ["sh", "python", "text"]
    sh, py, _ = blocks
    assert sh.commands == ["qlink discover --timeout-s 5", "echo hi"]
    assert sh.output == ["hi"] and sh.skip_reason == "needs a board on the LAN"
    assert sh.section == "One" and sh.line == 4
    assert py.file_name == "k.py" and py.lines == ["print(1)"]


@pytest.mark.parametrize("text, message", [
    ("<!-- tutorial-test: maybe later -->\n```sh\nls\n```\n", "tutorial.md:1: unknown"),
    ("<!-- tutorial-test: marker fast -->\n```sh\nls\n```\n", "unknown annotation"),
    ("text\n\n```sh\n# only a comment\n\n```\n", "tutorial.md:3: sh block without commands"),
    ("<!-- tutorial-test: needs a board -->\n", "tutorial.md:1: annotation 'needs a board' "
                                               "before no block"),
    ("```sh\nls\n```\n<!-- tutorial-test: needs x -->\n```text\na\n```\n", "before a command's"),
    ("<!-- tutorial-test: file a.py -->\n```sh\nls\n```\n", "on a 'sh' block (it goes on 'python'"),
    ("<!-- tutorial-test: needs x -->\n```text\nls\n```\n", "on a 'text' block (it goes on 'sh'"),
])
def test_parse_refuses(text, message):
    with pytest.raises(TutorialError, match=re.escape(message)):
        parse(text)


def test_output_match():
    output = "status DONE\n  device_call gpu_adder(i=5, readout=1) = 6 [HOST_CALL]\n"
    assert output_missing(["...", "device_call gpu_adder(i=5, readout=...) = ... [HOST_CALL]",
                           "status   DONE"], output) == []
    assert output_missing(["device_call gpu_adder(i=4, ...)"], output) == [
        "device_call gpu_adder(i=4, ...)"]


def test_tutorial_is_linked():
    assert "docs/tutorial.md" in (ROOT / "README.md").read_text()
    assert "tutorial.md" in (ROOT / "docs" / "architecture.md").read_text()


# --- the tutorial itself --------------------------------------------------------------------

BLOCKS = parse(TUTORIAL.read_text())


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40]


def _params():
    params = []
    counts: dict[str, int] = {}
    for index, block in enumerate(BLOCKS):
        if block.lang != "sh":
            continue
        slug = _slug(block.section)
        counts[slug] = counts.get(slug, 0) + 1
        block_id = f"{slug}-{counts[slug]}"
        if block.marker == "board":
            marks = [pytest.mark.board]
        elif block.skip_reason is not None:
            marks = []
        else:
            marks = [pytest.mark.cocotb, pytest.mark.experiments,
                     pytest.mark.xdist_group("tests/test_tutorial.py")]
        params.append(pytest.param(index, id=block_id, marks=marks))
    return params


class Checkout:
    """The tutorial's directory and which of its steps have run (one per test module)."""

    def __init__(self, path: Path):
        self.path = path
        for name in CHECKOUT_DIRS:
            shutil.copytree(ROOT / name, path / name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        bindir = str(Path(sys.executable).parent)
        self.env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
                        VIRTUAL_ENV=str(Path(bindir).parent))
        self.env.pop("PYTHONHOME", None)
        self.done: set[int] = set()
        self.failed: dict[int, str] = {}

    def run_block(self, index: int) -> None:
        block = BLOCKS[index]
        if block.file_name is not None:
            (self.path / block.file_name).write_text("\n".join(block.lines) + "\n")
            return
        timeout = BOARD_TIMEOUT_S if block.marker == "board" else COMMAND_TIMEOUT_S
        output = ""
        for command in block.commands:
            proc = subprocess.run(["bash", "-c", command], cwd=self.path, env=self.env,
                                  capture_output=True, text=True, timeout=timeout)
            output += proc.stdout + proc.stderr
            if proc.returncode != 0:
                raise AssertionError(
                    f"tutorial.md:{block.line} ({block.section}): `{command}` exited with "
                    f"status {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}")
        if block.output is not None:
            missing = output_missing(block.output, output)
            assert not missing, (f"tutorial.md:{block.line} ({block.section}): the output "
                                 f"lacks {missing!r}:\n{output[-4000:]}")

    def run_through(self, index: int) -> None:
        """Run the steps before ``index`` that have not run (of the same kind: default, or
        board), then ``index``; a step that failed fails those after it."""
        kind = BLOCKS[index].marker
        for j in range(index + 1):
            block = BLOCKS[j]
            if j in self.done or block.skip_reason is not None or block.marker != kind:
                continue
            if block.lang not in ("sh", "python") or (block.lang == "python"
                                                      and block.file_name is None):
                continue
            if j in self.failed:
                pytest.fail(f"an earlier step failed: {self.failed[j]}")
            try:
                self.run_block(j)
            except (AssertionError, subprocess.TimeoutExpired) as exc:
                self.failed[j] = str(exc).splitlines()[0]
                raise
            self.done.add(j)


def test_checkout_fails_a_command_or_a_missing_output(tmp_path):
    ran = Checkout(tmp_path)
    assert (tmp_path / "firmware" / "active_reset.s").is_file()
    good = Block("sh", [], 1, "t", commands=["echo hello from $PWD", "python --version"],
                 output=["hello from ...", "Python 3..."])
    bad_status = Block("sh", [], 2, "t", commands=["echo hi", "exit 3"])
    bad_output = Block("sh", [], 3, "t", commands=["echo hi"], output=["bye"])
    saved = Block("python", ["print(1)"], 4, "t", annotation="file k.py")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys.modules[__name__], "BLOCKS", [good, bad_status, bad_output, saved])
        ran.run_block(0)
        with pytest.raises(AssertionError, match=r"tutorial.md:2 \(t\): `exit 3` exited with "
                                                 "status 3"):
            ran.run_block(1)
        with pytest.raises(AssertionError, match=r"the output lacks \['bye'\]"):
            ran.run_block(2)
        ran.run_block(3)
    assert (tmp_path / "k.py").read_text() == "print(1)\n"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Checkout:
    return Checkout(tmp_path_factory.mktemp("tutorial"))


@pytest.mark.parametrize("index", _params())
def test_tutorial_block(checkout: Checkout, index: int):
    block = BLOCKS[index]
    if block.skip_reason is not None:
        pytest.skip(f"tutorial.md:{block.line}: {block.skip_reason}")
    if block.marker != "board" and shutil.which("iverilog") is None:
        pytest.skip("Icarus Verilog is not installed (apt-get install iverilog)")
    checkout.run_through(index)
