"""The README quickstart, followed word for word.

The blocks under "## Quickstart" are read from README.md and run as written:
``corral up --demo`` in the background, every CLI line, then the Python block,
with HOME pointing at a temporary directory so ``~/.corral`` is fresh.
The virtualenv and install lines are checked, not re-run: the test's own
environment is that editable install of this checkout, in a virtualenv.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_harness import Proc

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def quickstart_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def commands(block: str) -> list[str]:
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readme_quickstart_works_as_written(tmp_path: Path) -> None:
    import corral

    (_, setup), (_, cli), (lang, python) = quickstart_blocks()
    assert lang == "python"
    venv, install, up = commands(setup)
    assert venv == "python3 -m venv .venv && . .venv/bin/activate"
    assert install == "python3 -m pip install -e ."
    assert Path(corral.__file__).is_relative_to(ROOT / "src"), "tests run on an editable install"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env |= {"HOME": str(tmp_path), "PATH": f"{BIN}:{env['PATH']}", "PYTHONUNBUFFERED": "1"}
    # Free ports instead of the defaults, so a corral already running here does not interfere;
    # CORRAL_URL tells the CLI and SDK where that is, as the README says it may.
    port, agent_port = free_port(), free_port()
    env |= {"CORRAL_UP_PORT": str(port), "CORRAL_UP_AGENT_PORT": str(agent_port)}
    env["CORRAL_URL"] = f"http://127.0.0.1:{port}"

    assert up == "corral up --demo"
    server = Proc("corral up", ["bash", "-c", f"exec {up}"], env)
    try:
        server.wait_for(r"corral is up", timeout=60)
        server.wait_for(r"demo: job_\w+ succeeded", timeout=60)
        for line in commands(cli):
            out = subprocess.run(
                ["bash", "-c", line], env=env, capture_output=True, text=True, timeout=60
            )
            assert out.returncode == 0, f"{line!r} failed:\n{out.stdout}\n{out.stderr}"
        script = tmp_path / "quickstart.py"
        script.write_text(python)
        out = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180
        )
        assert out.returncode == 0, out.stderr
        assert re.match(r"job_\w+ \['image.png'\]", out.stdout), out.stdout
        assert server.interrupt(30) == 0, server.log()  # Ctrl-C stops it cleanly
    finally:
        server.stop()
