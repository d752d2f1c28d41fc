"""Autocast regions must not hold a call CUDA autocast refuses (analysis/autocast_banned.py).

apex ran `binary_cross_entropy` when its inputs were fp32; CUDA autocast raises on it whatever
they are, and CPU autocast does not, so `verify` on a CPU cannot see the break. The fixtures
tests/fixtures/AMP101/region_bce_*.py (written from scratch) hold the shapes: a `BCELoss`
bound in the module, one hidden in the file's own loss module called from a trainer method, and
the logits form, which autocast runs in fp32 and the region may hold.
"""

from __future__ import annotations

import libcst as cst
import pytest

from ampmigrate.analysis.autocast_banned import banned_call
from ampmigrate.engine.names import NameIndex

from conftest import FIXTURES, check, fix


def _reasons(path):
    return {f.no_fix_reason for f in check(path.read_text(), select=["AMP1"]) if f.code == "AMP101"}


@pytest.mark.parametrize("case,line,callee", [
    ("region_bce_loss_module", 13, "criterion"),
    ("region_bce_in_own_loss", 21, "self.criterion"),
])
def test_a_region_holding_binary_cross_entropy_is_refused(case, line, callee):
    path = FIXTURES / "AMP101" / f"{case}.py"
    reasons = _reasons(path)
    expected = f"the autocast region would hold the binary cross-entropy at line {line} (`{callee}`)"
    assert reasons and all(r and expected in r for r in reasons), reasons
    assert fix(path.read_text(), select=["AMP1"]) == path.read_text()


def test_the_logits_form_is_wrapped():
    migrated = fix((FIXTURES / "AMP101" / "region_bce_with_logits.py").read_text(), select=["AMP1"])
    assert "apex" not in migrated
    assert '    with torch.autocast("cuda", dtype=torch.float16):\n        loss = criterion(model(x), y)' in migrated


def _first_banned(code: str):
    module = cst.parse_module(code)
    names = NameIndex(module)
    statements = [s for s in module.body if not isinstance(s, (cst.ClassDef, cst.FunctionDef))][-1:]
    found = banned_call(names, statements)
    return None if found is None else module.code_for_node(found)


@pytest.mark.parametrize("code,expected", [
    ("import torch.nn.functional as F\nloss = F.binary_cross_entropy(p, y)\n", "F.binary_cross_entropy(p, y)"),
    ("from torch.nn.functional import binary_cross_entropy as bce\nloss = bce(p, y)\n", "bce(p, y)"),
    ("from torch import nn\nloss = nn.BCELoss(reduction='sum')(p, y)\n", "nn.BCELoss(reduction='sum')(p, y)"),
    ("import torch\nc = torch.nn.BCELoss() if w else torch.nn.MSELoss()\nloss = c(p, y)\n", "c(p, y)"),
    ("import torch.nn.functional as F\ndef f(p, y):\n    return F.binary_cross_entropy(p, y)\nloss = f(p, y)\n", "f(p, y)"),
    # Not banned: the logits form, another library's `binary_cross_entropy`, an unrelated `BCELoss`.
    ("import torch.nn.functional as F\nloss = F.binary_cross_entropy_with_logits(z, y)\n", None),
    ("from mylib import binary_cross_entropy\nloss = binary_cross_entropy(p, y)\n", None),
    ("class BCELoss:\n    def __call__(self, p, y):\n        return p - y\nloss = BCELoss()(p, y)\n", None),
])
def test_banned_call_resolves_names_not_text(code, expected):
    assert _first_banned(code) == expected
