"""Where a statement sits: its block, what runs after or before it in the same loop iteration,
and which `if` branches enclose a node. One statement model for every family: the path-aware
walk of `analysis/flow.py` (the AMP3 protocol rules) and the apex migration both place
statements with these functions.

The apex rewrite reasons about one training step: the `with amp.scale_loss(...)` statement, the
`optimizer.step()` that follows it, the clip between them, and the forward pass before it. Those
live in one function and one loop iteration, spread over `if`/`else`, `with` and `try` blocks.
`following` and `preceding` walk statements in that order, climbing out of such blocks but never
out of a loop body, a function, a class or the module (another iteration or another call).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

import libcst as cst

from ampmigrate.engine.names import NameIndex

# Blocks whose statements run at most once per execution of the enclosing statement sequence.
_TRANSPARENT = (cst.If, cst.Else, cst.With, cst.Try, cst.ExceptHandler, cst.Finally, cst.TryStar, cst.ExceptStarHandler)
_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def body_of(block: cst.CSTNode) -> Optional[Sequence[cst.BaseStatement]]:
    """The statement list of an IndentedBlock or Module (None for one-line suites)."""
    if isinstance(block, (cst.IndentedBlock, cst.Module)):
        return block.body
    return None


def block_of(names: NameIndex, statement: cst.CSTNode) -> Tuple[Optional[Sequence[cst.CSTNode]], int]:
    """The statement list holding `statement`, and its index there; an `elif` is its own
    one-statement block. (None, 0) for a statement of a one-line suite."""
    parent = names.parent(statement)
    if isinstance(parent, (cst.IndentedBlock, cst.Module)):
        for index, child in enumerate(parent.body):
            if child is statement:
                return parent.body, index
    if isinstance(parent, cst.If) and parent.orelse is statement:
        return [statement], 0
    return None, 0


def enclosing_compound(names: NameIndex, statement: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The compound statement (or module) whose block holds `statement`; for a statement in an
    `elif` chain, the chain's first `if`."""
    node = names.parent(statement)
    while node is not None and not isinstance(node, (cst.BaseCompoundStatement, cst.Module)):
        node = names.parent(node)
    if isinstance(node, cst.If):
        parent = names.parent(node)
        while isinstance(parent, cst.If) and parent.orelse is node:
            node, parent = parent, names.parent(parent)
    return node


def in_loop_body(names: NameIndex, statement: cst.CSTNode, loop: cst.CSTNode) -> bool:
    """Whether `statement` is in `loop`'s body (not its `else:` block)."""
    node: Optional[cst.CSTNode] = statement
    while node is not None and node is not loop:
        if node is loop.body:
            return True
        node = names.parent(node)
    return False


def containing_block(names: NameIndex, statement: cst.CSTNode) -> Optional[cst.CSTNode]:
    block = names.parent(statement)
    return block if isinstance(block, (cst.IndentedBlock, cst.Module)) else None


