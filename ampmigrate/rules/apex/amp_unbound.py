"""AMP101 on uses that a function-local apex import does not reach.

A trainer imports apex inside `__init__` (`if args.fp16: from apex import amp`) and runs
`with amp.scale_loss(loss, self.optimizer)` in another method. There `amp` is bound nowhere: the
import made a local of `__init__`, so the fp16 path raises NameError (unless something outside
the file sets a module global). The in-file plan (_amp_migration.py `_check_unreached_uses`)
refuses the file and reports it on the import; this rule reports each such use too, so the
site itself says what it is and why the fix leaves it.

Only a name that every binding of the file makes an import of apex's amp module counts: a free
`amp` in a file that also binds `amp` to anything else (or that has a `*` import) is not
reported.
"""

from __future__ import annotations

import libcst as cst

from ampmigrate.rules.apex.amp101_apex_amp import _REPLACEMENT as _ALL
from ampmigrate.rules.apex.amp_from_helper import APEX_AMP_CALLS as _APIS
from ampmigrate.rules.base import Rule

_REASON = (
    "`{name}` is not bound here: the `from apex import amp` at line {line} is local to `{function}`, so this "
    "raises NameError under fp16; make the GradScaler there, store it (`self.scaler`) or pass it here, and "
    "migrate this use by hand"
)


class ApexAmpUnbound(Rule):
    code = "AMP101"
    triggers = (r"\bapex\b",)  # the import names apex
    qualified_prefixes = ("apex",)

    def check(self, ctx) -> None:
        names = ctx.names
        if names.has_star_import:
            return
        imports = _local_apex_amp_imports(names)
        if not imports:
            return
        for name, scope in names.loads.items():
            found = imports.get(name.value)
            if found is None or names.lookup(name.value, scope):
                continue
            attribute = names.parent(name)
            if not (isinstance(attribute, cst.Attribute) and attribute.value is name and attribute.attr.value in _APIS):
                continue
            binding = found[0]
            function = binding.scope.node
            line = ctx.position(binding.node).start.line
            api = attribute.attr.value
            ctx.report(
                attribute,
                f"`amp.{api}` (apex's amp, imported in another function) was removed from apex in May 2025, "
                f"so this no longer runs; use {_ALL[api]}",
                no_fix_reason=_REASON.format(
                    name=name.value,
                    line=line,
                    function=getattr(getattr(function, "name", None), "value", "?"),
                ),
            )


def _local_apex_amp_imports(names):
    """{name: its bindings} for names every binding of the file makes `apex.amp` by an import
    in a function (none at module level)."""
    found = {}
    other = set()
    for scope in names.scopes:
        for name, bindings in scope.bindings.items():
            for binding in bindings:
                apex_amp = binding.kind in ("import", "from-import") and binding.qname == "apex.amp"
                if apex_amp and scope.kind == "function":
                    found.setdefault(name, []).append(binding)
                else:
                    other.add(name)
    for name, bindings in names.module_scope.bindings.items():
        other.add(name)
    return {name: bindings for name, bindings in found.items() if name not in other}
