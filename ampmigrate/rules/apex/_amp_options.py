"""What an `amp.initialize(...)` call asks for, and the `torch.amp.GradScaler` that matches it.

apex semantics (AMP_FACTS.md section 4): O1 patches torch functions, O2 casts the model to fp16
with fp32 master weights (batchnorm kept fp32), both with a dynamic loss scale whose defaults
(2**16, x2 after 2000 clean steps, x0.5 on overflow) are GradScaler's. O0 is plain fp32, O3 pure
fp16. Overrides that keep those semantics map exactly; the others change numerics and make the
migration unsafe, and the reason says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.statements import expression_key, is_pure
from ampmigrate.engine.names import NameIndex
from ampmigrate.rules.apex._keyword_dict import expanded

# amp.initialize(models, optimizers=None, enabled=True, opt_level="O1", cast_model_type=None, ...)
INITIALIZE_PARAMS = (
    "models",
    "optimizers",
    "enabled",
    "opt_level",
    "cast_model_type",
    "patch_torch_functions",
    "keep_batchnorm_fp32",
    "master_weights",
    "loss_scale",
    "cast_model_outputs",
    "num_losses",
    "verbosity",
    "min_loss_scale",
    "max_loss_scale",
)
# amp.init(enabled=True, loss_scale="dynamic", enable_caching=True, verbose=False, allow_banned=False)
INIT_PARAMS = ("enabled", "loss_scale", "enable_caching", "verbose", "allow_banned")

OPT_LEVELS = ("O0", "O1", "O2", "O3")
# GradScaler's growth tracker is an int32: this interval is never reached.
NO_GROWTH_INTERVAL = "2**31 - 1"

_LITERALS = {"True": True, "False": False, "None": None}


@dataclass(frozen=True)
class Conjunct:
    """One condition the scaler's `enabled` is the conjunction of (compared by `key`)."""

    code: str
    key: Tuple[str, bool]


@dataclass(frozen=True)
class Guard:
    """`if <test>: raise ValueError(<message>)` where `amp.initialize` was, which makes the unsafe
    reason `resolves` moot: every value the test lets through migrates exactly."""

    test: str
    message: str
    resolves: str


@dataclass
class ScalerSpec:
    """The GradScaler an initialize call becomes."""

    levels: Set[str]  # the opt levels the call can run with
    opt_level_code: Optional[str] = None  # the opt_level expression, when not a literal
    keywords: List[Tuple[str, str]] = field(default_factory=list)  # GradScaler keyword arguments
    enabled: List[Conjunct] = field(default_factory=list)
    unsafe: List[str] = field(default_factory=list)  # why the rewrite changes numerics
    notes: List[str] = field(default_factory=list)  # said in the fix message
    error: Optional[str] = None  # the call cannot be migrated at all
    # A run-time opt level: the test for O3 (pure fp16, which torch.amp cannot do), and the unsafe
    # reason that a guard raising on it makes moot.
    o3_test: Optional[str] = None
    o3_unsafe: Optional[str] = None
    # Other run-time options torch.amp cannot honour for some values: each stops with an error
    # where `amp.initialize` was, for those values only (as the O3 guard).
    guards: List["Guard"] = field(default_factory=list)
    # A run-time `loss_scale` read again in the GradScaler's keywords: where those cannot be
    # spelled (a scaler made apart from the call), the keywords go and this unsafe reason stays.
    run_time_scale: Optional[Tuple[Tuple[str, ...], str]] = None
    models: Optional[cst.BaseExpression] = None
    optimizers: Optional[cst.BaseExpression] = None

    def add_enabled(self, code: str, expression: Optional[cst.CSTNode], taken: bool = True) -> None:
        key = (expression_key(expression) if expression is not None else code, taken)
        if all(c.key != key for c in self.enabled):
            self.enabled.append(Conjunct(code, key))

    @property
    def enabled_keys(self) -> frozenset:
        return frozenset(c.key for c in self.enabled)


