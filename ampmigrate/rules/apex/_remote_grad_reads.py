"""What a function or method of another file of the run does with `.grad`, read from the index.

A call between the scaled backward and the step into code of another file (`fgm.attack()` of an
`FGM` imported from `callback/adversarial.py`, `add_bn_sparsity(model)` of a `utils` module) may
read or change the gradients, which apex had unscaled by then (_window_readers.py). Where the
project index resolves the callee to one function of the run, its body tells: no `.grad` read at
all, or only reads a power-of-two loss scale cannot change (a norm of the gradient, `g.sign()`, or
the gradient divided by such a norm: FGM's `epsilon * grad / norm`), is no reader. The same test
as this file's own code gets (`_window_readers._scale_invariant`), on the `ast` the index keeps.
One level: the calls that body makes are not followed.
"""

from __future__ import annotations

import ast
from typing import Dict, Optional, Set

from ampmigrate.engine.caller_uses import source_tree

_NORMS = ("norm", "vector_norm")


def remote_body(index, qname: str, importer: str) -> Optional[ast.AST]:
    """The `def` of the run that `qname` (as the file `importer` imports it) names: `pkg.mod.f`,
    or `pkg.mod.Class.method`."""
    if index is None or not qname:
        return None
    found = index.function(qname, importer)
    if found is not None:
        return _top_level(index, found[0], found[1], None)
    owner, _, method = qname.rpartition(".")
    found = index.function(owner, importer) if owner else None
    if found is not None:
        return _top_level(index, found[0], found[1], method)
    return None


def _top_level(index, path: str, name: str, method: Optional[str]) -> Optional[ast.AST]:
    tree = source_tree(index, path)
    if tree is None:
        return None
    defs = [s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.ClassDef)) and s.name == name]
    if len(defs) != 1:
        return None
    node = defs[0]
    if method is None:
        return node if isinstance(node, ast.FunctionDef) else None
    if not isinstance(node, ast.ClassDef):
        return None
    methods = [s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == method]
    return methods[0] if len(methods) == 1 else None


def reads_scaled_gradients(body: ast.AST) -> bool:
    """True unless every `.grad` read of `body` is scale-invariant."""
    parents: Dict[int, ast.AST] = {}
    for node in ast.walk(body):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    reads = [n for n in ast.walk(body) if _reads_grad(n, parents)]
    norm_names: Set[str] = set()
    inside_norms: Set[int] = set()
    for node in ast.walk(body):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if _is_norm_call(node.value):
                norm_names.add(node.targets[0].id)
                inside_norms.update(id(n) for n in ast.walk(node.value))
    for read in reads:
        if id(read) in inside_norms:
            continue
        parent = parents.get(id(read))
        if isinstance(parent, ast.Attribute) and parent.attr == "sign" and isinstance(parents.get(id(parent)), ast.Call):
            continue
        if not _divided_by_norm(read, parents, norm_names):
            return True
    return False


def _reads_grad(node: ast.AST, parents: Dict[int, ast.AST]) -> bool:
    if not (isinstance(node, ast.Attribute) and node.attr == "grad" and isinstance(node.ctx, ast.Load)):
        return False
    parent = parents.get(id(node))
    if isinstance(parent, ast.Compare) and parent.left is node and all(isinstance(o, (ast.Is, ast.IsNot)) for o in parent.ops):
        return False  # `p.grad is None`
    return True


def _is_norm_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr in _NORMS) or (isinstance(func, ast.Name) and func.id in _NORMS)


def _divided_by_norm(read: ast.AST, parents: Dict[int, ast.AST], norm_names: Set[str]) -> bool:
    """`grad / norm`, `eps * grad / norm`."""
    child: ast.AST = read
    node = parents.get(id(read))
    while node is not None and not isinstance(node, ast.stmt):
        if (
            isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and node.left is child
            and isinstance(node.right, ast.Name) and node.right.id in norm_names
        ):
            return True
        if not isinstance(node, (ast.BinOp, ast.Attribute, ast.Subscript)):
            return False
        if isinstance(node, ast.BinOp) and not isinstance(node.op, (ast.Mult, ast.Div)):
            return False
        child, node = node, parents.get(id(node))
    return False
