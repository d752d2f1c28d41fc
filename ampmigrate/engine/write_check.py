"""Whether a fixed text may be written: the one check the engine makes before writing a file
(engine/pipeline.py), also asked by the apex rules that fix several files as one group
(rules/apex/_cross_threading.py, _other_files.py): a side the engine would refuse to write must
stop the whole group, or the other files would migrate without it."""

from __future__ import annotations

from typing import Optional

from ampmigrate.analysis.unbound import introduced
from ampmigrate.engine import fixer


def why_not_written(new_text: str, old_text: str) -> Optional[str]:
    """Why the fixed text must not be written, or None: it does not parse or compile (where the
    original did), or it reads a name before any binding on some path where the original did not
    (analysis/unbound.py: a scaler created after a call that passes it, a read of `amp` whose
    import went)."""
    if not fixer.parses(new_text):
        return "produced invalid code"
    # Only hold CPython's parser against the fix if it accepted the original.
    if not fixer.compiles(new_text) and fixer.compiles(old_text):
        return "produced invalid code"
    unbound = introduced(old_text, new_text)
    if unbound:
        scope, name = unbound[0]
        where = "at the top level" if scope == "<module>" else f"in `{scope}()`"
        return f"would read `{name}` {where} where some path has not bound it"
    return None
