"""Fail when a module outgrows the size budget (STYLE.md habit 10).

Generated protobuf code is exempt: nobody reads or edits it by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

MAX_LINES = 500  # about 400 is the target; 500 is where a module must be split
EXEMPT = ("proto/gen/",)


def main() -> int:
    root = Path(__file__).resolve().parent.parent / "src" / "corral"
    over = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(rel.startswith(e) for e in EXEMPT):
            continue
        lines = sum(1 for _ in path.open(encoding="utf-8"))
        if lines > MAX_LINES:
            over.append(f"  src/corral/{rel}: {lines} lines (budget {MAX_LINES})")
    if over:
        print("modules over the size budget; split them:\n" + "\n".join(over))
        return 1
    print(f"all modules within {MAX_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
