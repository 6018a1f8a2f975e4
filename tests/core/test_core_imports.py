"""The pure packages import without ``mypy_extensions``: a deployment without the compiled
build (``scripts/build-native``) need not install it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_core_scheduler_and_sim_import_without_mypy_extensions() -> None:
    script = (
        "import sys; sys.modules['mypy_extensions'] = None\n"
        "import corral.core, corral.scheduler, corral.sim\n"
        "from corral.core.model import Job\n"
        "assert Job(id='x').id == 'x'\n"
        "print('ok')\n"
    )
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
