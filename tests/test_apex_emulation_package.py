"""`import apex` in the apex emulation gives its subpackages as attributes, as apex's own `__init__.py` did, so
`apex.amp.register_half_function(torch, "einsum")` after a bare `import apex` (transformers'
`run_squad.py` and its copies) runs; with AMPMIGRATE_APEX_EMULATION=current, as with a current apex,
`import apex` still works and the removed `apex.amp` / `apex.parallel` are not there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

pytest.importorskip("torch")

EMULATION = ROOT / "ampmigrate" / "verify" / "apex_emulation"
PROGRAM = """
import torch
import apex
import sys
print(sorted(name for name in sys.modules if name.startswith("apex.")))  # nothing loaded until used
print(sorted(name for name in ("amp", "parallel", "optimizers", "normalization") if hasattr(apex, name)))
try:
    apex.amp.register_half_function(torch, "einsum")
    print("registered")
except AttributeError as error:
    print("AttributeError")
"""


def _run(current: bool) -> list:
    env = {"PYTHONPATH": str(EMULATION), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if current:
        env["AMPMIGRATE_APEX_EMULATION"] = "current"
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_a_bare_import_of_apex_binds_amp_as_apex_did():
    assert _run(current=False) == ["[]", "['amp', 'normalization', 'optimizers', 'parallel']", "registered"]


def test_with_a_current_apex_the_removed_subpackages_are_absent():
    assert _run(current=True) == ["[]", "['normalization', 'optimizers']", "AttributeError"]
