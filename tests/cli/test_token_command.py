"""``corral token create`` against a real ``corral server`` process."""

from __future__ import annotations

import json

from cli_runner import Cli
from live_server import Running

from corral.sdk import Client


def test_a_team_token_is_printed_once_and_sees_its_team(
    cli: Cli, server: Running, team: str
) -> None:
    made = cli.against(server)("token", "create", "team", team)
    assert made.exit_code == 0, made.output
    secret = made.stdout.splitlines()[0]
    assert f"for team {team}" in made.stderr
    with Client(server.url, secret) as client:
        assert client.submit(payload={}).refresh().team == team  # the token's team


def test_an_agent_token_comes_with_its_join_command(cli: Cli, server: Running) -> None:
    made = cli.against(server)("token", "create", "agent", "home-4090", "--json")
    assert made.exit_code == 0, made.output
    body = json.loads(made.stdout)
    assert (body["kind"], body["name"]) == ("agent", "home-4090")
    assert body["join_command"].startswith("corral agent")


def test_a_bad_kind_and_a_team_token_are_refused_in_one_line(
    cli: Cli, server: Running, team: str
) -> None:
    bad = cli.against(server)("token", "create", "admin", "x")
    assert bad.exit_code == 2
    assert "agent" in bad.output
    with Client(server.url, server.token) as admin:
        secret = admin.create_token("team", "reader", team).token
    refused = cli("token", "create", "team", "other", "--url", server.url, "--token", secret)
    assert refused.exit_code == 1
    assert "Traceback" not in refused.output
