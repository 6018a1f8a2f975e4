"""``corral audit`` against a real ``corral server`` process, through the SDK's ``audit()``."""

from __future__ import annotations

import json

import pytest
from cli_runner import Cli
from live_server import Running

from corral.sdk import Client, PermissionDenied


def test_corral_audit_shows_who_changed_a_team_and_filters(
    cli: Cli, server: Running, team: str
) -> None:
    cli = cli.against(server)
    assert cli("team", "set", team, "--quota", "2").exit_code == 0
    assert cli("team", "set", team, "--weight", "3").exit_code == 0

    listed = cli("audit", "--target", team, "--action", "team.set", "--since", "1h", "--json")
    assert listed.exit_code == 0, listed.output
    records = json.loads(listed.stdout)
    assert [r["detail"]["weight"] for r in records] == [3, 1], "newest first"
    assert {r["actor"]["kind"] for r in records} == {"admin"}

    table = cli("audit", "--target", team, "--limit", "1")
    assert table.exit_code == 0, table.output
    assert "team.set" in table.stdout
    assert "admin:admin" in table.stdout
    assert "weight=3" in table.stdout

    future = cli("audit", "--target", team, "--since", "2999-01-01")
    assert (future.exit_code, future.stderr.strip()) == (0, "no audit records match")


def test_corral_audit_names_a_bad_time_and_refuses_team_tokens(
    cli: Cli, server: Running, team: str
) -> None:
    bad = cli.against(server)("audit", "--since", "yesterday-ish")
    assert bad.exit_code == 2
    assert "--since" in bad.stderr

    with Client(server.url, server.token) as admin:
        secret = admin.create_token("team", "reader", team).token
    with Client(server.url, secret) as reader, pytest.raises(PermissionDenied, match="admin"):
        reader.audit()
    refused = cli("audit", "--url", server.url, "--token", secret)
    assert refused.exit_code == 1