def literal_value(node: Optional[cst.CSTNode]):
    """The Python value of a literal (str, number, bool, None); raises ValueError otherwise."""
    if node is None:
        raise ValueError("no value")
    if isinstance(node, cst.Name) and node.value in _LITERALS:
        return _LITERALS[node.value]
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        value = node.evaluated_value
        if isinstance(value, bytes):
            raise ValueError("bytes")
        return value
    if isinstance(node, (cst.Integer, cst.Float)):
        return node.evaluated_value
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return -literal_value(node.expression)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power):
        return literal_value(node.left) ** literal_value(node.right)
    raise ValueError("not a literal")


def bound_arguments(call: cst.Call, params: Tuple[str, ...]) -> Optional[Dict[str, cst.Arg]]:
    """{parameter: Arg} for a call, or None when it uses `*args`/`**kwargs` or unknown names
    (a `**amp_args` dict built right before is read as its keywords: _keyword_dict.py)."""
    bound: Dict[str, cst.Arg] = {}
    position = 0
    found = expanded(call) if any(arg.star for arg in call.args) else None
    for arg in found.arguments if found is not None else call.args:
        if arg.star:
            return None
        if arg.keyword is None:
            if position >= len(params):
                return None
            bound[params[position]] = arg
            position += 1
        else:
            if arg.keyword.value not in params or arg.keyword.value in bound:
                return None
            bound[arg.keyword.value] = arg
    return bound


def _possible_levels(names: NameIndex, node: cst.BaseExpression, depth: int = 0) -> Optional[Set[str]]:
    """The opt levels an expression can hold (literals, `a if c else b`, a name bound to those)."""
    if depth > 3:
        return None
    try:
        value = literal_value(node)
    except ValueError:
        value = None
    else:
        return {value} if isinstance(value, str) else None
    if isinstance(node, cst.IfExp):
        body = _possible_levels(names, node.body, depth + 1)
        orelse = _possible_levels(names, node.orelse, depth + 1)
        return body | orelse if body is not None and orelse is not None else None
    if isinstance(node, cst.Name):
        bindings = names.bindings_of(node)
        if bindings and all(b.kind == "assign" and b.value is not None for b in bindings):
            result: Set[str] = set()
            for binding in bindings:
                levels = _possible_levels(names, binding.value, depth + 1)
                if levels is None:
                    return None
                result |= levels
            return result
    return None


def _levels_tested_around(names: NameIndex, call: cst.Call, level_node: cst.BaseExpression) -> Optional[Set[str]]:
    """`if args.opt_level == "O1": amp.initialize(..., opt_level=args.opt_level)`: inside the `if`
    the level is the one tested (also `in ("O1", "O2")`), whatever the run time value was."""
    key = expression_key(level_node)
    child: cst.CSTNode = call
    for ancestor in names.ancestors(call):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if isinstance(ancestor, cst.If) and child is ancestor.body:
            levels = _tested_levels(ancestor.test, key)
            if levels is not None:
                return levels
        child = ancestor
    return None


def _tested_levels(test: cst.BaseExpression, key: str) -> Optional[Set[str]]:
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _tested_levels(test.left, key) or _tested_levels(test.right, key)
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
        return None
    target = test.comparisons[0]
    left, right = test.left, target.comparator
    if isinstance(target.operator, cst.Equal):
        for subject, value in ((left, right), (right, left)):
            if expression_key(subject) == key:
                try:
                    level = literal_value(value)
                except ValueError:
                    return None
                return {level} if isinstance(level, str) else None
    if isinstance(target.operator, cst.In) and expression_key(left) == key and isinstance(right, (cst.Tuple, cst.List, cst.Set)):
        levels: Set[str] = set()
        for element in right.elements:
            try:
                level = literal_value(element.value)
            except ValueError:
                return None
            if not isinstance(level, str):
                return None
            levels.add(level)
        return levels
    return None


def is_no_optimizers(node: Optional[cst.BaseExpression]) -> bool:
    """`None` (apex's default) or an empty list or tuple: `model, _ = amp.initialize(model, [])`,
    the inference call of NVIDIA's WaveGlow and Tacotron 2 scripts, gives no optimizer either."""
    if isinstance(node, cst.Name):
        return node.value == "None"
    return isinstance(node, (cst.List, cst.Tuple)) and not node.elements


