"""The optimizer side of one training step: `optimizer.step()` after `amp.scale_loss`, and
`scaler.unscale_(optimizer)` before whatever reads the gradients in between.

`scaler.step(opt)` + `scaler.update()` replace the step (one update after the last step of a
group in a block: the documented multi-optimizer pattern). A clip or `amp.master_params(opt)`
between the backward and the step needs unscaled gradients, as apex gave it: `unscale_` is
inserted before it, once per optimizer and step (never inside a loop or a branch that runs more
often than the step, which GradScaler refuses). Where `amp.scale_loss` runs under a condition
that chooses between it and a plain `loss.backward()`, and the scaler is not disabled by the same
condition, the new calls test it again.

A mixin of the planner (`_amp_migration._Planner`): it uses its context, builder and helpers.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampmigrate.analysis.statements import (
    Branch,
    body_of,
    branches,
    condition_code,
    containing_block,
    expression_key,
    following,
    loops_between,
    walk,
)
from ampmigrate.api import CLIP_GRAD
from ampmigrate.rules.apex._amp_common import Step, Unfixable, plain_optimizer
from ampmigrate.rules.apex._class_input_gradient import class_input_gradient
from ampmigrate.rules.apex._init_enclosure import reads_of, stores_in
from ampmigrate.rules.apex._optimizer_alias import optimizer_aliases
from ampmigrate.rules.apex._presence import Unsupported, simplify
from ampmigrate.rules.apex._regions import NoRegion, autocast_regions


class StepRewrites:
    # ---- optimizer.step()
    def _plan_step_calls(self, step: Step, all_steps: List[Step]) -> None:
        found: List[cst.Call] = []
        if self._micro_step(step, all_steps):  # _delayed_micro_steps.py: no step of its own
            step.steps = []
            return
        if class_input_gradient(self, step, all_steps):  # _class_input_gradient.py: steps nothing
            step.steps = []
            return
        for optimizer in step.optimizers:
            wanted = {expression_key(optimizer), *optimizer_aliases(self, optimizer)}
            calls: List[cst.Call] = []
            for statement in following(self.names, step.with_node, out_of_loops=True):
                calls = [c for c in self._step_calls(statement) if expression_key(c.func.value) in wanted]
                if calls:
                    break
            if not calls:
                calls = self._steps_in_optimizer_loop(step, optimizer)  # _optimizer_loops.py
            if not calls:
                calls = self._sibling_steps(step, optimizer)
            if not calls:
                calls = self._steps_after_helper_loop(step, optimizer)  # _loop_helper_steps.py
            if not calls:
                calls = self._caller_steps(step, optimizer)
            if not calls:
                raise Unfixable(self._wrapped_step_reason(step, optimizer) or (
                    f"no `{self.ctx.code(optimizer).strip()}.step()` follows `amp.scale_loss` at line "
                    f"{self._line(step.call)} in the same function; it must become `scaler.step(...)` + "
                    "`scaler.update()`"
                ))
            calls.extend(self._later_steps(step, wanted, calls))
            found.extend(c for c in calls if c not in found)
        step.steps = found

    def _wrapped_step_reason(self, step: Step, optimizer: cst.BaseExpression) -> Optional[str]:
        """`opt = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer` scaled, and
        `optimizer.step()` after it (ESPnet's Noam wrapper): apex patched the inner optimizer's step,
        which the wrapper calls; GradScaler must unscale and step one object, and which object that
        may be (a wrapper with `param_groups`?) is not known here."""
        if not isinstance(optimizer, cst.Name):
            return None
        bindings = self.names.bindings_of(optimizer)
        if len(bindings) != 1 or bindings[0].value is None:
            return None
        inside = {expression_key(n) for n in walk(bindings[0].value) if isinstance(n, (cst.Name, cst.Attribute))}
        for statement in following(self.names, step.with_node, out_of_loops=True):
            for call in self._step_calls(statement):
                if expression_key(call.func.value) in inside:
                    stepped = self.ctx.code(call.func.value).strip()
                    return (
                        f"`amp.scale_loss` at line {self._line(step.call)} scales with `{optimizer.value}` "
                        f"(`{self.ctx.code(bindings[0].value).strip()}`), but line {self._line(call)} steps "
                        f"`{stepped}`: apex skipped the step of the optimizer it was given, which `{stepped}` "
                        "may wrap; GradScaler must unscale and step one object, and which one is not known here"
                    )
        return None

    def _later_steps(self, step: Step, wanted: Set[str], calls: List[cst.Call]) -> List[cst.Call]:
        """Other `optimizer.step()` calls of the function after the scaled backward, as the
        flush of an accumulation loop's remainder after the loop: they step on gradients
        GradScaler has scaled, so they go through the scaler too. A gradient read (a clip)
        after the first step and before such a call would need its own `unscale_`: refused."""
        with_end = self._end(step.with_node)
        first = min((self._start(c) for c in calls), default=with_end)
        later: List[cst.Call] = []
        readers: List[cst.CSTNode] = []
        backwards: List[cst.Call] = []
        function = step.function.node
        for node in walk(function.body if isinstance(function, cst.FunctionDef) else function):
            if not isinstance(node, (cst.Call, cst.Attribute)) or self._start(node) <= with_end:
                continue
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "step":
                if node not in calls and expression_key(node.func.value) in wanted and not self._inactive(step, node):
                    later.append(node)
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward":
                backwards.append(node)
            elif self._reads_gradients(node) and self._start(node) > first:
                readers.append(node)
        # A step after another backward pass (a phase of plain training after this one) is that
        # pass's own step: it stays as it is.
        later = [c for c in later if not any(first < self._start(b) < self._start(c) for b in backwards)]
        for call in later:
            reader = next((r for r in readers if self._start(r) < self._start(call)), None)
            if reader is not None:
                raise Unfixable(
                    f"`{self.ctx.code(call).strip()}` at line {self._line(call)} steps again after the scaled backward "
                    f"at line {self._line(step.call)}, and line {self._line(reader)} reads the gradients before it: "
                    "GradScaler would need an `unscale_` there"
                )
        return later

    def _end(self, node: cst.CSTNode) -> Tuple[int, int]:
        position = self.ctx.position(node).end
        return position.line, position.column

    def _step_calls(self, statement: cst.CSTNode) -> List[cst.Call]:
        return [
            node
            for node in walk(statement)
            if isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "step"
            and (isinstance(node.func.value, (cst.Name, cst.Attribute)) or plain_optimizer(node.func.value))
        ]

    def _emit_steps(self, steps: List[Step]) -> None:
        calls: Dict[cst.Call, Step] = {}
        for step in steps:
            for call in step.steps:
                calls.setdefault(call, step)
        # `scaler.update()` once, after the last step of the group in each block.
        # A step in a loop over the optimizers (_optimizer_loops.py) counts as its loop here.
        by_block: Dict[cst.CSTNode, List[cst.Call]] = {}
        for call in calls:
            line = self._step_anchor(call)
            by_block.setdefault(containing_block(self.names, line), []).append(call)
        for block, block_calls in by_block.items():
            body = list(body_of(block))
            block_calls.sort(key=lambda c: body.index(self._step_anchor(c)))
            for call in block_calls:
                last = call is block_calls[-1]
                looped = self._in_optimizer_loop(call) is not None
                self._rewrite_step(call, calls[call], update=last and not looped)
                if last and looped:
                    self._emit_loop_update(call, calls[call])

    def _step_line(self, call: cst.Call) -> cst.SimpleStatementLine:
        expr = self.names.parent(call)
        line = self.names.parent(expr)
        if not (isinstance(expr, cst.Expr) and isinstance(line, cst.SimpleStatementLine)):
            raise Unfixable(f"`{self.ctx.code(call)}` at line {self._line(call)} is not a statement of its own")
        if call.args:
            raise Unfixable(f"`{self.ctx.code(call)}` passes a closure, which GradScaler does not support")
        if containing_block(self.names, line) is None:
            raise Unfixable(f"`{self.ctx.code(call)}` at line {self._line(call)} is on one line with its `if`")
        return line

    def _rewrite_step(self, call: cst.Call, step: Step, update: bool) -> None:
        line = self._step_line(call)
        scaler = self.access.expression(line)
        optimizer = self.ctx.code(call.func.value).strip()
        lines = [f"{scaler}.step({optimizer})"] + ([f"{scaler}.update()"] if update else [])
        guard = self._needed_guard(step, line)
        if len(line.body) > 1:
            # `optimizer.step(); optimizer.zero_grad()`: the new calls share the line too.
            if guard is not None:
                raise Unfixable(f"`{self.ctx.code(call)}` at line {self._line(call)} shares its line with other statements")
            expr = self.names.parent(call)
            calls = [cst.Expr(self.ctx.parse_expression(text)) for text in lines]
            calls[-1] = calls[-1].with_changes(semicolon=expr.semicolon)
            self.builder.replace(expr, cst.FlattenSentinel(calls))
            self.handled.add(expr)
            return
        if guard is None:
            new = [self.ctx.parse_statement(text + "\n") for text in lines]
        else:
            code = "\n".join(f"    {text}" for text in lines)
            new = [self.ctx.parse_statement(f"if {guard}:\n{code}\nelse:\n    {optimizer}.step()\n")]
        new[0] = new[0].with_changes(leading_lines=line.leading_lines)
        self.builder.replace(line, cst.FlattenSentinel(new))
        self.handled.add(line)

    def _needed_guard(self, step: Step, node: cst.CSTNode) -> Optional[str]:
        """The condition `node` must test again so that it only goes through the scaler where apex
        was active. Only the `if`s around `amp.scale_loss` that choose between it and a plain
        `loss.backward()` count (an `if` that skips the backward, say on a NaN loss, does not:
        `scaler.step` handles that), and not even those when they are all part of the scaler's
        `enabled` (a disabled scaler passes `step` through to the optimizer)."""
        here = {b.key for b in self._branches(node, self._stop_node(step, node))}
        missing = [b for b in step.branches if b.key not in here and self._chooses_backward(b)]
        # Through a carrier (_amp_carrier.py) the scaler may not exist where that test is false.
        carried = getattr(self.access, "carried", None)  # a ScalerAccess (other accesses carry nothing)
        enabled_keys = frozenset() if carried is not None and carried(node) is not None else self.access.enabled_keys
        arguments = getattr(self, "_helper_arguments", {}).get(step, getattr(self, "_caller_arguments", {}).get(step))
        if missing and arguments is not None and self._function_scope(node) is not step.function:
            missing = self._in_caller(step, missing, arguments)  # a backward helper's `if fp16:`, as its caller spells it
        if not missing or {b.key for b in missing} <= enabled_keys:
            return None
        code = condition_code(self.module, missing)
        if code is None:
            raise Unfixable(
                f"`amp.scale_loss` at line {self._line(step.call)} runs under a condition with side effects, "
                "which the optimizer step after it would have to test again"
            )
        return code

    def _in_caller(self, step: Step, missing: List[Branch], arguments: Dict[str, cst.BaseExpression]) -> List[Branch]:
        """A backward helper's tests, spelled in its caller: each of its parameters replaced by what
        the call passes for it (`if fp16:` in `loss_backwards(fp16, ...)` -> `if self.fp16:` where
        `partial(loss_backwards, self.fp16)` made the call); a test reading another local is refused."""
        replaced: List[Branch] = []
        for branch in missing:
            swaps: Dict[cst.CSTNode, cst.BaseExpression] = {}
            for name in walk(branch.test):
                if not (isinstance(name, cst.Name) and name in self.names.loads):
                    continue
                if name.value in arguments:
                    swaps[name] = arguments[name.value]
                elif any(b.scope is step.function for b in self.names.bindings_of(name)):
                    raise Unfixable(
                        f"`amp.scale_loss` in `{step.function.node.name.value}()` runs under `if "
                        f"{self.ctx.code(branch.test).strip()}`, which reads `{name.value}`, which its callers do not all pass alike "
                        "(the steps after the calls would have to test it again)"
                    )
            test = branch.test.visit(_Swap(swaps)) if swaps else branch.test
            replaced.append(Branch(test, branch.taken, branch.statement))
        return replaced

    def _chooses_backward(self, branch: Branch) -> bool:
        """The other arm of `branch`'s `if` runs a plain backward pass, and no scaled one: an `if`
        with `amp.scale_loss` in both arms (`if chunked: <scaled backward per chunk> else: <scaled
        backward>`, each with its fp32 path) chooses how, not whether, to scale."""
        statement = branch.statement
        other = statement.orelse if branch.taken else statement.body
        if other is None:
            return False
        scaled = {id(r.node) for r in self.refs if r.api in ("scale_loss", "handle.scale_loss")}
        nodes = list(walk(other))
        if any(id(n) in scaled for n in nodes):
            return False
        return any(
            isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "backward"
            for n in nodes
        )

    def _never_runs_under(self, node: cst.CSTNode) -> bool:
        """`node` lies in both arms of one test: `if opt.amp == 1: <scaled backward> else:
        l.backward(); if opt.amp == 1: clip(amp.master_params(optimizer))` (A2W-Segmental), where
        nothing in the outer arm writes what the test reads. It never runs."""
        found = branches(self.names, node, stop=self._function_scope(node).node)  # innermost last
        for position, inner in enumerate(found):
            for outer in found[:position]:
                if outer.key != (inner.key[0], not inner.taken):
                    continue
                arm = outer.statement.body if outer.taken else outer.statement.orelse
                statements = [arm] if isinstance(arm, cst.If) else body_of(arm.body if isinstance(arm, cst.Else) else arm) or ()
                reads = reads_of(outer.test)
                written = {w for statement in statements for w in stores_in(statement)}
                if any(r == w or r.startswith(w + ".") or w.startswith(r + ".") for r in reads for w in written):
                    continue
                # nor handed to a call that could change it (`reset(opt)`, `opt.update(...)`)
                roots = {r.split(".")[0] for r in reads}
                if not any(
                    isinstance(n, cst.Call) and any(
                        isinstance(part, cst.Name) and part.value in roots
                        for part in [*(a.value for a in n.args), n.func.value if isinstance(n.func, cst.Attribute) else None]
                    )
                    for statement in statements for n in walk(statement)
                ):
                    return True
        return False

    def _inactive(self, step: Step, node: cst.CSTNode) -> bool:
        """True when `node` is in the other branch of an `if` (same test) that `amp.scale_loss` is in:
        the fp32 path of `if fp16: <scaled backward> else: loss.backward()`."""
        here = {b.key for b in self._branches(node, self._stop_node(step, node))}
        return any((b.key[0], not b.taken) in here for b in step.branches if self._chooses_backward(b))

    # ---- a plain backward inside the window
    def _plain_backwards(self, steps: List[Step]) -> List[Tuple[cst.SimpleStatementLine, cst.Name, Step]]:
        """`x.backward()` between the scaled backward and the step (an adversarial or a
        regularization loss): apex had unscaled the gradients by then, so it added `x`'s at scale
        1. GradScaler keeps them scaled until the step, which would divide those by the loss
        scale; `_rewrite_plain_backwards` scales `x` too (unless an `unscale_` comes first). Returns
        each with its step."""
        scaled = [step.with_node for step in steps]
        found: List[Tuple[cst.SimpleStatementLine, cst.Name, Step]] = []
        for step in self._stepping(steps):
            step_lines = {self._step_line(c) for c in step.steps}
            for statement in self._window_statements(step):
                stop = any(any(n is line for n in walk(statement)) for line in step_lines)
                for node in walk(statement):
                    if not (
                        isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                        and node.func.attr.value == "backward"
                    ):
                        continue
                    if any(a is w for a in self.names.ancestors(node) for w in scaled):
                        continue  # another `amp.scale_loss` block (several losses, one step)
                    if (stop and not self._before_any(node, step_lines)) or self._inactive(step, node):
                        continue
                    refusal = (
                        f"`{self.ctx.code(node.func).strip()}()` at line {self._line(node)} adds gradients after "
                        f"the scaled backward at line {self._line(step.call)} and before the step: apex had "
                        "unscaled by then, GradScaler has not"
                    )
                    expr, line = self.names.parent(node), self.names.parent(self.names.parent(node))
                    if not (
                        isinstance(expr, cst.Expr) and isinstance(line, cst.SimpleStatementLine)
                        and len(line.body) == 1 and isinstance(node.func.value, cst.Name)
                        and containing_block(self.names, line) is not None
                    ):
                        raise Unfixable(f"{refusal}, and it is not a `loss.backward()` statement of its own to scale")
                    if not any(line is seen for seen, _, _ in found):
                        found.append((line, node.func.value, step))
                if stop:
                    break
        return found

    def _plain_backward_regions(self, plain) -> List[Tuple[object, Step]]:
        """The autocast regions of the forward passes of the plain backwards (apex O1 ran them in
        float16 too), returned for merging."""
        regions = []
        for line, loss, step in plain:
            function = self._function_scope(line)
            try:
                found = autocast_regions(
                    self.names, line, loss, self._model_test(function), self._forward_like_test(function), self._is_barrier
                )
            except NoRegion:
                found = []
            regions.extend((r, step) for r in found)
        return regions

    def _rewrite_plain_backwards(self, plain, points: List[cst.CSTNode]) -> None:
        """`x.backward()` -> `scaler.scale(x).backward()` while the gradients are still scaled.
        After an `unscale_` the fix put where apex had unscaled (a gradient reader in the window,
        an FGM/PGD attack's `backup_grad()`), on every path to it, the gradients are at scale 1
        as apex had them: `x` adds its own unscaled, as in apex, and the step does not unscale
        again. A backward that an `unscale_` precedes on some paths only has no such place."""
        unscaled = getattr(self, "_unscaled", [])
        for line, loss, step in plain:
            function = self._function_scope(line)
            before = [p for p in points if self._function_scope(p) is function and self._start(p) < self._start(line)]
            covered = {o for p, o in unscaled if p in before and self._dominates(p, line)}
            wanted = {self.ctx.code(o).strip() for o in step.optimizers}
            if before and wanted and wanted <= covered:
                self._note(
                    f"`{loss.value}.backward()` at line {self._line(line)} runs after `unscale_`, where apex had "
                    "unscaled the gradients too, so it stays unscaled"
                )
                continue
            if before:
                raise Unfixable(
                    f"`{loss.value}.backward()` at line {self._line(line)} adds gradients after they are unscaled "
                    f"at line {self._line(before[0])} on some paths only (or for some of the step's optimizers only), "
                    "and before the step"
                )
            if self._needed_guard(step, line) is not None:
                raise Unfixable(
                    f"`{self.ctx.code(line.body[0].value.func).strip()}()` at line {self._line(line)} adds gradients "
                    f"after the scaled backward at line {self._line(step.call)} and before the step: apex had unscaled "
                    "by then, GradScaler has not, and the scaler is not disabled where apex was off"
                )
            call = line.body[0].value
            scaler = self.access.expression(line)
            args = ", ".join(self.ctx.code(a).strip().rstrip(",") for a in call.args)
            new = self.ctx.parse_statement(f"{scaler}.scale({loss.value}).backward({args})\n")
            self.builder.replace(line, new.with_changes(leading_lines=line.leading_lines))
            self.handled.add(line)
            self._note(
                f"`{loss.value}.backward()` at line {self._line(line)} runs between the scaled backward and the "
                "step, so it is scaled too (apex had unscaled the gradients before it)"
            )

    # ---- unscale_ before gradient reads
    def _plan_unscale(self, steps: List[Step]) -> Set[cst.CSTNode]:
        """Puts `unscale_` before the gradient reads of each step's window; returns the reads
        (and `_unscale_points`, where it went)."""
        inserts: Dict[cst.CSTNode, List[Tuple[str, Step]]] = {}
        self._own_code_readers: Set[cst.CSTNode] = set()  # see _window_readers
        self._opaque_readers: Set[cst.CSTNode] = set()  # of those, calls into code this fix cannot read
        self._micro_step_clips: Dict[Step, List[cst.Call]] = {}  # see _accumulation_clip
        self._micro_step_norms: Dict[Step, List[cst.Call]] = {}  # gradient-norm helpers, ditto
        order: List[cst.CSTNode] = []
        master_refs = {r.call: r for r in self.refs if r.api == "master_params" and r.call is not None}
        covered_master: Set[cst.Call] = set()
        readers: Dict[cst.CSTNode, List[cst.CSTNode]] = {}
        for step in self._stepping(steps):
            step_lines = {self._step_line(c) for c in step.steps}
            for statement in self._window_statements(step):
                stop = any(any(n is line for n in walk(statement)) for line in step_lines)
                for reader, optimizers in self._gradient_reads(statement, step, master_refs):
                    if stop and not self._before_any(reader, step_lines):
                        continue
                    if reader in master_refs:
                        covered_master.add(reader)
                    elif reader in self._helper_masters:
                        covered_master.update(self._helper_masters[reader])
                        self._helper_calls_covered.add(reader)
                    elif self._inactive(step, reader):
                        continue
                    point = self._per_optimizer_point(reader, optimizers, step, master_refs)  # _optimizer_loops.py
                    if point is None:
                        point = self._insertion_point(reader, statement)
                    if reader in self._own_code_readers and not stop:
                        point = statement  # as early as apex unscaled: before the statement holding the call
                    if self._scaled_on_micro_steps(reader, point, step, master_refs):
                        continue  # a torch clip on every micro-step: threshold scaled (_accumulation_clip)
                    readers.setdefault(point, []).append(reader)
                    if point not in inserts:
                        inserts[point] = []
                        order.append(point)
                    for optimizer in optimizers:
                        if optimizer not in [o for o, _ in inserts[point]]:
                            inserts[point].append((optimizer, step))
                if stop:
                    break
        self._check_helpers_covered(covered_master)
        self._note_o2_model_clips(readers)
        # `amp.master_params` read in the `scale_loss` body, after the backward: apex had not unscaled
        # yet, and those statements keep running before any `unscale_` (AMP301 judges a clip there).
        in_bodies = {id(n) for step in steps for statement in (step.rest or ()) for n in walk(statement)}
        for call, ref in master_refs.items():
            if call in covered_master or id(call) in in_bodies:
                continue
            statement = self.names.statement_of(call)
            if self._never_runs_under(call):
                continue  # its own rewrite suffices: no gradient it reads is ever scaled
            if any(self._reads_gradients(n) for n in walk(statement)):
                raise Unfixable(
                    f"`amp.master_params` at line {self._line(call)} reads gradients outside the backward/step "
                    "window the fix can follow, where `scaler.unscale_` would have to run first"
                )
        self._plan_micro_step_clips(inserts)
        order = self._hoist_exclusive(order, inserts)
        self._drop_double_unscale(order, inserts, readers, master_refs)
        self._check_loop_unscales(inserts)
        done: List[Tuple[cst.CSTNode, str]] = []
        for point in order:
            for optimizer, step in inserts[point]:
                self._check_once_per_step(point, step)
                if any(o == optimizer and self._dominates(p, point) for p, o in done):
                    continue
                done.append((point, optimizer))
                self.builder.insert_before(point, self._scaler_call(step, point, optimizer, unscale=True))
        self._unscale_points = [point for point, _ in done]
        self._unscaled = done  # (point, optimizer as written): `_rewrite_plain_backwards` reads it
        return {reader for found in readers.values() for reader in found} | set(self._helper_masters) | {
            call for calls in (*self._micro_step_clips.values(), *self._micro_step_norms.values()) for call in calls
        }

    def _scaler_call(self, step: Step, point: cst.CSTNode, call: str, unscale: bool = False) -> cst.BaseStatement:
        """`scaler.<call>` (with `unscale`: `scaler.unscale_(<call>)`, a loop for a collection of
        optimizers) as a statement to put next to `point`, under the condition apex was active in
        where the scaler is not disabled by it (`_needed_guard`)."""
        scaler = self.access.expression(point)
        text = self._unscale_code(scaler, call) if unscale else f"{scaler}.{call}"
        guard = self._needed_guard(step, point)
        if guard is not None:
            text = f"if {guard}:\n" + "\n".join(f"    {line}" for line in text.split("\n"))
        return self.ctx.parse_statement(text + "\n")

    def _hoist_exclusive(self, order: List[cst.CSTNode], inserts) -> List[cst.CSTNode]:
        """`if clip: clip_(...) else: norm(...)`, both reading gradients: one `unscale_` before
        the `if` instead of one in each arm."""
        changed = True
        while changed:
            changed = False
            for point in order:
                arms = self._arm_of(point)
                if arms is None:
                    continue
                statement, arm = arms
                others = [p for p in order if p is not point and self._arm_of(p) == (statement, not arm)]
                same = [p for p in others if {o for o, _ in inserts[p]} == {o for o, _ in inserts[point]}]
                if not same:
                    continue
                inserts[statement] = inserts[point]
                order = [statement if p is point else p for p in order if p is not same[0]]
                changed = True
                break
        return order

    def _arm_of(self, point: cst.CSTNode) -> Optional[Tuple[cst.If, bool]]:
        """(the `if`, True for its body / False for its plain `else`) when `point` is the first
        statement of that arm."""
        block = containing_block(self.names, point)
        body = body_of(block) if block is not None else None
        if not body or body[0] is not point:
            return None
        owner = self.names.parent(block)
        if isinstance(owner, cst.If) and owner.body is block and isinstance(owner.orelse, cst.Else):
            return owner, True
        if isinstance(owner, cst.Else):
            statement = self.names.parent(owner)
            if isinstance(statement, cst.If) and statement.orelse is owner:
                return statement, False
        return None

    def _check_once_per_step(self, point: cst.CSTNode, step: Step) -> None:
        """`unscale_` may run once per optimizer step: not inside a loop the step is outside of."""
        function = self._stop_node(step, point)
        step_lines = [self._step_line(c) for c in step.steps]
        here = {b.key for b in self._branches(point, function)}
        # `if log: ...; opt.step() else: opt.step()`: a test whose both arms step is no condition.
        stepped = {b.key for line in step_lines for b in self._branches(line, function)}
        for line in step_lines:
            extra = [
                b for b in self._branches(line, function)
                if b.key not in here and b.key not in self.access.enabled_keys
                and (b.key[0], not b.key[1]) not in stepped
            ]
            if extra:
                raise Unfixable(
                    f"the gradients are read at line {self._line(point)} on every backward pass, but the optimizer "
                    f"steps only `if {self.ctx.code(extra[0].test).strip()}`; apex unscaled every pass, GradScaler "
                    "unscales once per step"
                )
        for loop in loops_between(self.names, point, function):
            if loop is self._loop_of_point(point):
                continue  # one optimizer of the group per iteration (_optimizer_loops.py)
            if not all(any(a is loop for a in self.names.ancestors(line)) for line in step_lines):
                raise Unfixable(
                    f"the gradients are read at line {self._line(point)} inside a loop that runs several times "
                    "per optimizer step (with apex each micro-batch was unscaled; GradScaler unscales once)"
                )

    def _gradient_reads(self, statement, step: Step, master_refs) -> List[Tuple[cst.CSTNode, List[str]]]:
        found = []
        for node in walk(statement):
            if not isinstance(node, cst.Call):
                continue
            if node in master_refs:
                args = node.args
                if len(args) != 1 or args[0].keyword is not None:
                    raise Unfixable(f"`amp.master_params` at line {self._line(node)} is not called with one optimizer")
                found.append((node, [self.ctx.code(args[0].value).strip()]))
            elif self.names.qualified_names(node.func) & CLIP_GRAD:
                if any(n in master_refs for n in walk(node)):
                    continue  # its master_params argument is the read
                found.append((node, [self.ctx.code(o).strip() for o in step.optimizers]))
            else:
                optimizers = self._helper_reads(node, step, master_refs)
                if optimizers:
                    found.append((node, optimizers))
                elif not self._around_a_read(node, master_refs) and (
                    self._reads_scaled_gradients(node) or self._hands_over_gradients(node, step)
                ):
                    # this file's code reading `.grad`, or code it cannot read given the model (_window_readers)
                    self._own_code_readers.add(node)
                    if self._own_callee(node) is None:
                        self._opaque_readers.add(node)
                    found.append((node, [self.ctx.code(o).strip() for o in step.optimizers]))
        return found

    def _note_o2_model_clips(self, readers: Dict[cst.CSTNode, List[cst.CSTNode]]) -> None:
        """Under O2 apex's backward leaves the gradients in the optimizer's fp32 master copies and
        clears the fp16 model's, so a torch clip of anything but `amp.master_params(...)` there
        clipped nothing (AMP_FACTS: clip the master params). The migrated step clips what it
        names: the numerics change wherever O2 may run, and the fix says so."""
        spec = getattr(self, "spec", None)
        if spec is None or "O2" not in spec.levels:
            return
        masters = self._master_calls()
        for found in readers.values():
            for reader in found:
                if reader in masters or any(isinstance(n, cst.Call) and n in masters for n in walk(reader)):
                    continue
                if self._o2_excluded(reader, spec.opt_level_code):
                    continue  # `if args.fp16 == "O2": clip(amp.master_params(opt)) else: clip(model.parameters())`
                clip = isinstance(reader, cst.Call) and bool(self.names.qualified_names(reader.func) & CLIP_GRAD)
                what = f"`{self.ctx.code(reader.func).strip()}(...)`" if isinstance(reader, cst.Call) else f"`{self.ctx.code(reader).strip()}`"
                message = (
                    f"under O2 apex kept the gradients in fp32 master copies and cleared the fp16 model's, so {what} "
                    f"at line {self._line(reader)}, which does not go through `amp.master_params(...)`, "
                    + ("clipped only parameters apex left in fp32 (batch norm), if any; after the migration it clips all it names"
                       if clip else "saw only the gradients apex left in fp32 (batch norm), if any; after the migration it sees all")
                )
                if message not in self.unsafe:
                    self.unsafe.append(message)

    def _o2_excluded(self, node: cst.CSTNode, opt_level: Optional[str]) -> bool:
        """`node` runs only where the run-time opt level is not O2: in the `else` of `if <it> ==
        "O2"`, or under `if <it> != "O2"` (the opt level spelled as `amp.initialize` got it)."""
        if opt_level is None:
            return False
        child = node
        for ancestor in self.names.ancestors(node):
            if isinstance(ancestor, cst.If) and isinstance(ancestor.test, cst.Comparison):
                test = ancestor.test
                if (
                    len(test.comparisons) == 1
                    and self.ctx.code(test.left).strip() == opt_level
                    and isinstance(test.comparisons[0].comparator, cst.SimpleString)
                    and test.comparisons[0].comparator.evaluated_value == "O2"
                ):
                    operator = test.comparisons[0].operator
                    if isinstance(operator, cst.Equal) and child is ancestor.orelse:
                        return True
                    if isinstance(operator, cst.NotEqual) and child is ancestor.body:
                        return True
            child = ancestor
        return False

    def _master_calls(self) -> Set[cst.Call]:
        return {r.call for r in self.refs if r.api == "master_params" and r.call is not None}

    def _around_a_read(self, call: cst.Call, master_refs) -> bool:
        """`f(amp.master_params(opt))`, `log(clip_grad_norm_(...))`: the inner read is the one planned."""
        return any(
            n is not call and (n in master_refs or (isinstance(n, cst.Call) and self.names.qualified_names(n.func) & CLIP_GRAD))
            for n in walk(call)
        )

    def _reads_gradients(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Attribute) and node.attr.value == "grad":
            return True
        return isinstance(node, cst.Call) and bool(self.names.qualified_names(node.func) & CLIP_GRAD)

    def _before_any(self, node: cst.CSTNode, lines) -> bool:
        position = self.ctx.position(node).start
        return any((position.line, position.column) < self._start(line) for line in lines)

    def _start(self, node):
        position = self.ctx.position(node).start
        return position.line, position.column

    def _insertion_point(self, reader: cst.CSTNode, top: cst.CSTNode) -> cst.CSTNode:
        loops = loops_between(self.names, reader, top)
        if isinstance(top, (cst.For, cst.While)):
            return top
        if loops:
            return loops[0]
        statement = self.names.statement_of(reader)
        if containing_block(self.names, statement) is None:
            statement = self.names.statement_of(self.names.parent(statement))
        return statement

    def _dominates(self, earlier: cst.CSTNode, later: cst.CSTNode) -> bool:
        """`earlier` always runs before `later`: it precedes `later` or one of its ancestors in a block."""
        block = containing_block(self.names, earlier)
        if block is None:
            return False
        body = list(body_of(block))
        index = body.index(earlier)
        node: Optional[cst.CSTNode] = later
        while node is not None:
            if node in body[index:] and node is not earlier:
                return True
            if node is earlier:
                return True
            node = self.names.parent(node)
        # In the body of `if amp is not None:` (now `if scaler.is_enabled():`): where the scaler is
        # enabled that body runs, and where it is not `unscale_` does nothing, so the `if` counts.
        owner = self.names.parent(block)
        if isinstance(owner, cst.If) and owner.body is block and self._tests_presence(owner.test):
            return self._dominates(owner, later)
        return False

    def _tests_presence(self, test: cst.BaseExpression) -> bool:
        presence = self.presence_refs
        if not presence or not any(n in presence for n in walk(test)):
            return False
        try:
            return simplify(test, presence) is True
        except Unsupported:
            return False


class _Swap(cst.CSTTransformer):
    """Replace given nodes (by identity) with other expressions."""

    def __init__(self, swaps: Dict[cst.CSTNode, cst.BaseExpression]) -> None:
        super().__init__()
        self.swaps = swaps

    def on_leave(self, original_node, updated_node):
        return self.swaps.get(original_node, updated_node)
