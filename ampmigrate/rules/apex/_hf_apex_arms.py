"""The apex arms of a Hugging Face `Trainer` subclass (issue 12: apex set up by a library).

Code written against transformers 4.x overrides `Trainer.training_step` (HF's wav2vec2
`run_common_voice.py` `CTCTrainer` and its many copies) or copies `Trainer.train`, keeping the
library's three backends:

    if self.use_amp:
        self.scaler.scale(loss).backward()
    elif self.use_apex:
        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()
    else:
        loss.backward()

`amp.initialize` is not in the project: transformers runs it when `half_precision_backend="apex"`
(`--fp16_backend apex`) sets `self.use_apex`. That backend needs apex.amp, removed from apex in May
2025 (PR #1896), and transformers 5 dropped the option. The native arm beside it (`self.use_amp`,
transformers' own GradScaler) is what `--fp16` runs. So the apex arm's body becomes a `raise` that
names the replacement: every configuration that still runs behaves as before, and the one that
selected apex stops with the reason instead of training without its loss scaling. The apex import
goes once nothing else uses it.

Only an `if`/`elif` arm whose test is exactly `self.use_apex` (the method's first parameter) in a
method of a class whose base resolves to a transformers `...Trainer`, in a file that never
assigns `use_apex` itself; every apex.amp use of the file must be in such arms, or be the first
value of `... if self.use_apex else <other>` below such an arm in the same method (a copy of
`Trainer.train`: the clip of `amp.master_params(...)`), which becomes `<other>`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional

import libcst as cst

from ampmigrate.analysis.statements import walk
from ampmigrate.diagnostics import SAFE, Fix
from ampmigrate.engine.context import FixBuilder

if TYPE_CHECKING:
    from ampmigrate.rules.apex._amp_migration import _Planner

FLAG = "use_apex"
MESSAGE = "apex.amp was removed (apex PR #1896): use the native fp16 backend, not half_precision_backend='apex'"


def library_apex_arms_fix(planner: "_Planner", sites) -> Optional[Fix]:
    """The fix when every apex.amp use of the file is in a `self.use_apex` arm of a transformers
    Trainer subclass (see the module docstring); None when any is not (the usual planning goes on)."""
    refs = [r for r in planner.refs if r.api is not None]
    if not refs or _assigns_flag(planner):
        return None
    arms: Dict[int, cst.If] = {}
    choices: Dict[int, cst.IfExp] = {}
    for ref in refs:
        arm = _apex_arm(planner, ref.node)
        if arm is None:
            return None
        (choices if isinstance(arm, cst.IfExp) else arms)[id(arm)] = arm
    if not all(_after_a_raising_arm(planner, choice, arms.values()) for choice in choices.values()):
        return None
    planner.builder = FixBuilder("", SAFE, frozenset({s.code for s in sites}))
    raise_line = planner.ctx.parse_statement(f"raise RuntimeError({planner.ctx.string(MESSAGE).value})\n")
    for choice in choices.values():  # `amp.master_params(opt) if self.use_apex else model.parameters()`
        planner.builder.replace(choice, choice.orelse.with_changes(lpar=choice.lpar, rpar=choice.rpar))
        planner.handled.add(choice)
    for arm in arms.values():
        body = arm.body
        if isinstance(body, cst.IndentedBlock):
            new_body = body.with_changes(body=[raise_line])
        else:  # `elif self.use_apex: with ...` cannot be one line: a suite here holds small statements
            new_body = cst.IndentedBlock(body=[raise_line])
        planner.builder.replace(body, new_body)
        planner.handled.add(body)
    planner.fp32 = True
    planner._plan_presence_tests()
    planner._plan_imports()
    planner._emit_removals()
    planner._check_nesting()
    count = len(arms)
    planner.builder.message = (
        f"Replace the apex arm{'s' if count > 1 else ''} of this transformers Trainer subclass (`self.use_apex`, "
        "which only transformers' removed apex backend sets) with an error naming the native fp16 backend"
    )
    return planner.builder.build()


def _apex_arm(planner: "_Planner", node: cst.CSTNode):
    """The `if self.use_apex:` (or `elif`) whose body holds `node`, or the `... if self.use_apex else
    ...` whose first value does, in a method of a transformers Trainer subclass; None otherwise."""
    names = planner.names
    child: cst.CSTNode = node
    arm = None
    for ancestor in names.ancestors(node):
        if arm is None and isinstance(ancestor, (cst.If, cst.IfExp)) and child is ancestor.body:
            arm = ancestor
        if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            if arm is None or not isinstance(ancestor, cst.FunctionDef):
                return None
            self_name = _self_param(ancestor)
            if self_name is None or not _tests_flag(arm.test, self_name):
                return None
            owner = names.parent(names.parent(ancestor))  # FunctionDef -> IndentedBlock -> ClassDef
            if not (isinstance(owner, cst.ClassDef) and _trainer_subclass(planner, owner)):
                return None
            if ancestor.decorators:
                return None  # a staticmethod's first parameter is no instance
            return arm
        child = ancestor
    return None


def _after_a_raising_arm(planner: "_Planner", choice: cst.IfExp, arms) -> bool:
    """An expression's apex value is never taken when an `if self.use_apex:` arm the fix makes raise
    comes first in its method, as a statement of the method's own body (copies of transformers'
    `Trainer.train`: `amp.initialize` under it, `amp.master_params(...) if self.use_apex else ...`
    in the loop below)."""
    names = planner.names
    function = next(a for a in names.ancestors(choice) if isinstance(a, cst.FunctionDef))
    body = list(function.body.body) if isinstance(function.body, cst.IndentedBlock) else []
    holder = next((s for s in body if any(n is choice for n in walk(s))), None)
    if holder is None:
        return False
    return any(arm in body and body.index(arm) < body.index(holder) for arm in arms)


def _self_param(function: cst.FunctionDef) -> Optional[str]:
    params = [*function.params.posonly_params, *function.params.params]
    return params[0].name.value if params else None


def _tests_flag(test: cst.BaseExpression, self_name: str) -> bool:
    return (
        isinstance(test, cst.Attribute)
        and test.attr.value == FLAG
        and isinstance(test.value, cst.Name)
        and test.value.value == self_name
        and not test.lpar
    )


def _trainer_subclass(planner: "_Planner", cls: cst.ClassDef) -> bool:
    """A base resolves (through the imports) to a class of transformers named `...Trainer`."""
    for base in cls.bases:
        if base.keyword is not None or base.star:
            continue
        for qname in planner.names.qualified_names(base.value):
            if qname.startswith("transformers.") and qname.rpartition(".")[2].endswith("Trainer"):
                return True
    return False


def _assigns_flag(planner: "_Planner") -> bool:
    """The file stores `use_apex` on something itself: the flag is then not only the library's."""
    return any(
        isinstance(node, cst.Attribute) and node.attr.value == FLAG for node in planner.names.store_attributes
    )
