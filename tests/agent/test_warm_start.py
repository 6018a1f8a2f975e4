"""Warm start: Python commands forked from a zygote behave as the plain subprocesses they
replace (real zygote processes, real scripts), and start cold when no zygote can fork them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from corral.agent.executors.base import (
    Failed,
    Finished,
    Gang,
    JobWork,
    LogLine,
    Ready,
    StopSignal,
    Update,
)
from corral.agent.executors.command import CommandExecutor
from corral.agent.executors.scripted import tiny_png
from corral.agent.executors.warm import RESTARTS_MAX, Zygotes
from corral.agent.main import AgentOptions, build_executors, preload_modules
from corral.agent.orders import Done, Order, Report
from corral.agent.supervisor import Supervisor
from corral.agent.testing import CHECKS, Harness, run_to_end, stop_on_first_progress
from corral.agent.topology import parse_fake
from corral.agent.vram_guard import process_tree
from corral.core import InvalidSpec, WallClock
from corral.core.states import StopReason

SRC = str(Path(__file__).resolve().parents[2] / "src")
PRELOAD = ["xml.dom.minidom"]  # cheap to import, and imported by nothing else here

SCENARIOS = {
    "quick": """
import os, sys
print("CORRAL_PROGRESS 0.5 halfway")
print(f"CORRAL_PREVIEW {sys.argv[1]}")
print("CORRAL_PROGRESS 2/2")
with open(os.path.join(os.environ["CORRAL_OUTPUT_DIR"], "result.txt"), "w") as f:
    f.write(f"done {os.environ['CORRAL_JOB_ID']}\\n")
""",
    "failing": """
import sys
print("CORRAL_PROGRESS 0.1")
print("loss is NaN", file=sys.stderr)
sys.exit(3)
""",
    "long": """
import os, signal, sys, time
def leave(*_):
    print(f"CORRAL_CHECKPOINT {os.environ['CORRAL_CHECKPOINT_DIR']}/ckpt-{i} {i}")
    sys.exit(143)
signal.signal(signal.SIGTERM, leave)
with open(os.path.join(os.environ["CORRAL_OUTPUT_DIR"], "partial.txt"), "w") as f:
    f.write("started\\n")
i = 0
while True:
    i += 1
    print(f"CORRAL_PROGRESS {i}/100000")
    time.sleep(0.02)
