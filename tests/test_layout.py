"""The test tree itself: pytest imports test modules by basename (rootdir-relative
"prepend" mode, so each directory's helper modules import plainly), so two test
files with the same name in different directories would clash at collection."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).parent


def test_test_module_basenames_are_unique() -> None:
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name != "conftest.py")
    clashes = sorted(n for n, c in names.items() if c > 1 and n != "__init__.py")
    assert clashes == [], f"rename these so each basename is unique: {clashes}"
