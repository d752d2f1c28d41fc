"""The per-file stages stay linear in a file's size (issue 14: a large file full of AMP code is
checked in <= 3 x its own LibCST parse; `python bench/bench.py --big-file 6500` times it).

Each speed-up here answers exactly what the slower way answered: the tests compare the two over
every fixture and one large generated file (bench/big_amp_file.py), where a name is bound again
in every copy of a fixture (the shape that made the slow ways quadratic).
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Dict, List

import libcst as cst
import pytest

from ampmigrate.engine import collector
from ampmigrate.engine.context import FileContext
from ampmigrate.engine.names import Binding, NameIndex
from ampmigrate.rules.apex._import_lines import covering, inside
from ampmigrate.rules.meta import amp001_unused_noqa

from conftest import FIXTURES, make_settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from big_amp_file import big_file  # noqa: E402


SOURCES = sorted(p for p in FIXTURES.rglob("*.py") if p.is_file())


def _modules() -> List[cst.Module]:
    modules = []
    for path in SOURCES:
        try:
            modules.append(cst.parse_module(path.read_text(encoding="utf-8")))
        except (cst.ParserSyntaxError, UnicodeDecodeError):
            continue
    return modules


@pytest.fixture(scope="module")
def modules() -> List[cst.Module]:
    return [*_modules(), cst.parse_module(big_file(3000))]


def _naive_references(names: NameIndex) -> Dict[Binding, List[cst.Name]]:
    refs: Dict[Binding, List[cst.Name]] = {}
    for name, scope in names.loads.items():
        for found in names.lookup(name.value, scope):
            refs.setdefault(found, []).append(name)
    return refs


def test_references_are_each_loads_lookup(modules):
    for module in modules:
        names = NameIndex(module)
        naive = _naive_references(names)
        bindings = [b for scope in names.scopes for found in scope.bindings.values() for b in found]
        assert {id(b): [id(n) for n in names.references(b)] for b in bindings} == {
            id(b): [id(n) for n in naive.get(b, [])] for b in bindings
        }


class _NoSharedAnswers(NameIndex):
    """The resolver answering every load on its own (the memo of answers per bindings list is
    never read)."""

    def __init__(self, module: cst.Module) -> None:
        super().__init__(module)
        self._bindings_qnames = _Forgetful()


class _Forgetful(dict):
    def get(self, key, default=None):
        return default


def test_qualified_names_are_the_same_without_shared_answers(modules):
    for module in modules:
        fast, slow = NameIndex(module), _NoSharedAnswers(module)
        assert [(id(n), q) for n, q in fast.qualified_expressions()] == [
            (id(n), q) for n, q in slow.qualified_expressions()
        ]
        loads = list(fast.loads)
        assert [fast.qualified_names(n) for n in loads] == [slow.qualified_names(n) for n in loads]


def test_shared_answers_keep_a_cycles_own_answer():
    """`x = x.autocast` and `x = x`: a load resolved inside another resolution is cut short where
    it meets itself; it is never handed the answer of a load resolved alone, nor gives its own,
    whichever load is asked first."""
    text = "from torch.cuda import amp as x\nx = x.autocast\ny = x\nx = x\nz = x\nw = x.autocast\nv = y if z else x\n"
    module = cst.parse_module(text)
    count = len(NameIndex(module).loads)
    for order in (list(range(count)), list(reversed(range(count))), [3, 0, 5, 1, 4, 2, 6, 7, 8, 9][:count]):
        fast, slow = NameIndex(module), _NoSharedAnswers(module)
        fast_loads, slow_loads = list(fast.loads), list(slow.loads)
        assert [fast.qualified_names(fast_loads[i]) for i in order] == [slow.qualified_names(slow_loads[i]) for i in order]
        assert [(module.code_for_node(n), q) for n, q in fast.qualified_expressions()] == [
            (module.code_for_node(n), q) for n, q in slow.qualified_expressions()
        ]


def test_covering_is_inside(modules):
    for module in modules[:40]:
        ctx = FileContext("x.py", module.code, module, make_settings())
        calls = ctx.names.nodes_of_type(cst.Call)[::3]
        statements = ctx.names.nodes_of_type((cst.SimpleStatementLine, cst.BaseCompoundStatement, cst.Import))
        cover = covering(ctx, calls)
        for statement in statements:
            assert (id(statement) in cover) == any(inside(ctx, node, statement) for node in calls)


def test_noqa_comments_are_those_a_visit_meets(modules):
    def visited(ctx):
        found = []

        class Visitor(cst.CSTVisitor):
            def visit_TrailingWhitespace(self, node):
                self.owned(node)

            def visit_EmptyLine(self, node):
                self.owned(node)

            def owned(self, node):
                comment = node.comment
                if comment is not None and "noqa" in comment.value.lower():
                    if not comment.value.lstrip("# ").lower().startswith("ampmigrate:"):
                        found.append((node, comment, ctx.position(comment).start.line))

        ctx.module.visit(Visitor())
        return found

    seen = 0
    for module in modules:
        if "noqa" not in module.code:
            continue
        ctx = FileContext("x.py", module.code, module, make_settings())
        found = amp001_unused_noqa._noqa_comments(ctx)
        assert [(id(a), id(b), c) for a, b, c in found] == [(id(a), id(b), c) for a, b, c in visited(ctx)]
        seen += len(found)
    assert seen > 10


def test_collector_paused_restores_its_state():
    assert gc.isenabled()
    with collector.paused():
        assert not gc.isenabled()
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector.paused():
            pass
        assert not gc.isenabled()  # left as it was
    finally:
        gc.enable()
    with pytest.raises(ValueError):
        with collector.paused():
            raise ValueError
    assert gc.isenabled()


def test_staying_scalers_are_planned_once_per_file(monkeypatch):
    """AMP401 asks which GradScalers stay for every float16 autocast it reports; the removal of
    each scaler is planned once per file, not once per autocast (quadratic on large files)."""
    from ampmigrate.rules.precision import _scaler_removal

    calls = []
    original = _scaler_removal.plan_removal
    monkeypatch.setattr(_scaler_removal, "plan_removal", lambda ctx, scaler: calls.append(scaler) or original(ctx, scaler))
    steps = "".join(
        f"def step_{i}(model, x, opt):\n"
        f"    with torch.autocast('cuda', dtype=torch.float16):\n"
        f"        loss = model(x)\n"
        f"    scaler.scale(loss).backward()\n"
        f"    scaler.step(opt)\n"
        f"    scaler.update()\n"
        f"    keep(scaler)\n\n"
        for i in range(12)
    )
    text = "import torch\nscaler = torch.amp.GradScaler('cuda')\n\n" + steps
    from conftest import check

    findings = check(text, select=["AMP401"])
    assert len([f for f in findings if f.code == "AMP401"]) == 12
    assert len(calls) <= 2  # one family (a second _find with protocol typing may add none)
