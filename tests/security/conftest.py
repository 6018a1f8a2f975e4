"""Attacks on a real server, built by the server tests' harnesses (``tests/server``:
``http_harness``, ``process_harness``, ``server_harness``) on SQLite and PostgreSQL."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SERVER_TESTS = Path(__file__).resolve().parent.parent / "server"
sys.path.insert(0, str(SERVER_TESTS))

_spec = importlib.util.spec_from_file_location("server_conftest", SERVER_TESTS / "conftest.py")
assert _spec is not None
assert _spec.loader is not None
server_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(server_conftest)

# The server tests' fixtures, here too: the same databases, the same anyio backend.
anyio_backend = server_conftest.anyio_backend
db_url = server_conftest.db_url
pg_url = server_conftest.pg_url
