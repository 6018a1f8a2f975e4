"""The developer scripts: asking one how to use it installs nothing."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_scripts_test_help_answers_without_a_virtualenv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    env = os.environ | {"CORRAL_VENV": str(venv)}
    done = subprocess.run(
        [str(ROOT / "scripts" / "test"), "--help"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: scripts/test")
    assert not venv.exists()  # nothing was created or installed
