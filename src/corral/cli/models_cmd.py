"""``corral model add|ls|rm``: the model registry (issue 10).

::

    corral model add sdxl-base --source https://host/sdxl.safetensors --size 6.9GB --sha256 ...
    corral model add my-dreambooth --file ./my-dreambooth.safetensors --backend a1111
    corral model add vae-ft --server-file /srv/models/vae.safetensors --kind vae
    corral model ls
    corral model rm my-dreambooth

``--file`` hashes the local file and uploads it in chunks; run the same
command again after an interruption and the upload goes on where it stopped.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from corral.cli.common import (
    EXIT_BAD_INPUT,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    cli_errors,
    connect,
    err,
    fail,
    out,
    print_json,
    print_table,
)
from corral.cli.render import MODELS_DROP
from corral.sdk.registry import ModelInfo, UploadProgress

model_app = typer.Typer(
    name="model", help="The model registry: add, list, remove models.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.add_typer(model_app)
    app.command("models", help="List registered models (same as `corral model ls`).")(list_models)


@model_app.command("add")
def add(  # noqa: PLR0913 (each option of the command is an argument)
    name: Annotated[str, typer.Argument(help="Registry name jobs use (e.g. sdxl-base).")],
    source: Annotated[
        list[str] | None,
        typer.Option("--source", help="An http(s) URL agents fetch from (repeatable)."),
    ] = None,
    file: Annotated[
        str | None, typer.Option("--file", help="A local file to upload (resumable).")
    ] = None,
    server_file: Annotated[
        str | None, typer.Option("--server-file", help="A file on the server to serve.")
    ] = None,
    size: Annotated[str | None, typer.Option(help="Exact size: bytes or '6.5GiB'.")] = None,
    sha256: Annotated[str | None, typer.Option(help="sha256 of the file (64 hex digits).")] = None,
    kind: Annotated[str, typer.Option(help="checkpoint, lora, vae, embedding, ...")] = "checkpoint",
    backend: Annotated[str, typer.Option(help="The backend it is for (a1111, comfyui).")] = "",
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Register a model (or replace its entry): from URLs, a server file, or an upload."""
    sources = list(source or []) + ([server_file] if server_file else [])
    if not sources and not file:
        fail("give at least one of --source, --file, --server-file", EXIT_BAD_INPUT)
    with connect(url, token) as client, cli_errors():
        if file:
            with _bar() as show:
                info = client.add_model(
                    name, sources=sources, file=file, sha256=sha256, kind=kind,
                    backend=backend, progress=show,
                )  # fmt: skip
        else:
            info = client.add_model(
                name, sources=sources, size=size, sha256=sha256, kind=kind, backend=backend
            )
    if as_json:
        print_json(info)
        return
    out().print(f"model {escape(info.name)}: {info.state}, {_size(info.size)}, {info.sha256}")


@model_app.command("ls")
def list_models(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Registered models and the nodes that hold them (loaded, on disk, downloading)."""
    with connect(url, token) as client, cli_errors():
        models = client.models()
    if as_json:
        print_json(models)
    else:
        print_table(models_table(models), MODELS_DROP)


@model_app.command("rm")
def remove(
    name: Annotated[str, typer.Argument(help="The model to remove.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Remove a model from the registry (agents' copies age out of their caches)."""
    with connect(url, token) as client, cli_errors():
        client.remove_model(name)
    out().print(f"model {escape(name)} removed")


def models_table(models: list[ModelInfo]) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in ("MODEL", "KIND", "BACKEND", "SIZE", "STATE", "CACHED ON"):
        table.add_column(column, no_wrap=column != "CACHED ON")
    for m in models:
        state = m.state
        if m.state == "uploading" and m.uploaded is not None and m.size:
            state = f"uploading {100 * m.uploaded // m.size}%"
        table.add_row(escape(m.name), m.kind, m.backend or "any", _size(m.size), state, _sites(m))
    return table


def _sites(m: ModelInfo) -> str:
    parts = []
    for s in m.cached:
        if s.state == "downloading" and s.progress is not None:
            parts.append(f"{s.node} (downloading {int(100 * s.progress)}%)")
        elif s.state == "loaded":
            parts.append(f"{s.node} (loaded)")
        elif s.state == "failed":
            parts.append(f"{s.node} (failed)")
        else:
            parts.append(s.node)
    return escape(", ".join(parts)) or "-"


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


class _bar:
    """A progress bar for hashing and uploading a file (on stderr), as a callback."""

    def __init__(self) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=err(),
            transient=True,
        )
        self._tasks: dict[str, TaskID] = {}
        self._last = 0.0

    def __enter__(self) -> _bar:
        self._progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._progress.stop()

    def __call__(self, p: UploadProgress) -> None:
        task = self._tasks.get(p.phase)
        if task is None:
            task = self._tasks[p.phase] = self._progress.add_task(
                f"{p.phase} {p.name}", total=p.total
            )
        now = time.monotonic()
        if p.done >= p.total or now - self._last > 0.1:
            self._last = now
            self._progress.update(task, completed=p.done)
