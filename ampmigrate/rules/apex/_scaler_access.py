"""Where the GradScaler lives and how each use spells it.

The scaler is created where `amp.initialize` was. Its uses are reached as a local (`scaler`), as
`self.scaler` when other methods of the initializing method's class use it, or as a new `scaler`
parameter of the module-level functions that the initializing function calls (directly, or
through other such functions), which every call then passes: the way people migrate by hand.
When `amp.initialize` ran under `if`s that its uses do not share, the scaler is created before
them with `enabled=<their condition>` (and the opt level's `!= "O0"`, and apex's `enabled=`): a
disabled GradScaler passes `step` through and makes `unscale_`/`update` no-ops, so the fp32 path
keeps working, and autocast is enabled exactly when the scaler is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.bool_flags import bool_names, is_bool
from ampmigrate.analysis.statements import Branch, condition_code, elif_chain, is_main_guard, is_pure, walk
from ampmigrate.engine.context import rebuild_args
from ampmigrate.engine.names import Binding, Scope
from ampmigrate.rules.apex._amp_carrier import CARRIED_NAME, carried_autocast_enabled, carrier_scopes
from ampmigrate.rules.apex._amp_common import Unfixable
from ampmigrate.rules.apex._helper_calls import HelperCall, helper_calls
from ampmigrate.rules.apex._init_enclosure import InitEnclosure, enclosures
from ampmigrate.rules.apex._scalerless_calls import scalerless_calls

if TYPE_CHECKING:
    from ampmigrate.rules.apex._amp_migration import _Planner

SCALER_NAMES = ("scaler", "grad_scaler", "amp_scaler")


class ScalerAccess:
    """Where the scaler lives and how each use site spells it (see the module docstring)."""

    carriers: dict = {}  # {function scope: carrier expression} (_amp_carrier.py); none in subclasses
    # The home class's subclasses in other files read the scaler (_base_class.py): an attribute
    # even though no other function of this file uses it.
    serves_other_files = False
    optional: dict = {}  # (see __init__); none in subclasses
    returned_to = None  # (see __init__); none in subclasses

    def __init__(self, planner: "_Planner", use_scopes: List[Scope]) -> None:
        self.p = planner
        self.names = planner.names
        self.home = planner.home
        self.mode = "local"
        self.threaded: List[Scope] = []
        # threaded functions some of whose calls never reach the scaler (_scalerless_calls.py):
        # {scope: those calls}; the parameter is then `scaler=None`
        self.optional: Dict[Scope, List[cst.Call]] = {}
        self.hoist_before: Optional[cst.CSTNode] = None
        # The one caller of the home function that gets the scaler as one more returned value
        # (`_return_to`): (its scope, the tuple it unpacks the call into, the home's returned tuples).
        self.returned_to: Optional[Tuple[Scope, cst.BaseExpression, List[cst.BaseExpression]]] = None
        self.detached_init: Optional[Scope] = None  # the class's `__init__` when the scaler lives apart
        # Functions reaching the scaler through the object that carried apex's module (_amp_carrier.py).
        self.carriers = carrier_scopes(planner) if planner.usage.carrier is not None else {}
        use_scopes = [s for s in use_scopes if s not in self.carriers]
        others = [s for s in dict.fromkeys(use_scopes) if s is not self.home]
        home_class = self.home.parent if self.home.kind == "function" and self.home.parent is not None and self.home.parent.kind == "class" else None
        # module-level backward helpers the class's methods call (_helper_calls.py): {scope: calls}
        self.helper_calls: Dict[Scope, List[HelperCall]] = {}
        # other classes of the file holding an instance of the home class in an attribute (a
        # trainer's `self.GAN = StyleGAN2(...)`): {class scope: attribute}; they spell the
        # scaler `self.GAN.scaler`
        self.holders: Dict[Scope, str] = {}
        # subclasses of the home class in this file whose methods use apex (_inherits_setup): they
        # read the scaler the inherited `__init__` made, as `self.<scaler>`
        self.subclasses: Dict[Scope, None] = {}
        if (others or self.serves_other_files) and home_class is not None:
            for scope in others:
                if scope.kind == "function" and (
                    scope.parent is home_class
                    or (scope.parent is not None and self._inherits_setup(scope.parent, home_class))
                ):
                    if _static_or_class_method(scope.node):
                        raise Unfixable(
                            f"`{scope.node.name.value}()` uses apex.amp in a static or class method, which has "
                            "no `self` to reach the scaler on"
                        )
                    if scope.parent is not home_class:
                        self.subclasses[scope.parent] = None
                    continue
                if scope.kind == "function" and scope.parent is not None and scope.parent.kind == "class":
                    if self._holder_attribute(scope.parent, home_class) is not None:
                        continue
                calls = helper_calls(self.names, scope)
                if not calls or any(not self._reaches_scaler(self.p._function_scope(c.call), home_class) for c in calls):
                    raise Unfixable("the scaler would be needed outside the class whose method calls `amp.initialize`")
                self.helper_calls[scope] = calls
                self.threaded.append(scope)
            if isinstance(self.home.node, cst.FunctionDef) and not _runs_on_instance(self.home.node):
                raise Unfixable(
                    f"`amp.initialize` runs in `{self.home.node.name.value}()`, a decorated method (a classmethod "
                    "or staticmethod builds no `self`): the scaler has no instance to live on"
                )
            self.mode = "attribute"
            self.cls = home_class
        elif others and self.home.kind == "function" and planner._detached_class(others) is not None:
            # `amp.initialize` in a builder function, the scaled backward in an optimizer wrapper's
            # methods: the scaler is the wrapper's attribute, created in its `__init__`.
            self.mode = "attribute"
            self.cls, self.detached_init = planner._detached_class(others)
        else:
            for scope in others:
                if self._nested_in(scope, self.home) or self.home.kind == "module":
                    self._closure_helper(scope)
                    continue
                if self._thread(scope, ()):
                    continue
                owner = self._closure_owner(scope)
                if owner is not None and owner is not self.home and self._thread(owner, ()):
                    continue  # ignite's `def update_fn(engine, batch)` inside a trainer factory: it captures the parameter
                why_not_returned = self._return_to(scope)
                if not why_not_returned:
                    continue
                name = getattr(scope.node, "name", None)
                raise Unfixable(
                    f"`{name.value if name is not None else '?'}()` uses apex.amp but is not only called (directly) "
                    "from the function that calls `amp.initialize` or from functions it calls, so the scaler "
                    "cannot be passed to it" + (f" ({why_not_returned})" if why_not_returned != "-" else "")
                )
        self.name = self._choose_name(use_scopes)
        # `amp.initialize` in a method other than `__init__`: `__init__` gets a disabled scaler
        # for the instances that never call it, and autocast follows the scaler.
        self.default_init = planner._default_init(self)
        self.in_place = False  # made where apex was initialized, not before its `if`s (`_plan_enabled`)
        self._plan_enabled(use_scopes)
        self.model_names = self._models()

    # ---- scopes
    def _reaches_scaler(self, scope: Scope, home_class: Scope) -> bool:
        """A method of the home class, or of a class holding an instance of it."""
        if scope.kind != "function" or scope.parent is None or scope.parent.kind != "class":
            return False
        return scope.parent is home_class or self._holder_attribute(scope.parent, home_class) is not None

    def _inherits_setup(self, cls: Scope, home_class: Scope) -> bool:
        """`cls` is a class of this file that derives from the home class through top-level
        classes of this file named as bases, and each class on that path either has no `__init__`
        or starts its `__init__` by running the base's, so its instances get the scaler the home
        class's `__init__` makes. Bases beside that path must be classes of this file without an
        `__init__`: one of another file, or with an `__init__` of its own, could keep the home
        class's from running (a mixin whose `__init__` does not call `super().__init__()`)."""
        seen: Set[int] = set()
        current = cls
        while current is not home_class:
            if current.kind != "class" or id(current) in seen or current.parent is not self.names.module_scope:
                return False
            seen.add(id(current))
            bases = [self._module_class(b) for b in current.node.bases]
            if any(b is None for b in bases):
                return False
            next_cls = next((b for b in bases if b is home_class or self.derives_from(b, home_class)), None)
            if next_cls is None:
                return False
            if any(b is not next_cls and _own_init(b.node) is not None for b in bases):
                return False
            init = _own_init(current.node)
            if init is not None and not _starts_with_base_init(init, current.node.name.value, next_cls.node.name.value):
                return False
            current = next_cls
        return True

    def derives_from(self, cls: Scope, base: Scope, depth: int = 0) -> bool:
        if cls is base:
            return True
        if depth > 8 or cls.kind != "class":
            return False
        return any(
            b is not None and self.derives_from(b, base, depth + 1) for b in (self._module_class(a) for a in cls.node.bases)
        )

    def _module_class(self, base: cst.Arg) -> Optional[Scope]:
        """The top-level class of this file a base names by its one module-level binding."""
        if base.keyword is not None or base.star or not isinstance(base.value, cst.Name):
            return None
        bindings = self.names.module_scope.bindings.get(base.value.value, [])
        if len(bindings) != 1 or bindings[0].kind != "class":
            return None
        return next((s for s in self.names.scopes if s.kind == "class" and s.node is bindings[0].node), None)

    def _holder_attribute(self, cls: Scope, home_class: Scope) -> Optional[str]:
        """The one attribute of `cls`'s instances that every method assigns only an instance of
        the home class (or None) to (`self.GAN = StyleGAN2(...)`), made by name in this file; None
        where there is no such attribute, or several."""
        if cls in self.holders:
            return self.holders[cls]
        found = []
        for attr, bindings in cls.self_attrs.items():
            if bindings and all(self._makes_home_instance(b.value, home_class) for b in bindings) and any(
                b.value is not None and not (isinstance(b.value, cst.Name) and b.value.value == "None") for b in bindings
            ):
                found.append(attr)
        if len(found) != 1:
            return None
        self.holders[cls] = found[0]
        return found[0]

    def _makes_home_instance(self, value: Optional[cst.BaseExpression], home_class: Scope) -> bool:
        if isinstance(value, cst.Name) and value.value == "None":
            return True
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
            return False
        return any(b.kind == "class" and b.node is home_class.node for b in self.names.bindings_of(value.func))

    def _closure_helper(self, scope: Scope) -> None:
        """A backward helper defined in the function that sets apex up and called there
        (awesome-align's `def backward_loss(loss, tot_loss)`: the loss is its parameter, the
        optimizer it scales with the enclosing function's): its calls are a helper's
        (_helper_calls.py), each passing the optimizer by the name the helper reads freely. It reads
        the scaler the same way, so nothing is threaded."""
        if scope.kind != "function" or scope.parent is None or scope.parent.kind != "function":
            return
        calls = helper_calls(self.names, scope)
        if not calls:
            return
        free = {
            name for name in _loaded_names(self.names, scope.node.body)
            if name not in scope.bindings and self.names.lookup(name, scope.parent)
        }
        for call in calls:
            caller = self.p._function_scope(call.call)
            if not (caller is scope.parent or self._nested_in(caller, scope.parent)):
                return
            if self.p._start(call.call) < self.p._start(self.p.init_line):
                raise Unfixable(
                    f"`{scope.node.name.value}()` scales a loss with apex's amp and is called at line "
                    f"{self.p._line(call.call)}, before `amp.initialize` (line {self.p._line(self.p.init_line)}) "
                    "where the scaler it would read is made"
                )
            for name in free:
                if self.names.lookup(name, caller) is not self.names.lookup(name, scope.parent):
                    return  # rebound on the way: the caller's is not the helper's
        for call in calls:
            for name in free:
                call.arguments.setdefault(name, cst.Name(name))
        self.helper_calls[scope] = calls

    def _nested_in(self, scope: Scope, outer: Scope) -> bool:
        current = scope.parent
        while current is not None:
            if current is outer:
                return True
            current = current.parent
        return False

    def _def_binding(self, scope: Scope) -> Optional[Binding]:
        node = scope.node
        if not isinstance(node, cst.FunctionDef) or scope.parent is None:
            return None
        for binding in scope.parent.bindings.get(node.name.value, []):
            if binding.node is node:
                return binding
        return None

    def _closure_owner(self, scope: Scope) -> Optional[Scope]:
        """The module-level function a nested function (a closure, maybe several levels deep)
        is defined in; None for a method or a module-level function."""
        current = scope
        while current.parent is not None and current.parent.kind == "function":
            current = current.parent
        if current is scope or current.parent is not self.names.module_scope:
            return None
        return current

    def _thread(self, scope: Scope, visiting: Tuple[Scope, ...]) -> bool:
        """Pass the scaler to `scope` as a parameter: it must be a module-level function called
        only directly, from the home function or from functions the scaler can be passed to."""
        if scope in self.threaded:
            return True
        if len(visiting) > 3 or scope in visiting:
            return False
        if self.home.kind != "function" or self.home.parent is not self.names.module_scope:
            return False
        if scope.kind != "function" or scope.parent is not self.names.module_scope:
            return False
        binding = self._def_binding(scope)
        if binding is None or len(scope.parent.bindings.get(binding.name, [])) != 1:
            return False
        refs = self.names.references(binding)
        if not refs:
            return False
        callers: List[Scope] = []
        for ref in refs:
            call = self.names.parent(ref)
            if not (isinstance(call, cst.Call) and call.func is ref):
                return False
            callers.append(self.p._function_scope(call))
        scalerless: List[cst.Call] = []
        for caller in dict.fromkeys(callers):
            if caller is self.home or self._nested_in(caller, self.home):
                continue
            if not self._thread(caller, (*visiting, scope)):
                calls = scalerless_calls(self.p, scope, caller)
                if calls is None:
                    return False
                scalerless.extend(calls)
        if scalerless:
            if len(scalerless) == len(callers):
                return False  # no call would pass the scaler
            self.optional = {**self.optional, scope: scalerless}
        self.threaded.append(scope)
        return True

    def _return_to(self, scope: Scope) -> str:
        """`scope` is the one caller of the home function, unpacking what it returns: D-NeRF's
        `create_nerf(args)` sets apex up and returns `render_kwargs_train, ..., optimizer`, and
        `train()` does `..., optimizer = create_nerf(args)` and then scales the loss. The home
        returns the scaler as one more value (every `return` a tuple of the same length, after
        `amp.initialize`), the caller unpacks it, as people migrate by hand. The caller's own uses
        must come after that statement; other files calling the home refuse (_threaded_importers.py).
        "" when it does; else why not, or "-" where `scope` is no such caller at all."""
        home = self.home
        if self.returned_to is not None or self.threaded or self.helper_calls:
            return "-"
        if home.kind != "function" or home.parent is not self.names.module_scope or not isinstance(home.node, cst.FunctionDef):
            return "-"
        if scope.kind != "function" or scope.parent is not self.names.module_scope:
            return "-"
        binding = self._def_binding(home)
        if binding is None or len(home.parent.bindings.get(binding.name, [])) != 1:
            return "-"
        refs = list(self.names.references(binding))
        name = home.node.name.value
        if not any(self.p._function_scope(r) is scope for r in refs):
            return "-"
        if len(refs) != 1:
            return f"nor returned to it: `{name}()` is used {len(refs)} times"
        call = self.names.parent(refs[0])
        if not (isinstance(call, cst.Call) and call.func is refs[0]):
            return f"nor returned to it: `{name}` is used otherwise than by a call"
        assign = self.names.parent(call)
        target = assign.targets[0].target if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None
        if (
            target is None or assign.value is not call or not isinstance(target, (cst.Tuple, cst.List))
            or any(isinstance(e, cst.StarredElement) for e in target.elements)
        ):
            return f"nor returned to it: what `{name}()` returns is not unpacked into names by one assignment"
        returns = [n for n in walk(home.node.body, into_scopes=False) if isinstance(n, cst.Return)]
        if any(isinstance(n, (cst.Yield, cst.Await)) for n in walk(home.node.body, into_scopes=False)):
            return f"nor returned to it: `{name}()` is a generator or coroutine"
        init_start = self.p._start(self.p.init_line)
        for node in returns:
            value = node.value
            if not (
                isinstance(value, cst.Tuple) and len(value.elements) == len(target.elements)
                and not any(isinstance(e, cst.StarredElement) for e in value.elements)
                and self.p._start(node) > init_start
            ):
                return (
                    f"nor returned to it: `{name}()` returns at line {self.p._line(node)} other than a tuple of the "
                    "values unpacked, after `amp.initialize`"
                )
        body = list(home.node.body.body) if isinstance(home.node.body, cst.IndentedBlock) else []
        if not returns or not body or not any(n is body[-1] for n in [*returns, *(self.names.parent(r) for r in returns)]):
            return f"nor returned to it: `{name}()` does not end with its `return`"
        statement = self.names.parent(assign)
        if self.names.parent(statement) is not scope.node.body:
            # under an `if`, a loop or a `try`: the other paths would leave the scaler unbound
            return f"nor returned to it: `{scope.node.name.value}()` calls `{name}()` inside a block of its own"
        if any(self.p._function_scope(r.node) is scope and self.p._start(r.node) <= self.p._start(statement) for r in self.p.refs):
            return f"nor returned to it: `{scope.node.name.value}()` uses apex.amp before it calls `{name}()`"
        self.returned_to = (scope, target, [n.value for n in returns])
        return ""

    def _returned_model_keys(self) -> Set[str]:
        """The names the caller unpacks the home's models into: the positions where every `return`
        gives a model, or a dict, list or tuple the home built around one (D-NeRF's
        `render_kwargs_train = {"network_fn": model, ...}`, later `render(..., **render_kwargs_train)`)."""
        _, target, values = self.returned_to
        models = set(self.model_names)

        def holds_model(value: cst.BaseExpression) -> bool:
            if isinstance(value, cst.Name) and value.value in models:
                return True
            if not isinstance(value, cst.Name):
                return False
            bindings = self.home.bindings.get(value.value, [])
            return bool(bindings) and all(
                b.kind == "assign" and isinstance(b.value, (cst.Dict, cst.List, cst.Tuple)) and any(
                    isinstance(n, cst.Name) and n.value in models for n in walk(b.value)
                )
                for b in bindings
            )

        keys: Set[str] = set()
        for position, element in enumerate(target.elements):
            if isinstance(element.value, cst.Name) and all(holds_model(v.elements[position].value) for v in values):
                keys.add(element.value.value)
        return keys

    def _choose_name(self, use_scopes: List[Scope]) -> str:
        if self.mode == "attribute":
            taken = set(self.cls.self_attrs) | set(self.cls.bindings) | {n for s in self.helper_calls for n in s.bindings}
            for sub in self.subclasses:
                taken |= set(sub.self_attrs) | set(sub.bindings)
            for candidate in SCALER_NAMES:
                if candidate not in taken:
                    return candidate
            raise Unfixable("every usual name for the scaler is taken on this class")
        scopes = {self.home, *use_scopes, *self.threaded}
        for candidate in SCALER_NAMES:
            if self.home.kind == "module" or self.threaded:
                clash = any(candidate in s.bindings for s in self.names.scopes)
            else:
                clash = any(candidate in s.bindings for s in scopes) or any(
                    candidate == n.value for n in self.names.loads
                )
            if not clash:
                return candidate
        raise Unfixable("every usual name for the scaler is taken here")

    # ---- spelling
    def _self_name(self, node: cst.CSTNode) -> str:
        scope = self.p._function_scope(node)
        func = scope.node
        if not isinstance(func, cst.FunctionDef) or not func.params.params:
            raise Unfixable("a method without `self` uses apex.amp")
        return func.params.params[0].name.value

    def carried(self, node: cst.CSTNode) -> Optional[str]:
        """The carrier expression where `node` is, if its function reaches the scaler through it."""
        return self.carriers.get(self.p._function_scope(node)) if self.carriers else None

    def expression(self, node: cst.CSTNode) -> str:
        carrier = self.carried(node)
        if carrier is not None:
            return f"{carrier}.{CARRIED_NAME}"
        if self.mode == "attribute":
            scope = self.p._function_scope(node)
            if scope in self.helper_calls:
                return self.name
            holder = self.holders.get(scope.parent) if scope.parent is not None else None
            if holder is not None:
                return f"{self._self_name(node)}.{holder}.{self.name}"
            return f"{self._self_name(node)}.{self.name}"
        return self.name

    def home_expression(self) -> str:
        if self.detached_init is not None:
            return f"{self.detached_init.node.params.params[0].name.value}.{self.name}"
        return self.expression(self.p.init_line)

    # ---- enabled
    def _enter_defining_ifs(self, conditions: List[Branch], use_scopes: List[Scope]) -> List[Branch]:
        """The scaler is made before the outermost `if` of `conditions`, so every test's names must
        be bound there. Where an outer `if`'s arm binds a name an inner test reads (`if __name__ ==
        "__main__":` holding a script's settings, then `if not IS_CHECK_RESULT:` around
        `amp.initialize`), the scaler is made inside that arm instead, its test no condition of the
        scaler: only when every use of the scaler lies in that arm too; else the fix refuses."""
        # The creation's keywords read names too (`init_scale=... float(args.loss_scale)`), and so
        # does its `enabled=` (`amp.initialize(..., enabled=enabled)`, `enabled` set in the arm).
        keyword_reads = set()
        codes = [code for _, code in getattr(self.p.spec, "keywords", ())]
        codes += [conjunct.code for conjunct in getattr(self.p.spec, "enabled", ())]
        for code in codes:
            try:
                keyword_reads |= {n.value for n in walk(cst.parse_expression(code)) if isinstance(n, cst.Name)}
            except cst.ParserSyntaxError:
                continue
        while conditions:
            outer = conditions[0]
            arm = outer.statement.body if outer.taken else outer.statement.orelse
            if (
                self.home.kind == "module" and outer.taken and is_main_guard(outer.statement)
                and self._only_run_in_arm(arm, conditions[1:], use_scopes)
            ):
                # a script's `if __name__ == "__main__":` whose functions using the scaler run only
                # from the arm: the scaler is made in it, not `enabled=__name__ == "__main__"` before it
                conditions = conditions[1:]
                continue
            inner_reads = {n.value for b in conditions[1:] for n in walk(b.test) if isinstance(n, cst.Name) and n in self.names.loads}
            # a name every binding of which (where the scaler is made) is in the arm: unbound there
            bound_inside = set()
            for name in inner_reads | keyword_reads:
                bindings = self.home.bindings.get(name, [])
                if arm is not None and bindings and all(self._within(b.node, arm) for b in bindings):
                    bound_inside.add(name)
            if not bound_inside:
                break
            uses = [r.node for r in self.p.refs] + [scope.node for scope in use_scopes if scope is not self.home]
            if arm is not None and not all(self._within(node, arm) for node in uses) and self._else_default_fits(outer):
                # NVIDIA retinanet-examples: `if with_apex: loss_scale = ...; amp.initialize(...,
                # loss_scale=loss_scale)`: made in that arm, with a disabled scaler in a new `else:`
                self.else_default = outer.statement
                conditions = conditions[1:]
                continue
            if arm is None or not (
                all(self._within(node, arm) for node in uses) or self._only_run_in_arm(arm, conditions[1:], use_scopes)
            ):
                reader = next((b for b in conditions[1:] if any(
                    isinstance(n, cst.Name) and n.value in bound_inside for n in walk(b.test))), None)
                what = f"`if {self.p.ctx.code(reader.test).strip()}`, whose" if reader is not None else "options whose"
                raise Unfixable(
                    f"`amp.initialize` runs under {what} `{sorted(bound_inside)[0]}` is set inside the `if` at line "
                    f"{self.p._line(outer.statement)}, and the scaler is used outside that `if`: there is no place to "
                    "make it that every use sees"
                )
            conditions = conditions[1:]
        return conditions

    else_default: Optional[cst.If] = None  # an `if` that gains `else: <scaler> = GradScaler(enabled=False)`

    def _else_default_fits(self, outer: Branch) -> bool:
        """The scaler can be made in the arm of `outer` with a disabled one in a new `else:` of it:
        a plain `if` (no `else`/`elif`) whose body holds `amp.initialize`, a statement of the
        function's own block; the scaler a local of that function (every use after the `if`), or
        an attribute made in `__init__` (ART's estimators: `if self._use_amp:` computing
        `enabled` before `amp.initialize`; every other method runs after `__init__`)."""
        statement = outer.statement
        if not outer.taken or statement.orelse is not None or isinstance(self.names.parent(statement), cst.If):
            return False
        if self.home.kind != "function" or self.threaded or self.detached_init is not None:
            return False
        if self.mode == "attribute":
            if self.home.node.name.value != "__init__" or self.default_init is not None:
                return False
        elif self.mode != "local":
            return False
        block = self.names.parent(statement)
        if not isinstance(block, cst.IndentedBlock) or block is not self.home.node.body:
            return False
        return True

    def _only_run_in_arm(self, arm: cst.CSTNode, rest: List[Branch], use_scopes: List[Scope]) -> bool:
        """A script's `if __name__ == "__main__":` binding `args` and setting apex up, its training
        in module-level functions reading the global scaler (cascade-stereo's `train_sample()`):
        the scaler made in the arm serves them when they run only from the arm, after it. The
        creation (before the first remaining `if`, else where `amp.initialize` was) must be a
        statement of the arm itself, and every reference to a function using the scaler a call
        from a later statement of the arm or from another such function."""
        if self.home.kind != "module" or not isinstance(arm, cst.IndentedBlock):
            return False
        creation = rest[0].statement if rest else self.p.init_line
        while isinstance(self.names.parent(creation), cst.If) and self.names.parent(creation).orelse is creation:
            creation = self.names.parent(creation)  # an `elif`: before its chain
        body = list(arm.body)
        if not any(statement is creation for statement in body):
            return False
        start = next(i for i, statement in enumerate(body) if statement is creation)
        later = body[start + 1:] if rest or creation is not self.p.init_line else body[start + 1:]
        for ref in self.p.refs:
            scope = self.p._function_scope(ref.node)
            if scope is self.home and not self._within(ref.node, arm):
                return False
        pending = [s for s in use_scopes if s is not self.home]
        seen: Set[int] = set()
        while pending:
            scope = pending.pop()
            if id(scope) in seen:
                continue
            seen.add(id(scope))
            binding = self._def_binding(scope)
            if binding is None or scope.parent is not self.names.module_scope or len(self.home.bindings.get(binding.name, [])) != 1:
                return False
            refs = self.names.references(binding)
            if not refs:
                return False
            for ref in refs:
                call = self.names.parent(ref)
                if not (isinstance(call, cst.Call) and call.func is ref):
                    return False
                caller = self.p._function_scope(call)
                if caller is self.home:
                    if not any(self._within(call, statement) for statement in later):
                        return False
                elif caller.kind == "function" and caller.parent is self.names.module_scope:
                    pending.append(caller)
                else:
                    return False
        return True

    def _within(self, node: cst.CSTNode, container: cst.CSTNode) -> bool:
        return node is container or any(a is container for a in self.names.ancestors(node))

    def _plan_enabled(self, use_scopes: List[Scope]) -> None:
        """Which `if`s around `amp.initialize` become the scaler's `enabled`, and where it goes."""
        spec = self.p.spec
        init_line = self.p.init_line
        stop = self.home.node
        if self.detached_init is not None:
            # Always enabled: every use in the wrapper runs under the test that chose apex, tested again.
            self.conditions, self.enabled_keys = [], frozenset()
            return
        found = enclosures(self, stop)  # _init_enclosure.py: loops and `try`s around the call
        path = self.p._branches(init_line, stop)
        if self.default_init is not None and self._changed_on_reentry(path):
            # `if self.fp16 and not self.amp_initialized:` in a method run every epoch: created
            # before the `if`, the scaler would be replaced by a disabled one on the second call. It
            # is made where apex was initialized instead; `__init__` holds the disabled default.
            self.in_place = True
            common = len(path)
        elif self.mode == "attribute" or self.threaded or any(s is not self.home for s in use_scopes):
            common = 0  # other functions may run whether or not the branch did
        else:
            common = len(path)
            for use in self._home_uses():
                use_path = self.p._branches(use, stop)
                shared = 0
                for a, b in zip(path, use_path):
                    if a.statement is b.statement and a.taken == b.taken:
                        shared += 1
                    else:
                        break
                common = min(common, shared)
        conditions = self._enter_defining_ifs(path[common:], use_scopes)
        # Two `amp.initialize` alternatives in the arms of one `if` (_multi_init.py): apex was set
        # up in either arm, so that `if` is no condition of the scaler; it is created before it.
        alternatives_if = getattr(self.p, "alternatives_if", None)
        chain = {id(link) for link in elif_chain(alternatives_if)} if alternatives_if is not None else set()
        forced_hoist = None
        if alternatives_if is not None and any(b.statement is alternatives_if for b in conditions):
            forced_hoist = conditions[0].statement  # before that `if` (or an outer one), not in its arm
            conditions = [b for b in conditions if id(b.statement) not in chain]
        self.conditions: List[Tuple[str, Tuple[str, bool]]] = []
        for branch in conditions:
            code = condition_code(self.p.module, [branch])
            if code is None:
                raise Unfixable(
                    f"`amp.initialize` runs under `if {self.p.ctx.code(branch.test).strip()}`, which has side effects, "
                    "so the scaler cannot be created before it"
                )
            self.conditions.append((code, branch.key))
        if conditions or forced_hoist is not None:
            self.hoist_before = forced_hoist if forced_hoist is not None else conditions[0].statement
            while isinstance(self.names.parent(self.hoist_before), cst.If):  # an `elif`
                self.hoist_before = self.names.parent(self.hoist_before)
        self.enclosure = InitEnclosure(self, found, conditions) if found else None
        for conjunct in spec.enabled:
            if conditions and conjunct.code != "False":
                node = cst.parse_expression(conjunct.code)
                if not is_pure(node):
                    raise Unfixable("the `enabled` argument of `amp.initialize` has side effects")
            self.conditions.append((conjunct.code, conjunct.key))
        keys = []
        for _, key in self.conditions:
            if key not in keys:
                keys.append(key)
        self.enabled_keys = frozenset(keys)

    def _changed_on_reentry(self, path) -> bool:
        """An `if` around `amp.initialize` reads an attribute of the instance that some method other
        than `__init__` sets (a flag the method flips, state a later call sees changed)."""
        self_name = self._self_name(self.p.init_line)
        for branch in path:
            for node in walk(branch.test):
                if not (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == self_name):
                    continue
                for binding in self.cls.self_attrs.get(node.attr.value, []):
                    method = binding.scope.node  # the class body's `args: Args` is set once, not on a call
                    if isinstance(method, cst.FunctionDef) and method.name.value != "__init__":
                        return True
        return False

    def _home_uses(self) -> List[cst.CSTNode]:
        uses: List[cst.CSTNode] = []
        for ref in self.p.refs:
            if ref.api in ("initialize", "init", "pass", "carry") or ref.api is None:
                continue
            if self.p._function_scope(ref.node) is self.home:
                uses.append(ref.node)
        return uses

    def creation_enabled(self) -> Optional[str]:
        codes: List[str] = []
        seen = set()
        for code, key in self.conditions:
            if key in seen:
                continue
            seen.add(key)
            codes.append(code)
        ctx = self.p.ctx
        codes = _as_bools(codes, ctx.shared("apex.bool_names", lambda: bool_names(ctx.text)))
        if len(codes) > 1:
            codes = [f"({c})" if _binds_looser_than_and(c) else c for c in codes]
        return " and ".join(codes) if codes else None

    def autocast_enabled(self, at: cst.CSTNode) -> Optional[str]:
        """autocast is on exactly when apex was: when the scaler is enabled."""
        if self.else_default is not None:
            return f"{self.expression(at)}.is_enabled()"  # the `if` that set apex up is no condition of it
        if self.carried(at) is not None:
            return carried_autocast_enabled(self.p, at)  # under the test that chose apex there
        if self.default_init is not None and (self.in_place or self.p._function_scope(at) is not self.home):
            return f"{self.expression(at)}.is_enabled()"
        scope = self.p._function_scope(at)
        if scope in self.optional and not self.conditions:
            # a call without the scaler ran no apex here (fp32), as a disabled scaler would
            return f"{self.expression(at)} is not None and {self.expression(at)}.is_enabled()"
        if not self.conditions:
            return None
        here = {b.key for b in self.p._branches(at, scope.node)}
        if self.enabled_keys <= here:
            return None
        if scope is self.home and self.mode == "local" and all(is_pure(cst.parse_expression(c)) for c, _ in self.conditions):
            return self.creation_enabled()
        if scope in self.optional:  # `scaler=None` from the calls that never scale a loss
            return f"{self.expression(at)} is not None and {self.expression(at)}.is_enabled()"
        return f"{self.expression(at)}.is_enabled()"

    # ---- models (for the autocast region)
    def _models(self) -> List[str]:
        spec = self.p.spec
        found: List[str] = []
        if self.detached_init is not None:
            return found  # the builder's locals mean nothing in the wrapper

        def add(node: Optional[cst.CSTNode]) -> None:
            if node is None:
                return
            if isinstance(node, (cst.List, cst.Tuple)):
                for element in node.elements:
                    add(element.value)
            elif isinstance(node, cst.Name):
                found.append(node.value)
            elif isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
                found.append(f"self.{node.attr.value}")
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                add(node.func.value)  # amp.initialize(model.cuda(), ...)
            elif isinstance(node, cst.ListComp) and isinstance(node.elt, cst.Subscript):
                add(node.elt.value)  # amp.initialize([self.modules[k] for k in names], ...): the collection

        add(spec.models)
        for models in (*getattr(self.p, "sibling_models", ()), *getattr(self.p, "alternative_models", ())):
            add(models)  # other `amp.initialize` calls the scaler serves
        small = self.p.init_line.body[0]
        if isinstance(small, cst.Assign):
            target = small.targets[0].target
            if isinstance(target, (cst.Tuple, cst.List)) and target.elements:
                add(target.elements[0].value)
            elif spec.optimizers is None:
                add(target)
        found.extend(self._model_attributes(found))
        return found

    def _model_attributes(self, models: List[str]) -> List[str]:
        """`self.biencoder = model` in the method that sets apex up (DPR's trainer): the
        attribute holds the same module, which the other methods run."""
        home = self.p.home
        if home.kind != "function" or home.parent is None or home.parent.kind != "class":
            return []
        local = {m for m in models if "." not in m}
        found: List[str] = []
        for node in walk(home.node):
            if not (isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Name)):
                continue
            target = node.targets[0].target
            if (
                node.value.value in local
                and isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self"
                and self.names.scope_of(node) is home
            ):
                found.append(f"self.{target.attr.value}")
        return found

    def model_keys(self, function: Scope, depth: int = 0) -> Set[str]:
        """Names (or `self.x`) that hold the model in `function`: the initialized models at home,
        and in a function the scaler is passed to, the parameters its callers pass them as."""
        if function is self.home or self._nested_in(function, self.home) or self.home.kind == "module":
            return set(self.model_names)
        if self.returned_to is not None and function is self.returned_to[0]:
            return self._returned_model_keys()
        if self.mode == "attribute":
            return {n for n in self.model_names if n.startswith("self.")}
        keys: Set[str] = set()
        owner = self._closure_owner(function)
        if owner is not None and owner in self.threaded and depth < 4:
            # a closure sees its owner's names, unless a scope in between binds them anew
            shadowed = set()
            current = function
            while current is not owner:
                shadowed |= set(current.bindings)
                current = current.parent
            return {k for k in self.model_keys(owner, depth + 1) if k not in shadowed}
        if function in self.threaded and depth < 4:
            binding = self._def_binding(function)
            params = function.node.params
            positional = [p.name.value for p in (*params.posonly_params, *params.params)]
            for ref in self.names.references(binding):
                call = self.names.parent(ref)
                caller_keys = self.model_keys(self.p._function_scope(call), depth + 1)
                position = 0
                for arg in call.args:
                    if arg.star:
                        break
                    if arg.keyword is not None:
                        name = arg.keyword.value
                    else:
                        name = positional[position] if position < len(positional) else None
                        position += 1
                    value = arg.value
                    if name and isinstance(value, cst.Name) and value.value in caller_keys:
                        keys.add(name)
        return keys

    # ---- edits for threading
    def emit(self) -> None:
        builder = self.p.builder
        slots = self.p.usage.slots
        if self.returned_to is not None:
            scope, target, values = self.returned_to
            for node in [*values, target]:
                builder.replace(node, lambda updated, name=self.name: _with_element(updated, name))
            home = self.home.node.name.value
            self.p._note(f"`{home}()` returns the scaler as one more value, which `{scope.node.name.value}()` unpacks")
        for scope in self.threaded:
            func = scope.node
            if func in slots:
                self._reuse_slot(func, slots[func])
                continue
            optional = self.optional.get(scope, [])
            builder.replace(func.params, add_parameter(func.params, self.name, optional=bool(optional)))
            if scope in self.helper_calls:
                self._pass_to_helper(self.helper_calls[scope])
                continue
            binding = self._def_binding(scope)
            for ref in self.names.references(binding):
                call = self.names.parent(ref)
                if call in optional:
                    continue
                arg = cst.Arg(
                    cst.Name(self.name),
                    keyword=cst.Name(self.name),
                    equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
                )
                builder.replace(call, rebuild_args(call, [*call.args, arg]))
                self.p.handled.add(call)
        added = [s for s in self.threaded if s.node not in slots]
        if added:
            self.p._note(
                "the scaler is passed to "
                + ", ".join(f"`{s.node.name.value}()`" for s in added)
                + f" as a new `{self.name}` argument"
            )
        for scope, calls in self.optional.items():
            lines = ", ".join(str(self.p._line(c)) for c in calls)
            fp32 = " (their forward pass now runs in fp32 where apex ran it in fp16)" if self.conditions else ""
            self.p._note(
                f"the calls of `{scope.node.name.value}()` at line {lines} never reach its scaled backward and "
                f"pass no scaler{fp32}"
            )
        reused = [s for s in self.threaded if s.node in slots]
        if reused:
            self.p._note(
                "the scaler is passed where apex's amp was ("
                + ", ".join(f"`{s.node.name.value}({slots[s.node].name.value})`" for s in reused)
                + f", renamed `{self.name}`)"
            )

    def _pass_to_helper(self, calls: List[HelperCall]) -> None:
        """`partial(helper, ...)`, or the helper's call, also passes `scaler=self.scaler`."""
        done: Set[int] = set()
        for helper_call in calls:
            call = helper_call.partial if helper_call.partial is not None else helper_call.call
            if id(call) in done:
                continue
            done.add(id(call))
            arg = cst.Arg(
                self.p.ctx.parse_expression(self.expression(call)),
                keyword=cst.Name(self.name),
                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
            )
            self.p.builder.replace(call, rebuild_args(call, [*call.args, arg]))
            self.p.handled.add(call)

    def _reuse_slot(self, func: cst.FunctionDef, param: cst.Param) -> None:
        """The function already receives apex's amp module in `param`: the scaler takes its place
        (the parameter renamed, each call passing the scaler). Every use of the parameter in the
        function is an apex use the migration rewrites."""
        builder = self.p.builder
        builder.replace(param.name, cst.Name(self.name))
        for ref in self.p.refs:
            if ref.api != "pass" or ref.slot is not param:
                continue
            builder.replace(ref.node, cst.Name(self.name))
            arg = self.names.parent(ref.node)
            if arg.keyword is not None:
                builder.replace(arg.keyword, cst.Name(self.name))
            self.p.handled.add(ref.node)


