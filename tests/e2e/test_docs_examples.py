"""Every example in docs/*.md and README.md runs as written on ``corral up --demo`` (a
CPU-only machine).

Each ``python``, ``bash`` and ``sh`` block of the docs and the README is run here, in a fresh HOME,
against one ``corral up --demo`` (as ``test_readme_quickstart.py`` does for the README):
a Python block as a script, a shell block line by line, from the checkout's root (where
the docs' relative paths point). A block that cannot run as written (a sketch of an
interface, a command for a remote machine, a benchmark of minutes, a file of the
reader's own) says so, and why, in a comment on the line above its fence:
``<!-- not run: REASON -->``; a block with neither fails here, so no new example is left
unchecked. Lines ``corral up ...`` are the server this test runs, and are not started twice.
Blocks of other kinds (output, JSON, YAML, diagrams) are shown, not run.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_harness import Proc

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RUN = ("python", "bash", "sh")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    where: str  # docs/FILE.md:LINE
    lang: str
    code: str
    not_run: str | None  # why, when it is not run


def blocks() -> list[Block]:
    found = []
    for doc in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        text = doc.read_text()
        for m in _FENCE.finditer(text):
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            reason = _NOT_RUN.search(before)
            line = text.count("\n", 0, m.start()) + 1
            where = f"{doc.relative_to(ROOT)}:{line}"
            found.append(Block(where, m.group(1), m.group(2), reason.group(1) if reason else None))
    return found


def test_every_runnable_kind_of_block_runs_or_says_why_not() -> None:
    unchecked = [b.where for b in blocks() if b.lang in RUN and b.not_run is None and not b.code]
    assert unchecked == []
    assert [b for b in blocks() if b.lang in RUN and b.not_run is None], "nothing would run"
    for b in blocks():
        assert b.not_run is None or len(b.not_run.split()) >= 2, f"{b.where}: say why not"


def test_every_docs_example_runs_as_written_on_the_demo(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env |= {"HOME": str(tmp_path), "PATH": f"{BIN}:{env['PATH']}", "PYTHONUNBUFFERED": "1"}
    port, agent_port = _free_port(), _free_port()
    env |= {"CORRAL_UP_PORT": str(port), "CORRAL_UP_AGENT_PORT": str(agent_port)}
    env["CORRAL_URL"] = f"http://127.0.0.1:{port}"
    server = Proc("corral up", ["corral", "up", "--demo"], env)
    failures: list[str] = []
    try:
        server.wait_for(r"corral is up", timeout=90)
        for b in blocks():
            if b.lang in RUN and b.not_run is None:
                failures += _run(b, env, tmp_path)
    finally:
        server.stop()
    assert failures == [], "\n\n".join(failures)


def _run(b: Block, env: dict[str, str], tmp: Path) -> list[str]:
    """What failed in block ``b``, one entry per failing script or line."""
    if b.lang == "python":
        script = tmp / "example.py"
        script.write_text(b.code)
        done = subprocess.run(
            [sys.executable, str(script)],
            env=env, cwd=tmp, capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip
        return [] if done.returncode == 0 else [f"{b.where}: exit {done.returncode}\n{done.stderr}"]
    failed = []
    for line in _lines(b.code):
        done = subprocess.run(
            ["bash", "-c", line],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            failed.append(f"{b.where}: {line!r} exit {done.returncode}\n{done.stdout}{done.stderr}")
    return failed


def _lines(code: str) -> list[str]:
    """A shell block's commands: comments dropped, continued lines joined, ``corral up``
    (this test's own server) left out."""
    text = code.replace("\\\n", " ")
    lines = [line.split("  #", 1)[0].strip() for line in text.splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "corral up"))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
