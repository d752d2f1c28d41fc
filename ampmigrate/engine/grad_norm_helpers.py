"""Gradient-norm helpers of a program, recognized by their structure (on `ast`).

Swin-Transformer and its forks log `grad_norm = get_grad_norm(amp.master_params(optimizer))` on
every micro-step of gradient accumulation, with `get_grad_norm` a helper of the program:

    def get_grad_norm(parameters, norm_type=2):
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        parameters = list(filter(lambda p: p.grad is not None, parameters))
        norm_type = float(norm_type)
        total_norm = 0
        for p in parameters:
            param_norm = p.grad.data.norm(norm_type)
            total_norm += param_norm.item() ** norm_type
        total_norm = total_norm ** (1. / norm_type)
        return total_norm

apex handed it unscaled gradients; GradScaler hands it gradients times the loss scale S. A p-norm
(p > 0, finite) is positively homogeneous of degree 1, `norm(S * g) == S * norm(g)`, so
`get_grad_norm(params) / scaler.get_scale()` is apex's value (up to rounding; S is a power of two).

Soundness over coverage: a function is recognized only when its whole body is one of the
templates below, statement by statement, so that nothing else reads or writes `.grad`, the
accumulator starts at 0 and the same norm type `t` (one parameter with a positive finite literal
default, or one positive finite literal) is used throughout:

- preamble, each optional, in this order: `if isinstance(P, torch.Tensor): P = [P]`;
  `P = list(filter(lambda q: q.grad is not None, P))` or `P = [q for q in P if q.grad is not None]`;
  `t = float(t)`;
- the loop: `acc = 0`, `for q in P:` whose body (optionally under `if q.grad is not None:` or after
  `if q.grad is None: continue`) is `n = G` and `acc += n[.item()] ** t`, or `acc += G[.item()] ** t`
  (`acc = acc + ...` too), with G `q.grad[.data|.detach()].norm(t)`; then
  `acc = acc ** (1. / t)` and `return acc`, or `return acc ** (1. / t)`;
- or torch's form: `return torch.norm(torch.stack([torch.norm(q.grad[.data|.detach()], t) for q in P]), t)`
  (through one name and `.item()` allowed).

What is recorded: {function name: (its positional parameters, the norm-type parameter or "")}. A
call is the helper's value only with its parameters argument alone, or with the norm type as a
positive finite literal too (`grad_norm_call_ok`).
"""

from __future__ import annotations

import ast
import math
from typing import Dict, List, Optional, Sequence, Tuple

Record = Tuple[List[str], str]


def grad_norm_helpers(tree: Optional[ast.Module]) -> Dict[str, Record]:
    """The top-level functions of `tree` whose value is the p-norm of their parameters' gradients."""
    if tree is None:
        return {}
    found: Dict[str, Record] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            record = recognize(node)
            if record is not None:
                found[node.name] = record
    if not found:  # the usual case: no walk of the whole tree below
        return found
    bound: Dict[str, int] = {}
    for node in tree.body:
        for name in _top_level_bindings(node):
            bound[name] = bound.get(name, 0) + 1
    for node in ast.walk(tree):  # `global f` in a function may rebind it: not recognized
        if isinstance(node, ast.Global):
            for name in node.names:
                bound[name] = bound.get(name, 0) + 1
    return {name: record for name, record in found.items() if bound.get(name) == 1}


def positive_finite_literal(node: ast.AST) -> Optional[float]:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = float(node.value)
        if value > 0 and math.isfinite(value):
            return value
    return None


def recognize(fn: ast.FunctionDef) -> Optional[Record]:
    args = fn.args
    if fn.decorator_list or args.vararg or args.kwarg or args.kwonlyargs:
        return None
    positional = [a.arg for a in args.posonlyargs + args.args]
    if len(positional) not in (1, 2):
        return None
    params = positional[0]
    norm: object  # the norm type: a parameter name (str) or a literal (float)
    if len(positional) == 2:
        if len(args.defaults) != 1 or positive_finite_literal(args.defaults[0]) is None:
            return None
        norm = positional[1]
    else:
        norm = None  # fixed by the first literal met
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    m = _Matcher(params, norm)
    i = 0
    if i < len(body) and m.tensor_wrap(body[i]):
        i += 1
    if i < len(body) and m.filter_none(body[i]):
        i += 1
    if i < len(body) and isinstance(norm, str) and m.float_cast(body[i]):
        i += 1
    rest = body[i:]
    if not (m.loop_form(rest) or m.stack_form(rest)):
        return None
    if m.norm is None:
        return None
    return positional, norm if isinstance(norm, str) else ""


def grad_norm_call_ok(record: Record, args: Sequence[Tuple[Optional[str], Optional[ast.AST]]]) -> bool:
    """`args`: the call's arguments as (keyword or None, the value as `ast`, None where starred
    or unparsable). True when the first is the parameters (positional) and the only other, if
    any, the norm type as a positive finite literal."""
    positional, norm = record
    if not args or args[0][0] is not None or args[0][1] is None:
        return False
    for index, (keyword, value) in enumerate(args[1:], start=1):
        if value is None or not norm or index > 1:
            return False
        if keyword is None and positional[1] != norm:
            return False
        if keyword is not None and keyword != norm:
            return False
        if positive_finite_literal(value) is None:
            return False
    return True


