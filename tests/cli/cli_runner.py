"""``Cli``: run ``corral ARGS`` in-process (typer's runner) with a controlled environment."""

from __future__ import annotations

from dataclasses import dataclass, field

from live_server import Running
from typer.testing import CliRunner, Result

from corral.cli.main import app


@dataclass
class Cli:
    """Runs ``corral ARGS`` in-process with a controlled environment."""

    env: dict[str, str | None] = field(default_factory=dict)

    def __call__(self, *args: str, input: str | None = None) -> Result:
        return CliRunner().invoke(app, list(args), env=self.env, input=input)

    def against(self, server: Running) -> Cli:
        """The same runner, pointed at ``server`` with its admin token."""
        return Cli({**self.env, "CORRAL_URL": server.url, "CORRAL_TOKEN": server.token})
