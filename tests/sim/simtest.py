"""Helpers shared by the simulator tests (a uniquely named module, importable from them)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from corral.cli.main import app

SCENARIOS = Path(__file__).resolve().parent / "scenarios"


@dataclass
class SimRun:
    """What ``corral sim --json`` printed, with per-job lookups."""

    report: dict[str, Any]

    @property
    def summary(self) -> dict[str, Any]:
        return self.report["summary"]

    def job(self, job_id: str) -> dict[str, Any]:
        return next(j for j in self.report["jobs"] if j["id"] == job_id)

    def running(self, prefix: str) -> list[dict[str, Any]]:
        """Jobs whose id starts with ``prefix`` that hold GPUs at the end."""
        return [
            j for j in self.report["jobs"] if j["id"].startswith(prefix) and j["state"] == "running"
        ]


def run_cli(path: Path | str, *options: str) -> SimRun:
    """Run ``corral sim PATH --json OPTIONS`` in-process; it must succeed."""
    result = CliRunner().invoke(app, ["sim", str(path), "--json", *options])
    assert result.exit_code == 0, f"exit {result.exit_code}: {result.stderr}{result.exception}"
    return SimRun(json.loads(result.stdout))
