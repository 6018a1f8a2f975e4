"""The agent uses its model cache: a job waits for its model (progress shown per job), runs
with the verified file pinned, and a model it cannot have is a retryable failure that says why.

Real HTTP file servers on loopback (``model_fixtures``): one that holds a transfer
half way, one that serves a corrupted file, one that answers 404.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from model_fixtures import KIB, FileServer, agent, blob, file_server, spec_for

from corral.agent.executors.base import (
    Failed,
    Finished,
    JobWork,
    Progress,
    Result,
    Started,
    StopSignal,
    Update,
)
from corral.agent.model_report import ModelReporter, api_base, spec_from, token_headers
from corral.agent.models import ModelManager, ModelSpec
from corral.agent.orders import Done, Order, Report
from corral.agent.supervisor import Supervisor
from corral.agent.wire import order_from
from corral.core import VirtualClock
from corral.core.states import StopReason
from corral.proto.gen.corral.v1 import agent_pb2 as pb

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SIZE = 256 * KIB
A, B, C = blob(SIZE, seed=1), blob(SIZE, seed=2), blob(SIZE, seed=3)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def server() -> Iterator[FileServer]:
    with file_server() as s:
        yield s


class ReadsModel:
    """An executor that answers with the first bytes of its model file, and says it is loaded."""

    name = "reader"

    def __init__(self) -> None:
        self.seen: list[JobWork] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self._loaded: tuple[str, ...] = ()

    def loaded(self) -> tuple[str, ...]:
        return self._loaded

    async def run(self, assignment: JobWork, stop: StopSignal) -> AsyncIterator[Update]:
        self.seen.append(assignment)
        assert assignment.model_path is not None
        self._loaded = (assignment.model or "",)
        await self.gate.wait()
        head = assignment.model_path.read_bytes()[:16]
        yield Finished((Result("head.bin", head),))


class Bench:
    def __init__(self, models: ModelManager, executor: ReadsModel) -> None:
        self.sup = Supervisor({"reader": executor}, VirtualClock(), default="reader", models=models)
        self.reports: list[Report] = []
        self.sup.sink = self.reports.append

    def of(self, alloc: str) -> list[Report]:
        return [r for r in self.reports if r.allocation_id == alloc]

    async def ended(self, alloc: str) -> Report:
        return await until(lambda: next((r for r in self.of(alloc) if r.terminal), None))


async def until(probe: Callable[[], Report | bool | None], timeout: float = 10.0) -> Report:
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := probe()):
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)
    return value  # type: ignore[return-value]


def order(alloc: str, job: str, spec: ModelSpec | str) -> Order:
    work = (JobWork(alloc, 1, (job,), model=spec if isinstance(spec, str) else spec.name),)
    specs = {job: spec} if isinstance(spec, ModelSpec) else {job: "bad entry"}
    return Order(alloc, 1, work, model_specs=specs)


async def test_a_job_waits_for_its_model_showing_progress_then_runs_with_it(
    server: FileServer, tmp_path: Path
) -> None:
    spec = spec_for("sdxl-base", A, server.add("sdxl", A, hold_at=128 * KIB))
    reader = ReadsModel()
    async with agent(tmp_path) as models:
        bench = Bench(models, reader)
        bench.sup.assign(order("al-1", "job-1", spec))
        await until(lambda: any("waiting for model sdxl-base" in _msg(r) for r in bench.of("al-1")))
        assert not any(isinstance(r.update, Started) for r in bench.of("al-1"))
        server.release("sdxl")
        done = (await bench.ended("al-1")).update
    assert isinstance(done, Done)
    assert done.results[0].result.data == A[:16]
    messages = [_msg(r) for r in bench.of("al-1") if isinstance(r.update, Progress)]
    assert "waiting for model sdxl-base: 0%" in messages
    assert "waiting for model sdxl-base: 50%" in messages  # where the server held the transfer
    assert all(r.job_id == "job-1" for r in bench.of("al-1") if isinstance(r.update, Progress))
    kinds = [type(r.update).__name__ for r in bench.of("al-1")]
    assert kinds.index("Started") > max(i for i, k in enumerate(kinds) if k == "Progress")
    assert reader.seen[0].model_path == models.cache.blob_path(spec.sha256)


@pytest.mark.parametrize(
    ("behaviour", "want"),
    [({"corrupt": True}, "sha256 mismatch"), ({"statuses": [404] * 10}, "404")],
    ids=["corrupted-file", "missing-file"],
)
async def test_a_model_it_cannot_have_is_a_retryable_failure_naming_it(
    server: FileServer, tmp_path: Path, behaviour: dict[str, object], want: str
) -> None:
    spec = spec_for("lora-x", A, server.add("lora", A, **behaviour))
    async with agent(tmp_path) as models:
        bench = Bench(models, ReadsModel())
        bench.sup.assign(order("al-1", "job-1", spec))
        failed = (await bench.ended("al-1")).update
    assert isinstance(failed, Failed)
    assert failed.retryable
    assert "lora-x" in failed.error
    assert want in failed.error
    assert not any(isinstance(r.update, Started) for r in bench.of("al-1"))


async def test_a_registry_entry_the_agent_cannot_read_fails_for_good(tmp_path: Path) -> None:
    async with agent(tmp_path) as models:
        bench = Bench(models, ReadsModel())
        bench.sup.assign(order("al-1", "job-1", "broken"))
        failed = (await bench.ended("al-1")).update
    assert isinstance(failed, Failed)
    assert not failed.retryable
    assert "model broken: bad entry" in failed.error


async def test_a_cancel_while_waiting_ends_it_at_once_and_the_download_goes_on(
    server: FileServer, tmp_path: Path
) -> None:
    spec = spec_for("sdxl", A, server.add("sdxl", A, hold_at=64 * KIB))
    async with agent(tmp_path) as models:
        bench = Bench(models, ReadsModel())
        bench.sup.assign(order("al-1", "job-1", spec))
        await server.arrived("sdxl", 1)
        bench.sup.stop("al-1", StopReason.CANCEL, 5.0)
        failed = (await bench.ended("al-1")).update
        assert isinstance(failed, Failed)
        assert "cancelled" in failed.error
        assert not failed.retryable
        server.release("sdxl")
        await models.downloader.ensure(spec)  # it carried on as a prefetch
        assert models.on_disk() == ("sdxl",)


async def test_a_budget_smaller_than_the_models_evicts_idle_ones_never_one_in_use(
    server: FileServer, tmp_path: Path
) -> None:
    specs = [
        spec_for(n, d, server.add(n, d))
        for n, d in (("model-a", A), ("model-b", B), ("model-c", C))
    ]
    reader = ReadsModel()
    async with agent(tmp_path, budget=2 * SIZE + SIZE // 2) as models:  # room for two of three
        bench = Bench(models, reader)
        reader.gate.clear()  # model-a's job holds its model while the others arrive
        bench.sup.assign(order("al-a", "job-a", specs[0]))
        await until(lambda: bool(reader.seen))
        bench.sup.assign(order("al-b", "job-b", specs[1]))
        await until(lambda: len(reader.seen) == 2)
        bench.sup.assign(order("al-c", "job-c", specs[2]))  # no room: a and b are in use
        full = (await bench.ended("al-c")).update
        assert isinstance(full, Failed)
        assert full.retryable
        assert "no room for model model-c" in full.error
        reader.gate.set()
        await bench.ended("al-a")
        await bench.ended("al-b")
        bench.sup.assign(order("al-c2", "job-c2", specs[2]))  # now the older one is evicted
        assert isinstance((await bench.ended("al-c2")).update, Done)
        assert set(models.on_disk()) == {"model-b", "model-c"}


async def test_the_status_report_merges_cache_backends_and_downloads(
    server: FileServer, tmp_path: Path
) -> None:
    spec = spec_for("sdxl", A, server.add("sdxl", A))
    slow = spec_for("flux", B, server.add("flux", B, hold_at=64 * KIB))
    reader = ReadsModel()
    async with agent(tmp_path) as models:
        reporter = ModelReporter(models, lambda: (("native-ckpt",), {"a1111": ("native-ckpt",)}),
                                 {"reader": reader})  # fmt: skip
        bench = Bench(models, reader)
        reporter.changed.clear()
        bench.sup.assign(order("al-1", "job-1", spec))
        await bench.ended("al-1")
        assert reporter.changed.is_set()  # the download and the finished job marked it
        models.prefetch(slow)
        await server.arrived("flux", 1)
        status = reporter.status()
        server.release("flux")
    assert list(status.models_on_disk) == ["native-ckpt", "sdxl"]
    assert {k: list(v.models) for k, v in status.loaded_by_backend.items()} == {
        "a1111": ["native-ckpt"],
        "reader": ["sdxl"],
    }
    assert [(d.model, d.bytes_total, list(d.jobs)) for d in status.downloads] == [
        ("flux", SIZE, [])
    ]
    assert status.cache_budget_bytes == 10 * 1024 * KIB
    assert status.cache_used_bytes >= SIZE


def test_assignments_carry_specs_with_server_sources_resolved() -> None:
    ref = pb.ModelRef(name="m", size=10, sha256="a" * 64, kind="lora",
                      sources=["/v1/models/m/file", "https://hf.example/m"])  # fmt: skip
    msg = pb.Assign(allocation_id="al", attempt=1, jobs=[pb.Work(job_id="j", model="m",
                                                                model_ref=ref)])  # fmt: skip
    got = order_from(msg, None, "http://10.0.0.5:8470").model_specs["j"]
    assert isinstance(got, ModelSpec)
    assert got.sources == ("http://10.0.0.5:8470/v1/models/m/file", "https://hf.example/m")
    assert got.kind.value == "lora"
    broken = pb.ModelRef(name="m", size=0, sha256="x", sources=["/x"])
    bad = pb.Assign(jobs=[pb.Work(job_id="j", model="m", model_ref=broken)])
    assert "registry entry is not usable" in str(order_from(bad, None, "").model_specs["j"])
    assert order_from(pb.Assign(jobs=[pb.Work(job_id="j", model="sd15")])).model_specs == {}
    with pytest.raises(ValueError, match=r"sources\[0\].*API is unknown"):
        spec_from(pb.ModelRef(name="m", size=1, sha256="a" * 64, sources=["/rel"]), "")


def test_the_api_base_and_who_gets_the_token() -> None:
    assert api_base("10.0.0.5:8471", False, pb.Welcome(api_port=8470)) == "http://10.0.0.5:8470"
    assert api_base("h:8471", True, pb.Welcome(api_port=443)) == "https://h:443"
    assert api_base("h:8471", False, pb.Welcome(api_url="https://corral.example/")) == (
        "https://corral.example"
    )
    assert api_base("h:8471", False, pb.Welcome()) == ""
    base = "http://10.0.0.5:8470"
    assert token_headers(base, "T", base + "/v1/models/m/file") == {"Authorization": "Bearer T"}
    assert token_headers(base, "T", "https://huggingface.co/x") == {}
    assert token_headers(base, "T", base + ".evil.example/x") == {}


def _msg(report: Report) -> str:
    return report.update.message if isinstance(report.update, Progress) else ""