def scaler_spec(
    module: cst.Module, names: NameIndex, call: cst.Call, quote: str = '"', *, handle_api: bool = False
) -> ScalerSpec:
    """Read an `amp.initialize(...)` (or, with `handle_api`, an `amp.init(...)`) call."""
    params = INIT_PARAMS if handle_api else INITIALIZE_PARAMS
    bound = bound_arguments(call, params)
    spec = ScalerSpec(levels=set())
    if bound is None:
        spec.error = "its arguments are passed with `*`/`**` or do not match apex's signature"
        double = next((a for a in call.args if a.star == "**"), None)
        if double is not None and isinstance(double.value, cst.Name):
            spec.error = (
                f"its keywords come from `**{double.value.value}`, which the fix reads only when it is a dict "
                "(`dict(k=v)` or `{\"k\": v}`) built right before the call, stored into only there and read by nothing else"
            )
        return spec
    code = module.code_for_node

    def value(name: str) -> Optional[cst.BaseExpression]:
        arg = bound.get(name)
        return arg.value if arg is not None else None

    spec.models, spec.optimizers = value("models"), value("optimizers")
    if is_no_optimizers(spec.optimizers):
        spec.optimizers = None  # `amp.initialize(model, None or [], ...)`: no optimizers (inference)
    # ---- opt level
    if handle_api:
        spec.levels = {"O1"}  # amp.init() is the O1 behaviour: patched functions, dynamic scale
    else:
        level_node = value("opt_level")
        if level_node is None:
            spec.levels = {"O1"}
        else:
            levels = _possible_levels(names, level_node)
            if levels is None:
                levels = _levels_tested_around(names, call, level_node)
            bad = (levels or set()) - set(OPT_LEVELS)
            if bad:
                spec.error = f"`opt_level` {sorted(bad)[0]!r} is not an apex opt level (apex raises on it)"
                return spec
            if levels is None:
                spec.levels = set(OPT_LEVELS)
                spec.unsafe.append(
                    f"`opt_level={code(level_node).strip()}` is only known at run time; the rewrite assumes O1 or O2 "
                    "(under O0 the scaler and autocast are disabled; O3, pure fp16, would change)"
                )
                if is_pure(level_node):
                    spec.o3_test = f"{_operand(level_node, code)} == {quote}O3{quote}"
                    spec.o3_unsafe = spec.unsafe[-1]
            else:
                spec.levels = levels
                if "O3" in levels and len(levels) > 1:
                    # `if args.dtype in ("O0", "O1", "O2", "O3")`: O3 (pure fp16) has no torch.amp
                    # equivalent, so under it the rewrite raises (the planner's guard) or is refused.
                    if not is_pure(level_node):
                        spec.error = f"`opt_level={code(level_node).strip()}` may be O3 (pure fp16), which has no torch.amp equivalent"
                        return spec
                    spec.unsafe.append(f"`opt_level={code(level_node).strip()}` may be O3 (pure fp16), which has no torch.amp equivalent")
                    spec.o3_test = f"{_operand(level_node, code)} == {quote}O3{quote}"
                    spec.o3_unsafe = spec.unsafe[-1]
            if "O0" in spec.levels and spec.levels & {"O1", "O2"}:
                # O0 is fp32: the scaler (and autocast) are enabled only for the other levels.
                spec.opt_level_code = code(level_node).strip()
                chosen = _fp16_arm_test(level_node, code)
                if chosen is not None:  # `"O1" if args.fp16 else "O0"`: enabled=args.fp16
                    spec.add_enabled(*chosen)
                else:
                    condition = f"{_operand(level_node, code)} != {quote}O0{quote}"
                    spec.add_enabled(condition, cst.parse_expression(condition))
    # ---- enabled
    enabled = value("enabled")
    if enabled is not None:
        try:
            flag = literal_value(enabled)
        except ValueError:
            spec.add_enabled(_operand(enabled, code), enabled)
        else:
            if flag is False:
                spec.add_enabled("False", enabled)
    # ---- loss scale
    loss_scale = value("loss_scale")
    if loss_scale is not None:
        try:
            scale = literal_value(loss_scale)
        except ValueError:
            if _reread(loss_scale):
                # apex: None or "dynamic" scale dynamically, a number (or numeric string) is static.
                given = code(loss_scale).strip()
                dynamic = f"{given} in (None, {quote}dynamic{quote})"
                spec.keywords.append(("init_scale", f"65536.0 if {dynamic} else float({given})"))
                spec.keywords.append(("growth_interval", f"2000 if {dynamic} else {NO_GROWTH_INTERVAL}"))
                spec.run_time_scale = (
                    ("init_scale", "growth_interval"),
                    f"`loss_scale={given}` is only known at run time; the rewrite assumes a dynamic loss scale",
                )
                spec.notes.append(
                    f"`loss_scale={given}` is known only at run time: None or \"dynamic\" keep GradScaler's dynamic "
                    "scale, a number becomes `init_scale` with growth disabled as far as GradScaler allows (it still "
                    "skips a step and halves the scale on inf/NaN, where apex applied it)"
                )
            else:
                spec.unsafe.append(
                    f"`loss_scale={code(loss_scale).strip()}` is only known at run time; the rewrite assumes a dynamic loss scale"
                )
        else:
            if scale not in (None, "dynamic"):
                try:
                    number = float(scale)
                except (TypeError, ValueError):
                    spec.error = f"`loss_scale={scale!r}` is neither a number nor 'dynamic'"
                    return spec
                spec.keywords.append(("init_scale", _float_code(number)))
                spec.keywords.append(("growth_interval", NO_GROWTH_INTERVAL))
                spec.notes.append(
                    f"the static loss scale {_float_code(number)} becomes `init_scale` with growth disabled as far as "
                    "GradScaler allows (it still skips a step and halves the scale on inf/NaN, where apex applied it)"
                )
    if handle_api:
        return spec
    # ---- overrides of the opt level's properties
    fp16_levels = spec.levels & {"O1", "O2"}
    for name, good in (
        ("keep_batchnorm_fp32", (None, True, "True")),
        ("master_weights", (None, True)),
        ("patch_torch_functions", (None,) + ((True,) if fp16_levels == {"O1"} else (False,) if fp16_levels == {"O2"} else ())),
        ("cast_model_outputs", (None,)),
    ):
        node = value(name)
        if node is None:
            continue
        try:
            given = literal_value(node)
        except ValueError:
            spec.unsafe.append(f"`{name}={code(node).strip()}` is only known at run time")
            if name in _RUN_TIME_GUARDS:
                accepted, message = _RUN_TIME_GUARDS[name]
                test = _outside_test(node, accepted.format(q=quote), code)
                if test is not None:
                    spec.guards.append(Guard(test, message, spec.unsafe[-1]))
            continue
        if spec.levels == {"O1"} and name in ("keep_batchnorm_fp32", "master_weights") and given is not None:
            # apex's Properties.__setattr__ (frontend.py) raises RuntimeError for these under O1
            # (warn_or_err): such a call never ran, so there is nothing to keep.
            spec.error = (
                f"apex raises RuntimeError for `{name}={code(node).strip()}` with opt_level O1 (O1 keeps fp32 "
                "weights and runs batchnorm in fp32 itself): the original does not run; remove the argument first"
            )
            return spec
        if given not in good:
            spec.unsafe.append(f"`{name}={code(node).strip()}` differs from what autocast does (fp32 weights and batchnorm, fp16 matmuls)")
    cast_type = value("cast_model_type")
    if cast_type is not None:
        qnames = names.qualified_names(cast_type)
        allowed = {"torch.float16", "torch.half"} if spec.levels <= {"O2"} else set()
        if not (qnames & allowed or (isinstance(cast_type, cst.Name) and cast_type.value == "None")):
            spec.unsafe.append(f"`cast_model_type={code(cast_type).strip()}`: autocast keeps the model's weights in fp32")
    for name in ("min_loss_scale", "max_loss_scale"):
        node = value(name)
        if node is None:
            continue
        try:
            given = literal_value(node)
        except ValueError:
            given = object()
        if given is None or (name == "max_loss_scale" and isinstance(given, (int, float)) and given >= 2.0**16):
            continue  # above the initial 2**16, apex's cap only matters after long overflow-free runs
        if name == "min_loss_scale" and isinstance(given, (int, float)) and not isinstance(given, bool) and given <= 1.0:
            continue  # at or below 1, apex's floor only matters after 16 halvings: a run diverging, skipping every step
        if name == "max_loss_scale" and isinstance(given, (int, float)) and not any(k == "init_scale" for k, _ in spec.keywords):
            spec.keywords.append(("init_scale", _float_code(float(given))))
            spec.unsafe.append(f"apex started at `max_loss_scale={code(node).strip()}` and never grew past it; GradScaler starts there but cannot cap growth")
            continue
        spec.unsafe.append(f"GradScaler has no `{name}`; `{name}={code(node).strip()}` is dropped")
    if value("num_losses") is not None:
        spec.notes.append("one GradScaler serves every loss (`num_losses` and `loss_id` go)")
    return spec


