"""Generate the Python gRPC code from src/corral/proto/corral/v1/*.proto.

Output goes to src/corral/proto/gen/ (never edited by hand). protoc writes
absolute imports rooted at the proto path (``from corral.v1 import ...``);
they are rewritten to the package path so the code imports inside corral.
``--check`` regenerates into a temporary directory and fails if the
committed code differs (scripts/check runs it).
"""

from __future__ import annotations

import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "src" / "corral" / "proto"
GEN = PROTO_ROOT / "gen"
PACKAGE = "corral.proto.gen"


def generate(out: Path) -> None:
    sources = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.glob("corral/v1/*.proto"))
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for path in out.rglob("*.py*"):
        text = path.read_text()
        text = text.replace("from corral.v1 import", f"from {PACKAGE}.corral.v1 import")
        text = text.replace("import corral.v1.", f"import {PACKAGE}.corral.v1.")
        path.write_text(text)
    for pkg in [out, *(d for d in out.rglob("*") if d.is_dir())]:
        (pkg / "__init__.py").touch()


def same_tree(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
    if cmp.left_only or cmp.right_only or cmp.diff_files:
        return False
    return all(same_tree(a / d, b / d) for d in cmp.common_dirs)


def main() -> int:
    if "--check" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp))
            if not GEN.exists() or not same_tree(Path(tmp), GEN):
                print("generated protobuf code is stale: run `python scripts/gen_proto.py`")
                return 1
        print("generated protobuf code is up to date")
        return 0
    shutil.rmtree(GEN, ignore_errors=True)
    generate(GEN)
    print(f"wrote {GEN.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
