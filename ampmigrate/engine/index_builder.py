"""Building the project index beside the engine's import, on a cold run.

A cold `check` does two serial things before its workers start: it builds the project index
(engine/project_index.py: every file of the run read and summarised) and it imports the engine
(LibCST and the rules), which the workers inherit when they are forked. Neither needs the other.
So, where processes can be forked, the index is built in a forked child while this process
imports the engine, and comes back pickled through a pipe; the two overlap on a machine with a
second core, whatever the number of jobs.

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
from typing import Callable, Optional, Sequence

from ampmigrate.engine.project_index import ProjectIndex

# Fewer files than this: the fork and the pickle cost about what the overlap saves.
MIN_FILES = 64


def build_beside(
    prepare: Callable[[], None],
    root: str,
    files: Sequence[str],
    cache_path: Optional[str],
    max_size: int,
) -> ProjectIndex:
    """`ProjectIndex.build(root, files, cache_path, max_size)`, with `prepare()` run meanwhile
    (in this process); both are done when it returns."""
    if len(files) < MIN_FILES or not sys.platform.startswith("linux"):
        prepare()
        return ProjectIndex.build(root, files, cache_path=cache_path, max_size=max_size)
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(
        target=_build_in_child, args=(sender, receiver, os.getpid(), root, list(files), cache_path, max_size), daemon=True
    )
    child.start()
    sender.close()
    index: Optional[ProjectIndex] = None
    try:
        prepare()
        try:
            index = pickle.loads(receiver.recv_bytes())
        except (EOFError, OSError, pickle.UnpicklingError, AttributeError, ValueError):
            index = None  # the child died or failed: built here below
    finally:
        receiver.close()
        child.join(timeout=5)
        if child.is_alive():
            child.kill()
            child.join()
    if not isinstance(index, ProjectIndex):
        index = ProjectIndex.build(root, files, cache_path=cache_path, max_size=max_size)
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
