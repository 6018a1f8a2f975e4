"""The in-process link cases (``link_inprocess_cases.py``: a gRPC server and
agent clients in one process, a new event loop per test) run in an
interpreter of their own.

grpc's asyncio layer keeps process-wide state tied to the loops it has seen;
after many loops in one long pytest process it has crashed the interpreter
(SIGSEGV) now and then, taking every later test with it. In a fresh process
the same cases run cleanly, and a crash would fail this one test only.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow


def test_the_in_process_link_cases_pass_in_their_own_interpreter() -> None:
    argv = [sys.executable, "-X", "faulthandler", "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    argv += ["-W", "error", str(HERE / "link_inprocess_cases.py")]
    out = subprocess.run(argv, cwd=HERE.parents[1], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout.splitlines()[-1], out.stdout[-2000:]
