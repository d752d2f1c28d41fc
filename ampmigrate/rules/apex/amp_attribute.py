"""AMP101 through an attribute: apex's amp module stored as `<obj>.amp` by another file.

argus' trainers: the model class sets `self.amp = None` and runs `with self.amp.scale_loss(loss,
self.optimizer) as scaled_loss:` in `train_step`; `initialize_amp(model)` in utils.py imports apex,
runs `amp.initialize` and sets `model.amp = amp`. The class's file never names apex, so neither
the in-file plan nor the name screen sees the calls. The project index records what every file
stores in attributes named like amp (engine/apex_attrs.py); this rule reports the apex amp calls on
`<x>.<attr>` where every store to `<attr>` anywhere in the run is apex's amp module or None.

Reported, never fixed: the attribute, the file storing the module and every use of it would
change together (a GradScaler in the module's place), across files. The finding says so. A file
storing the module in the attribute and reading it itself is the in-file plan's
(rules/apex/_amp_carrier.py).
"""

from __future__ import annotations

import libcst as cst

from ampmigrate.rules.apex._amp_refs import amp_usage
from ampmigrate.rules.apex.amp101_apex_amp import _REPLACEMENT as _ALL
from ampmigrate.rules.apex.amp_from_helper import APEX_AMP_CALLS, ApexAmpFromHelper
from ampmigrate.rules.base import Rule

_REASON = (
    "apex's amp module is the attribute `.{attr}`, which {origin} sets (every store to it in the "
    "project is that module or None): the store, the attribute and every use must change together "
    "(a GradScaler in the module's place), an edit the fix does not make yet"
)


class ApexAmpAttribute(Rule):
    code = "AMP101"
    triggers = ApexAmpFromHelper.triggers  # the amp calls it reports

    def applies_to_run(self, index) -> bool:
        """Only a run whose index records apex's amp module stored in an attribute."""
        return index is not None and any(
            "apex" in kinds for summary in index.modules.values() for kinds in summary.apex_attr_stores.values()
        )

    def check(self, ctx) -> None:
        index = ctx.file.project_index
        if index is None:
            return
        carried = None  # the calls the in-file plan reaches through the object carrying the module
        for call in ctx.names.nodes_of_type(cst.Call):
            func = call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value in APEX_AMP_CALLS):
                continue
            receiver = func.value
            if not (isinstance(receiver, cst.Attribute) and isinstance(receiver.value, (cst.Name, cst.Attribute))):
                continue
            if ctx.names.qualified_names(receiver):
                continue  # resolved in the file (an in-file `self.amp = amp`): the in-file plan's
            if carried is None:
                carried = {id(r.node) for r in amp_usage(ctx.file).refs if r.carrier is not None}
            if id(func) in carried:
                continue  # stored in this file too (`args.amp = amp`): rules/apex/_amp_carrier.py
            origin = index.apex_attr(receiver.attr.value)
            if origin is None:
                continue
            api = func.attr.value
            attr = receiver.attr.value
            where = index.relative(origin)
            ctx.report(
                func,
                f"`{attr}.{api}` (apex's amp module, stored in `.{attr}` by {where}) was removed from apex in "
                f"May 2025, so this no longer runs; use {_ALL[api]}",
                no_fix_reason=_REASON.format(attr=attr, origin=where),
            )