# Run-time overrides whose other values torch.amp cannot honour: the values autocast matches
# (apex takes "True"/"False" strings for keep_batchnorm_fp32), and the error for the rest.
_RUN_TIME_GUARDS = {
    "keep_batchnorm_fp32": (
        "(None, True, {q}True{q})",
        "apex keep_batchnorm_fp32=False (fp16 batchnorm) has no torch.amp equivalent",
    ),
    "master_weights": (
        "(None, True)",
        "apex master_weights=False (no fp32 master weights) has no torch.amp equivalent",
    ),
}


def _outside_test(node: cst.BaseExpression, accepted: str, code) -> Optional[str]:
    """A test of `node`'s value lying outside `accepted` (a tuple display holding None), read
    again where `amp.initialize` was: `v not in accepted`, and for `v if test else None` (a
    keyword set only under a test, _keyword_dict.py) `test and v not in accepted`."""
    if _reread(node):
        return f"{code(node).strip()} not in {accepted}"
    if (
        isinstance(node, cst.IfExp) and isinstance(node.orelse, cst.Name) and node.orelse.value == "None"
        and _reread(node.body) and is_pure(node.test)
    ):
        test = code(node.test).strip()
        if isinstance(node.test, (cst.BooleanOperation, cst.IfExp)):
            test = f"({test})"
        return f"{test} and {code(node.body).strip()} not in {accepted}"
    return None