def _top_level_bindings(node: ast.stmt) -> List[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    names = []
    for inner in ast.walk(node):  # assignments, `for`/`with` targets, `global` writes anywhere at top level
        if isinstance(inner, ast.Name) and isinstance(inner.ctx, (ast.Store, ast.Del)):
            names.append(inner.id)
        elif isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and inner is not node:
            names.append(inner.name)
    return names


def _name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _assign(node: ast.stmt) -> Optional[Tuple[str, ast.AST]]:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id, node.value
    return None


def _grad_of(node: ast.AST, var: str) -> bool:
    """`var.grad`, `var.grad.data` or `var.grad.detach()`."""
    if isinstance(node, ast.Call) and not node.args and not node.keywords and isinstance(node.func, ast.Attribute):
        if node.func.attr != "detach":
            return False
        node = node.func.value
    elif isinstance(node, ast.Attribute) and node.attr == "data":
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr == "grad" and _name(node.value, var)


def _grad_is(node: ast.AST, var: str, op: type) -> bool:
    """`var.grad is None` (op ast.Is) / `var.grad is not None` (ast.IsNot)."""
    return (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], op)
        and isinstance(node.left, ast.Attribute)
        and node.left.attr == "grad"
        and _name(node.left.value, var)
        and isinstance(node.comparators[0], ast.Constant)
        and node.comparators[0].value is None
    )


def _item(node: ast.AST) -> ast.AST:
    if isinstance(node, ast.Call) and not node.args and not node.keywords and isinstance(node.func, ast.Attribute):
        if node.func.attr == "item":
            return node.func.value
    return node


