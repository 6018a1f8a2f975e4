"""The admin token: rotating it revokes the old one, and a configured one must be strong.

The attack: before the fix nothing could rotate the admin token (a leaked
one stayed valid for good: configuring a new ``CORRAL_ADMIN_TOKEN`` added a
second admin token and kept the first), and ``CORRAL_ADMIN_TOKEN=x`` was
accepted. Each test runs ``corral server`` itself, as an operator does.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))

from process_harness import ServerProcess, corral_command
from revocation_harness import Follower, bearer, new_token

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("weak", ["x", "a" * 40, "hunter2-" * 5])
def test_a_weak_configured_admin_token_is_refused_at_start(weak: str, tmp_path: Path) -> None:
    done = _start(tmp_path, weak)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "admin_token" in done.stderr
    assert "CORRAL_ADMIN_TOKEN" in done.stderr
    assert "too weak" in done.stderr
    if len(weak) > 1:
        assert weak not in done.stdout + done.stderr, "the error never shows the token"


def test_rotating_the_admin_token_revokes_the_old_one_and_ends_its_streams(
    tmp_path: Path,
) -> None:
    server = ServerProcess(str(tmp_path / "corral.db"), tmp_path / "home").start()
    try:
        assert server.admin_token is not None
        with httpx.Client(base_url=server.url, headers=bearer(server.admin_token)) as old:
            old.post("/v1/jobs", json={}).raise_for_status()  # an event for the stream
            stream = Follower(server.url, server.admin_token, "/v1/events?after=0")
            team = new_token(old, "team", "ci", team="vision")
            with httpx.Client(base_url=server.url, headers=bearer(team["token"])) as client:
                assert client.post("/v1/tokens/admin/rotate").status_code == 403

            rotated = old.post("/v1/tokens/admin/rotate")
            assert rotated.status_code == 201, rotated.text
            assert old.get("/v1/tokens").status_code == 401
            stream.wait_ended()
        with httpx.Client(base_url=server.url, headers=bearer(rotated.json()["token"])) as new:
            tokens = new.get("/v1/tokens").json()
            admins = [t["id"] for t in tokens if t["kind"] == "admin" and not t["revoked"]]
            assert admins == [rotated.json()["id"]], "one live admin token: the new one"
            records = new.get("/v1/audit", params={"action": "token.rotate"}).json()["records"]
            assert [(r["target"], r["detail"]["revoked"]) for r in records] == [
                (rotated.json()["id"], [t["id"] for t in tokens if t["kind"] == "admin"][:1])
            ], "the rotation is in the audit log with the token it replaced"
    finally:
        server.stop()


def test_changing_the_configured_admin_token_revokes_the_old_one_at_start(
    tmp_path: Path,
) -> None:
    db, home = str(tmp_path / "corral.db"), tmp_path / "home"
    first = ServerProcess(db, home).start()
    first.stop()
    generated = first.admin_token
    assert generated is not None
    configured = f"corral_admin_{secrets.token_urlsafe(32)}"
    second = ServerProcess(db, home, env={"CORRAL_ADMIN_TOKEN": configured}).start()
    try:
        assert httpx.get(f"{second.url}/v1/jobs", headers=bearer(generated)).status_code == 401
        with httpx.Client(base_url=second.url, headers=bearer(configured)) as admin:
            assert admin.get("/v1/jobs").status_code == 200
            refused = admin.post("/v1/tokens/admin/rotate")
            assert refused.status_code == 409, "the setting is the admin token: change it there"
            assert "CORRAL_ADMIN_TOKEN" in refused.json()["message"]
            revokes = admin.get("/v1/audit", params={"action": "token.revoke"}).json()["records"]
            assert [r["actor"]["kind"] for r in revokes] == ["server"], (
                "the server revoked the generated token at start, and says so"
            )
    finally:
        second.stop()

    again = _start(tmp_path, generated, "--db", db, "--home", str(home))
    assert again.returncode != 0, "a revoked token never comes back"
    assert "admin_token" in again.stdout + again.stderr
    assert "was revoked" in again.stdout + again.stderr


def _start(tmp: Path, admin_token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``corral server`` with ``admin_token`` configured, expected to refuse to start."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    argv = [*corral_command(), "server", "--port", "0", "--agent-port", "0", *args]
    if "--home" not in args:
        argv += ["--home", str(tmp / "refused")]
    env |= {"CORRAL_ADMIN_TOKEN": admin_token}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
