"""apex's amp spelled out (`import apex`, then `apex.amp.initialize(...)`) as the index's facts read it.

The split-setup facts (engine/apex_threading.py and the shapes built on it: a base class, a
trainer class, a class owning its optimizer) look for apex's amp module bound to a name by an
import (`from apex import amp`, `import apex.amp as amp`). A file that imports the package and
spells the module out at every use is the same program. `view` hands those facts a copy of the
file's tree where each `apex.amp` reads as one name that the `import apex` binds, so every shape
reads both spellings without a second copy of its logic. The rules never see the copy: the name
pass (engine/names.py) resolves `apex.amp.scale_loss` by its qualified name already.
"""

from __future__ import annotations

import ast
import copy
from typing import Optional

# Not an identifier: no name of the file can be spelled so, and `ast.unparse` writes it as it was.
SPELLED = "apex.amp"


def view(tree: ast.Module) -> Optional[ast.Module]:
    """A copy of `tree` reading `apex.amp` as the name SPELLED bound by the file's `import apex`
    statements, or None when the file spells no `apex.amp` or binds `apex` otherwise than by an
    unaliased `import apex[.submodule]` (then `apex` may be something else somewhere)."""
    spelled = False
    fallbacks = _none_fallbacks(tree)
    for node in ast.walk(tree):
        if _binds_apex_otherwise(node) and id(node) not in fallbacks:
            return None
        spelled = spelled or _is_spelled_amp(node)
    if not spelled:
        return None
    return _Respell().visit(copy.deepcopy(tree))


def _is_spelled_amp(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute) and node.attr == "amp" and isinstance(node.value, ast.Name)
        and node.value.id == "apex" and isinstance(node.ctx, ast.Load)
    )


def _binds_apex_otherwise(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "apex" and not isinstance(node.ctx, ast.Load)
    if isinstance(node, ast.arg):
        return node.arg == "apex"
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == "apex"
    if isinstance(node, ast.ImportFrom):
        return any((alias.asname or alias.name) == "apex" for alias in node.names)
    if isinstance(node, ast.Import):
        return any(alias.asname == "apex" for alias in node.names)
    if isinstance(node, ast.ExceptHandler):
        return node.name == "apex"
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return "apex" in node.names
    if isinstance(node, (ast.MatchAs, ast.MatchStar)):
        return node.name == "apex"
    return False


def _none_fallbacks(tree: ast.Module) -> set:
    """The `apex` targets of `apex = None` in a handler of a `try` whose body imports apex (apex
    not installed): code reading `apex` then runs only with the package there."""
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        imports = any(
            isinstance(s, ast.Import) and any(a.asname is None and _package(a.name) == "apex" for a in s.names)
            for s in node.body
        )
        for handler in node.handlers if imports else ():
            for statement in handler.body:
                if (
                    isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)
                    and statement.value.value is None
                ):
                    found.update(id(t) for t in statement.targets if isinstance(t, ast.Name) and t.id == "apex")
    return found


def _package(dotted: str) -> str:
    return dotted.split(".")[0]


class _Respell(ast.NodeTransformer):
    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if _is_spelled_amp(node):
            return ast.copy_location(ast.Name(id=SPELLED, ctx=ast.Load()), node)
        self.generic_visit(node)
        return node

    def visit_Import(self, node: ast.Import) -> ast.AST:
        # `import apex` (or `import apex.optimizers`) binds the package: here, the module it spells.
        node.names = [
            ast.alias(name="apex.amp", asname=SPELLED) if alias.asname is None and _package(alias.name) == "apex" else alias
            for alias in node.names
        ]
        return node