def _reread(node: cst.BaseExpression) -> bool:
    """A name, attribute or literal subscript (`args.loss_scale`, `cfg["scale"]`): the rewrite
    can read it again in a test."""
    return isinstance(node, (cst.Name, cst.Attribute, cst.Subscript)) and is_pure(node)


def _fp16_arm_test(node: cst.BaseExpression, code) -> Optional[Tuple[str, cst.BaseExpression, bool]]:
    """`"O1" if flag else "O0"` -> (`flag`, its node, taken); `"O0" if flag else "O2"` -> `not flag`."""
    if not isinstance(node, cst.IfExp):
        return None
    try:
        body, orelse = literal_value(node.body), literal_value(node.orelse)
    except ValueError:
        return None
    test = code(node.test).strip()
    if orelse == "O0" and body in ("O1", "O2"):
        return test, node.test, True
    if body == "O0" and orelse in ("O1", "O2"):
        atomic = isinstance(node.test, (cst.Name, cst.Attribute, cst.Subscript, cst.Call))
        return (f"not {test}" if atomic else f"not ({test})"), node.test, False
    return None


def _operand(node: cst.BaseExpression, code) -> str:
    text = code(node).strip()
    if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript, cst.Call, cst.SimpleString)):
        return text
    return f"({text})"


def _float_code(number: float) -> str:
    if number == int(number) and abs(number) < 1e16:
        return f"{int(number)}.0"
    return repr(number)
