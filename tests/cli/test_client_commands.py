"""The client commands against a real ``corral server`` process (no agents: jobs stay queued)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from cli_runner import Cli
from live_server import Running, corral_command, eventually, free_port

from corral.sdk.config import load


def submit_json(cli: Cli, text: str, *args: str) -> list[dict[str, object]]:
    result = cli("submit", "-", "--json", *args, input=text)
    assert result.exit_code == 0, result.output
    jobs: list[dict[str, object]] = json.loads(result.stdout)
    return jobs


def test_login_saves_the_server_and_later_commands_use_it(
    cli: Cli, server: Running, tmp_path: Path
) -> None:
    result = cli("login", server.url, "--token", server.token)
    assert result.exit_code == 0, result.output
    config = Path(str(cli.env["CORRAL_CONFIG"]))
    assert load(config) == {"url": server.url, "token": server.token}
    assert "logged in" in result.stdout

    listed = cli("jobs", "--json")  # no --url, no env: the config file
    assert listed.exit_code == 0, listed.output
    assert isinstance(json.loads(listed.stdout), list)

    wrong = cli("jobs", "--token", "corral_nope")  # a flag beats the file
    assert wrong.exit_code == 1
    assert "corral login" in wrong.stderr


def test_login_with_a_bad_token_saves_nothing(cli: Cli, server: Running) -> None:
    result = cli("login", server.url, "--token", "corral_wrong")
    assert result.exit_code == 1
    assert "token" in result.stderr.lower()
    assert not Path(str(cli.env["CORRAL_CONFIG"])).exists()


def test_submit_a_yaml_list_then_list_show_and_cancel(
    cli: Cli, server: Running, team: str, tmp_path: Path
) -> None:
    cli = cli.against(server)
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "- kind: sample\n  payload: {prompt: a fox}\n  resources: {gpus: 1, vram: 8GiB}\n"
        "- kind: sample\n  payload: {prompt: a barn}\n  resources: {gpus: 0.5}\n"
        "- resources: {gpus: 8}\n  user: bob\n"
    )
    result = cli("submit", str(path), "--team", team)
    assert result.exit_code == 0, result.output
    assert "submitted 3 jobs" in result.stderr
    assert result.stdout.count("queued") == 3

    listed = json.loads(cli("jobs", "--team", team, "--json").stdout)
    assert [j["resources"]["gpu_milli"] or j["resources"]["gpus"] for j in listed] == [8, 500, 1]
    assert [j["user"] for j in cli_json(cli, "jobs", "--team", team, "--user", "bob")] == ["bob"]
    table = cli("jobs", "--team", team, "--limit", "2").stdout
    assert table.count(team) == 2
    assert "0.5 GPU" in table
    # piped: a header, then each job whole on one line (nothing folded, no colour)
    header, *rows = table.splitlines()
    assert header.split()[:3] == ["ID", "STATE", "KIND"]
    assert [r.split()[0] for r in rows] == [listed[0]["id"], listed[1]["id"]]
    assert all("bob" in r or "anonymous" in r for r in rows)
    assert "\x1b[" not in table

    first = listed[-1]["id"]
    details = cli("job", first)
    assert details.exit_code == 0
    assert "1 GPU × 8GiB" in details.stdout
    assert "waiting because" in details.stdout

    cancelled = cli("cancel", first, listed[0]["id"])
    assert cancelled.exit_code == 0
    assert cancelled.stdout.count("cancelled") == 2
    assert [j["id"] for j in cli_json(cli, "jobs", "--team", team, "--state", "cancelled")] == [
        listed[0]["id"],
        first,
    ]


def test_delete_removes_finished_jobs_and_refuses_queued_ones(
    cli: Cli, server: Running, team: str
) -> None:
    cli = cli.against(server)
    done, waiting = (j["id"] for j in submit_json(cli, "[{}, {}]", "--team", team))
    assert cli("cancel", str(done)).exit_code == 0
    result = cli("delete", str(done), str(waiting))
    assert result.exit_code == 1
    assert f"{done} deleted" in result.stdout  # the first went before the second was refused
    assert "cancel it first" in result.stderr
    assert [j["id"] for j in cli_json(cli, "jobs", "--team", team)] == [waiting]


def cli_json(cli: Cli, *args: str) -> list[dict[str, object]]:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    value: list[dict[str, object]] = json.loads(result.stdout)
    return value


def test_submit_from_stdin_with_a_key_is_idempotent(cli: Cli, server: Running, team: str) -> None:
    cli = cli.against(server)
    body = json.dumps({"jobs": [{"team": team}, {"team": team, "priority": "paid"}]})
    first = submit_json(cli, body, "--key", f"{team}-k")
    again = submit_json(cli, body, "--key", f"{team}-k")
    assert [j["id"] for j in again] == [j["id"] for j in first]
    assert [j["priority"] for j in first] == ["free", "paid"]
    quiet = cli("submit", "-", "-q", input=json.dumps({"team": team}))
    assert quiet.stdout.strip().startswith("job_")
    assert len(cli_json(cli, "jobs", "--team", team)) == 3


def test_bad_input_names_the_file_and_the_field(
    cli: Cli, server: Running, team: str, tmp_path: Path
) -> None:
    cli = cli.against(server)
    path = tmp_path / "bad.yaml"
    path.write_text(f"- team: {team}\n- team: {team}\n  resources: {{gpu: 1}}\n")
    local = cli("submit", str(path))
    assert local.exit_code == 2
    assert "bad.yaml" in local.stderr
    assert "jobs[1].resources.gpu" in local.stderr

    remote = cli("submit", "-", input=json.dumps([{"team": team}, {"priority": "vip"}]))
    assert remote.exit_code == 2
    assert "jobs[1].priority" in remote.stderr
    assert "vip" in remote.stderr
    assert cli_json(cli, "jobs", "--team", team) == []  # nothing half-written

    for text, want in (
        ("{", "not valid"),
        ("[1, 2]", "jobs[0]: a job must be a mapping"),
        ("", "no jobs"),
    ):
        result = cli("submit", "-", input=text)
        assert result.exit_code == 2
        assert want in result.stderr
    missing = cli("submit", str(tmp_path / "nope.yaml"))
    assert missing.exit_code == 2
    assert "cannot read" in missing.stderr


def test_queue_shows_why_jobs_wait(cli: Cli, server: Running, team: str) -> None:
    cli = cli.against(server)
    [job] = submit_json(cli, json.dumps({"team": team, "resources": {"gpus": 2}}))

    def entry() -> dict[str, object] | None:
        queue = json.loads(cli("queue", "--limit", "1000", "--json").stdout)
        mine = [e for e in queue["entries"] if e["job"]["id"] == job["id"]]
        return mine[0] if mine and mine[0]["queue"]["reasons"] else None

    assert "no nodes in the cluster" in json.dumps(eventually(entry))
    table = cli("queue", "--limit", "1000")
    assert job["id"] in table.stdout
    assert "no nodes in the cluster" in table.stdout
    assert "queued" in table.stderr


def test_teams_are_listed_and_set(cli: Cli, server: Running, team: str) -> None:
    cli = cli.against(server)
    made = cli("team", "set", team, "--quota", "4", "--weight", "2", "--json")
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout) == {
        "name": team,
        "quota_gpus": 4.0,
        "borrow_limit_gpus": None,
        "weight": 2.0,
    }
    limited = json.loads(cli("team", "set", team, "--borrow-limit", "1.5", "--json").stdout)
    assert (limited["quota_gpus"], limited["borrow_limit_gpus"]) == (4.0, 1.5)
    table = cli("teams").stdout
    assert team in table
    assert "1.5" in table
    assert cli("team", "set", team).exit_code == 2
    assert cli("team", "set", team, "--borrow-limit", "lots").exit_code == 2


def test_nodes_on_a_server_without_agents(cli: Cli, server: Running) -> None:
    cli = cli.against(server)
    assert cli_json(cli, "nodes") == []
    assert "corral agent" in cli("nodes").stderr
    missing = cli("node", "pause", "ghost")
    assert missing.exit_code == 1
    assert "ghost" in missing.stderr
    gone = cli("node", "delete", "ghost")
    assert gone.exit_code == 1
    assert "ghost" in gone.stderr


def test_the_autoscaler_says_when_it_is_off(cli: Cli, server: Running) -> None:
    cli = cli.against(server)
    off = {"enabled": False, "pools": [], "machines": [], "spend": None, "decisions": []}
    assert cli_json(cli, "autoscaler") == off | {"last": None}
    assert cli_json(cli, "autoscaler", "status") == off | {"last": None}
    assert "autoscaler is off" in cli("autoscaler").stderr


def test_an_unreachable_server_says_where_it_looked(cli: Cli) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = cli("jobs", "--url", url)
    assert result.exit_code == 3
    assert url in result.stderr
    assert "corral up" in result.stderr
    from_env = Cli({**cli.env, "CORRAL_URL": url})("queue")
    assert "from CORRAL_URL" in from_env.stderr


def test_the_installed_command_prints_json_for_scripts(server: Running, tmp_path: Path) -> None:
    env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": server.token, "PATH": "/usr/bin:/bin"}
    env["CORRAL_CONFIG"] = str(tmp_path / "config.toml")
    for args in (["team", "set", "scripted", "--quota", "1"], ["teams", "--json"]):
        done = subprocess.run(
            [*corral_command(), *args], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
    assert "scripted" in [t["name"] for t in json.loads(done.stdout)]


def test_a_job_shows_its_eta(cli: Cli, server: Running, team: str) -> None:
    cli = cli.against(server)
    [job] = submit_json(cli, json.dumps({"team": team, "resources": {"gpus": 2}}))

    def shown() -> str | None:
        out = cli("job", job["id"]).stdout
        return out if "no node can run it" in out else None

    assert "eta" in eventually(shown)
    assert "no node can run it" in cli("queue", "--limit", "1000").stdout


def test_submit_memory_sets_every_job_s_request(
    cli: Cli, server: Running, team: str, tmp_path: Path
) -> None:
    cli = cli.against(server)
    path = tmp_path / "jobs.yaml"
    path.write_text(f"- team: {team}\n  resources: {{memory: 1Gi}}\n- team: {team}\n")
    jobs = json.loads(cli("submit", str(path), "--json").stdout)
    assert [j["resources"]["memory_bytes"] for j in jobs] == [2**30, 0]  # from the file
    jobs = json.loads(cli("submit", str(path), "--memory", "512Mi", "--json").stdout)
    assert [j["resources"]["memory_bytes"] for j in jobs] == [2**29, 2**29]  # the flag wins
    bad = cli("submit", str(path), "--memory", "500m")
    assert bad.exit_code == 2
    assert "resources.memory" in bad.stderr
