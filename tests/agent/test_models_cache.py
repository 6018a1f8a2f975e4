"""The model cache on disk: budget, LRU eviction, pins, restarts, integrity, repairs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from model_fixtures import KIB, JumpClock, blob, put, spec_for

from corral.agent.models import CacheFull, IntegrityError, ModelCache, ModelSpec

SIZE = 100 * KIB
BUDGET = 3 * SIZE  # room for three of the models below, not four
DATA = {name: blob(SIZE, seed) for seed, name in enumerate("abcde")}
SPECS = {name: spec_for(name, data, "/nowhere") for name, data in DATA.items()}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def fill(cache: ModelCache, *names: str) -> None:
    for name in names:
        put(cache, SPECS[name], DATA[name])


def test_least_recently_used_goes_first_when_the_budget_is_short(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, BUDGET, JumpClock())
    fill(cache, "a", "b", "c")
    cache.unpin(cache.pin("a"))  # a job used a: b is now the least recently used
    fill(cache, "d")
    assert cache.on_disk() == ("a", "c", "d")
    fill(cache, "e")
    assert cache.on_disk() == ("a", "d", "e")
    assert cache.used_bytes == BUDGET
    assert sorted(p.name for p in (tmp_path / "blobs").iterdir()) == sorted(
        SPECS[n].sha256 for n in "ade"
    )


@pytest.mark.anyio
async def test_a_model_in_use_is_never_evicted(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, BUDGET, JumpClock())
    fill(cache, "a", "b", "c")
    async with cache.use("a") as path:  # a is the least recently used, but pinned
        cache.unpin(cache.pin("b"))
        cache.unpin(cache.pin("c"))
        fill(cache, "d")
        assert cache.on_disk() == ("a", "c", "d")
        assert path.read_bytes() == DATA["a"]
    fill(cache, "e")  # leaving use() counts as a use: c is the least recently used now
    assert cache.on_disk() == ("a", "d", "e")


@pytest.mark.anyio
async def test_when_everything_is_pinned_the_cache_refuses_clearly(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, BUDGET, JumpClock())
    fill(cache, "a", "b", "c")
    async with cache.use("a"), cache.use("b"), cache.use("c"):
        with pytest.raises(CacheFull) as caught:
            cache.reserve(SPECS["d"])
    message = str(caught.value)
    assert caught.value.model == "d"
    assert "no room for model d (100.0 KiB)" in message
    assert all(f"{n} (100.0 KiB)" in message for n in "abc")
    assert cache.on_disk() == ("a", "b", "c")  # nothing deleted for a refusal


def test_a_model_bigger_than_the_budget_is_refused(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, BUDGET, JumpClock())
    huge = ModelSpec("huge", BUDGET + 1, "0" * 64, ("/nowhere",))
    with pytest.raises(CacheFull, match="larger than the whole cache budget"):
        cache.reserve(huge)


def test_two_names_for_the_same_bytes_share_one_file(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, BUDGET, JumpClock())
    fill(cache, "a")
    alias = spec_for("a-alias", DATA["a"], "/nowhere")
    assert cache.link(alias)
    assert cache.on_disk() == ("a", "a-alias")
    assert cache.used_bytes == SIZE
    cache.remove("a")
    assert cache.on_disk() == ("a-alias",)
    assert cache.blob_path(alias.sha256).exists()


def test_the_cache_survives_a_restart_with_its_lru_order(tmp_path: Path) -> None:
    clock = JumpClock()
    cache = ModelCache(tmp_path, BUDGET, clock)
    fill(cache, "a", "b", "c")
    cache.unpin(cache.pin("a"))
    cache.flush()
    again = ModelCache(tmp_path, BUDGET, clock)
    assert again.on_disk() == ("a", "b", "c")
    assert [m.name for m in again.models()] == ["a", "c", "b"]
    found = again.lookup("a")
    assert found is not None
    assert found.path.read_bytes() == DATA["a"]
    fill(again, "d")
    assert again.on_disk() == ("a", "c", "d")


def test_a_restart_drops_files_that_are_missing_or_the_wrong_size(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, BUDGET, JumpClock())
    fill(cache, "a", "b", "c")
    cache.blob_path(SPECS["a"].sha256).unlink()
    with open(cache.blob_path(SPECS["b"].sha256), "r+b") as f:
        f.truncate(SIZE // 2)
    again = ModelCache(tmp_path, BUDGET, JumpClock())
    assert again.on_disk() == ("c",)
    assert any("a: file is missing" in n for n in again.notes)
    assert any(f"b: file has {SIZE // 2} bytes, not {SIZE}" in n for n in again.notes)
    assert not again.blob_path(SPECS["b"].sha256).exists()


def test_a_smaller_budget_after_a_restart_evicts_the_least_recently_used(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, BUDGET, JumpClock())
    fill(cache, "a", "b", "c")
    again = ModelCache(tmp_path, 2 * SIZE, JumpClock())
    assert again.on_disk() == ("b", "c")


@pytest.mark.anyio
async def test_verify_finds_a_corrupted_file_and_names_both_hashes(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, BUDGET, JumpClock())
    fill(cache, "a", "b")
    path = cache.blob_path(SPECS["a"].sha256)
    data = bytearray(path.read_bytes())
    data[10] ^= 1
    path.write_bytes(bytes(data))  # same size: only a re-hash can tell
    assert ModelCache(tmp_path, BUDGET, JumpClock()).on_disk() == ("a", "b")
    bad = await cache.verify_all()
    assert [e.model for e in bad] == ["a"]
    assert isinstance(bad[0], IntegrityError)
    assert SPECS["a"].sha256 in str(bad[0])
    assert bad[0].actual in str(bad[0])
    assert bad[0].actual != SPECS["a"].sha256
    assert cache.on_disk() == ("b",)
    assert not path.exists()
    await cache.verify("b")  # a good file passes


def test_an_unreadable_index_is_moved_aside_and_files_are_kept_to_re_verify(
    tmp_path: Path,
) -> None:
    cache = ModelCache(tmp_path, BUDGET, JumpClock())
    fill(cache, "a")
    (tmp_path / "index.json").write_text("{not json")
    again = ModelCache(tmp_path, BUDGET, JumpClock())
    assert again.on_disk() == ()
    assert (tmp_path / "index.json.unreadable").exists()
    assert again.part_path(SPECS["a"].sha256).read_bytes() == DATA["a"]
    assert again.used_bytes == SIZE  # an idle partial still counts against the budget


def test_the_index_is_replaced_atomically(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, BUDGET, JumpClock())
    fill(cache, "a")
    (tmp_path / ".index.json.tmp").write_text("half a wri")  # a crash mid-write
    again = ModelCache(tmp_path, BUDGET, JumpClock())
    assert again.on_disk() == ("a",)
    assert not (tmp_path / ".index.json.tmp").exists()
    raw = json.loads((tmp_path / "index.json").read_text())
    assert raw["models"]["a"]["sha256"] == SPECS["a"].sha256
    assert raw["blobs"][SPECS["a"].sha256]["size"] == SIZE


def test_stray_files_are_cleaned_up_at_load(tmp_path: Path) -> None:
    ModelCache(tmp_path, BUDGET, JumpClock())
    (tmp_path / "blobs" / "notes.txt").write_text("x")
    (tmp_path / "partial" / "junk").write_text("x")
    again = ModelCache(tmp_path, BUDGET, JumpClock())
    assert os.listdir(tmp_path / "blobs") == []
    assert os.listdir(tmp_path / "partial") == []
    assert len(again.notes) == 2


def test_an_idle_partial_is_evicted_before_any_model(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, BUDGET, JumpClock())
    fill(cache, "a", "b")
    cache.part_path(SPECS["e"].sha256).write_bytes(DATA["e"][: SIZE // 2])
    fill(cache, "c")
    assert cache.on_disk() == ("a", "b", "c")
    assert not cache.part_path(SPECS["e"].sha256).exists()
