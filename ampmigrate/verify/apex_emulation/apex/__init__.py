"""NVIDIA apex, emulated with torch for `ampmigrate verify` runs (not the real apex).

`amp`, `parallel`, `optimizers` and `normalization` follow apex's semantics (apex `frontend.py`,
`handle.py`, `scaler.py`, `_initialize.py`; see the verify section of ampmigrate's README) on top
of their torch counterparts, on a GPU or on the CPU. With AMPMIGRATE_APEX_EMULATION=current, the
modules that apex removed in 2025 (`amp`, `parallel`, PR #1896) fail to import as they do with a
current apex, while `optimizers` and `normalization` remain.
"""

import os

EMULATED = True  # lets a verify run tell the emulation from a real apex
REMOVED_IN_CURRENT_APEX = os.environ.get("AMPMIGRATE_APEX_EMULATION") == "current"


def removed(module: str) -> ImportError:
    return ImportError(
        f"{module} was removed from apex on 2025-05-08 (NVIDIA/apex PR #1896); use torch.amp", name=module
    )


_SUBPACKAGES = ("amp", "parallel", "optimizers", "normalization")


def __getattr__(name):
    """`apex.amp` after a bare `import apex` (transformers' `run_squad.py` calls
    `apex.amp.register_half_function` so), as apex's own `__init__.py`, which imported its
    subpackages, allowed; loaded on first use, so a run's report lists only what it used. With a
    current apex the removed ones are no attributes."""
    if name in _SUBPACKAGES:
        import importlib

        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ImportError:
            pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
