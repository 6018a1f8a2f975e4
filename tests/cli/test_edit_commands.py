"""``corral hold``, ``release``, ``top``, ``edit``, ``deliveries`` and ``webhooks secret``
against a real ``corral server`` process (no agents: jobs stay queued)."""

from __future__ import annotations

import json
import time

from cli_runner import Cli
from live_server import Running


def test_hold_release_top_and_edit_a_queued_job(cli: Cli, server: Running, team: str) -> None:
    cli = cli.against(server)
    made = cli("submit", "-", "--json", "--team", team, input="- {user: ana}\n- {user: ana}\n")
    assert made.exit_code == 0, made.output
    first, second = (j["id"] for j in json.loads(made.stdout))

    held = cli("hold", first)
    assert held.exit_code == 0, held.output
    assert f"{first} queued held" in held.stdout
    shown = cli("job", first)
    assert "held" in shown.stdout
    released = json.loads(cli("release", first, "--json").stdout)
    assert released[0]["held"] is False

    moved = cli("top", second, "--json")
    assert moved.exit_code == 0, moved.output
    queue = json.loads(cli("queue", "--json").stdout)
    mine = [e["job"]["id"] for e in queue["entries"] if e["job"]["team"] == team]
    assert set(mine) == {first, second}

    edited = cli("edit", first, "--priority", "paid", "--timeout", "90", "--label", "run=b")
    assert edited.exit_code == 0, edited.output
    assert f"{first} queued paid limit 90s run=b" in edited.stdout
    bad = cli("edit", first, "--priority", "gold")
    assert bad.exit_code != 0
    assert "priority" in bad.stderr
    assert "gold" in bad.stderr
    nothing = cli("edit", first)
    assert nothing.exit_code != 0
    assert "name a change" in nothing.stderr
    weighted = cli("edit", second, "--user-weight", "0")  # the server's policy is shared here
    assert weighted.exit_code != 0
    assert "--user-weight" in weighted.stderr
    assert cli("cancel", first, second).exit_code == 0
    late = cli("hold", first)
    assert late.exit_code != 0
    assert "only a queued job" in late.stderr


def test_webhook_secret_and_a_job_s_deliveries(cli: Cli, server: Running, team: str) -> None:
    cli = cli.against(server)
    key = cli("webhooks", "secret")
    assert key.exit_code == 0, key.output
    assert key.stdout.strip().startswith("whsec_")
    assert cli("webhooks", "secret").stdout == key.stdout
    rotated = cli("webhooks", "secret", "--rotate")
    assert rotated.stdout.strip().startswith("whsec_")
    assert rotated.stdout != key.stdout
    hook = "https://hooks.example.com/corral"
    made = cli("submit", "-", "--json", "--team", team, "--webhook", hook, input="{user: ana}\n")
    assert made.exit_code == 0, made.output
    submitted = json.loads(made.stdout)[0]
    assert submitted["webhook"] == {"url": hook, "events": "end"}
    job = submitted["id"]
    listed = cli("deliveries", job)
    assert listed.exit_code == 0, listed.output
    assert "no deliveries" in listed.stdout  # it ends only when cancelled: not yet
    assert json.loads(cli("deliveries", job, "--json").stdout) == []
    refused = cli("submit", "-", "--team", team, "--webhook", "http://10.0.0.5/x", input="{}\n")
    assert refused.exit_code != 0
    assert "webhook.url" in refused.stderr
    steps = "steps: {a: {user: ana}}\n"
    hook = "https://hooks.invalid/corral"  # called: .invalid never resolves, no network
    args = ("pipeline", "submit", "-", "--json", "--team", team, "--webhook", hook)
    pipe = cli(*args, "--webhook-events", "all", input=steps)
    assert pipe.exit_code == 0, pipe.output
    group = json.loads(pipe.stdout)
    assert group["webhook"] == {"url": hook, "events": "all"}
    # no agent places its step: its one change is the step's submission (events all)
    deadline = time.monotonic() + 20
    while not (listed := json.loads(cli("deliveries", group["id"], "--json").stdout)):
        assert time.monotonic() < deadline, "the webhook loop made no delivery"
        time.sleep(0.1)
    (d,) = listed
    assert (d["kind"], d["subject"], d["subject_kind"]) == (
        "job.submitted",
        group["id"],
        "pipeline",
    )
    assert d["body"]["job"]["id"] == group["steps"][0]["job_id"]
    missing = cli("deliveries", "pipe_nothing")
    assert missing.exit_code != 0
    assert "not found" in missing.stderr