def _torch(node: ast.AST, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr and _name(node.value, "torch")


class _Matcher:
    def __init__(self, params: str, norm: object) -> None:
        self.params = params
        self.norm = norm  # a parameter name, a float, or None until a literal fixes it

    def is_norm(self, node: ast.AST) -> bool:
        if isinstance(self.norm, str):
            return _name(node, self.norm)
        value = positive_finite_literal(node)
        if value is None:
            return False
        if self.norm is None:
            self.norm = value
        return value == self.norm

    def inverse(self, node: ast.AST) -> bool:
        """`1. / t` (or `1 / t`), or 0.5 where t is the literal 2."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            one = node.left
            if isinstance(one, ast.Constant) and type(one.value) in (int, float) and one.value == 1:
                return self.is_norm(node.right)
        if self.norm == 2.0 and isinstance(node, ast.Constant) and type(node.value) is float and node.value == 0.5:
            return True
        return False

    # ---- preamble
    def tensor_wrap(self, node: ast.stmt) -> bool:
        """`if isinstance(P, torch.Tensor): P = [P]`."""
        if not (isinstance(node, ast.If) and not node.orelse and len(node.body) == 1):
            return False
        test = node.test
        if not (
            isinstance(test, ast.Call)
            and _name(test.func, "isinstance")
            and len(test.args) == 2
            and not test.keywords
            and _name(test.args[0], self.params)
            and _torch(test.args[1], "Tensor")
        ):
            return False
        assigned = _assign(node.body[0])
        return (
            assigned is not None
            and assigned[0] == self.params
            and isinstance(assigned[1], ast.List)
            and len(assigned[1].elts) == 1
            and _name(assigned[1].elts[0], self.params)
        )

    def filter_none(self, node: ast.stmt) -> bool:
        """`P = list(filter(lambda q: q.grad is not None, P))` / `P = [q for q in P if q.grad is not None]`."""
        assigned = _assign(node)
        if assigned is None or assigned[0] != self.params:
            return False
        value = assigned[1]
        if isinstance(value, ast.Call) and _name(value.func, "list") and len(value.args) == 1 and not value.keywords:
            inner = value.args[0]
            if not (
                isinstance(inner, ast.Call)
                and _name(inner.func, "filter")
                and len(inner.args) == 2
                and not inner.keywords
                and _name(inner.args[1], self.params)
                and isinstance(inner.args[0], ast.Lambda)
            ):
                return False
            fn = inner.args[0]
            lam = fn.args
            if lam.posonlyargs or lam.vararg or lam.kwarg or lam.kwonlyargs or lam.defaults or len(lam.args) != 1:
                return False
            return _grad_is(fn.body, lam.args[0].arg, ast.IsNot)
        if isinstance(value, ast.ListComp) and len(value.generators) == 1:
            gen = value.generators[0]
            return (
                isinstance(gen.target, ast.Name)
                and _name(value.elt, gen.target.id)
                and _name(gen.iter, self.params)
                and not gen.is_async
                and len(gen.ifs) == 1
                and _grad_is(gen.ifs[0], gen.target.id, ast.IsNot)
            )
        return False

    def float_cast(self, node: ast.stmt) -> bool:
        """`t = float(t)`."""
        assigned = _assign(node)
        return (
            assigned is not None
            and assigned[0] == self.norm
            and isinstance(assigned[1], ast.Call)
            and _name(assigned[1].func, "float")
            and len(assigned[1].args) == 1
            and not assigned[1].keywords
            and _name(assigned[1].args[0], self.norm)
        )

    # ---- the accumulation loop
    def grad_norm(self, node: ast.AST, var: str) -> bool:
        """`var.grad[.data|.detach()].norm(t)`."""
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "norm"
            and len(node.args) == 1
            and not node.keywords
            and self.is_norm(node.args[0])
            and _grad_of(node.func.value, var)
        )

    def power_of(self, node: ast.AST) -> Optional[ast.AST]:
        """`x[.item()] ** t` -> x."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and self.is_norm(node.right):
            return _item(node.left)
        return None

    def added(self, node: ast.stmt, acc: str) -> Optional[ast.AST]:
        """`acc += E` / `acc = acc + E` -> E."""
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and _name(node.target, acc):
            return node.value
        assigned = _assign(node)
        if assigned is not None and assigned[0] == acc:
            value = assigned[1]
            if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add) and _name(value.left, acc):
                return value.right
        return None

    def loop_body(self, body: List[ast.stmt], var: str, acc: str) -> bool:
        if len(body) == 1 and isinstance(body[0], ast.If) and not body[0].orelse and _grad_is(body[0].test, var, ast.IsNot):
            body = body[0].body
        elif (
            body
            and isinstance(body[0], ast.If)
            and not body[0].orelse
            and _grad_is(body[0].test, var, ast.Is)
            and len(body[0].body) == 1
            and isinstance(body[0].body[0], ast.Continue)
        ):
            body = body[1:]
        if len(body) == 1:
            term = self.added(body[0], acc)
            base = self.power_of(term) if term is not None else None
            return base is not None and self.grad_norm(base, var)
        if len(body) == 2:
            first = _assign(body[0])
            if first is None or first[0] in (acc, var, self.params, self.norm) or not self.grad_norm(first[1], var):
                return False
            term = self.added(body[1], acc)
            base = self.power_of(term) if term is not None else None
            return base is not None and _name(base, first[0])
        return False

    def loop_form(self, body: List[ast.stmt]) -> bool:
        if len(body) not in (3, 4):
            return False
        start = _assign(body[0])
        if start is None or start[0] in (self.params, self.norm):
            return False
        acc, zero = start
        if not (isinstance(zero, ast.Constant) and type(zero.value) in (int, float) and zero.value == 0):
            return False
        loop = body[1]
        if not (
            isinstance(loop, ast.For)
            and not loop.orelse
            and isinstance(loop.target, ast.Name)
            and _name(loop.iter, self.params)
            and loop.target.id not in (acc, self.params, self.norm)
            and self.loop_body(list(loop.body), loop.target.id, acc)
        ):
            return False
        if len(body) == 4:
            final = _assign(body[2])
            if final is None or final[0] != acc or not self.root_of(final[1], acc):
                return False
            last = body[3]
            return isinstance(last, ast.Return) and _name(last.value, acc)
        last = body[2]
        return isinstance(last, ast.Return) and last.value is not None and self.root_of(last.value, acc)

    def root_of(self, node: ast.AST, acc: str) -> bool:
        """`acc ** (1. / t)`."""
        return (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Pow)
            and _name(node.left, acc)
            and self.inverse(node.right)
        )

    # ---- torch's form
    def stack_norm(self, node: ast.AST) -> bool:
        """`torch.norm(torch.stack([torch.norm(q.grad[.data|.detach()], t) for q in P]), t)`."""
        if not (
            isinstance(node, ast.Call)
            and _torch(node.func, "norm")
            and len(node.args) == 2
            and not node.keywords
            and self.is_norm(node.args[1])
        ):
            return False
        stack = node.args[0]
        if not (isinstance(stack, ast.Call) and _torch(stack.func, "stack") and len(stack.args) == 1 and not stack.keywords):
            return False
        comp = stack.args[0]
        if not (isinstance(comp, ast.ListComp) and len(comp.generators) == 1):
            return False
        gen = comp.generators[0]
        if gen.is_async or not isinstance(gen.target, ast.Name) or not _name(gen.iter, self.params):
            return False
        var = gen.target.id
        if var in (self.params, self.norm):
            return False
        if gen.ifs and not (len(gen.ifs) == 1 and _grad_is(gen.ifs[0], var, ast.IsNot)):
            return False
        inner = comp.elt
        return (
            isinstance(inner, ast.Call)
            and _torch(inner.func, "norm")
            and len(inner.args) == 2
            and not inner.keywords
            and self.is_norm(inner.args[1])
            and _grad_of(inner.args[0], var)
        )

    def stack_form(self, body: List[ast.stmt]) -> bool:
        if len(body) == 1:
            last = body[0]
            return isinstance(last, ast.Return) and last.value is not None and self.stack_norm(_item(last.value))
        if len(body) == 2:
            assigned = _assign(body[0])
            if assigned is None or assigned[0] in (self.params, self.norm) or not self.stack_norm(assigned[1]):
                return False
            last = body[1]
            return isinstance(last, ast.Return) and last.value is not None and _name(_item(last.value), assigned[0])
        return False
