"""`amp.initialize(model, opt, **amp_args)` whose keywords a dict built right before gives.

The shape of the fast adversarial training scripts (locuslab/fast_adversarial, and the many
repositories that copy them):

    amp_args = dict(opt_level=args.opt_level, loss_scale=args.loss_scale, verbosity=False)
    if args.opt_level == 'O2':
        amp_args['master_weights'] = args.master_weights
    model, opt = amp.initialize(model, opt, **amp_args)

is the call `amp.initialize(model, opt, opt_level=args.opt_level, loss_scale=args.loss_scale,
verbosity=False, master_weights=args.master_weights if args.opt_level == 'O2' else None)`: a key
stored under an `if` is that value when the test holds and what it was before otherwise (apex's
default, None, for a key not yet set). `keyword_dict` reads it so, when nothing can make the two
differ: the dict (`dict(k=v, ...)` or a literal with string keys) is bound once, used only by
those stores and the call, the stores follow it directly (each alone on its line, or alone in an
`if` without `else`), the statement holding the call comes next, and every value and test is pure
(analysis/statements.is_pure), so reading it at the call gives what it gave at the store.

`bound_arguments` (_amp_options.py) binds such a call's arguments through `expanded_arguments`:
the planner reads the options as it reads written keywords, and removes the dict's statements
with the `amp.initialize` line (`_Planner._place_home`). The expansion is kept per call node for
the file being planned (LibCST nodes compare by identity and take no weak references).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampmigrate.analysis.statements import is_pure
from ampmigrate.engine.names import NameIndex

# amp.initialize's parameters whose default is None: a key stored only under a test is None otherwise.
_NONE_DEFAULTS = frozenset(
    {
        "cast_model_type", "patch_torch_functions", "keep_batchnorm_fp32", "master_weights", "loss_scale",
        "cast_model_outputs", "min_loss_scale",
    }
)
_KEEP = 64  # expansions kept (a file's calls; other files' plans made meanwhile)


@dataclass(frozen=True)
class KeywordDict:
    arguments: Tuple[cst.Arg, ...]  # the call's arguments, the `**` one replaced by keywords
    statements: Tuple[cst.BaseStatement, ...]  # the dict's assignment and the statements storing into it


_EXPANDED: "OrderedDict[int, Tuple[cst.Call, KeywordDict]]" = OrderedDict()


def register(names: NameIndex, call: cst.Call, params: Tuple[str, ...]) -> Optional[KeywordDict]:
    """Read `call`'s `**name` argument as keywords, and keep the answer for `expanded_arguments`."""
    found = _read(names, call, params)
    if found is not None:
        _EXPANDED[id(call)] = (call, found)
        while len(_EXPANDED) > _KEEP:
            _EXPANDED.popitem(last=False)
    return found


def expanded(call: cst.Call) -> Optional[KeywordDict]:
    entry = _EXPANDED.get(id(call))
    return entry[1] if entry is not None and entry[0] is call else None