""",
}

REPORT = """
import json, os, sys
keys = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "MINE")
print(json.dumps({
    "env": {k: os.environ.get(k) for k in keys},
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "name": __name__,
    "preloaded": "xml.dom.minidom" in sys.modules,
}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def warm_executor(**kw: Any) -> CommandExecutor:
    return CommandExecutor(WallClock(), preload=kw.pop("preload", PRELOAD), **kw)


async def cooled(executor: CommandExecutor, work: Awaitable[Any]) -> Any:
    try:
        return await work
    finally:
        await executor.cool()


def run(
    executor: CommandExecutor, job: JobWork, on: Callable[[Update, StopSignal], None] | None = None
) -> list[Update]:
    """Run ``job`` once its zygote is ready (as at the agent's start or before a gang's go)."""

    async def warm_then_run() -> list[Update]:
        await executor.warm(job)
        return await run_to_end(Harness(executor, WallClock(), None), job, on)  # type: ignore[arg-type]

    return list(asyncio.run(cooled(executor, warm_then_run())))


def python(tmp_path: Path, body: str, *args: str, **payload: Any) -> JobWork:
    script = tmp_path / "script.py"
    script.write_text(body)
    command = [sys.executable, str(script), *args]
    return JobWork("al-1", 1, ("job-1",), payload={"command": command, **payload})


def agent_lines(updates: list[Update]) -> list[str]:
    return [u.line for u in updates if isinstance(u, LogLine) and u.stream == "agent"]


def own_lines(updates: list[Update]) -> list[tuple[str, str]]:
    return [(u.stream, u.line) for u in updates if isinstance(u, LogLine) and u.stream != "agent"]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_a_warm_command_passes_the_conformance_suite(check, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    preview = tmp_path / "preview.png"
    preview.write_bytes(tiny_png(90))
    for name, body in SCENARIOS.items():
        (tmp_path / f"{name}.py").write_text(body)
    executor = warm_executor()

    def make(scenario: str, alloc: str) -> JobWork:
        command = [sys.executable, str(tmp_path / f"{scenario}.py"), str(preview)]
        return JobWork(
            alloc, 1, (f"job-{alloc}",), payload={"command": command}, checkpoint_dir=tmp_path
        )

    async def warm_then_check() -> None:
        await executor.warm(make("quick", "warm-up"))
        await check(Harness(executor, WallClock(), make, checkpoints_on_preempt=True))

    asyncio.run(cooled(executor, warm_then_check()))


@pytest.mark.parametrize("code", [0, 3])
def test_warm_and_cold_runs_see_the_same_world_and_end_the_same(tmp_path: Path, code: int) -> None:
    job = python(tmp_path, REPORT, "--lr", "0.1", env={"EXIT": str(code), "MINE": "yes"})
    cold = run(CommandExecutor(WallClock()), job)
    warm = run(warm_executor(), job)
    assert agent_lines(warm) == ["started warm: forked with xml.dom.minidom preloaded"]
    assert agent_lines(cold) == []
    cold_report, warm_report = (json.loads(own_lines(u)[0][1]) for u in (cold, warm))
    assert warm_report.pop("preloaded")
    assert not cold_report.pop("preloaded")
    assert warm_report == cold_report
    assert warm_report["argv"] == [str(tmp_path / "script.py"), "--lr", "0.1"]
    assert warm_report["path0"] == str(tmp_path)
    assert warm_report["name"] == "__main__"
    assert own_lines(warm)[1:] == own_lines(cold)[1:] == [("stderr", "to stderr")]
    assert warm[-1] == cold[-1]


def test_a_warm_run_is_pinned_to_its_gpus_cpus_from_its_first_line(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to tell the NUMA nodes apart")
    layout = parse_fake(f"numa=0,1; cpus=0:{cpus[0]},1:{cpus[-1]}", 2)
    body = "import os\nprint(sorted(os.sched_getaffinity(0)), os.environ['CUDA_VISIBLE_DEVICES'])\n"
    job = replace(python(tmp_path, body), gpu_indices=(1,))
    updates = run(warm_executor(topology=layout), job)
    assert isinstance(updates[-1], Finished)
    assert own_lines(updates) == [("stdout", f"[{cpus[-1]}] 1")]
    assert "started warm: forked with xml.dom.minidom preloaded" in agent_lines(updates)


def test_an_uncaught_exception_exits_1_with_the_scripts_traceback(tmp_path: Path) -> None:
    job = python(tmp_path, "def main():\n    raise ValueError('bad batch')\nmain()\n")
    terminal, lines = (lambda u: (u[-1], own_lines(u)))(run(warm_executor(), job))
    assert isinstance(terminal, Failed)
    assert terminal.error.startswith("command exited with code 1"), terminal
    assert lines[-1] == ("stderr", "ValueError: bad batch")
    frames = [line for _, line in lines if line.strip().startswith("File ")]
    assert frames
    assert all("script.py" in f for f in frames), frames  # none of the zygote's


def test_death_by_a_signal_is_reported_as_for_a_subprocess(tmp_path: Path) -> None:
    job = python(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    warm, cold = run(warm_executor(), job), run(CommandExecutor(WallClock()), job)
    assert isinstance(warm[-1], Failed)
    assert warm[-1] == cold[-1]
    assert "killed by SIGKILL" in warm[-1].error
    assert warm[-1].retryable


def test_a_stop_reaches_everything_the_run_started(tmp_path: Path) -> None:
    """The forked run leads its own process group, as a subprocess does: a cancel ends its
    children too."""
    body = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "print('CORRAL_PROGRESS 0.1', flush=True)\n"
        "time.sleep(60)\n"
    )
    pids: list[int] = []

    def on(update: Update, stop: StopSignal) -> None:
        if isinstance(update, LogLine) and update.line.isdigit():
            pids.append(int(update.line))
        stop_on_first_progress(StopReason.CANCEL, 5.0)(update, stop)

    updates = run(warm_executor(), python(tmp_path, body), on)
    assert isinstance(updates[-1], Failed)
    assert updates[-1].stopped is StopReason.CANCEL
    assert pids
    assert not _alive(pids[0])


def test_a_dead_zygote_means_a_cold_start_then_a_new_zygote(tmp_path: Path) -> None:
    executor = warm_executor()
    job = python(tmp_path, REPORT)

    async def scenario() -> list[list[Update]]:
        h = Harness(executor, WallClock(), None)  # type: ignore[arg-type]
        await executor.warm(job)
        for pid in _zygotes():
            os.kill(pid, signal.SIGKILL)
        first = await run_to_end(h, job)
        await executor.warm(job)  # as a gang replica does before it says ready
        return [first, await run_to_end(h, job)]

    first, second = asyncio.run(cooled(executor, scenario()))
    assert isinstance(first[-1], Finished)
    assert isinstance(second[-1], Finished)
    [note] = agent_lines(first)
    assert note.startswith("warm start unavailable (the zygote "), note
    assert note.endswith("; started cold"), note
    assert json.loads(own_lines(first)[0][1])["preloaded"] is False
    assert agent_lines(second) == ["started warm: forked with xml.dom.minidom preloaded"]


def test_a_run_outlives_its_zygote_and_ends_retryably(tmp_path: Path) -> None:
    """Its exit code is lost with the zygote: the run still ends when it ends, retryably."""
    body = "import time\nprint('CORRAL_PROGRESS 0.1', flush=True)\ntime.sleep(0.5)\nprint('done')\n"

    def on(update: Update, stop: StopSignal) -> None:
        if isinstance(update, LogLine) and update.stream == "agent":
            for pid in _zygotes():
                os.kill(pid, signal.SIGKILL)

    updates = run(warm_executor(), python(tmp_path, body), on)
    assert ("stdout", "done") in own_lines(updates)
    assert isinstance(updates[-1], Failed)
    assert updates[-1].retryable
    assert "unknown exit status" in updates[-1].error


def test_a_zygote_that_keeps_dying_is_started_again_a_bounded_number_of_times() -> None:
    async def scenario() -> tuple[int, bool]:
        pool, started = Zygotes(), set[int]()
        try:
            for _ in range(RESTARTS_MAX + 3):
                zygote = pool.get(sys.executable, tuple(PRELOAD))
                assert zygote is not None
                if zygote.dead:
                    return len(started), zygote.forks
                assert await zygote.ready() == ""
                started.add(id(zygote))
                for pid in _zygotes():
                    os.kill(pid, signal.SIGKILL)
                for _ in range(1000):  # until the pool has seen it die
                    if zygote.dead:
                        break
                    await asyncio.sleep(0.01)
            raise AssertionError("started again without end")
        finally:
            await pool.aclose()

    assert asyncio.run(scenario()) == (1 + RESTARTS_MAX, False)


def test_a_preload_that_fails_to_import_starts_runs_cold_and_says_why(tmp_path: Path) -> None:
    updates = run(warm_executor(preload=["no_such_module_here"]), python(tmp_path, REPORT))
    assert isinstance(updates[-1], Finished)
    [note] = agent_lines(updates)
    assert note.startswith("warm start unavailable (the zygote could not preload"), note
    assert "No module named 'no_such_module_here'" in note


@pytest.mark.parametrize(
    ("payload", "want"),
    [
        ({"preload": []}, []),  # the job opts out
        ({"launcher": "torchrun"}, None),  # torchrun starts its own workers
    ],
)
def test_what_starts_cold(tmp_path: Path, payload: dict[str, Any], want: list[str] | None) -> None:
    job = python(tmp_path, REPORT, **payload)
    if want is None:  # only check that no zygote is asked: torchrun itself is not run here
        executor = warm_executor()
        asyncio.run(cooled(executor, executor.warm(job)))
        assert not _zygotes()
        return
    assert agent_lines(run(warm_executor(), job)) == want


def test_a_run_does_not_wait_for_a_zygote_still_importing(tmp_path: Path) -> None:
    """It would wait as long as a cold start takes; the zygote is for the runs after it."""
    executor = warm_executor()
    job = python(tmp_path, REPORT)

    async def scenario() -> list[list[Update]]:
        h = Harness(executor, WallClock(), None)  # type: ignore[arg-type]
        first = await run_to_end(h, job)  # the zygote starts now, with this run
        await executor.warm(job)
        return [first, await run_to_end(h, job)]

    first, second = asyncio.run(cooled(executor, scenario()))
    assert agent_lines(first) == [
        "warm start unavailable (the zygote is still importing); started cold"
    ]
    assert agent_lines(second) == ["started warm: forked with xml.dom.minidom preloaded"]


def test_a_shell_command_starts_cold(tmp_path: Path) -> None:
    job = JobWork("al", 1, ("job",), payload={"command": ["sh", "-c", "echo hi"]})
    assert agent_lines(run(warm_executor(), job)) == []


def test_a_bad_preload_names_the_field(tmp_path: Path) -> None:
    updates = run(warm_executor(), python(tmp_path, REPORT, preload=["os; rm -rf"]))
    assert isinstance(updates[-1], Failed)
    assert "payload.preload" in updates[-1].error
    with pytest.raises(InvalidSpec, match="preload"):
        preload_modules(["torch", "not a module"])
    options = AgentOptions(servers=("grpc://127.0.0.1:1",), token="t", preload=("torch",))
    with pytest.raises(InvalidSpec, match="preload: warms the runs of --command"):
        build_executors(options, WallClock(), tmp_path)


def test_a_gang_replica_says_ready_once_its_zygote_has_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The imports are part of preparing: the go is followed by a fork, not by them."""
    (tmp_path / "slow_import.py").write_text(
        "import os, pathlib, time\ntime.sleep(0.3)\n"
        "pathlib.Path(os.environ['IMPORTED']).write_text('yes')\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the zygote has the agent's environment
    monkeypatch.setenv("IMPORTED", str(tmp_path / "imported"))
    script = tmp_path / "rank.py"
    script.write_text("import sys\nprint('slow_import' in sys.modules)\n")

    async def scenario() -> list[Report]:
        clock = WallClock()
        executor = CommandExecutor(clock, preload=["slow_import"])
        sup = Supervisor({"cmd": executor}, clock, default="cmd")
        sup.gang.enabled = True
        reports: list[Report] = []
        seen_at_ready: list[bool] = []

        def sink(report: Report) -> None:
            reports.append(report)
            if isinstance(report.update, Ready):
                seen_at_ready.append((tmp_path / "imported").exists())
                sup.gang.go("al-g")

        sup.sink = sink
        job = JobWork(
            "al-g", 1, ("j",), payload={"command": [sys.executable, str(script)]},
            gang=Gang(0, 1, "127.0.0.1", 29500),
        )  # fmt: skip
        sup.assign(Order("al-g", 1, (job,)))
        for _ in range(1000):
            if any(r.terminal for r in reports):
                break
            await asyncio.sleep(0.01)
        await sup.shutdown(0.0)
        assert seen_at_ready == [True]
        return reports

    updates = [r.update for r in asyncio.run(scenario())]
    assert isinstance(updates[-1], Done)
    lines = [u.line for u in updates if isinstance(u, LogLine)]
    assert lines == ["started warm: forked with slow_import preloaded", "True"]


AGENT = """
import asyncio, sys
from corral.agent.executors.base import JobWork
from corral.agent.executors.command import CommandExecutor
from corral.core import WallClock

async def main():
    executor = CommandExecutor(WallClock(), preload=["xml.dom.minidom"])
    await executor.warm(JobWork("a", 1, ("j",), payload={"command": [sys.executable, "x.py"]}))
    print("warm", flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


def test_a_zygote_ends_with_its_agent_even_on_kill_9() -> None:
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT], stdout=subprocess.PIPE, env=os.environ | {"PYTHONPATH": SRC}
    )
    try:
        assert agent.stdout is not None
        assert agent.stdout.readline() == b"warm\n"
        [zygote] = _zygotes(agent.pid)
    finally:
        agent.kill()
        agent.wait()
        agent.stdout.close()  # type: ignore[union-attr]
    for _ in range(200):  # it notices at once; the bound is for a loaded machine
        if not _alive(zygote):
            break
        time.sleep(0.05)
    assert not _alive(zygote)


def _zygotes(parent: int | None = None) -> list[int]:
    """The zygote processes ``parent`` (this test) started; their forks share the name."""
    parent = parent or os.getpid()
    found = []
    for pid in process_tree(parent) - {parent}:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if b"zygote.py" in cmdline and ppid == parent:
            found.append(pid)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
