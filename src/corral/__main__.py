"""``python -m corral``: the same as the ``corral`` command, whatever is on PATH."""

from corral.cli.main import main

main()
