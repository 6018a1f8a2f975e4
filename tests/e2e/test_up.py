"""`corral up`: one command brings up a server and a local agent; Ctrl-C stops both."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import httpx
import pytest
from e2e_harness import CLI, Proc, wait_state

pytestmark = pytest.mark.slow


def test_corral_up_serves_runs_a_job_and_stops_cleanly(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", CLI, "up", "--port", "0", "--agent-port", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    up = Proc("corral up", [*argv, "--data-dir", str(tmp_path)], env | {"PYTHONUNBUFFERED": "1"})
    try:
        base = up.wait_for(r"dashboard:\s+(http://\S+)/").group(1)
        token = up.wait_for(r"admin token: (\S+)").group(1)
        assert (tmp_path / "admin-token").read_text().strip() == token  # kept for the next run
        link = up.wait_for(r"log in:\s+(\S+)").group(1)
        assert link == f"{base}/#token={token}"  # the dashboard logs in from the fragment
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, headers=headers, timeout=10) as http:
            assert http.get("/").status_code == 200  # the dashboard
            reply = http.post("/v1/jobs", json={"payload": {"steps": 5, "step_s": 0.05}})
            assert reply.status_code == 201, reply.text
            done = wait_state(http, reply.json()["id"], "succeeded")
            assert done["result"][0]["content_type"] == "image/png"
        assert up.interrupt() == 0
        up.wait_for(r"corral: stopped")
    finally:
        up.stop()
        print(up.log())


def _up(home: Path, *args: str) -> Proc:
    argv = [sys.executable, "-c", CLI, "up", "--port", "0", "--agent-port", "0", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return Proc("corral up", [*argv, "--data-dir", str(home)], env | {"PYTHONUNBUFFERED": "1"})


def test_a_second_corral_up_says_where_the_first_one_runs(tmp_path: Path) -> None:
    first = _up(tmp_path)
    try:
        base = first.wait_for(r"dashboard:\s+(http://\S+)/").group(1)
        second = _up(tmp_path)
        try:
            assert second.popen.wait(30) == 1
            second.wait_for(r"corral up: already running at " + re.escape(base) + r"/ \(pid \d+\)")
            assert "Traceback" not in "\n".join(second.lines)
        finally:
            second.stop()
        assert first.interrupt() == 0
        restarted = _up(tmp_path)  # the first one stopped: its record no longer counts
        try:
            restarted.wait_for(r"dashboard:\s+(http://\S+)/")
        finally:
            restarted.stop()
    finally:
        first.stop()
        print(first.log())


def test_demo_jobs_are_submitted_once_across_restarts(tmp_path: Path) -> None:
    first = _up(tmp_path, "--demo")
    try:
        first.wait_for(r"demo: submitted 6 jobs", timeout=60)
        base = first.wait_for(r"dashboard:\s+(http://\S+)/").group(1)
        token = first.wait_for(r"admin token: (\S+)").group(1)
        assert first.interrupt(30) == 0
    finally:
        first.stop()
    again = _up(tmp_path, "--demo")
    try:
        again.wait_for(r"demo: the 6 demo jobs of an earlier run", timeout=60)
        base = again.wait_for(r"dashboard:\s+(http://\S+)/").group(1)
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, headers=headers, timeout=10) as http:
            assert len(http.get("/v1/jobs", params={"limit": 50}).json()["jobs"]) == 6
    finally:
        again.stop()
        print(again.log())
