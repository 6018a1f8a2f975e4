"""``corral policy`` and ``corral usage`` against a real ``corral server`` process.

The server is shared by the session's tests: the policy applied here keeps
every built-in class open, and the test rolls back to the built-in one.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from cli_runner import Cli
from live_server import Running

from corral.sdk import Client

WEIGHTED = """\
format: 1
classes:
  - {name: interactive, rank: 40, preemptible: false, may_preempt: true}
  - {name: paid, rank: 30, may_preempt: true}
  - {name: free, rank: 20}
  - {name: batch, rank: 10, cpu_offload: true}
users:
  ana: {weight: 2}
"""


def test_check_diff_apply_history_and_rollback(cli: Cli, server: Running, tmp_path: Path) -> None:
    admin = cli.against(server)
    good, bad = tmp_path / "policy.yaml", tmp_path / "bad.yaml"
    good.write_text(WEIGHTED)
    bad.write_text(WEIGHTED.replace("weight: 2", "weight: lots"))

    refused = admin("policy", "check", str(bad))
    assert refused.exit_code == 2, refused.output
    assert "users.ana.weight" in refused.output
    assert "line 8" in refused.output
    assert admin("policy", "check", str(good)).exit_code == 0

    before = admin("policy", "show", "--json")
    version = json.loads(before.stdout)["version"]
    changes = admin("policy", "diff", str(good))
    assert changes.exit_code == 1
    assert "+users:" in changes.stdout

    applied = admin("policy", "apply", str(good), "--note", "ana first")
    assert applied.exit_code == 0, applied.output
    assert f"version {version + 1}" in applied.output
    assert admin("policy", "diff", str(good)).exit_code == 0
    shown = admin("policy", "show")
    assert shown.stdout == WEIGHTED
    listed = admin("policy", "history")
    assert "ana first" in listed.stdout

    back = admin("policy", "rollback", "0")
    assert back.exit_code == 0, back.output
    assert json.loads(admin("policy", "show", "--json").stdout)["policy"]["user_weights"] == {}


def test_usage_prints_a_table_and_csv(cli: Cli, server: Running, team: str) -> None:
    with Client(server.url, server.token) as client:
        client.submit(payload={}, team=team, user="ana")
    admin = cli.against(server)
    table = admin("usage", "--by", "team,class")
    assert table.exit_code == 0, table.output
    assert "GPU-HOURS" in table.stdout
    assert "total" in table.stdout
    rows = list(csv.reader(io.StringIO(admin("usage", "--by", "team", "--csv").stdout)))
    assert rows[0] == ["team", "gpu_seconds", "milli_gpu_seconds", "cpu_seconds", "jobs", "cost"]
    bad = admin("usage", "--by", "colour")
    assert bad.exit_code == 2
    assert "by" in bad.output
