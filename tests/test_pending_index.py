"""engine/runner.py while the project index is still being built (engine/index_builder.py's
`IndexBeside`, a cold run): round one's workers screen every file without the index, round
two's analyse the files that need LibCST once it is here. Whatever the order, the results,
their cache keys and the cache written must be those of a run given the finished index."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ampmigrate.engine.cache import Cache
from ampmigrate.engine.index_builder import IndexBeside
from ampmigrate.engine.project_index import ProjectIndex
from ampmigrate.engine.runner import Job, run_files

from conftest import FIXTURES, make_settings

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the index child is forked on Linux only"),
    pytest.mark.slow,
]

MAX = 1 << 20


def _outcome(result):
    return [
        (r.path, [repr(f) for f in r.findings], r.errors, r.parsed, r.cache_digest)
        for r in result.results
    ]


def _both(root: Path, files, settings, job, jobs, tmp_path):
    caches = []
    outcomes = []
    for name, make in (("after", lambda: ProjectIndex.build(str(root), files, max_size=MAX)),
                       ("beside", lambda: IndexBeside(str(root), list(files), None, MAX))):
        cache = Cache.open(str(tmp_path / name), settings)
        result = run_files(files, settings, job, jobs=jobs, cache=cache, index=make())
        outcomes.append(_outcome(result))
        caches.append(cache)
    assert outcomes[0] == outcomes[1]
    return outcomes[0]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_run_beside_the_index_is_the_run_after_it(tmp_path, jobs):
    # every multi-file project's files (they need the index) and every other single-file fixture
    every = sorted(str(p) for p in FIXTURES.rglob("*.py"))
    # Not the single-file fixtures registering a cast function: in one run with every project they
    # make each apex migration of the run unsafe (engine/apex_cast_registrations.py), a refusal the
    # projects were not written for, whose reason names whichever group member was planned first.
    files = [f for i, f in enumerate(every) if ".project" in f or (i % 4 == 0 and "register_" not in Path(f).read_text())]
    outcome = _both(FIXTURES, files, make_settings(), Job("check"), jobs, tmp_path)
    assert sum(1 for _, findings, *_ in outcome if findings) > 100  # the fixtures' findings, all found
    assert all(digest for *_, digest in outcome if digest is not None)


def test_fix_mode_too(tmp_path):
    files = sorted(str(p) for p in FIXTURES.rglob("*.py"))[:120]
    _both(FIXTURES, files, make_settings({"unsafe-fixes": True}), Job("fix", unsafe=True), 2, tmp_path)


@pytest.mark.parametrize("project", ["amp_passed_to_trainer.project", "amp_passed_to_method.project"])
def test_rules_that_report_through_the_index_are_screened_once_it_is_here(tmp_path, project):
    """AMP101 across files applies only to a run whose index records apex's amp passed on:
    round one cannot tell, so round two screens such files again."""
    root = FIXTURES / "AMP101" / project
    files = sorted(str(p) for p in root.rglob("*.py"))
    outcome = _both(root, files, make_settings({"select": ["AMP1"]}), Job("check"), 1, tmp_path)
    assert any("amp passed in from main.py" in finding for _, findings, *_ in outcome for finding in findings)


def test_a_run_beside_the_index_stores_what_a_run_after_it_stores(tmp_path):
    """The cache a run beside the index writes serves the next (warm) run as well as the cache
    of a run after it: the same files are found there, with the same results."""
    from ampmigrate.engine import runner

    files = sorted(str(p) for p in FIXTURES.rglob("*.py"))[:100]
    settings = make_settings()
    job = Job("check")
    found = []
    for name in ("after", "beside"):
        directory = str(tmp_path / name)
        cache = Cache.open(directory, settings)
        if name == "after":
            index = ProjectIndex.build(str(FIXTURES), files, cache_path=cache.index_path, max_size=MAX)
        else:
            index = IndexBeside(str(FIXTURES), files, cache.index_path, MAX)
        cold = run_files(files, settings, job, jobs=2, cache=cache, index=index)
        warm_cache = Cache.open(directory, settings)
        warm_index = ProjectIndex.build(str(FIXTURES), files, cache_path=warm_cache.index_path, max_size=MAX)
        stored = [runner._from_cache(path, job, warm_cache, settings, None, warm_index) for path in files]
        hits = [(r.path, [repr(f) for f in r.findings], r.errors) for r in stored if r is not None]
        assert hits == [o[:3] for o in _outcome(cold) if o[0] in {h[0] for h in hits}]
        found.append(hits)
    assert found[0] == found[1]
    assert len(found[1]) >= len(files) - 2


def test_round_two_does_not_parse_again_what_round_one_parsed(monkeypatch):
    """LibCST never sees a file `ast` rejects (pipeline.python_rejects); a file the first
    round's screens parsed is not parsed again for that in the second round."""
    import ast

    from ampmigrate.engine import prescreen, runner
    from ampmigrate.engine.pipeline import Engine

    path = str(FIXTURES / "AMP201" / "alias_variable.py")
    text = Path(path).read_text(encoding="utf-8")
    settings = make_settings()
    flagged = runner._process(Engine(settings, index_pending=True), path, Job("check"), None, defer_large=False, pending=True)
    assert isinstance(flagged, runner._Deferred) and flagged.rules and flagged.parses
    prescreen.parse("x = 1")  # another file parsed since, as in a worker
    parses = []
    real = ast.parse
    monkeypatch.setattr(ast, "parse", lambda source, *a, **k: parses.append(source == text) or real(source, *a, **k))
    engine = Engine(settings, index=ProjectIndex.build(str(FIXTURES / "AMP201"), [path], max_size=MAX))
    result = runner._process(engine, path, Job("check"), None, defer_large=False, screened=flagged)
    assert result.findings and result.parsed
    assert True not in parses


def test_a_notebook_waits_for_the_index_and_is_analysed_as_before(tmp_path):
    import json

    tree = tmp_path / "tree"
    for i, path in enumerate(sorted(FIXTURES.rglob("*.py"))[:70]):
        target = tree / f"d{i}" / path.name
        target.parent.mkdir(parents=True)
        target.write_bytes(path.read_bytes())
    cells = [
        {"cell_type": "code", "id": "a", "metadata": {}, "execution_count": 1, "outputs": [],
         "source": ["import torch\n", "scaler = torch.cuda.amp.GradScaler()\n"]},
        {"cell_type": "code", "id": "b", "metadata": {}, "execution_count": 2, "outputs": [],
         "source": ["with torch.cuda.amp.autocast():\n", "    pass\n"]},
    ]
    (tree / "train.ipynb").write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    files = sorted(str(p) for p in tree.rglob("*.py")) + [str(tree / "train.ipynb")]
    outcome = _both(tree, files, make_settings(), Job("check"), 2, tmp_path)
    assert any(path.endswith(".ipynb") and findings for path, findings, *_ in outcome)
