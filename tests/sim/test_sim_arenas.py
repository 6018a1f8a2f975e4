"""Huge pages for a simulation's objects: ``corral.sim.arenas`` and its C extension
(``src/corral/sim/arenas.c``, which ``scripts/build-native`` builds into the compiled build).

The extension changes the allocator of the whole process, so it is tried in a child
process: built here from the source with the C compiler Python was built with, enabled,
then made to serve, give back and serve again a few hundred thousand objects, and to run a
simulation whose report must match one made without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from corral.sim import arenas, generate
from corral.sim.runner import simulate

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src" / "corral" / "sim" / "arenas.c"

CHILD = textwrap.dedent(
    """
    import gc, json, sys
    sys.path.insert(0, sys.argv[1])
    import _arenas
    from corral.sim import generate
    from corral.sim.runner import simulate

    out = {"first": _arenas.enable(), "again": _arenas.enable()}
    start, end = _arenas.region()
    made = [(i, str(i)) for i in range(300_000)]  # small objects: pymalloc's
    out["inside"] = sum(start <= id(t) < end for t in made[-1000:])
    out["after_made"] = _arenas.stats()
    del made
    gc.collect()
    again = [(i, str(i)) for i in range(300_000)]
    out["after_again"] = _arenas.stats()
    del again
    flags = ""
    with open("/proc/self/smaps") as maps:
        inside = False
        for line in maps:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= start < hi
            elif inside and line.startswith("VmFlags:"):
                flags = line
    out["vmflags"] = flags.split()[1:]
    summary = simulate(generate.scenario(40, 2000, seed=3), "corral")
    out["summary"] = json.dumps(summary, sort_keys=True)
    print(json.dumps(out))
    """
)


def _build(tmp_path: Path) -> Path:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) to build arenas.c")
    target = tmp_path / f"_arenas{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    include = sysconfig.get_paths()["include"]
    command = [compiler, "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror"]
    subprocess.run([*command, f"-I{include}", str(SOURCE), "-o", str(target)], check=True)
    return tmp_path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise huge pages: Linux")
def test_arenas_come_from_the_region_are_reused_and_a_run_reports_the_same(
    tmp_path: Path,
) -> None:
    built = _build(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(built)])}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(built)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    ok, why = out["first"]
    if arenas.thp_mode() in (None, "never"):
        pytest.skip("this kernel has no transparent huge pages, or they are disabled")
    assert ok is True, why
    assert out["again"] == [True, "already on in this process"]
    assert "hg" in out["vmflags"]  # the region is marked MADV_HUGEPAGE
    assert out["inside"] == 1000  # new small objects live in the region
    made, again = out["after_made"], out["after_again"]
    assert made["enabled"] is True
    assert made["fresh"] * made["arena_bytes"] == made["used_bytes"] > 0
    assert made["elsewhere"] == 0
    # what was given back served the second round: reused, and little fresh memory
    assert again["reused"] > made["reused"]
    assert again["used_bytes"] < 2 * made["used_bytes"]
    plain = simulate(generate.scenario(40, 2000, seed=3), "corral")
    assert out["summary"] == json.dumps(plain, sort_keys=True)


def test_without_the_compiled_build_or_when_turned_off_it_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CORRAL_HUGE_PAGES", "0")
    assert arenas.use_huge_pages() == "off (CORRAL_HUGE_PAGES=0)"
    monkeypatch.delenv("CORRAL_HUGE_PAGES")
    if arenas.stats() is None:  # pure Python: no extension to turn on
        assert arenas.use_huge_pages().startswith("off (no corral.sim._arenas")


def test_the_kernels_mode_is_read_from_its_setting(tmp_path: Path) -> None:
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    assert arenas.thp_mode(setting) == "madvise"
    setting.write_text("[never]\n")
    assert arenas.thp_mode(setting) == "never"
    assert arenas.thp_mode(tmp_path / "missing") is None
