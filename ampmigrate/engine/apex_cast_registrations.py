"""apex.amp cast registrations that torch.autocast would not honour: the index fact.

`amp.register_float_function(torch, "sigmoid")` changes how apex's fp16 regions run that op in
the whole process, whichever file registers it (a loss module's `import` does). torch.autocast
has fixed cast lists: where the op is already on the list of the same dtype, AMP105 drops the
registration and nothing changes; otherwise nothing in torch.amp registers it, so a migration of
any file of the run to autocast changes that op's precision until it is cast by hand. The planner
(rules/apex/_amp_migration.py `_check_casts_left_behind`) makes that migration unsafe and says
which registration, of which file.

Read with `ast` from the import lines: `from apex import amp [as a]`, `import apex.amp as a`,
`import apex` then `apex.amp.register_...`, and torch's modules as the file spells them
(`import torch.nn.functional as F`, `from torch.nn import functional as F`, `from torch import
nn` then `nn.functional`).
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Tuple

from ampmigrate.api import AUTOCAST_CUDA_FLOAT_OPS, AUTOCAST_CUDA_HALF_OPS
from ampmigrate.engine.caller_uses import dotted

_REGISTRATIONS = {
    "register_float_function": AUTOCAST_CUDA_FLOAT_OPS,
    "register_half_function": AUTOCAST_CUDA_HALF_OPS,
    "register_promote_function": None,  # autocast promotes its own list only
}


def cast_registrations(tree: ast.Module) -> List[Tuple[str, int]]:
    """(the call as written, its line) for each registration autocast would not honour."""
    amp_spellings, modules = _bindings(tree)
    found: List[Tuple[str, int]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _REGISTRATIONS):
            continue
        if dotted(node.func.value) not in amp_spellings:
            continue
        table = _REGISTRATIONS[node.func.attr]
        if table is not None and len(node.args) == 2 and not node.keywords:
            module = _resolve(dotted(node.args[0]), modules)
            op = node.args[1]
            if isinstance(op, ast.Constant) and isinstance(op.value, str) and op.value in table.get(module or "", ()):
                continue  # autocast already casts it so (AMP105 drops the registration)
        found.append((ast.unparse(node), node.lineno))
    return found


def _bindings(tree: ast.Module) -> Tuple[set, Dict[str, str]]:
    """(spellings of apex's amp module, {local name: torch module it is bound to})."""
    amp_spellings: set = set()
    modules: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                local = alias.asname or alias.name
                if node.module == "apex" and alias.name == "amp":
                    amp_spellings.add(local)
                elif node.module.split(".")[0] == "torch":
                    modules[local] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "apex.amp" and alias.asname:
                    amp_spellings.add(alias.asname)
                elif alias.name in ("apex", "apex.amp") and not alias.asname:
                    amp_spellings.add("apex.amp")
                elif alias.name.split(".")[0] == "torch":
                    if alias.asname:
                        modules[alias.asname] = alias.name
                    else:
                        modules["torch"] = "torch"
    return amp_spellings, modules


def _resolve(spelled: str, modules: Dict[str, str]) -> Optional[str]:
    """The torch module a name or attribute chain of the file denotes (`F` -> torch.nn.functional)."""
    head, _, rest = spelled.partition(".")
    base = modules.get(head)
    if base is None:
        return None
    return f"{base}.{rest}" if rest else base

