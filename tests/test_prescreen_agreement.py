"""The `ast` name screen (engine/prescreen.py) and the LibCST resolver (engine/names.py) are two
implementations of one question that must agree: every qualified-name prefix the resolver gives
some import or expression of a file, the screen finds reachable in it. (The screen may find more:
it is the cheap over-approximation that decides which files LibCST parses at all.)

The property is checked file by file over whole real trees, independently of any rule's findings:
a sample of the installed torch package here, and with `-m slow` every file of torch and of the
trees named in `AMPMIGRATE_AGREEMENT_TREES` (paths separated by `os.pathsep`, e.g. repositories
fetched under /work/corpus/).
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import FrozenSet, List, Set

import libcst as cst
import pytest

from ampmigrate.engine.names import NameIndex
from ampmigrate.engine.prescreen import QualifiedNameScreen
from ampmigrate.rules import all_rules
from ampmigrate.source import SourceError, SourceFile

PREFIXES = sorted({p for rule in all_rules() for p in (rule.qualified_prefixes or ())})
SCREEN = QualifiedNameScreen(PREFIXES)
# A qualified name starts at an import, which spells its package: other files cannot disagree.
PACKAGES = re.compile(r"\b(?:%s)\b" % "|".join(sorted({re.escape(p.split(".")[0]) for p in PREFIXES})))
MAX_SIZE = 200_000  # larger files take LibCST too long for a test (the bench covers them)


def resolver_prefixes(module: cst.Module) -> Set[str]:
    """The prefixes the resolver gives an import binding or an expression of `module`."""
    names = NameIndex(module)
    found: Set[str] = set()
    for scope in names.scopes:
        for bindings in scope.bindings.values():
            for binding in bindings:
                for qname in names.binding_qualified_names(binding):
                    found |= SCREEN.hits(qname)
    for _node, qnames in names.qualified_expressions():
        for qname in qnames:
            found |= SCREEN.hits(qname)
    return found


def disagreement(path: str) -> FrozenSet[str]:
    """Prefixes the resolver reaches in the file and the screen does not (should be empty)."""
    try:
        text = SourceFile.read(path).text
    except SourceError:
        return frozenset()
    if not PACKAGES.search(text):
        return frozenset()
    screened = SCREEN.reachable(text)
    if screened is None:  # `ast` cannot parse it: never screened, LibCST decides
        return frozenset()
    try:
        module = cst.parse_module(text)
        resolved = resolver_prefixes(module)
    except (cst.ParserSyntaxError, RecursionError):
        return frozenset()
    return frozenset(resolved - screened)


def tree_files(root: Path) -> List[str]:
    return [str(p) for p in sorted(root.rglob("*.py")) if p.is_file() and p.stat().st_size <= MAX_SIZE]


def _torch_root():
    spec = importlib.util.find_spec("torch")
    return Path(spec.origin).parent if spec is not None and spec.origin else None


TORCH = _torch_root()
TORCH_FILES = tree_files(TORCH) if TORCH is not None else []
OTHER_TREES = [Path(p) for p in os.environ.get("AMPMIGRATE_AGREEMENT_TREES", "").split(os.pathsep) if p]


@pytest.mark.skipif(not TORCH_FILES, reason="torch is not installed")
def test_screen_and_resolver_agree_on_a_sample_of_torch():
    sample = TORCH_FILES[::25] + [p for p in TORCH_FILES if "/amp/" in p or "/cuda/amp" in p]
    assert {path: found for path in sample if (found := disagreement(path))} == {}


SHARDS = 6  # the whole trees in interleaved shards, so that `pytest -n` runs them side by side
# The suite's budget (15 minutes on two cores) takes every fourth file of the trees in each whole-tree
# test (this one, test_screen_agreement's, test_project_index_shortcuts' and the round-trip sweep of
# test_roundtrip_sweep); set AMPMIGRATE_WHOLE_TREES=1 to check every file.
TREE_STRIDE = 1 if os.environ.get("AMPMIGRATE_WHOLE_TREES") == "1" else 4


@pytest.mark.slow
@pytest.mark.skipif(not TORCH_FILES and not OTHER_TREES, reason="no real tree")
@pytest.mark.parametrize("shard", range(SHARDS))
def test_screen_and_resolver_agree_on_whole_trees(shard):
    files = TORCH_FILES + [f for tree in OTHER_TREES for f in tree_files(tree)]
    assert {path: found for path in files[shard::SHARDS * TREE_STRIDE] if (found := disagreement(path))} == {}


def test_the_property_fails_where_the_screen_misses_a_way_of_reaching_a_name(monkeypatch):
    """The check can fail: a screen that ignores alias assignments disagrees with the resolver."""
    import ampmigrate.engine.prescreen as prescreen

    monkeypatch.setattr(prescreen._Search, "_alias", lambda self, target, value: None)
    text = "import torch\ncu = torch.cuda\nwith cu.amp.autocast():\n    pass\n"
    assert "torch.cuda.amp" in resolver_prefixes(cst.parse_module(text)) - SCREEN.reachable(text)
