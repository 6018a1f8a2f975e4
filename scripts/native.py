"""The compiled build of corral's pure hot packages (``scripts/build-native``): where it
is, and whether it is fresh.

``scripts/build-native`` copies ``corral.core``, ``corral.scheduler`` and ``corral.sim``
(``PACKAGES``) to ``build/native/corral`` (git-ignored) and compiles them there with
mypyc (less ``NOT_COMPILED``), as mypy and black ship compiled wheels. The build's
``corral/__init__.py`` is the source's plus one line that extends the package's path
to ``src/corral``, so every other subpackage (cli, server, ...) is imported from the
sources. Nothing compiled is ever written into ``src/``: pure Python stays what an
editable install imports. A run against the build puts ``build/native`` first on
``PYTHONPATH`` (``env()``); the stamp written at build time holds a digest of the
sources it was built from, and ``stale()`` says when they have changed since.

``python scripts/native.py digest|stamp DIGEST|check|sources|targets|extensions|path``:
print the sources' digest, write the stamp, check it (exit 1 when missing or stale), list
what is copied, what mypyc compiles, the C extensions (source and module file), print the
build directory.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "src" / "corral"
BUILD = ROOT / "build" / "native"
STAMP = BUILD / "SOURCES.sha256"
# What is compiled: these packages, less the modules that stay interpreted: lifecycle.py
# (mypyc cannot compile its generic dataclass, Lifecycle[S]; the gate, gate.py, is
# compiled) and states.py (its enums and tables, off the hot path); errors.py (other packages
# subclass its exceptions together with built-in ones, which a compiled base forbids);
# sim/loaders.py (a YAML loader subclass whose constructors are generators); sim/traces.py
# (compiled, a generator expression handed to a generator was read ahead, so a bad row
# surfaced before the rows above it); the rest of core (but its virtual clock, whose timers
# the simulator sets per job) is not on the simulator's hot path.
PACKAGES = ("core", "scheduler", "sim")
NOT_COMPILED = (
    "core/__init__.py",
    "core/errors.py",
    "core/events.py",
    "core/lifecycle.py",
    "core/states.py",
    "sim/loaders.py",
    "sim/traces.py",
)


# C extensions built beside the compiled modules: (source under ``src/corral``, module name).
# ``sim/arenas.c`` serves pymalloc's arenas from huge pages (``corral.sim.arenas``).
EXTENSIONS = (("sim/arenas.c", "corral.sim._arenas"),)


def digest() -> str:
    """A digest of the Python sources the build copies (``sources()``)."""
    h = hashlib.sha256()
    for path in sources():
        h.update(str(path.relative_to(SOURCES)).encode())
        h.update(b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def sources() -> list[Path]:
    """What the build copies: the package's ``__init__.py`` and ``PACKAGES`` (their Python
    modules, and C extensions such as ``sim/arenas.c``: ``EXTENSIONS``)."""
    out = [SOURCES / "__init__.py"]
    for package in PACKAGES:
        out.extend(sorted((SOURCES / package).rglob("*.py")))
        out.extend(sorted((SOURCES / package).rglob("*.c")))
    return [p for p in out if "__pycache__" not in p.parts]


def stale() -> str | None:
    """Why the build cannot be used (missing, or built from other sources), or None."""
    if not STAMP.exists():
        return f"no compiled build in {BUILD}: run scripts/build-native"
    if STAMP.read_text().strip() != digest():
        return "the compiled build is stale (its sources changed since): run scripts/build-native"
    return None


def env() -> dict[str, str]:
    """The environment of a process that imports the compiled build."""
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(BUILD), environ.get("PYTHONPATH", "")) if p
    )
    return environ


def targets() -> list[str]:
    """The files handed to mypyc, relative to the build directory."""
    out = []
    for package in PACKAGES:
        for path in sorted((SOURCES / package).glob("*.py")):
            rel = f"{package}/{path.name}"
            if rel not in NOT_COMPILED:
                out.append(f"corral/{rel}")
    return out


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "check"
    if command == "digest":
        print(digest())
        return 0
    if command == "stamp":  # the digest taken before the sources were copied
        STAMP.write_text(argv[1] + "\n")
        return 0
    if command == "sources":
        print("\n".join(str(p.relative_to(SOURCES)) for p in sources()))
        return 0
    if command == "targets":
        print("\n".join(targets()))
        return 0
    if command == "extensions":  # source, then where its module goes, per line
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        for source, module in EXTENSIONS:
            print(source, module.replace(".", "/") + suffix)
        return 0
    if command == "path":
        print(BUILD)
        return 0
    problem = stale()
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