def _own_init(cls: cst.ClassDef) -> Optional[cst.FunctionDef]:
    """The `__init__` a class body defines (the last one: it is the one that counts)."""
    inits = [s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"]
    return inits[-1] if inits else None


def _starts_with_base_init(init: cst.FunctionDef, cls_name: str, base_name: str) -> bool:
    """The first statement of `init` (after a docstring) runs the base's `__init__`:
    `super().__init__(...)`, `super(Cls, self).__init__(...)` or `Base.__init__(self, ...)`."""
    body = [s for s in init.body.body] if isinstance(init.body, cst.IndentedBlock) else []
    if body and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Expr) and isinstance(body[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
        body = body[1:]
    if not body or not isinstance(body[0], cst.SimpleStatementLine) or len(body[0].body) != 1:
        return False
    expr = body[0].body[0]
    call = expr.value if isinstance(expr, cst.Expr) else None
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "__init__"):
        return False
    owner = call.func.value
    if isinstance(owner, cst.Call) and isinstance(owner.func, cst.Name) and owner.func.value == "super":
        args = owner.args
        return not args or (
            len(args) == 2 and isinstance(args[0].value, cst.Name) and args[0].value.value == cls_name
        )
    return isinstance(owner, cst.Name) and owner.value == base_name


def _static_or_class_method(func: cst.CSTNode) -> bool:
    return isinstance(func, cst.FunctionDef) and any(
        isinstance(d.decorator, cst.Name) and d.decorator.value in ("staticmethod", "classmethod") for d in func.decorators
    )


def _runs_on_instance(func: cst.FunctionDef) -> bool:
    """`func` runs with the instance as its first argument: a plain method, or a property's
    setter (inferno's `@mixed_precision.setter`, `trainer.mixed_precision = True`)."""
    return all(
        isinstance(d.decorator, cst.Attribute) and d.decorator.attr.value == "setter" for d in func.decorators
    )


def add_parameter(params: cst.Parameters, name: str, optional: bool = False) -> cst.Parameters:
    """`params` with a parameter `name` added last (keyword-only when a default or `*` precedes);
    `optional`: `name=None`."""
    new_param = cst.Param(cst.Name(name))
    if optional:
        equal = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
        new_param = new_param.with_changes(default=cst.Name("None"), equal=equal)
    simple = (
        not any(p.default is not None for p in params.params)
        and isinstance(params.star_arg, cst.MaybeSentinel)
        and not params.kwonly_params
        and params.star_kwarg is None
    )
    if simple:
        existing = list(params.params)
        if not existing:
            return params.with_changes(params=[new_param])
        last = existing[-1]
        if isinstance(last.comma, cst.Comma):
            separator = existing[-2].comma if len(existing) > 1 and isinstance(existing[-2].comma, cst.Comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            existing[-1] = last.with_changes(comma=separator)
            new_param = new_param.with_changes(comma=last.comma)
        else:
            existing[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return params.with_changes(params=existing + [new_param])
    kwonly = list(params.kwonly_params)
    star_arg = params.star_arg
    trailing = _trailing_comma_lines(params)
    if trailing is not None and params.star_kwarg is None:
        # One parameter a line, a comma after the last (`    non_blocking=True,\n):`): so are `*` and the new one.
        separator, closing = trailing
        if kwonly:
            kwonly[-1] = kwonly[-1].with_changes(comma=separator)
        elif isinstance(star_arg, cst.MaybeSentinel):
            before = list(params.params)
            before[-1] = before[-1].with_changes(comma=separator)
            params = params.with_changes(params=before)
            star_arg = cst.ParamStar(comma=separator)
        else:
            star_arg = star_arg.with_changes(comma=separator)
        return params.with_changes(star_arg=star_arg, kwonly_params=kwonly + [new_param.with_changes(comma=closing)])
    if isinstance(star_arg, cst.MaybeSentinel):
        star_arg = cst.ParamStar(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        # the parameter before `*` needs a comma
        before = list(params.params)
        if before and (
            not isinstance(before[-1].comma, cst.Comma)
            or (isinstance(before[-1].comma.whitespace_after, cst.SimpleWhitespace) and not before[-1].comma.whitespace_after.value)
        ):  # none, or a trailing one before `)`: `scheduler=None,)` -> `scheduler=None, *, scaler=None)`
            before[-1] = before[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        params = params.with_changes(params=before)
    elif isinstance(star_arg, cst.Param) and not isinstance(star_arg.comma, cst.Comma):
        star_arg = star_arg.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    if kwonly and not isinstance(kwonly[-1].comma, cst.Comma):
        kwonly[-1] = kwonly[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    if params.star_kwarg is not None:
        new_param = new_param.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return params.with_changes(star_arg=star_arg, kwonly_params=kwonly + [new_param])


def _trailing_comma_lines(params: cst.Parameters):
    """(the comma to put between two parameters, the comma after the last) when the last
    parameter has a comma and the closing parenthesis is on a line of its own; None otherwise."""
    items = [*params.params, *([params.star_arg] if isinstance(params.star_arg, (cst.Param, cst.ParamStar)) else []), *params.kwonly_params]
    if not items or not isinstance(items[-1].comma, cst.Comma):
        return None
    closing = items[-1].comma
    if not isinstance(closing.whitespace_after, cst.ParenthesizedWhitespace):
        return None
    between = items[-2].comma if len(items) > 1 and isinstance(items[-2].comma, cst.Comma) else None
    return between or cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")), closing


def _loaded_names(names, node: cst.CSTNode) -> Set[str]:
    return {n.value for n in walk(node) if isinstance(n, cst.Name) and n in names.loads}


def _binds_looser_than_and(code: str) -> bool:
    """`a or b`, `x if c else y`, `lambda: ...` need parentheses inside `... and ...`."""
    expression = cst.parse_expression(code)
    if expression.lpar:
        return False
    if isinstance(expression, cst.BooleanOperation):
        return isinstance(expression.operator, cst.Or)
    return isinstance(expression, (cst.IfExp, cst.Lambda, cst.NamedExpr))


def _as_bools(codes: List[str], names: FrozenSet[str]) -> List[str]:
    """Each conjunct of `enabled=` as a bool (analysis/bool_flags.py: `torch.autocast` rejects
    anything else, and the scaler's `is_enabled()` hands on what it was given): `bool(args.amp)`
    where the file does not show `args.amp` to be one. A truth test of a value another conjunct
    compares with strings is wrapped whatever the evidence (`args.fp16 and args.fp16 != "O0"`,
    HF's transfer-learning-conv-ai, where `--fp16` is an opt level string, "" for fp32)."""
    compared = set()
    parsed: List[Optional[cst.BaseExpression]] = []
    for code in codes:
        try:
            node = cst.parse_expression(code)
        except cst.ParserSyntaxError:
            node = None
        parsed.append(node)
        if isinstance(node, cst.Comparison) and all(
            isinstance(c.comparator, cst.SimpleString)
            or (isinstance(c.comparator, (cst.Tuple, cst.List, cst.Set)) and all(isinstance(e.value, cst.SimpleString) for e in c.comparator.elements))
            for c in node.comparisons
        ):
            compared.add(cst.Module([]).code_for_node(node.left).strip())
    result = []
    for code, node in zip(codes, parsed):
        if node is None or (is_bool(node, names) and code not in compared):
            result.append(code)
        elif node.lpar:
            result.append(f"bool{code}")
        else:
            result.append(f"bool({code})")
    return result


def _with_element(node: cst.BaseExpression, name: str) -> cst.BaseExpression:
    """`a, b` (a tuple or list, as written) with `name` appended: `a, b, name`."""
    elements = list(node.elements)
    last = elements[-1]
    if isinstance(last.comma, cst.MaybeSentinel):
        elements[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return node.with_changes(elements=[*elements, cst.Element(cst.Name(name))])
