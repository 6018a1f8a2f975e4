"""gRPC's I/O engine for the command's processes: the polling engine unless told otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from corral.cli import grpc_engine
from corral.core.errors import InvalidSpec


def test_the_polling_engine_by_default() -> None:
    env: dict[str, str] = {}
    assert grpc_engine.choose(env) == "poller"
    assert env == {
        "GRPC_EXPERIMENTS": grpc_engine.POLLER_EXPERIMENTS,
        "GRPC_ENABLE_FORK_SUPPORT": "false",  # no log line per subprocess the server starts
    }


def test_grpcs_own_setting_is_kept() -> None:
    env = {"GRPC_EXPERIMENTS": "-event_engine_client"}
    assert grpc_engine.choose(env) == "poller"
    assert env["GRPC_EXPERIMENTS"] == "-event_engine_client"


def test_grpcs_default_engine_when_asked() -> None:
    env = {grpc_engine.ENV: "Event_Engine"}
    assert grpc_engine.choose(env) == "event_engine"
    assert "GRPC_EXPERIMENTS" not in env


def test_a_wrong_choice_names_the_variable() -> None:
    with pytest.raises(InvalidSpec, match=r"CORRAL_GRPC_ENGINE.*'epoll'"):
        grpc_engine.choose({grpc_engine.ENV: "epoll"})


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GRPC_EXPERIMENTS", grpc_engine.ENV)}
    return env | extra


# A server and a channel of gRPC's asyncio API, in a process that imported the command first.
_LINK = """
import asyncio, os
import corral.cli.main
import grpc
from grpc import aio

async def main():
    server = aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = aio.insecure_channel(f"127.0.0.1:{port}")
    await channel.channel_ready()
    await channel.close()
    await server.stop(None)

asyncio.run(main())
print(os.environ.get("GRPC_EXPERIMENTS"))
"""


def test_the_command_sets_it_before_grpc_loads_and_grpc_knows_the_names() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _LINK], env=_clean_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == grpc_engine.POLLER_EXPERIMENTS
    # gRPC names what it does not know ("Unknown experiment: ..."): a grpcio upgrade that
    # renamed the experiments would show here.
    assert "Unknown experiment" not in out.stderr, out.stderr


def test_a_wrong_choice_stops_the_command_with_the_reason() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "corral", "--help"],
        env=_clean_env(CORRAL_GRPC_ENGINE="epoll"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "CORRAL_GRPC_ENGINE: must be poller or event_engine, not 'epoll'" in out.stderr