def owner_statement(names: NameIndex, block: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The compound statement a block belongs to (the `if` for an `else:`/`elif` block)."""
    owner = names.parent(block)
    if isinstance(owner, (cst.Else, cst.ExceptHandler, cst.Finally, cst.ExceptStarHandler)):
        owner = names.parent(owner)
    # `elif` chains: the `If` in another `If`'s orelse is a statement of that chain.
    while isinstance(owner, cst.If) and isinstance(names.parent(owner), cst.If):
        owner = names.parent(owner)
    return owner


def climbable(names: NameIndex, block: cst.CSTNode, *, out_of_loops: bool = False) -> Optional[cst.CSTNode]:
    """The statement to continue from when leaving `block`, or None at a scope boundary (and,
    unless `out_of_loops`, at a loop boundary: the next iteration is not "after")."""
    direct = names.parent(block)
    if isinstance(direct, (cst.For, cst.While)) and out_of_loops and direct.body is block:
        # Only an inner loop (gradient accumulation), or a counted one (`for _ in range(accum)`
        # in a per-step function): past the outermost loop over data the function has trained.
        return direct if _inside_loop(names, direct) or _counted(direct) else None
    if not isinstance(direct, _TRANSPARENT):
        return None
    owner = owner_statement(names, block)
    if isinstance(owner, (cst.If, cst.With, cst.Try, cst.TryStar)):
        return owner
    return None


def _counted(loop: cst.CSTNode) -> bool:
    """`for _ in range(n)`: a loop counted out, as the micro-batches of one optimizer step."""
    return (
        isinstance(loop, cst.For) and isinstance(loop.iter, cst.Call) and isinstance(loop.iter.func, cst.Name)
        and loop.iter.func.value == "range" and loop.orelse is None
    )


def _inside_loop(names: NameIndex, node: cst.CSTNode) -> bool:
    for ancestor in names.ancestors(node):
        if isinstance(ancestor, (cst.For, cst.While)):
            return True
        if isinstance(ancestor, _SCOPES):
            return False
    return False


def following(names: NameIndex, statement: cst.CSTNode, *, out_of_loops: bool = False) -> Iterator[cst.BaseStatement]:
    """Statements that run after `statement` in the same iteration, in order; with
    `out_of_loops`, also those after an inner loop (gradient accumulation over an inner loop
    steps after it), up to the body of the function's outermost loop."""
    for body, index in _enclosing_bodies(names, statement, out_of_loops=out_of_loops):
        yield from body[index + 1 :]


def preceding(names: NameIndex, statement: cst.CSTNode) -> Iterator[cst.BaseStatement]:
    """Statements that ran before `statement` in the same iteration, nearest first."""
    for body, index in _enclosing_bodies(names, statement, out_of_loops=False):
        yield from reversed(body[:index])


def _enclosing_bodies(
    names: NameIndex, statement: cst.CSTNode, *, out_of_loops: bool
) -> Iterator[Tuple[Sequence[cst.BaseStatement], int]]:
    """Each block body around `statement` within the iteration, innermost first, with the index
    of the statement (or of the block holding it) in that body."""
    current = statement
    while True:
        block = containing_block(names, current)
        body = body_of(block) if block is not None else None
        if body is None:
            return
        yield body, _index(body, current)
        holder = names.parent(block)
        owner = names.parent(holder) if isinstance(holder, cst.Else) else None
        if isinstance(owner, (cst.Try, cst.TryStar)) and owner.orelse is holder:
            # `try: loss = ... except ...: ... else: <here>`: the whole `try` body ran first
            tried = body_of(owner.body)
            if tried is not None:
                yield tried, len(tried)
        current = climbable(names, block, out_of_loops=out_of_loops)
        if current is None:
            return


def _index(body: Sequence[cst.CSTNode], node: cst.CSTNode) -> int:
    for index, item in enumerate(body):
        if item is node:
            return index
    raise ValueError("statement not in its block")  # pragma: no cover - parents are exact


def walk(node: cst.CSTNode, *, into_scopes: bool = False) -> Iterator[cst.CSTNode]:
    """`node` and its descendants in source order, not entering nested defs/classes/lambdas."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if current is not node and not into_scopes and isinstance(current, _SCOPES):
            continue
        stack.extend(reversed(current.children))


def loops_between(names: NameIndex, node: cst.CSTNode, root: cst.CSTNode) -> List[cst.CSTNode]:
    """`for`/`while` statements enclosing `node` below `root`, outermost first."""
    found = []
    for ancestor in names.ancestors(node):
        if ancestor is root:
            break
        if isinstance(ancestor, (cst.For, cst.While)):
            found.append(ancestor)
    return list(reversed(found))


# --------------------------------------------------------------------------------- if-branches
@dataclass(frozen=True)
class Branch:
    """`node` lies in the `body` (taken=True) or the `else` (taken=False) of `test`."""

    test: cst.BaseExpression
    taken: bool
    statement: cst.If

    @property
    def key(self) -> Tuple[str, bool]:
        return expression_key(self.test), self.taken


def branches(names: NameIndex, node: cst.CSTNode, stop: Optional[cst.CSTNode] = None) -> List[Branch]:
    """The `if` branches enclosing `node` (innermost last), below `stop`; `elif` adds the
    negations of the earlier tests of its chain."""
    found: List[Branch] = []
    child = node
    for ancestor in names.ancestors(node):
        if ancestor is stop:
            break
        if isinstance(ancestor, cst.If) and child is not ancestor.test:
            if child is ancestor.body:
                found.append(Branch(ancestor.test, True, ancestor))
            elif child is ancestor.orelse:
                found.append(Branch(ancestor.test, False, ancestor))
        if isinstance(ancestor, _SCOPES):
            break
        child = ancestor
    return list(reversed(found))


def elif_chain(statement: cst.If) -> List[cst.If]:
    """`statement` and each `elif` of its chain, in order."""
    links = [statement]
    while isinstance(links[-1].orelse, cst.If):
        links.append(links[-1].orelse)
    return links


def is_main_guard(node: cst.CSTNode) -> bool:
    """`node` is `if __name__ == "__main__":` (either way round) with no `else`."""
    if not (isinstance(node, cst.If) and node.orelse is None and isinstance(node.test, cst.Comparison)):
        return False
    test = node.test
    if len(test.comparisons) != 1 or not isinstance(test.comparisons[0].operator, cst.Equal):
        return False
    sides = [test.left, test.comparisons[0].comparator]
    names = [s for s in sides if isinstance(s, cst.Name) and s.value == "__name__"]
    strings = [s for s in sides if isinstance(s, cst.SimpleString) and s.evaluated_value == "__main__"]
    return len(names) == 1 and len(strings) == 1


def expression_key(expression: cst.CSTNode) -> str:
    """A spelling of an expression that ignores formatting (for comparing `if` tests)."""
    code = cst.Module([]).code_for_node(expression)
    try:
        return ast.dump(ast.parse(code.strip(), mode="eval"))
    except SyntaxError:  # pragma: no cover - it came from a parsed module
        return code


_PURE_LEAVES = (cst.Name, cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString)
# torch's queries of the machine, asked without arguments: the same answer each time in a run, and
# nothing changed by asking (`if torch.cuda.is_available(): ... amp.initialize(...)`, SSD-pytorch).
# Spelled as written: an alias of torch is not followed (the answer is then "not pure").
_PURE_QUERIES = frozenset({
    "torch.cuda.is_available", "torch.cuda.device_count", "torch.cuda.is_bf16_supported",
    "torch.distributed.is_available", "torch.distributed.is_initialized",
})


# Methods of `str` that read the string (`args.optimizer.lower() == "adam"`, `name.startswith("O")`):
# a configuration value's, called with literal arguments or none.
_STR_QUERIES = frozenset({
    "lower", "upper", "casefold", "strip", "lstrip", "rstrip", "startswith", "endswith", "isdigit", "isalpha",
})


def _str_query(expression: cst.CSTNode) -> bool:
    return (
        isinstance(expression, cst.Call) and isinstance(expression.func, cst.Attribute)
        and expression.func.attr.value in _STR_QUERIES and is_pure(expression.func.value)
        and all(a.keyword is None and not a.star and isinstance(a.value, _PURE_LEAVES) for a in expression.args)
    )


def _mapping_get(expression: cst.CSTNode) -> bool:
    """`<pure>.get("key")` or `<pure>.get("key", <literal>)`: a dict's (or a config object's)
    lookup by a string key. A string key keeps out `queue.get(True)` and the like."""
    if not (isinstance(expression, cst.Call) and isinstance(expression.func, cst.Attribute) and expression.func.attr.value == "get"):
        return False
    args = expression.args
    if not 1 <= len(args) <= 2 or any(a.keyword is not None or a.star for a in args):
        return False
    if not isinstance(args[0].value, (cst.SimpleString, cst.ConcatenatedString)):
        return False
    return (len(args) == 1 or isinstance(args[1].value, _PURE_LEAVES)) and is_pure(expression.func.value)


def is_pure(expression: cst.CSTNode) -> bool:
    """True when evaluating `expression` again has no side effects and (barring reassignment)
    gives the same value: names, attributes, literals, subscripts with literal keys and `.get("key")` lookups,
    comparisons, `not`, `and`/`or`, and tuple, list and set displays of such values (the
    `("O1", "O2")` of `opt_level in ("O1", "O2")`)."""
    if isinstance(expression, _PURE_LEAVES):
        return True
    if isinstance(expression, (cst.Tuple, cst.List, cst.Set)):
        return all(isinstance(e, cst.Element) and is_pure(e.value) for e in expression.elements)
    if isinstance(expression, cst.Attribute):
        return is_pure(expression.value)
    if isinstance(expression, cst.Subscript):
        return is_pure(expression.value) and all(
            isinstance(element.slice, cst.Index) and isinstance(element.slice.value, _PURE_LEAVES)
            for element in expression.slice
        )
    if isinstance(expression, cst.Comparison):
        return is_pure(expression.left) and all(is_pure(c.comparator) for c in expression.comparisons)
    if isinstance(expression, cst.UnaryOperation):
        return is_pure(expression.expression)
    if isinstance(expression, cst.BooleanOperation):
        return is_pure(expression.left) and is_pure(expression.right)
    if isinstance(expression, cst.IfExp):
        return is_pure(expression.test) and is_pure(expression.body) and is_pure(expression.orelse)
    if _mapping_get(expression):  # `cfg.train.get("use_fp16")`: a lookup, as `cfg.train["use_fp16"]`
        return True
    if isinstance(expression, cst.Call) and not expression.args and _dotted(expression.func) in _PURE_QUERIES:
        return True
    if _str_query(expression):
        return True
    if (
        isinstance(expression, cst.BinaryOperation) and isinstance(expression.operator, cst.Modulo)
        and isinstance(expression.left, (cst.SimpleString, cst.ConcatenatedString))
    ):  # "O%i" % level: %-formatting of pure values, as an f-string
        right = expression.right
        values = [e.value for e in right.elements] if isinstance(right, cst.Tuple) else [right]
        return all(not isinstance(v, cst.StarredElement) and is_pure(v) for v in values)
    if isinstance(expression, cst.FormattedString):  # f"O{level}": str() of pure parts
        return all(
            is_pure(part.expression) and part.format_spec is None and part.conversion is None
            for part in expression.parts
            if isinstance(part, cst.FormattedStringExpression)
        )
    return False


def condition_code(module: cst.Module, path: Sequence[Branch]) -> Optional[str]:
    """The branch path as one boolean expression (`a and not b`), or None if it is not pure."""
    parts = []
    for branch in path:
        if not is_pure(branch.test):
            return None
        code = module.code_for_node(branch.test).strip()
        atomic = isinstance(branch.test, (cst.Name, cst.Attribute, cst.Subscript, cst.Call))
        if branch.taken and _mapping_get(branch.test):
            parts.append(f"bool({code})")  # `.get` may give None or a string: `enabled=` must be a bool
        elif branch.taken:
            parts.append(code if atomic or len(path) == 1 or not isinstance(branch.test, cst.BooleanOperation) else f"({code})")
        elif isinstance(branch.test, cst.UnaryOperation) and isinstance(branch.test.operator, cst.Not):
            # the `else` of `if not x:` is `bool(x)` (a bool: callers pass it to `enabled=`), not
            # `not (not x)`; a comparison is one already
            inner = branch.test.expression
            code = module.code_for_node(inner).strip()
            if isinstance(inner, cst.Comparison):
                parts.append(code if len(path) == 1 or inner.lpar else f"({code})")
            else:
                parts.append(f"bool{code}" if inner.lpar else f"bool({code})")
        else:
            parts.append(f"not {code}" if atomic else f"not ({code})")
    return " and ".join(parts) if parts else None


class _ContinuationIndent(cst.CSTTransformer):
    """Lines continued with a backslash keep their indentation relative to the statement when the
    statement moves one level in (LibCST re-indents the others, not what follows a `\\`)."""

    def __init__(self, indent: str) -> None:
        self.indent = indent

    def leave_SimpleWhitespace(self, original_node, updated_node):
        if "\\\n" not in updated_node.value:
            return updated_node
        return updated_node.with_changes(value=updated_node.value.replace("\\\n", "\\\n" + self.indent))


def indent_continuations(statement: cst.CSTNode, indent: str) -> cst.CSTNode:
    """`statement` as it reads one level in (in a new `with` block): the same node unless a line of it
    is continued with a backslash, whose next line then gains `indent` too."""
    if not any(isinstance(n, cst.SimpleWhitespace) and "\\\n" in n.value for n in walk(statement)):
        return statement
    return statement.visit(_ContinuationIndent(indent))



def _dotted(node: cst.CSTNode) -> str:
    """`torch.cuda.is_available` as written ("" for anything but names and attributes)."""
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return ""
    return ".".join([node.value, *reversed(parts)])
