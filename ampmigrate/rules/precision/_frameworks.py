"""Reading and changing how a training framework object is configured.

A framework object (`TrainingArguments`, a Lightning `Trainer`, an `Accelerator`) is configured
by keyword arguments, and often by a dict spread into the call: `TrainingArguments(**config)`
with `config = {"fp16": True, ...}` or `dict(fp16=True, ...)` assigned in a visible scope.
`settings_of(call)` lists both kinds the same way, so rules read and edit them alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, FrozenSet, List, Optional, Tuple

import libcst as cst

from ampmigrate.analysis.values import Followed, Follower, is_comparison_use, literal_value, respell_string
from ampmigrate.engine.context import FileContext, without_items


@dataclass(eq=False)
class Setting:
    name: str
    value: cst.BaseExpression
    item: cst.CSTNode  # the keyword Arg, or the DictElement
    container: cst.CSTNode  # the Call or the Dict holding the item

    @property
    def anchor(self) -> cst.CSTNode:
        """Where a finding about it points: the keyword, or the dict key."""
        return self.item.keyword if isinstance(self.item, cst.Arg) else self.item.key

    def renamed(self, new_name: str) -> cst.CSTNode:
        if isinstance(self.item, cst.Arg):
            return self.item.with_changes(keyword=cst.Name(new_name))
        key = self.item.key
        assert isinstance(key, cst.SimpleString)
        return self.item.with_changes(key=respell_string(key, new_name))


def framework_calls(ctx: FileContext, qnames: FrozenSet[str]) -> List[Tuple[cst.BaseExpression, cst.Call]]:
    """(callee, call) for every call of one of `qnames`, resolved through imports."""
    found = []
    for ref, _ in ctx.names.find(qnames):
        parent = ctx.names.parent(ref)
        if isinstance(parent, cst.Call) and parent.func is ref:
            found.append((ref, parent))
    return found


def settings_of(ctx: FileContext, call: cst.Call) -> List[Setting]:
    """The call's keyword arguments, and the entries of dicts it spreads with `**`."""
    settings: List[Setting] = []
    for arg in call.args:
        if arg.keyword is not None:
            settings.append(Setting(arg.keyword.value, arg.value, arg, call))
        elif arg.star == "**":
            config = config_literal(ctx, arg.value)
            if config is not None:
                settings.extend(dict_settings(ctx, config))
    return settings


def dict_settings(ctx: FileContext, config: cst.CSTNode) -> List[Setting]:
    """The string-keyed entries of a dict display, or the keywords of a `dict(...)` call."""
    settings: List[Setting] = []
    if isinstance(config, cst.Dict):
        for element in config.elements:
            if isinstance(element, cst.DictElement):
                key = literal_value(element.key)
                if isinstance(key, str) and isinstance(element.key, cst.SimpleString):
                    settings.append(Setting(key, element.value, element, config))
    elif isinstance(config, cst.Call):
        for arg in config.args:
            if arg.keyword is not None:
                settings.append(Setting(arg.keyword.value, arg.value, arg, config))
    return settings


def is_dict_call(ctx: FileContext, node: cst.CSTNode) -> bool:
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value == "dict"
        and not ctx.names.bindings_of(node.func)
        and all(a.keyword is not None for a in node.args)
    )


def config_literal(ctx: FileContext, expr: cst.BaseExpression) -> Optional[cst.CSTNode]:
    """A dict display or `dict(...)` call: inline, or the one value of a name."""
    if isinstance(expr, cst.Dict) or is_dict_call(ctx, expr):
        return expr
    if isinstance(expr, cst.Name):
        bindings = ctx.names.bindings_of(expr)
        if len(bindings) == 1 and bindings[0].kind == "assign" and bindings[0].value is not None:
            value = bindings[0].value
            if isinstance(value, cst.Dict) or is_dict_call(ctx, value):
                return value
    return None


def follow_setting(ctx: FileContext, setting: Setting, allowed_use: Optional[Callable] = None) -> Followed:
    """The literal values a setting can take (through variables, ternaries, argparse defaults)."""
    return Follower(ctx, allowed_use=allowed_use or (lambda ref: is_comparison_use(ctx, ref))).follow(setting.value)


def removal_changes(ctx: FileContext, settings: List[Setting]) -> Optional[List[Tuple[cst.CSTNode, cst.CSTNode]]]:
    """Changes that drop `settings` from their containers (None: the containers nest)."""
    by_container = {}
    for setting in settings:
        by_container.setdefault(setting.container, []).append(setting.item)
    for container in by_container:
        if any(ancestor in by_container for ancestor in ctx.names.ancestors(container)):
            return None
    return [(container, without_items(container, items)) for container, items in by_container.items()]


def respell_sources(
    ctx: FileContext, followed: Followed, is_old: Callable[[Any], bool], new_value: Any
) -> Tuple[List[Tuple[cst.CSTNode, cst.CSTNode]], Optional[str]]:
    """Edits that write `new_value` where each old value is written, or why that cannot be done."""
    if followed.blocker is not None:
        return [], followed.blocker
    edits = []
    for source in followed.sources:
        if not is_old(source.value):
            continue
        if source.node is None:
            return [], f"the value is the implicit default of {source.via}"
        if source.option is not None:
            reason = source.option.accepts(new_value)
            if reason is not None:
                return [], reason
        if isinstance(new_value, str) and isinstance(source.node, cst.SimpleString):
            edits.append((source.node, respell_string(source.node, new_value)))
        elif isinstance(new_value, str):
            edits.append((source.node, ctx.string(new_value)))
        else:
            return [], "the value cannot be respelled in place"
    return edits, None


def chosen_by_hardware(ctx: FileContext, setting: Setting, followed: Followed) -> bool:
    """The setting, or where its value is written, sits in a branch that tests for bf16 support."""
    from ampmigrate.rules.precision._common import in_bf16_choice

    nodes = [setting.item, *(s.node for s in followed.sources if s.node is not None)]
    return any(in_bf16_choice(ctx, node) for node in nodes)


def describe_sources(ctx: FileContext, followed: Followed, is_old: Callable[[Any], bool]) -> str:
    """' (set through `x` at line 3)' when the old value is written away from the call."""
    for source in followed.sources:
        if is_old(source.value) and source.via and source.node is not None:
            return f" (set through {source.via} at line {ctx.position(source.node).start.line})"
    return ""
