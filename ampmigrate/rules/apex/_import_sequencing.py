"""An apex import that other fixes also need gone: `import apex` used by `apex.amp` *and* by
`apex.parallel.DistributedDataParallel(...)` (AMP109) or `apex.optimizers.FusedAdam(...)` (AMP107).

The amp migration removes the import only when its own changes leave it unused; each class fix
the same. Applied in one round, each leaves the import to the other, and once both have run
nothing uses it, so it stays: the migrated file still needs apex installed. The amp fix therefore
*claims* (replaces with itself, a change that changes nothing) each remaining use of the import,
so the engine cannot apply it in the same round as a fix that rewrites such a use: whichever
runs second sees the import used only by its own uses, and removes it.
"""

from __future__ import annotations

from typing import Iterable

import libcst as cst

from ampmigrate.engine.context import FixBuilder
from ampmigrate.engine.names import Binding, NameIndex


def claim_other_uses(names: NameIndex, builder: FixBuilder, binding: Binding, handled: Iterable[cst.CSTNode]) -> None:
    """Claim the references of `binding` outside `handled` (what this fix changes, and apex.amp's
    uses, which only the amp plans rewrite), where nothing the fix replaces holds them."""
    handled_set = set(handled)
    replaced = set(builder.replaced())
    for ref in names.references(binding):
        if ref in handled_set or ref in replaced or any(a in handled_set or a in replaced for a in names.ancestors(ref)):
            continue
        builder.replace(ref, ref)
