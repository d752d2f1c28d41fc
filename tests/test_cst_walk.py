"""engine/cst_walk.walk must make exactly the calls LibCST's node.visit makes, in its order."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import libcst as cst
import pytest

from ampmigrate.engine.cst_walk import nodes_of_type, walk

from conftest import FIXTURES

SNIPPETS = [
    "x = f'{a!r:>{width}} {b=} {c:{d}.{e}f}' f\"{g}\"\n",
    "from m import *\nfrom . import (a as b, c)\nimport x.y as z, w\n",
    "async def f(a, /, b: int = 1, *c, d, **e) -> None:\n    async with x as (y, z):\n        await g([i async for i in h if i])\n",
    "match p:\n    case {'k': [1, *rest], **kw} if rest:\n        pass\n    case Point(x=0) | None:\n        pass\n",
    "try:\n    pass\nexcept* (A, B) as e:\n    raise C from e\nfinally:\n    del a[1:2:3], b.c\n",
    "@d1\n@d2(x)\nclass A(B, metaclass=M):\n    x: int = 1\n    lambda q=1: (yield q)\n",
    "global g\nwhile (n := n - 1) > 0:\n    print(*a, **k, sep='')\nelse:\n    ...\n",
]


class Recorder(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.events = []

    def on_visit(self, node):
        self.events.append(("visit", id(node)))
        # Prune like a real visitor may: children of a Lambda are skipped.
        return not isinstance(node, cst.Lambda)

    def on_leave(self, original_node):
        self.events.append(("leave", id(original_node)))


def assert_same_walk(module: cst.Module) -> None:
    expected, got = Recorder(), Recorder()
    module.visit(expected)
    walk(module, got)
    assert got.events == expected.events


@pytest.mark.parametrize("text", SNIPPETS, ids=[f"snippet{i}" for i in range(len(SNIPPETS))])
def test_snippets(text):
    assert_same_walk(cst.parse_module(text))


@pytest.mark.parametrize("path", sorted(FIXTURES.rglob("*.py")), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_fixtures(path: Path):
    assert_same_walk(cst.parse_module(path.read_bytes()))


def _torch_files():
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return []
    root = Path(spec.origin).parent
    names = ["amp/grad_scaler.py", "_dynamo/variables/ctx_manager.py", "testing/_internal/common_utils.py"]
    return [root / name for name in names if (root / name).exists()]


@pytest.mark.parametrize("path", _torch_files(), ids=lambda p: p.name)
def test_real_files(path: Path):
    assert_same_walk(cst.parse_module(path.read_bytes()))


def test_visitors_with_attribute_hooks_are_refused():
    class Hooked(cst.CSTVisitor):
        def visit_Call_func(self, node):
            pass

    with pytest.raises(TypeError):
        walk(cst.parse_module("f()\n"), Hooked())


def test_a_field_visited_only_when_set_is_learned_when_met(monkeypatch):
    import ampmigrate.engine.cst_walk as cst_walk

    monkeypatch.setattr(cst_walk, "_ORDERS", {})
    # The first f-string expression has no format spec, the second has one (itself an f-string).
    assert_same_walk(cst.parse_module("x = f'{a!r}'\ny = f'{b:{c}>{d!s}}'\nz = f'{e}'\n"))


class _AllNodes(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.nodes = []

    def on_visit(self, node):
        self.nodes.append(node)
        return True


@pytest.mark.parametrize("text", SNIPPETS, ids=[f"snippet{i}" for i in range(len(SNIPPETS))])
def test_nodes_of_type_finds_what_a_visitor_finds(text):
    module = cst.parse_module(text)
    visitor = _AllNodes()
    module.visit(visitor)
    for kind in {type(node) for node in visitor.nodes}:
        expected = [id(node) for node in visitor.nodes if type(node) is kind]
        assert sorted(id(node) for node in nodes_of_type(module, kind)) == sorted(expected), kind.__name__


# ---------------------------------------------------------------- visitors with typed hooks
class TypedRecorder(cst.CSTVisitor):
    """Typed hooks only (no on_visit/on_leave of its own): walk calls them through its
    per-class table (cst_walk.hooks) instead of CSTVisitor's per-node name lookups."""

    def __init__(self) -> None:
        super().__init__()
        self.events = []

    def visit_Name(self, node):
        self.events.append(("visit Name", id(node)))

    def leave_Name(self, original_node):
        self.events.append(("leave Name", id(original_node)))

    def visit_Call(self, node):
        self.events.append(("visit Call", id(node)))
        return not (isinstance(node.func, cst.Name) and node.func.value == "skip")  # prune

    def leave_Call(self, original_node):
        self.events.append(("leave Call", id(original_node)))

    def visit_Lambda(self, node):
        self.events.append(("visit Lambda", id(node)))
        return False

    def visit_SimpleWhitespace(self, node):
        self.events.append(("visit ws", id(node)))


@pytest.mark.parametrize("text", [*SNIPPETS, "skip(a, f(b))\nf(skip(c))\n"])
def test_typed_hooks_are_called_as_by_visit(text):
    module = cst.parse_module(text)
    expected, got = TypedRecorder(), TypedRecorder()
    module.visit(expected)
    walk(module, got)
    assert got.events == expected.events
    assert got.events


def test_a_hook_set_on_the_instance_is_still_called():
    module = cst.parse_module("a = b\n")
    seen = []
    visitor = cst.CSTVisitor()
    visitor.visit_Name = lambda node: seen.append(node.value)
    walk(module, visitor)
    assert seen == ["a", "b"]
