"""The CLI's pure parts: reading job files and the short human forms in tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.cli.jobfile import JobFileError, parse_jobs, with_defaults
from corral.cli.render import JOBS_DROP, age, fit, jobs_table, vram_summary, why
from corral.cli.watch_cmd import describe
from corral.sdk import JobEvent, JobStatus, NodeStatus, WaitInfo

GIB = 2**30


@pytest.mark.parametrize(
    ("text", "source", "want"),
    [
        pytest.param("kind: sample\n", "a.yaml", [{"kind": "sample"}], id="one mapping"),
        pytest.param(
            "- {user: a}\n- {user: b}\n", "a.yaml", [{"user": "a"}, {"user": "b"}], id="a list"
        ),
        pytest.param('{"jobs": [{"user": "a"}]}', "-", [{"user": "a"}], id="jobs key in JSON"),
        pytest.param(
            "user: a\n---\n- user: b\n", "a.yml", [{"user": "a"}, {"user": "b"}], id="documents"
        ),
    ],
)
def test_job_files_in_every_shape(text: str, source: str, want: list[dict[str, Any]]) -> None:
    assert parse_jobs(text, source) == want


@pytest.mark.parametrize(
    ("text", "source", "want_field", "want_message"),
    [
        pytest.param("{", "a.json", "a.json", "not valid JSON", id="broken JSON"),
        pytest.param("a: [", "a.yaml", "a.yaml", "not valid YAML", id="broken YAML"),
        pytest.param(
            "- {}\n- 3\n", "a.yaml", "a.yaml: jobs[1]", "not a number", id="not a mapping"
        ),
        pytest.param("# nothing\n", "a.yaml", "a.yaml", "no jobs", id="empty"),
    ],
)
def test_bad_job_files_say_where(
    text: str, source: str, want_field: str, want_message: str
) -> None:
    with pytest.raises(JobFileError) as err:
        parse_jobs(text, source)
    assert err.value.field == want_field
    assert want_message in err.value.message


def test_flags_override_the_file() -> None:
    jobs = with_defaults([{"team": "a", "user": "x"}, {}], team="b", user=None)
    assert jobs == [{"team": "b", "user": "x"}, {"team": "b"}]


@pytest.mark.parametrize(
    ("then", "now", "want"),
    [(None, 10.0, "-"), (100.0, 104.9, "4s"), (0.5, 3600.5, "1h"), (1.0, 1.0 + 2 * 86400, "2d")],
)
def test_ages(then: float | None, now: float, want: str) -> None:
    assert age(then, now) == want


def node(*gpus: dict[str, Any]) -> NodeStatus:
    return NodeStatus.model_validate({"name": "n", "state": "ready", "gpus": list(gpus)})


def test_vram_shows_used_of_total_only_when_measured() -> None:
    card = {"index": 0, "model": "RTX 4090", "vram_bytes": 24 * GIB}
    assert vram_summary(node()) == "-"
    assert vram_summary(node(card, card | {"index": 1})) == "48 GiB"
    measured = [card | {"vram_free_bytes": 20 * GIB}, card | {"index": 1, "vram_free_bytes": 0}]
    assert vram_summary(node(*measured)) == "28/48 GiB"


def test_why_a_job_waits_in_one_line() -> None:
    info = WaitInfo.model_validate(
        {
            "position": 0,
            "remedy": "preempt",
            "summary": "",
            "reasons": [{"code": "too_few_gpus", "nodes": 3, "message": "fewer than 8 GPUs"}],
        }
    )
    assert why(info) == "3 nodes: fewer than 8 GPUs (could run after: preempt)"
    assert why(None) == ""


def test_event_lines_for_logs() -> None:
    def ev(kind: str, **data: Any) -> str:
        return describe(JobEvent(seq=7, kind=kind, at=0.0, node="box", data=data))

    assert ev("job.progress", progress=0.5, message="step 5") == "     7 job.progress    50% step 5"
    assert ev("job.failed", state="failed", attempt=2, error="oom").endswith(
        "on box attempt 2 (oom)"
    )
    assert ev("job.log", lines=["a", "b"]).endswith("a | b")


def test_corral_up_keeps_its_data_in_corral_home_when_it_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from corral.cli import up_cmd
    from corral.cli.main import app

    served: list[Path] = []

    async def up(home: Path, *args: Any) -> None:  # records where it would serve, serves nothing
        served.append(home)

    monkeypatch.setattr(up_cmd, "_up", up)
    home = tmp_path / "corral-home"
    result = CliRunner().invoke(app, ["up"], env={"CORRAL_HOME": str(home)})
    assert result.exit_code == 0, result.output
    flag = tmp_path / "flag"
    result = CliRunner().invoke(
        app, ["up", "--data-dir", str(flag)], env={"CORRAL_HOME": str(home)}
    )
    assert result.exit_code == 0, result.output
    assert served == [home, flag], "the flag beats the variable"
    assert (home / "admin-token").is_file(), "the token `corral jobs` finds through CORRAL_HOME"


def test_a_demo_backend_missing_a_module_is_one_line_naming_the_api_and_the_fix() -> None:
    import subprocess
    import sys

    from corral.cli.up_backends import INSTALL_DEMO, not_serving

    crash = subprocess.run(
        [sys.executable, "-c", "import diffusers_not_installed_here.pipelines"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    line = not_serving("a1111", crash.stderr.splitlines()[-5:])
    assert line == (
        "corral: not serving the AUTOMATIC1111 API (/sdapi/v1): "
        f"needs diffusers_not_installed_here; add it with: {INSTALL_DEMO}"
    )
    other = not_serving("comfyui", ["Traceback (most recent call last):", "OSError: port taken"])
    assert other == (
        "corral: not serving the ComfyUI API (/prompt): "
        "its reference backend did not start (OSError: port taken)"
    )


def test_a_jobs_table_fits_80_columns_by_leaving_out_details_not_folding_ids() -> None:
    from rich.console import Console

    job = JobStatus.model_validate(
        {
            "id": "job_0123456789abcdef012345", "kind": "sample", "state": "running",
            "priority": "interactive", "team": "vision-research", "user": "alice@example.com",
            "resources": {"gpus": 1, "gpu_milli": 1000, "cpus": 1, "vram_bytes": 8 * 2**30},
            "node": "gpu-box-number-17", "progress": 0.42, "submitted_at": 1000.0,
        }
    )  # fmt: skip
    for width in (80, 60):
        console = Console(width=width, force_terminal=True)
        with console.capture() as shown:
            console.print(fit(jobs_table([job], 1300.0), console, JOBS_DROP))
        lines = shown.get().splitlines()
        assert all(console.measure(line).maximum <= width for line in lines)
        assert len(lines) == 2, lines  # a header and one row: no cell folded onto a second
        assert job.id in lines[1]
        assert "running" in lines[1]
    wide = Console(width=200, force_terminal=True)
    assert len(fit(jobs_table([job], 1300.0), wide, JOBS_DROP).columns) == 11  # with ETA
