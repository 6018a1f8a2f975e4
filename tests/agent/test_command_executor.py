"""The command executor: real subprocesses (sh), the CORRAL_* environment and line protocol."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from corral.agent.executors.base import (
    Checkpoint,
    Failed,
    Finished,
    JobWork,
    LogLine,
    Preview,
    Progress,
    StopSignal,
    Update,
)
from corral.agent.executors.command import CommandExecutor
from corral.agent.executors.lines import ResultFile, parse_line
from corral.agent.executors.scripted import tiny_png
from corral.agent.testing import CHECKS, Harness, run_to_end, stop_on_first_progress
from corral.core import WallClock
from corral.core.states import StopReason

LONG = """
trap 'echo CORRAL_CHECKPOINT "$CORRAL_CHECKPOINT_DIR/ckpt-$i" $i; exit 143' TERM
echo "started" > "$CORRAL_OUTPUT_DIR/partial.txt"
i=0
while true; do i=$((i+1)); echo "CORRAL_PROGRESS $i/100000"; sleep 0.02; done
"""


def scripts(tmp_path: Path) -> dict[str, str]:
    preview = tmp_path / "preview.png"
    preview.write_bytes(tiny_png(90))
    return {
        "quick": (
            'echo "CORRAL_PROGRESS 0.5 halfway"; '
            f'echo "CORRAL_PREVIEW {preview}"; '
            'echo "CORRAL_PROGRESS 2/2"; '
            'echo "done $CORRAL_JOB_ID" > "$CORRAL_OUTPUT_DIR/result.txt"'
        ),
        "failing": "echo 'CORRAL_PROGRESS 0.1'; echo 'loss is NaN' >&2; exit 3",
        "long": LONG,
    }


def command_harness(tmp_path: Path) -> Harness:
    bodies = scripts(tmp_path)

    def make(scenario: str, alloc: str) -> JobWork:
        payload = {"command": ["sh", "-c", bodies[scenario]]}
        return JobWork(alloc, 1, (f"job-{alloc}",), payload=payload, checkpoint_dir=tmp_path)

    return Harness(CommandExecutor(WallClock()), WallClock(), make, checkpoints_on_preempt=True)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_command_executor_passes_the_conformance_suite(check, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    asyncio.run(check(command_harness(tmp_path)))


def run(assignment: JobWork, executor: CommandExecutor | None = None, **kw: object) -> list[Update]:
    h = Harness(executor or CommandExecutor(WallClock()), WallClock(), None)  # type: ignore[arg-type]
    return asyncio.run(run_to_end(h, assignment, **kw))  # type: ignore[arg-type]


def sh(body: str, **kwargs: object) -> JobWork:
    return JobWork(
        "alloc-7", 3, ("job-7", "job-8"), payload={"command": ["sh", "-c", body]}, **kwargs
    )  # type: ignore[arg-type]


def test_the_process_gets_its_job_through_corral_variables(tmp_path: Path) -> None:
    dump = (
        f"{sys.executable} -c 'import json, os; "
        "print(json.dumps({k: v for k, v in os.environ.items() "
        'if k.startswith(("CORRAL_", "CUDA_"))}))\''
    )
    job = sh(
        dump,
        gpu_indices=(1, 3),
        checkpoint_dir=tmp_path / "ck",
        resume_from="/ck/step-40",
        resume_step=40,
        model="sdxl",
    )
    updates = run(job)
    env = json.loads(next(u.line for u in updates if isinstance(u, LogLine)))
    assert env["CORRAL_JOB_ID"] == "job-7"
    assert env["CORRAL_JOB_IDS"] == "job-7,job-8"
    assert env["CORRAL_ALLOCATION_ID"] == "alloc-7"
    assert env["CORRAL_ATTEMPT"] == "3"
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert env["CORRAL_CHECKPOINT_DIR"] == str(tmp_path / "ck")
    assert (tmp_path / "ck").is_dir()
    assert env["CORRAL_RESUME_FROM"] == "/ck/step-40"
    assert env["CORRAL_RESUME_STEP"] == "40"
    assert env["CORRAL_MODEL"] == "sdxl"
    assert json.loads(env["CORRAL_PAYLOAD"])["command"][0] == "sh"


def test_a_cpu_job_sees_no_gpu() -> None:
    updates = run(sh('echo "[$CUDA_VISIBLE_DEVICES]"'))
    assert LogLine("[]") in updates


def test_stdout_and_stderr_stream_as_log_lines_in_order() -> None:
    updates = run(sh("echo one; echo two >&2; echo three"))
    logs = [(u.stream, u.line) for u in updates if isinstance(u, LogLine)]
    assert ("stdout", "one") in logs
    assert ("stderr", "two") in logs
    assert [line for s, line in logs if s == "stdout"] == ["one", "three"]


def test_a_failed_command_quotes_its_last_stderr_lines() -> None:
    terminal = run(sh("echo 'CUDA error: device-side assert' >&2; exit 2"))[-1]
    assert terminal == Failed(
        "command exited with code 2; last stderr: CUDA error: device-side assert", retryable=False
    )


@pytest.mark.parametrize(
    ("body", "want"),
    [
        pytest.param("exit 75", "command exited with code 75", id="tempfail-exit-code"),
        pytest.param("kill -9 $$", "command killed by SIGKILL", id="killed-by-someone-else"),
    ],
)
def test_temporary_failures_are_retryable(body: str, want: str) -> None:
    terminal = run(sh(body))[-1]
    assert isinstance(terminal, Failed)
    assert terminal.retryable
    assert terminal.error == want


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    body = (
        "trap '' TERM; i=0; while true; do i=$((i+1)); echo CORRAL_PROGRESS 0.$i; sleep 0.05; done"
    )
    updates = run(sh(body), on_update=stop_on_first_progress(StopReason.CANCEL, 0.3))
    terminal = updates[-1]
    assert isinstance(terminal, Failed)
    assert terminal.stopped is StopReason.CANCEL


def test_checkpoint_and_result_paths_are_relative_to_the_workdir(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    body = "echo 'CORRAL_CHECKPOINT ck/step-9 9'; echo 'CORRAL_RESULT model.safetensors'"
    updates = run(sh(body), CommandExecutor(WallClock(), workdir=tmp_path))
    assert Checkpoint(str(tmp_path / "ck/step-9"), 9) in updates
    assert isinstance(updates[-1], Finished)
    assert [(r.name, r.data) for r in updates[-1].results] == [("model.safetensors", b"weights")]


def test_a_fixed_command_takes_args_from_the_payload_and_refuses_payload_commands() -> None:
    executor = CommandExecutor(WallClock(), ["echo", "train"], allow_payload_command=False)
    updates = run(JobWork("a", 1, ("j",), payload={"args": ["--lr", "0.1"]}), executor)
    assert LogLine("train --lr 0.1") in updates
    guarded = CommandExecutor(WallClock(), allow_payload_command=False)
    terminal = run(sh("echo hi"), guarded)[-1]
    assert isinstance(terminal, Failed)
    assert "payload.command: this agent runs only its configured command" in terminal.error


@pytest.mark.parametrize(
    ("payload", "want"),
    [
        ({}, "payload.command: missing"),
        ({"command": 5}, "payload.command: must be a list of strings"),
        ({"command": "x", "env": {"A": 1}}, "payload.env: must be an object of string values"),
        ({"command": ["/nonexistent/trainer"]}, "cannot start '/nonexistent/trainer'"),
    ],
)
def test_bad_commands_fail_with_a_clear_error(payload: dict[str, object], want: str) -> None:
    terminal = run(JobWork("a", 1, ("j",), payload=payload))[-1]
    assert isinstance(terminal, Failed)
    assert want in terminal.error
    assert not terminal.retryable


def test_payload_env_is_passed_but_cannot_override_corral_variables() -> None:
    payload = {
        "command": "sh -c 'echo $LR $CORRAL_JOB_ID'",
        "env": {"LR": "0.1", "CORRAL_JOB_ID": "x"},
    }
    assert LogLine("0.1 j") in run(JobWork("a", 1, ("j",), payload=payload))


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("CORRAL_PROGRESS 0.25", Progress(0.25)),
        ("CORRAL_PROGRESS 30/120 epoch 3", Progress(0.25, 30, 120, "epoch 3")),
        ("CORRAL_CHECKPOINT /ck/a b/step 12", Checkpoint("/ck/a b/step", 12)),
        ("CORRAL_CHECKPOINT /ck/last", Checkpoint("/ck/last")),
        ("CORRAL_RESULT out/img.png", ResultFile(Path("out/img.png"))),
        (
            "CORRAL_PROGRESS 1.5",
            LogLine(
                "CORRAL_PROGRESS 1.5  [corral: ignored, progress must be within 0..1, got 1.5]"
            ),
        ),
        (
            "CORRAL_PROGRESS lots",
            LogLine(
                "CORRAL_PROGRESS lots  [corral: ignored, could not convert string to float: 'lots']"
            ),
        ),
        (
            "CORRAL_PREVIEW /nonexistent.png",
            LogLine(
                "CORRAL_PREVIEW /nonexistent.png  [corral: ignored, [Errno 2] "
                "No such file or directory: '/nonexistent.png']"
            ),
        ),
        ("CORRAL_RESULT", LogLine("CORRAL_RESULT  [corral: ignored, missing argument]")),
        ("CORRAL_OTHER thing", LogLine("CORRAL_OTHER thing")),
        ("epoch 1 loss 0.3", LogLine("epoch 1 loss 0.3")),
    ],
)
def test_protocol_lines(line: str, want: object) -> None:
    assert parse_line(line, "stdout") == want


def test_preview_lines_read_the_image(tmp_path: Path) -> None:
    image = tmp_path / "p.png"
    image.write_bytes(tiny_png(3))
    assert parse_line(f"CORRAL_PREVIEW {image}", "stdout") == Preview(tiny_png(3), "image/png")


def test_interrupt_keeps_files_already_in_the_output_dir(tmp_path: Path) -> None:
    updates = run(
        command_harness(tmp_path).make("long", "a9"),
        on_update=stop_on_first_progress(StopReason.INTERRUPT, 2.0),
    )
    terminal = updates[-1]
    assert isinstance(terminal, Finished)
    assert terminal.interrupted
    assert [(r.name, r.data) for r in terminal.results] == [("partial.txt", b"started\n")]


def test_the_running_process_is_known_by_allocation_for_the_vram_guard() -> None:
    executor = CommandExecutor(WallClock())
    seen: list[int | None] = []

    def look(update: Update, stop: StopSignal) -> None:
        if isinstance(update, LogLine) and update.line.isdigit():
            seen.append(executor.root_pid("alloc-7"))
            seen.append(int(update.line))

    run(sh("echo $$"), executor, on_update=look)
    assert seen[0] == seen[1]
    assert executor.root_pid("alloc-7") is None  # forgotten once it ended


def test_with_a_scratch_folder_results_are_kept_as_files_not_read(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"weights" * 1000)
    body = 'echo \'CORRAL_RESULT model.safetensors\'; printf "log" > "$CORRAL_OUTPUT_DIR/train.txt"'
    keep = tmp_path / "scratch" / "alloc-7" / "job-7"
    job = sh(body, results_root=tmp_path / "scratch")
    assert job.scratch_dir == keep
    updates = run(job, CommandExecutor(WallClock(), workdir=tmp_path))
    terminal = updates[-1]
    assert isinstance(terminal, Finished)
    model, log = terminal.results
    assert (model.name, model.data, model.size) == ("model.safetensors", b"", 7000)
    assert model.path is not None
    assert model.path.parent == keep, "it outlives the command's output folder"
    assert model.read() == b"weights" * 1000
    assert (log.name, log.read(), log.mime) == ("train.txt", b"log", "text/plain")
    assert (tmp_path / "model.safetensors").exists(), "the user's own file is left in place"
