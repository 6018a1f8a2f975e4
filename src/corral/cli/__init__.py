"""corral.cli: the ``corral`` command.

Importing it picks gRPC's I/O engine (``grpc_engine``) before any command
module imports gRPC: gRPC reads its setting once, as it loads.
"""

import sys

from corral.cli import grpc_engine
from corral.core.errors import InvalidSpec

try:
    grpc_engine.choose()
except InvalidSpec as exc:
    sys.exit(f"corral: {exc}")
