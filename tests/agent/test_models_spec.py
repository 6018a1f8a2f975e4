"""ModelSpec validation, the pure eviction decision, and what progress says."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.agent.models import (
    DownloadProgress,
    DownloadSettings,
    DownloadState,
    ModelKind,
    ModelSettings,
    ModelSpec,
)
from corral.agent.models.eviction import Candidate, Rank, plan_eviction
from corral.core import InvalidSpec

SHA = "ab" * 32
GOOD = {"name": "sdxl-base", "size": 1000, "sha256": SHA, "sources": ["https://h/x.safetensors"]}


def test_a_registry_entry_becomes_a_spec() -> None:
    spec = ModelSpec.from_mapping(
        {**GOOD, "size": "2KiB", "kind": "lora", "backend": "a1111", "sha256": SHA.upper()}
    )
    assert (spec.size, spec.kind, spec.backend, spec.sha256) == (2048, ModelKind.LORA, "a1111", SHA)


@pytest.mark.parametrize(
    ("change", "want_field"),
    [
        pytest.param({"name": ""}, "model.name", id="empty-name"),
        pytest.param({"name": "a b"}, "model.name", id="space-in-name"),
        pytest.param({"size": -1}, "model.size", id="negative-size"),
        pytest.param({"size": "lots"}, "model.size", id="size-not-a-size"),
        pytest.param({"sha256": "abc"}, "model.sha256", id="short-hash"),
        pytest.param({"sources": []}, "model.sources", id="no-source"),
        pytest.param({"sources": "https://h/x"}, "model.sources", id="sources-not-a-list"),
        pytest.param({"sources": ["https://h/x", "ftp://h/x"]}, "model.sources[1]", id="ftp"),
        pytest.param({"sources": ["models/x.ckpt"]}, "model.sources[0]", id="relative-path"),
        pytest.param({"sources": ["http:///x"]}, "model.sources[0]", id="url-without-host"),
        pytest.param({"kind": "weights"}, "model.kind", id="unknown-kind"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(change: dict[str, object], want_field: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        ModelSpec.from_mapping({**GOOD, **change})
    assert caught.value.field == want_field


def test_a_missing_field_is_named() -> None:
    with pytest.raises(InvalidSpec, match=r"model\.sha256: is required"):
        ModelSpec.from_mapping({k: v for k, v in GOOD.items() if k != "sha256"})


def test_file_sources_are_accepted() -> None:
    spec = ModelSpec.from_mapping({**GOOD, "sources": ["/srv/m.ckpt", "file:///srv/m.ckpt"]})
    assert spec.sources == ("/srv/m.ckpt", "file:///srv/m.ckpt")


@pytest.mark.parametrize(
    ("done", "state", "want"),
    [
        pytest.param(430, DownloadState.FETCHING, "waiting for model sdxl-base: 43%", id="43"),
        pytest.param(999, DownloadState.FETCHING, "waiting for model sdxl-base: 99%", id="no-100"),
        pytest.param(0, DownloadState.QUEUED, "waiting for model sdxl-base: 0%", id="queued"),
        pytest.param(1000, DownloadState.VERIFYING, "verifying model sdxl-base", id="verify"),
        pytest.param(1000, DownloadState.DONE, "model sdxl-base is ready", id="done"),
    ],
)
def test_progress_reads_as_a_job_shows_it(done: int, state: DownloadState, want: str) -> None:
    assert DownloadProgress("sdxl-base", done, 1000, state, ("job-1",)).message == want


# ---- eviction: a pure decision --------------------------------------------------

PARTIAL = Candidate("partial:p", 30, Rank.PARTIAL, 0, label="partial p")
ORPHAN = Candidate("o", 40, Rank.ORPHAN, 9, label="old o")
OLD = Candidate("a", 100, Rank.MODEL, 1, label="a")
MID = Candidate("b", 100, Rank.MODEL, 2, label="b")
NEW = Candidate("c", 100, Rank.MODEL, 3, label="c")
OLD_PINNED = Candidate("a", 100, Rank.MODEL, 1, pinned=True, label="a")


@pytest.mark.parametrize(
    ("candidates", "used", "need", "want_victims", "want_fits"),
    [
        pytest.param([OLD, MID, NEW], 300, 0, [], True, id="room-already"),
        pytest.param([NEW, MID, OLD], 300, 100, ["a"], True, id="least-recently-used-first"),
        pytest.param([NEW, MID, OLD], 300, 150, ["a", "b"], True, id="as-many-as-needed"),
        pytest.param([OLD_PINNED, MID, NEW], 300, 100, ["b"], True, id="pinned-skipped"),
        pytest.param([OLD, PARTIAL], 230, 100, ["partial:p"], True, id="partials-go-first"),
        pytest.param([OLD, ORPHAN], 240, 101, ["o", "a"], True, id="orphans-before-models"),
        pytest.param([OLD_PINNED], 100, 350, [], False, id="everything-pinned"),
        pytest.param([OLD], 100, 500, [], False, id="bigger-than-the-budget"),
    ],
)
def test_eviction_picks_the_cheapest_victims(
    candidates: list[Candidate],
    used: int,
    need: int,
    want_victims: list[str],
    want_fits: bool,
) -> None:
    plan = plan_eviction(candidates, used=used, budget=300, need=need)
    assert [v.key for v in plan.victims] == want_victims
    assert plan.fits is want_fits


def test_a_refusal_names_what_holds_the_space() -> None:
    plan = plan_eviction([OLD_PINNED, MID], used=200, budget=250, need=200)
    assert not plan.fits
    assert [c.label for c in plan.held] == ["a"]


def test_settings_read_cli_values_and_name_bad_fields(tmp_path: Path) -> None:
    settings = ModelSettings.parse(tmp_path, "2GiB")
    assert (settings.dir, settings.budget_bytes) == (tmp_path, 2 * 1024**3)
    with pytest.raises(InvalidSpec, match=r"^models\.budget: not a size"):
        ModelSettings.parse(tmp_path, "plenty")
    with pytest.raises(InvalidSpec, match=r"^models\.parallel: must be at least 1"):
        DownloadSettings(parallel=0)
    with pytest.raises(InvalidSpec, match=r"^models\.jitter"):
        DownloadSettings(jitter=1.5)
