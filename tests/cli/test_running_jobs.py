"""``watch``, ``logs``, ``interrupt`` and ``node`` against a server whose stub agents run jobs."""

from __future__ import annotations

import json
from pathlib import Path

from cli_runner import Cli
from live_server import Running, eventually

PNG = b"\x89PNG\r\n\x1a\n"


def submit(cli: Cli, job: dict[str, object]) -> str:
    result = cli("submit", "-", "-q", input=json.dumps(job))
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def test_watch_shows_progress_writes_previews_and_saves_results(
    cli: Cli, stub: Running, team: str, tmp_path: Path
) -> None:
    cli = cli.against(stub)
    ok = submit(
        cli,
        {
            "team": team,
            "kind": "sample",
            "payload": {"steps": 3, "preview": True, "log": True, "files": {"image.txt": "pixels"}},
        },
    )
    bad = submit(cli, {"team": team, "payload": {"fail": "CUDA out of memory"}})

    result = cli("watch", ok, bad, "--out", str(tmp_path))
    assert result.exit_code == 4, result.output  # one of them failed
    assert (tmp_path / ok / "image.txt").read_bytes() == b"pixels"
    previews = sorted((tmp_path / ok / "previews").iterdir())
    assert len(previews) == 3
    assert all(p.read_bytes().startswith(PNG) for p in previews)
    assert f"{ok} | step 3 of 3" in result.stdout
    assert "CUDA out of memory" in result.stdout
    assert not (tmp_path / bad).exists()

    again = cli("watch", ok, "--out", str(tmp_path / "again"), "--no-previews", "--json")
    assert again.exit_code == 0
    kinds = [json.loads(line)["kind"] for line in again.stdout.splitlines()]
    assert kinds[0] == "job.submitted"
    assert kinds[-1] == "job.succeeded"
    assert kinds.count("job.progress") == 3
    assert not (tmp_path / "again" / ok / "previews").exists()


def test_submit_and_watch_in_one_command(
    cli: Cli, stub: Running, team: str, tmp_path: Path
) -> None:
    cli = cli.against(stub)
    result = cli("submit", "-", "--watch", "--out", str(tmp_path), input=json.dumps({"team": team}))
    assert result.exit_code == 0, result.output
    [folder] = list(tmp_path.iterdir())
    assert (folder / "out.txt").read_text() == f"done {folder.name}"


def test_logs_of_a_running_job_then_interrupt_it(
    cli: Cli, stub: Running, team: str, tmp_path: Path
) -> None:
    cli = cli.against(stub)
    gate = tmp_path / "go"
    job = submit(cli, {"team": team, "payload": {"steps": 2, "log": True, "gate": str(gate)}})
    eventually(lambda: json.loads(cli("job", job, "--json").stdout)["progress"] == 1.0)

    logs = cli("logs", job)  # returns with what is there while the job still runs
    assert logs.exit_code == 0
    assert logs.stdout.splitlines() == ["step 1 of 2", "step 2 of 2"]

    stopped = cli("interrupt", job)
    assert "interrupt requested" in stopped.stdout
    final = cli("watch", job, "--out", str(tmp_path))
    assert final.exit_code == 0
    assert (tmp_path / job / "partial.txt").read_bytes() == b"partial"

    events = cli("logs", job, "--events").stdout
    assert "job.started" in events
    assert "interrupt requested" in events
    assert "files: partial.txt" in events


def test_nodes_table_and_pause_resume(cli: Cli, stub: Running) -> None:
    cli = cli.against(stub)
    table = cli("nodes").stdout
    assert "box-a" in table
    assert "2× RTX 4090" in table
    assert "48 GiB" in table
    try:
        paused = cli("node", "pause", "box-b")
        assert paused.exit_code == 0, paused.output
        assert "paused" in paused.stdout
        nodes = {n["name"]: n for n in json.loads(cli("nodes", "--json").stdout)}
        assert nodes["box-b"]["paused"] is True
        assert "draining" in cli("node", "drain", "box-b").stdout
    finally:
        assert "ready" in cli("node", "resume", "box-b").stdout
