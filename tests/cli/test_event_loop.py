"""The event loop of server, agent and up: uvloop unless told otherwise (cli/loop.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
import uvloop

from corral.cli import loop
from corral.core.errors import InvalidSpec


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(loop.ENV, raising=False)
    assert loop.choice() == "uvloop"
    assert loop.run(_loop_type()) is uvloop.Loop


def test_asyncio_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loop.ENV, "asyncio")
    assert loop.choice() == "asyncio"
    assert not issubclass(loop.run(_loop_type()), uvloop.Loop)


def test_a_wrong_choice_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loop.ENV, "trio")
    with pytest.raises(InvalidSpec, match=r"CORRAL_EVENT_LOOP.*'trio'"):
        loop.choice()


def test_uvloop_asked_for_but_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loop.ENV, "uvloop")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import fails
    with pytest.raises(InvalidSpec, match="not installed"):
        loop.choice()
    monkeypatch.setenv(loop.ENV, "auto")
    assert loop.choice() == "asyncio"


PROBE = (
    "import gc; from corral.cli import loop; settled = loop.settle_heap(); "
    "print(settled, gc.get_freeze_count() > 0, gc.get_threshold()[0])"
)


@pytest.mark.parametrize(
    ("setting", "want"), [("", "True True 10000"), ("default", "False False 700")]
)
def test_a_started_process_settles_its_heap_unless_told_not_to(setting: str, want: str) -> None:
    env = {**os.environ, loop.GC_ENV: setting}  # its own process: a freeze lasts for good
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == want.split()
