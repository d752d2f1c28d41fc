"""Building the project index beside the rest of a cold run.

A cold `check` needs two things before any file can be analysed with LibCST: the project index
(engine/project_index.py: every file of the run read and summarised) and the engine (LibCST and
the rules), which the workers inherit when they are forked. Neither needs the other, and most
of a worker's work on a framework tree (reading, the trigger regexes, the `ast` screens) needs
neither the index nor LibCST's rules to run. So, where processes can be forked, the index is
built in a forked child (`IndexBeside.start`) and comes back pickled through a pipe
(`IndexBeside.result`), while this process imports the engine and its workers screen the files
(engine/runner.py: the first round of a run whose index is still pending, in which every file
that needs LibCST is only flagged); the files flagged are analysed once the index is here.

Only a run that will need the engine does this: one without a stored project index (no cache,
or a new cache). A warm run finds its results in the cache and never imports the engine, so it
builds the index (from the stored summaries) here, as before. Whatever goes wrong in the child
(it dies, its answer cannot be read) costs only the time: the index is then built here.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
from typing import Callable, List, Optional, Sequence, Union

from ampmigrate.engine.project_index import ProjectIndex

# Fewer files than this: the fork and the pickle cost about what the overlap saves.
MIN_FILES = 64


class IndexBeside:
    """The project index of a run, being built in a forked child; `result()` waits for it."""

    def __init__(self, root: str, files: List[str], cache_path: Optional[str], max_size: int) -> None:
        self._args = (root, files, cache_path, max_size)
        self._index: Optional[ProjectIndex] = None
        from ampmigrate.engine.workers import _libc

        _libc()  # the child inherits it (engine/workers.py)
        context = multiprocessing.get_context("fork")
        self._receiver, sender = context.Pipe(duplex=False)
        self._child = context.Process(
            target=_build_in_child, args=(sender, self._receiver, os.getpid(), *self._args), daemon=True
        )
        self._child.start()
        sender.close()

    @classmethod
    def start(
        cls, root: str, files: Sequence[str], cache_path: Optional[str], max_size: int
    ) -> Union[ProjectIndex, "IndexBeside"]:
        """The index of `files`, built in a child (an `IndexBeside`) where that pays: with at
        least MIN_FILES files, where processes can be forked; else built here, now."""
        if len(files) < MIN_FILES or not sys.platform.startswith("linux"):
            return ProjectIndex.build(root, files, cache_path=cache_path, max_size=max_size)
        return cls(root, list(files), cache_path, max_size)

    def result(self) -> ProjectIndex:
        """The index (built here if the child failed); the child is gone when this returns."""
        if self._index is None:
            index: Optional[ProjectIndex] = None
            try:
                index = pickle.loads(self._receiver.recv_bytes())
            except (EOFError, OSError, pickle.UnpicklingError, AttributeError, ValueError):
                index = None  # the child died or failed: built here below
            finally:
                self._end(wait=True)
            if not isinstance(index, ProjectIndex):
                root, files, cache_path, max_size = self._args
                index = ProjectIndex.build(root, files, cache_path=cache_path, max_size=max_size)
            self._index = index
        return self._index

    def ready(self) -> bool:
        """Whether `result()` would not wait (the child has answered, or is gone)."""
        if self._index is not None or self._child is None:
            return True
        try:
            return self._receiver.poll()
        except (OSError, EOFError):
            return True

    def close(self) -> None:
        """The run ends without the index (an error): the child is stopped, if still there."""
        self._end(wait=False)

    def _end(self, wait: bool) -> None:
        if self._child is None:
            return
        child, self._child = self._child, None
        self._receiver.close()
        child.join(timeout=5 if wait else 0)
        if child.is_alive():
            child.kill()
            child.join()


def build_beside(
    prepare: Callable[[], None],
    root: str,
    files: Sequence[str],
    cache_path: Optional[str],
    max_size: int,
) -> ProjectIndex:
    """`ProjectIndex.build(root, files, cache_path, max_size)`, with `prepare()` run meanwhile
    (in this process); both are done when it returns."""
    pending = IndexBeside.start(root, files, cache_path, max_size)
    try:
        prepare()
    finally:
        index = pending if isinstance(pending, ProjectIndex) else pending.result()
    return index


def _build_in_child(sender, receiver, parent: int, root: str, files, cache_path: Optional[str], max_size: int) -> None:
    from ampmigrate.engine.workers import _die_with_parent  # as the workers do

    _die_with_parent(parent)
    receiver.close()
    try:
        index = ProjectIndex.build(root, files, cache_path=cache_path, max_size=max_size)
        payload = pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        payload = b""  # the parent builds it itself
    try:
        sender.send_bytes(payload)
    except OSError:
        pass
