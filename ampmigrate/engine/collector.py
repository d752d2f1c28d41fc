"""Pausing Python's cyclic garbage collector around one file's analysis.

Parsing a file (with LibCST or `ast`), the name pass and the rules make millions of objects that
all live until the file is done; every automatic collection on the way walks them again, which
costs a quarter of a large file's time and grows with its size. Nearly all of them are freed by
reference counting; what is cyclic (the name pass's scopes and bindings) is collected once the
collector runs again, after the file (or the fix round).
"""

from __future__ import annotations

import functools
import gc
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

_F = TypeVar("_F", bound=Callable)


@contextmanager
def paused() -> Iterator[None]:
    """No automatic collection inside the block (left as it was when already paused)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def pausing(function: _F) -> _F:
    """`function` run with the collector `paused`."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with paused():
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
