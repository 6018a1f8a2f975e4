"""``@mypyc_attr(acyclic=True)`` (mypyc knows the decorator by that name): a class whose
instances never take part in a reference cycle.

The compiled build (``scripts/build-native``) makes such instances without the cyclic
garbage collector's bookkeeping, which the simulator pays for several records per job.
Mark only classes that hold immutable values or records that never refer back (an
untracked cycle would leak). Pure Python ignores the mark.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

try:
    from mypy_extensions import mypyc_attr as mypyc_attr
except ImportError:  # not installed (a deployment without the compiled build): a no-op

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[T], T]:
        """``mypy_extensions.mypyc_attr``'s signature; marks nothing."""
        return lambda cls: cls
