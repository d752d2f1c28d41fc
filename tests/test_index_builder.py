"""engine/index_builder.py: on a cold run the project index is built in a forked child while the
parent imports the engine. The index must be the one `ProjectIndex.build` makes here, the
preparation must have run, and a child that fails costs only time."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ampmigrate.engine import index_builder
from ampmigrate.engine.project_index import ProjectIndex

from conftest import FIXTURES


def _files():
    return sorted(str(p) for p in FIXTURES.rglob("*.py"))


def _same(a: ProjectIndex, b: ProjectIndex) -> None:
    assert a.root == b.root
    assert a.modules == b.modules
    for path in a.modules:
        assert a.dependency_key(path) == b.dependency_key(path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child is forked on Linux only")
def test_the_index_built_beside_is_the_index_built_here(tmp_path):
    files = _files()
    assert len(files) >= index_builder.MIN_FILES
    prepared = []
    cache = tmp_path / "project-index.json"
    beside = index_builder.build_beside(lambda: prepared.append(os.getpid()), str(FIXTURES), files, str(cache), 1 << 20)
    assert prepared == [os.getpid()]  # run here, once
    assert cache.exists()  # the child wrote the index's cache
    _same(beside, ProjectIndex.build(str(FIXTURES), files, max_size=1 << 20))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child is forked on Linux only")
def test_a_child_that_fails_costs_only_time(monkeypatch):
    files = _files()

    def broken(*args, **kwargs):
        raise RuntimeError("no pickle today")

    monkeypatch.setattr(index_builder.pickle, "dumps", broken)  # inherited by the forked child
    index = index_builder.build_beside(lambda: None, str(FIXTURES), files, None, 1 << 20)
    _same(index, ProjectIndex.build(str(FIXTURES), files, max_size=1 << 20))


def test_few_files_are_indexed_here(monkeypatch):
    files = _files()[:3]
    monkeypatch.setattr(index_builder.multiprocessing, "get_context", None)  # would fail if called
    order = []
    index = index_builder.build_beside(lambda: order.append("prepared"), str(FIXTURES), files, None, 1 << 20)
    assert order == ["prepared"]
    assert set(index.modules) == {os.path.abspath(f) for f in files}


def test_a_cold_cli_run_and_a_warm_one_find_the_same(tmp_path):
    """Cold (index built beside the import) and warm (built here from its cache) agree."""
    from click.testing import CliRunner

    from ampmigrate.cli import main

    tree = tmp_path / "tree"
    for i, path in enumerate(_files()[:80]):
        target = tree / f"d{i}" / Path(path).name
        target.parent.mkdir(parents=True)
        target.write_bytes(Path(path).read_bytes())
    cache = tmp_path / "cache"
    args = ["check", str(tree), "--cache-dir", str(cache), "--output-format", "concise", "--exit-zero", "-j", "1"]
    cold = CliRunner().invoke(main, args)
    assert list(cache.rglob("project-index.json"))
    warm = CliRunner().invoke(main, args)
    assert cold.exit_code == warm.exit_code == 0, cold.output
    assert cold.output == warm.output
    assert ": AMP" in cold.output


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child is forked on Linux only")
def test_ready_says_when_the_result_would_not_wait():
    import time

    files = _files()
    beside = index_builder.IndexBeside(str(FIXTURES), files, None, 1 << 20)
    try:
        deadline = time.monotonic() + 60
        while not beside.ready():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        _same(beside.result(), ProjectIndex.build(str(FIXTURES), files, max_size=1 << 20))
        assert beside.ready()
    finally:
        beside.close()


def _pid(item):
    import time

    time.sleep(0.02)
    return os.getpid()


def _nothing():
    pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_a_pool_grown_during_a_run_forks_a_worker_for_the_batches_left():
    """engine/runner.py's round one starts with one worker fewer while the index child runs and
    grows the pool when the child is done."""
    from ampmigrate.engine.workers import Limits, WorkerPool

    pool = WorkerPool(1, _nothing, (), _pid, Limits(cpu_seconds=60, memory_mib=4096))
    batches = [[(i, i)] for i in range(12)]
    pids = []
    with pool:
        for key, pid in pool.run(batches):
            pids.append(pid)
            if key == 0:
                pool.grow(2)
    assert len(pids) == 12
    assert len(set(pids[:1])) == 1 and len(set(pids)) == 2


_BALLAST = []


def _hold(mib):
    _BALLAST.append(b"x" * (mib << 20))  # every page written


def _slow(item):
    import time

    time.sleep(0.2)  # long enough for the parent to look at the worker's memory
    return item


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_what_a_worker_is_set_up_with_again_is_no_files_memory():
    """The index a running worker is given (`reinitialize`) after its first file is not counted
    against the files after it (file-memory-limit: the worker's growth since it was set up)."""
    from ampmigrate.engine.workers import Failure, Limits, WorkerPool

    pool = WorkerPool(1, _nothing, (), _slow, Limits(cpu_seconds=60, memory_mib=150))
    with pool:
        first = list(pool.run([[(0, 0)]]))
        pool.reinitialize((), _hold, (300,))
        later = list(pool.run([[(1, 1)], [(2, 2)]]))
    assert first == [(0, 0)]
    assert later == [(1, 1), (2, 2)], [o.reason if isinstance(o, Failure) else o for _, o in later]
