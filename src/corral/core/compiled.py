"""What the compiled build (``scripts/build-native``, mypyc) is told about a class:
``@mypyc_attr(acyclic=True)``, spelled so (mypyc knows the decorator by its name).

``acyclic``: instances of the class never take part in a reference cycle, so the compiled
build makes them without the cyclic garbage collector's header and never tracks them.
A tracked object is linked into the collector's list when made and unlinked when freed,
which writes to its two neighbours in that list: objects made about when it was, long
cold when a job's records die. Each such class holds only immutable values, or records
that never refer back to it; an untracked object in a cycle would not be freed (a leak,
never a crash). Pure Python ignores the mark.
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
