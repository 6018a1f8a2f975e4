"""A command provider for tests: machines are rows in a JSON state file.

``python provider_script.py STATE_FILE list|launch|terminate`` reads the
request on stdin, as ``corral.server.providers.CommandProvider`` sends it. The
state file keeps the members, the launch request ids seen (a launch sent again
starts nothing) and the last launch request, so tests can check what the
provider was given. With ``PROVIDER_LAG_S`` set, ``list`` hides machines
launched less than that many seconds ago, as a cloud API's list lags. Writes go
through a temporary file and ``os.replace``, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def main(state_file: str, action: str) -> int:
    path = Path(state_file)
    state = load(path)
    request = json.loads(sys.stdin.read() or "{}")
    if action == "list":
        shown = time.time() - float(os.environ.get("PROVIDER_LAG_S", "0"))
        members = [m for m in state["members"] if m["launched_at"] <= shown]
        print(json.dumps({"members": members}))
        return 0
    if action == "launch":
        if request["request_id"] in state["requests"]:
            return 0
        state["requests"].append(request["request_id"])
        state["launches"] += 1
        pool = request["pool"]["name"]
        state["members"] += [
            {"name": name, "pool": pool, "launched_at": time.time()} for name in request["names"]
        ]
        state["last_launch"] = request
    elif action == "terminate":
        gone = set(request["names"])
        state["members"] = [m for m in state["members"] if m["name"] not in gone]
    else:
        print(f"provider_script: unknown action {action!r}", file=sys.stderr)
        return 2
    save(path, state)
    return 0


def load(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"members": [], "last_launch": None, "requests": [], "launches": 0}
    state: dict[str, Any] = json.loads(path.read_text())
    return state


def save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
