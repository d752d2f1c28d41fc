"""The path-aware statement walk (ampmigrate/analysis/flow.py), with a client that records which
marker calls (`a()`, `b()`, ...) may have run before each `check()`."""

from __future__ import annotations

import textwrap
from typing import FrozenSet, List, Optional

import libcst as cst
import pytest

from ampmigrate.analysis import flow
from ampmigrate.engine.names import NameIndex


_MARKERS = {"a", "b", "c", "check", "reset"}


class _Trace(flow.FlowClient):
    """Facts: the set of paths, each the set of marker calls it made (exact, unlike a real
    client's may/must facts). `check()` records every path reaching it."""

    def __init__(self) -> None:
        self.seen: List[FrozenSet[str]] = []

    def join(self, a, b):
        return a | b

    def transfer(self, facts, unit, assignment, record):
        return frozenset(self._path(path, unit, record) for path in facts)

    def _path(self, facts, unit, record):
        calls: List[str] = []

        class _Calls(cst.CSTVisitor):
            def leave_Call(self, node: cst.Call) -> None:
                if isinstance(node.func, cst.Name):
                    calls.append(node.func.value)

        unit.visit(_Calls())
        for name in calls:
            if name not in _MARKERS:
                continue
            if name == "check":
                if record:
                    self.seen.append(facts)
            elif name == "reset":
                facts = frozenset()
            else:
                facts = facts | {name}
        return facts


def _walk(code: str, relevant=lambda statement: True) -> List[FrozenSet[str]]:
    module = cst.parse_module(textwrap.dedent(code))
    func = module.body[0]
    body = func.body.body
    conditions = flow.Conditions(module, body, relevant)
    client = _Trace()
    flow.FlowWalker(body, client, conditions).run(frozenset({frozenset()}))
    return sorted(set(client.seen), key=sorted)


def test_branches_join_and_straight_code_accumulates():
    seen = _walk(
        """
        def f(x):
            a()
            if x:
                b()
            else:
                c()
            check()
        """
    )
    assert seen == [frozenset({"a", "b"}), frozenset({"a", "c"})]


def test_a_stable_flag_takes_the_same_branch_twice():
    seen = _walk(
        """
        def f(args):
            if args.amp:
                a()
            if args.amp:
                check()
        """
    )
    assert seen and all("a" in facts for facts in seen)


def test_different_conditions_are_independent():
    seen = _walk(
        """
        def f(args, scaler):
            if args.amp:
                a()
            if scaler is not None:
                check()
        """
    )
    assert any("a" not in facts for facts in seen)


def test_negation_and_none_tests_share_one_condition():
    seen = _walk(
        """
        def f(scaler):
            if scaler is None:
                a()
            if not scaler:
                check()
            if scaler:
                b()
            if scaler is not None:
                check()
        """
    )
    first, second = [s for s in seen if "b" not in s], [s for s in seen if "b" in s]
    assert first and all("a" in facts for facts in first)
    assert second and all("a" not in facts for facts in second)


def test_conjunctions_split_into_their_atoms():
    seen = _walk(
        """
        def f(use_amp, clip):
            if use_amp and clip:
                a()
            if use_amp:
                b()
                if clip:
                    check()
        """
    )
    assert seen and all("a" in facts for facts in seen)


def test_loops_carry_facts_to_the_next_iteration():
    seen = _walk(
        """
        def f(loader):
            for batch in loader:
                check()
                a()
        """
    )
    assert seen == [frozenset(), frozenset({"a"})]  # the first iteration, and the later ones


def test_a_varying_condition_agrees_within_an_iteration():
    seen = _walk(
        """
        def f(loader, accum):
            for i, batch in enumerate(loader):
                reset()
                if (i + 1) % accum == 0:
                    a()
                if (i + 1) % accum == 0:
                    check()
        """
    )
    assert seen == [frozenset({"a"})]


def test_a_varying_condition_is_forgotten_at_the_next_iteration():
    seen = _walk(
        """
        def f(loader, accum):
            for i, batch in enumerate(loader):
                if (i + 1) % accum == 0:
                    check()
                    reset()
                else:
                    a()
        """
    )
    # The stepping iteration sees what a previous, non-stepping iteration did.
    assert frozenset({"a"}) in seen and frozenset() in seen


def test_condition_forgotten_when_its_name_is_rebound():
    seen = _walk(
        """
        def f(flag, other):
            if flag:
                a()
            flag = other
            if flag:
                check()
        """
    )
    assert any("a" not in facts for facts in seen)


def test_break_continue_and_return_end_their_paths():
    seen = _walk(
        """
        def f(loader):
            for batch in loader:
                if batch is None:
                    continue
                if batch == 0:
                    break
                a()
            check()
            if loader:
                return
            b()
            check()
        """
    )
    assert frozenset() in seen  # the break path (loops are taken to run at least once)
    assert any("b" in facts for facts in seen)


def test_try_handlers_see_any_point_of_the_body():
    seen = _walk(
        """
        def f():
            try:
                a()
                b()
            except RuntimeError:
                check()
        """
    )
    # Not the path that raised before anything ran: handlers reason from "something ran".
    assert seen == [frozenset({"a"}), frozenset({"a", "b"})]


def test_irrelevant_conditions_are_not_tracked():
    module = cst.parse_module("def f(x):\n    if x:\n        a()\n    if x:\n        check()\n")
    body = module.body[0].body.body
    conditions = flow.Conditions(module, body, relevant=lambda statement: False)
    assert conditions.stable_keys() == set()


def test_too_many_paths_gives_up():
    flags = "\n".join(f"    if f{i}:\n        a{i}()\n    if f{i}:\n        b{i}()" for i in range(8))
    code = "def f(" + ", ".join(f"f{i}" for i in range(8)) + "):\n" + flags + "\n    check()\n"
    with pytest.raises(flow.TooComplex):
        _walk(code)


# ---------------------------------------------------------------------------------- reaches
def _reaches(code: str, start_marker: str = "start") -> bool:
    module = cst.parse_module(textwrap.dedent(code))
    names = NameIndex(module)
    start: Optional[cst.CSTNode] = None
    for node in names.parents:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == start_marker:
            start = names.statement_of(node)
    assert start is not None

    def classify(unit: cst.CSTNode) -> Optional[str]:
        found: List[str] = []

        class _Calls(cst.CSTVisitor):
            def leave_Call(self, node: cst.Call) -> None:
                if isinstance(node.func, cst.Name):
                    found.append(node.func.value)

        unit.visit(_Calls())
        for name in found:
            if name == "hit":
                return flow.HIT
            if name == "stop":
                return flow.STOP
        return None

    return flow.reaches(names, start, classify)


def test_reaches_through_following_statements_and_enclosing_blocks():
    assert _reaches(
        """
        for b in loader:
            if step:
                start()
                other()
            hit()
        """
    )


def test_does_not_reach_when_a_branch_skips_the_goal():
    assert not _reaches(
        """
        for b in loader:
            start()
            if step:
                hit()
        """
    )


def test_stop_before_the_goal_and_loop_back_edges_fail():
    assert not _reaches("for b in x:\n    start()\n    stop()\n    hit()\n")
    assert not _reaches("for b in x:\n    hit()\n    start()\n")
    assert not _reaches("def f():\n    start()\n    if c:\n        return\n    hit()\n")


def test_raising_paths_are_ignored_and_nested_loops_are_opaque():
    assert _reaches("def f():\n    start()\n    if bad:\n        raise ValueError\n    hit()\n")
    assert not _reaches("def f(opts):\n    start()\n    for o in opts:\n        hit()\n")