def _read(names: NameIndex, call: cst.Call, params: Tuple[str, ...]) -> Optional[KeywordDict]:
    starred = [a for a in call.args if a.star]
    if len(starred) != 1 or starred[0].star != "**" or call.args[-1] is not starred[0]:
        return None
    name = starred[0].value
    if not isinstance(name, cst.Name):
        return None
    bindings = names.bindings_of(name)
    if len(bindings) != 1 or bindings[0].value is None:
        return None
    binding = bindings[0]
    keywords = _literal_keywords(names, binding.value)
    if keywords is None:
        return None
    creation = names.statement_of(binding.value)
    block = names.parent(creation)
    body = list(getattr(block, "body", ()))
    if not isinstance(creation, cst.SimpleStatementLine) or len(creation.body) != 1 or creation not in body:
        return None
    assign = creation.body[0]
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and assign.targets[0].target is binding.node):
        return None
    holder = _top_statement(names, call, block)
    if holder is None or body.index(holder) <= body.index(creation):
        return None
    between = body[body.index(creation) + 1 : body.index(holder)]
    stores: Dict[int, cst.CSTNode] = {}
    for statement in between:
        test, lines = _stores_of(statement)
        if lines is None:
            return None  # anything else between the dict and the call
        for line in lines:
            key, value = _store(line, name.value)
            if key is None or key not in params or not is_pure(value):
                return None
            if test is None:
                keywords[key] = value
            elif key in keywords:
                keywords[key] = cst.IfExp(test=test, body=value, orelse=keywords[key])
            elif key in _NONE_DEFAULTS:
                keywords[key] = cst.IfExp(test=test, body=value, orelse=cst.Name("None"))
            else:
                return None  # another default than None: not worth spelling
            stores[id(line.body[0].targets[0].target.value)] = line
    uses = names.references(binding)
    if len(uses) != len(stores) + 1 or not all(u is name or id(u) in stores for u in uses):
        return None  # the dict is read elsewhere
    given = [a for a in call.args if not a.star]
    if any(a.keyword is not None and a.keyword.value in keywords for a in given):
        return None  # `f(x=1, **{"x": 2})` raises TypeError: not a call that ran
    expanded_args = [
        *given,
        *(cst.Arg(keyword=cst.Name(key), value=value, equal=cst.AssignEqual()) for key, value in keywords.items()),
    ]
    return KeywordDict(tuple(expanded_args), (creation, *between))


def _literal_keywords(names: NameIndex, value: cst.BaseExpression) -> Optional[Dict[str, cst.BaseExpression]]:
    """`dict(k=v, ...)` (the builtin) or `{"k": v, ...}` with pure values: {k: v}."""
    found: Dict[str, cst.BaseExpression] = {}
    if isinstance(value, cst.Call):
        if not (isinstance(value.func, cst.Name) and value.func.value == "dict" and not names.bindings_of(value.func)):
            return None
        for arg in value.args:
            if arg.star or arg.keyword is None or arg.keyword.value in found or not is_pure(arg.value):
                return None
            found[arg.keyword.value] = arg.value
        return found
    if isinstance(value, cst.Dict):
        for element in value.elements:
            if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.SimpleString):
                return None
            key = element.key.evaluated_value
            if not isinstance(key, str) or key in found or not is_pure(element.value):
                return None
            found[key] = element.value
        return found
    return None


def _stores_of(statement: cst.CSTNode) -> Tuple[Optional[cst.BaseExpression], Optional[List[cst.SimpleStatementLine]]]:
    """(the `if`'s test or None, the lines) of a store line or an `if` (no `else`) holding only such lines."""
    if isinstance(statement, cst.SimpleStatementLine):
        return None, [statement]
    if isinstance(statement, cst.If) and statement.orelse is None and is_pure(statement.test):
        lines = list(statement.body.body) if isinstance(statement.body, cst.IndentedBlock) else []
        if lines and all(isinstance(line, cst.SimpleStatementLine) for line in lines):
            return statement.test, lines
    return None, None


def _store(line: cst.SimpleStatementLine, dict_name: str) -> Tuple[Optional[str], Optional[cst.BaseExpression]]:
    """`<dict_name>["key"] = value` alone on its line: (key, value)."""
    if len(line.body) != 1 or not isinstance(line.body[0], cst.Assign) or len(line.body[0].targets) != 1:
        return None, None
    target = line.body[0].targets[0].target
    if not (isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name) and target.value.value == dict_name):
        return None, None
    if len(target.slice) != 1 or not isinstance(target.slice[0].slice, cst.Index):
        return None, None
    key = target.slice[0].slice.value
    if not isinstance(key, cst.SimpleString) or not isinstance(key.evaluated_value, str):
        return None, None
    return key.evaluated_value, line.body[0].value


def _top_statement(names: NameIndex, node: cst.CSTNode, block: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The statement of `block` that holds `node`."""
    child = node
    for ancestor in names.ancestors(node):
        if ancestor is block:
            return child
        child = ancestor
    return None
