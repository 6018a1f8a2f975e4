"""The compiled build's bookkeeping (``scripts/native.py``): what is compiled, and the
freshness stamp that keeps a stale build from being measured or tested.

Building itself takes about two minutes (profile-guided: two compiles and a training
run) and runs in ``scripts/build-native``; ``scripts/test-native`` runs tests/scheduler
and tests/sim against the build.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _native() -> ModuleType:
    spec = importlib.util.spec_from_file_location("native", ROOT / "scripts" / "native.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_hot_modules_are_compiled_and_the_known_misfits_are_not() -> None:
    native = _native()
    targets = native.targets()
    for hot in (
        "scheduler/incremental.py",
        "scheduler/capacity.py",
        "sim/world.py",
        "core/clock.py",
    ):
        assert f"corral/{hot}" in targets
    assert "corral/core/model.py" in targets
    for left in native.NOT_COMPILED:
        assert f"corral/{left}" not in targets
    assert not any("/server/" in t or "/agent/" in t for t in targets)


def test_the_digest_covers_exactly_what_the_build_copies() -> None:
    native = _native()
    copied = {p.relative_to(native.SOURCES).as_posix() for p in native.sources()}
    assert "__init__.py" in copied
    assert "scheduler/incremental.py" in copied
    assert not any(p.startswith(("server/", "agent/", "cli/")) for p in copied)
    assert native.digest() == native.digest()


def test_a_missing_or_stale_build_is_refused_with_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native = _native()
    monkeypatch.setattr(native, "STAMP", tmp_path / "SOURCES.sha256")
    assert "run scripts/build-native" in native.stale()
    native.STAMP.write_text("0" * 64 + "\n")
    assert "stale" in native.stale()
    native.STAMP.write_text(native.digest() + "\n")
    assert native.stale() is None


def test_a_run_against_the_build_finds_it_first_on_the_path() -> None:
    native = _native()
    path = native.env()["PYTHONPATH"].split(os.pathsep)
    assert path[0] == str(native.BUILD)


def test_the_c_extensions_are_part_of_the_digest_and_named_for_the_build() -> None:
    native = _native()
    copied = {p.relative_to(native.SOURCES).as_posix() for p in native.sources()}
    for source, module in native.EXTENSIONS:
        assert source in copied  # an edit of the C makes the build stale
        assert module.startswith("corral.")
