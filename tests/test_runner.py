"""Many files: the same results, in the same order, whatever the number of jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

import ampmigrate.engine.runner as runner
from ampmigrate.engine.cache import Cache
from ampmigrate.engine.runner import Job, run_files

from conftest import FIXTURES, make_settings


@pytest.fixture
def tree(tmp_path: Path):
    # Every third fixture (the fixtures grow with every rule; several hundred files of every rule
    # family still), some contents twice, in other packages.
    sources = sorted(p for p in FIXTURES.rglob("*.py") if not p.name.endswith(".expected.py"))[::3]
    files = []
    for i, source in enumerate(sources + sources[::8]):
        target = tmp_path / f"pkg{i % 3}" / f"{i:02d}_{source.name}"
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(source.read_bytes())
        files.append(str(target))
    (tmp_path / "unreadable.py").mkdir()  # an error in the middle of the list
    files.insert(5, str(tmp_path / "unreadable.py"))
    return files


def summary(result):
    return [
        (r.path, r.parsed, [(f.location, f.code, f.message, f.fix is not None) for f in r.findings], [e.message for e in r.errors])
        for r in result.results
    ]


@pytest.mark.slow  # worker processes over a large tree
@pytest.mark.parametrize("mode", ["check", "fix"])
def test_jobs_do_not_change_results_or_their_order(tree, monkeypatch, mode, tmp_path):
    # Make every file that needs LibCST "large", so the second round (largest first) runs too.
    monkeypatch.setattr(runner, "LARGE_FILE", 1)
    settings = make_settings()
    job = Job(mode)
    one = run_files(tree, settings, job, jobs=1)
    assert [r.path for r in one.results] == tree
    assert any(r.findings for r in one.results) and one.all_errors
    seen = []
    cached = Cache.open(str(tmp_path / "cache"), settings)
    three = run_files(tree, settings, job, jobs=3, on_result=seen.append, cache=cached)  # a cold cache
    assert summary(three) == summary(one)
    assert sorted(r.path for r in seen) == sorted(tree)
    assert summary(run_files(tree, settings, job, jobs=3, cache=cached)) == summary(one)  # warm
    if mode == "fix":
        assert [r.new_text for r in three.results] == [r.new_text for r in one.results]


def test_check_results_carry_no_source_text(tree):
    result = run_files(tree, make_settings(), Job("check"), jobs=2)
    assert all(r.new_text is None and r.old_text is None for r in result.results)
