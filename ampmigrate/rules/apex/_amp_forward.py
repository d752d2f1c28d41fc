"""Planning the autocast regions of the migration (see `_regions` for how one is found): which
names hold the model, what looks like a forward pass, what ends a training step, and the `with
torch.autocast(...)` statements that wrap each region.

A mixin of the planner (`_amp_migration._Planner`).
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampmigrate.analysis.autocast_banned import banned_calls
from ampmigrate.analysis.statements import body_of, indent_continuations, walk
from ampmigrate.engine.names import Scope
from ampmigrate.rules.apex._amp_common import Step, Unfixable
from ampmigrate.rules.apex._regions import Region, merge

# A method of the model that runs its forward pass by its name: `forward_loss`, `compute_loss`,
# `loss`, `forward_train`; not `parse_batch`, `zero_grad`, `eval`, `state_dict`.
_FORWARD_METHOD = re.compile(r"(?:^|_)(?:forward|loss)(?:$|_)")


class ForwardRegions:
    # ---- autocast regions
    def _plan_regions(self, regions: List[Tuple[Region, Step]]) -> None:
        merged, problem = merge([r for r, _ in regions])
        if problem:
            raise Unfixable(problem)
        self.planned_regions = merged  # read by `_check_half_inputs` (_caller_forward.py)
        for region in merged:
            if body_of(region.block) is None:
                raise Unfixable("the forward pass is on one line with its block header")
            self._emit_region(region)

    def _escape_banned_calls(self, region: Region) -> Dict[int, cst.BaseStatement]:
        """CUDA autocast raises on `binary_cross_entropy` whatever its inputs (see
        analysis/autocast_banned.py), where apex ran it on fp32 inputs (apex O1 refused fp16 ones,
        O2 gave the loss fp32 outputs). Each such call, a statement of its own (`loss =
        criterion(probs, target)`, `return F.binary_cross_entropy(p, y)`), runs as apex ran it:
        under `torch.autocast("cuda", enabled=False)` on `.float()` inputs. Those in the region's
        statements are returned ({id(line): its new form}) for `_emit_region`; those in the file's
        functions the region calls are rewritten in place. Any other shape refuses."""
        found = banned_calls(self.names, region.statements)
        if not found:
            return {}
        inside = {id(n) for statement in region.statements for n in walk(statement)}
        rewritten: Dict[int, cst.BaseStatement] = {}
        done: set = set()
        for top, call in found:
            line = self._own_statement(call)
            if line is None:
                raise Unfixable(
                    f"the autocast region would hold the binary cross-entropy at line {self._line(call)} "
                    f"(`{self.module.code_for_node(top.func).strip()}`), which CUDA autocast refuses to run, and it is not "
                    "a line of its own with the input and target first (`loss = criterion(probs, target)`) that could run "
                    "outside autocast: compute it from logits (`BCEWithLogitsLoss`), then migrate"
                )
            if id(line) in done:
                continue
            done.add(id(line))
            new = self._fp32_line(line, call)
            if id(line) in inside:
                rewritten[id(line)] = new
            elif self.builder.replaces(line) or any(self.builder.replaces(a) for a in self.names.ancestors(line)):
                raise Unfixable(f"the binary cross-entropy at line {self._line(call)} is in code this fix also rewrites")
            else:
                self.builder.replace(line, new)
            self._note(
                f"the binary cross-entropy at line {self._line(call)} runs with autocast disabled on `.float()` inputs, "
                "as apex ran it (CUDA autocast refuses it)"
            )
        return rewritten

    def _own_statement(self, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
        """The line holding `call` as its one statement's whole value (`x = call`, `return call`,
        `call`), with the loss's input and target as its first two arguments; None otherwise."""
        line = self.names.statement_of(call)
        if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
            return None
        small = line.body[0]
        if not (isinstance(small, (cst.Assign, cst.AnnAssign, cst.Return, cst.Expr)) and small.value is call):
            return None
        if isinstance(small, cst.Assign) and len(small.targets) != 1:
            return None
        first_two = call.args[:2]
        if len(first_two) != 2 or any(a.star or a.keyword is not None for a in first_two):
            return None
        if not isinstance(self.names.parent(line), cst.IndentedBlock):
            return None
        return line

    def _fp32_line(self, line: cst.SimpleStatementLine, call: cst.Call) -> cst.With:
        torch = self._torch(line)
        header = self.ctx.parse_statement(f"with {torch}.autocast({self.ctx.string('cuda').value}, enabled=False):\n    pass\n")
        args = list(call.args)
        for index in (0, 1):
            value = args[index].value
            code = self.module.code_for_node(value)
            if not isinstance(value, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)):
                code = f"({code})"
            args[index] = args[index].with_changes(value=self.ctx.parse_expression(f"{code}.float()"))
        small = line.body[0].with_changes(value=call.with_changes(args=args))
        block = self.names.parent(line)
        own = block.indent if isinstance(block, cst.IndentedBlock) else None
        inner = line.with_changes(body=[small], leading_lines=())
        return header.with_changes(body=header.body.with_changes(body=[inner], indent=own), leading_lines=line.leading_lines)

    def _emit_region(self, region: Region) -> None:
        """`with torch.autocast("cuda", dtype=torch.float16[, enabled=...]):` around the region."""
        fp32_lines = self._escape_banned_calls(region)
        first = region.statements[0]
        torch = self._torch(first)
        dtype = f"{torch}.float16"
        half_name = getattr(self, "half_feed_enabled", {}).get(id(first))  # _multi_init.py: no scaler in reach
        enabled = f"{half_name}.dtype == {dtype}" if half_name else self.access.autocast_enabled(first)
        args = f'{self.ctx.string("cuda").value}, dtype={dtype}' + (f", enabled={enabled}" if enabled else "")
        header = self.ctx.parse_statement(f"with {torch}.autocast({args}):\n    pass\n")
        assert isinstance(header, cst.With)
        # The region's own block's step, not the file's first (a file indented by 3 in its first
        # function and by 4 elsewhere, IAST's trainer.py).
        own = region.block.indent if isinstance(region.block, cst.IndentedBlock) else None
        indent = own if own is not None else self.module.default_indent
        statements = [with_lines_replaced(s, fp32_lines) for s in region.statements]
        inner = [indent_continuations(s, indent) for s in [statements[0].with_changes(leading_lines=()), *statements[1:]]]
        with_node = header.with_changes(
            body=header.body.with_changes(body=inner, indent=own), leading_lines=first.leading_lines
        )
        self.builder.replace(first, with_node)
        for statement in region.statements[1:]:
            self.builder.move_away(statement)

    def _instance_attribute_bindings(self, node: cst.Attribute) -> list:
        """`self.attr = ...` bindings of the method's class, or, in a method of a subclass in this
        file of the class the scaler lives on, that class's (the model it sets, `self.model`)."""
        found = self.names.self_attribute_bindings(node)
        if found or not isinstance(node.value, cst.Name):
            return found
        access = getattr(self, "access", None)
        if getattr(access, "mode", None) != "attribute" or not hasattr(access, "derives_from"):
            return found
        cls = self.names.method_class_scope(node.value)
        if cls is not None and cls is not access.cls and access.derives_from(cls, access.cls):
            return access.cls.self_attrs.get(node.attr.value, [])
        return found

    def _is_instance_attribute(self, node: cst.Attribute) -> bool:
        """`self.attr` is set on the instance: by the method's class (or the home class it derives
        from in this file), or by a base class of another file that the scaler's access names
        (the model a setup class handed to `amp.initialize`, _base_class.py)."""
        if self._instance_attribute_bindings(node):
            return True
        inherited = getattr(getattr(self, "access", None), "inherited_attributes", frozenset())
        return (
            node.attr.value in inherited and isinstance(node.value, cst.Name)
            and self.names.method_class_scope(node.value) is not None
        )

    def _model_test(self, function: Scope):
        """A statement runs the model: calls it (`model(x)`, `model.module(x)`, `model.forward(x)`)
        or passes it to a call (`loss = compute_loss(model, batch)`); other methods
        (`model.parse_batch`, `model.zero_grad`) are not the forward pass."""
        keys = self.access.model_keys(function)
        holders = getattr(self.access, "holders", {})
        holder = holders.get(function.parent) if function.parent is not None else None

        def is_model(node: cst.CSTNode) -> bool:
            if isinstance(node, cst.Subscript):  # one model of a list or dict of them: `models[0]`
                return is_model(node.value)
            if isinstance(node, cst.Name):
                return node.value in keys and node in self.names.loads
            if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
                return f"self.{node.attr.value}" in keys and self._is_instance_attribute(node)
            if holder is not None and isinstance(node, cst.Attribute) and isinstance(node.value, cst.Attribute):
                # `self.GAN.G` in a class holding the scaler's class as `self.GAN`
                inner = node.value
                return isinstance(inner.value, cst.Name) and inner.attr.value == holder and f"self.{node.attr.value}" in keys
            return False

        def is_forward_callee(func: cst.CSTNode) -> bool:
            if isinstance(func, cst.Attribute) and _FORWARD_METHOD.search(func.attr.value) and is_model(func.value):
                return True  # `model.forward_loss(batch)`, `model.compute_loss(x, y)` (flair, detectors)
            while isinstance(func, cst.Attribute) and func.attr.value in ("module", "forward") and not is_model(func):
                func = func.value
            return is_model(func)

        def uses_model(statement: cst.CSTNode) -> bool:
            if not keys:
                return False
            for node in walk(statement):
                if isinstance(node, cst.Call):
                    if is_forward_callee(node.func) or any(is_model(a.value) for a in node.args):
                        return True
            return False

        return uses_model

    def _forward_like_test(self, function: Scope):
        # the initialized models' own names (`model` for `self.model` or a local `model`): a held
        # container's attribute spelled so is the model (`mhop_loss(self._state.model, batch)`)
        model_names = {n.rpartition(".")[2] for n in getattr(self.access, "model_names", ())}
        runs_model = self._model_test(function)

        def held_model(node: cst.CSTNode) -> bool:
            return (
                isinstance(node, cst.Attribute)
                and node.attr.value in model_names
                and isinstance(node.value, cst.Attribute)
                and isinstance(node.value.value, cst.Name)
                and self._is_instance_attribute(node.value)
            )

        def looks_like_forward(statement: cst.CSTNode) -> bool:
            for node in walk(statement):
                if not isinstance(node, cst.Call):
                    continue
                if any(held_model(a.value) for a in node.args):
                    return True
                func = node.func
                while isinstance(func, cst.Subscript):  # `self.encoders[0](x)`: one of the held networks
                    func = func.value
                if isinstance(func, cst.Name):
                    bindings = self.names.bindings_of(func)
                    if bindings and all(b.scope is function and b.kind in ("param", "assign", "for", "with") for b in bindings):
                        return True
                    if bindings and all(b.kind == "def" and isinstance(b.node, cst.FunctionDef) for b in bindings) and any(
                        runs_model(b.node.body) for b in bindings
                    ):
                        return True  # `loss, acc = forward_step(batch)`: a function of this file that runs the model
                if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
                    if self._is_instance_attribute(func):
                        return True
                    if self._self_method_call(node, function) is not None:
                        return True  # `outputs = self.batch_outputs(batch)`: a method of the class
                if (
                    isinstance(func, cst.Attribute)
                    and isinstance(func.value, cst.Attribute)
                    and isinstance(func.value.value, cst.Name)
                    and self._is_instance_attribute(func.value)
                ):
                    return True  # `loss = self._state.model(inputs)`: a network a held container keeps
            return False

        return looks_like_forward

    def _is_barrier(self, statement: cst.CSTNode) -> bool:
        """A statement no forward region reaches across: a backward, a step, a scaled loss, and
        the apex setup itself (`model, opt = amp.initialize(model, opt)` passes the model: in a
        straight-line script the region would otherwise start there, where the scaler goes),
        and a call handing the scaler to an input gradient's helper of another file, which runs
        its own backward under its own autocast (_input_gradient_threading.py)."""
        gradient_calls = {id(call) for call, _, _ in getattr(self, "gradient_calls", ())}
        for node in walk(statement):
            if id(node) in gradient_calls:
                return True
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                if node.func.attr.value in ("backward", "step"):
                    return True
            if any(node is r.node for r in self.refs if r.api in ("scale_loss", "handle.scale_loss", "initialize", "init")):
                return True
        return False



def with_lines_replaced(statement: cst.BaseStatement, lines: Dict[int, cst.BaseStatement]) -> cst.BaseStatement:
    """`statement` with the lines of `lines` (by identity, at any depth) replaced."""
    if not lines:
        return statement
    if id(statement) in lines:
        return lines[id(statement)]

    class _Replace(cst.CSTTransformer):
        def leave_SimpleStatementLine(self, original_node, updated_node):
            return lines.get(id(original_node), updated_node)

    return statement.visit(_Replace())
