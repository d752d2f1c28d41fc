"""Autocast regions must not run a call CUDA autocast refuses (analysis/autocast_banned.py).

apex ran `binary_cross_entropy` when its inputs were fp32; CUDA autocast raises on it whatever
they are, and CPU autocast does not, so `verify` on a CPU cannot see the break. Where the call is
a line of its own, it runs as apex ran it, with autocast disabled on `.float()` inputs; inside a
larger expression the setup is refused. The fixtures tests/fixtures/AMP101/region_bce_*.py
(written from scratch) hold the shapes: a `BCELoss` bound in the module, one in the model's own
`forward` (a click-through model), one inside a sum in the file's own loss module, and the logits
form, which autocast runs in fp32 and the region may hold.
"""

from __future__ import annotations

import libcst as cst
import pytest

from ampmigrate.analysis.autocast_banned import banned_call
from ampmigrate.engine.names import NameIndex

from conftest import FIXTURES, check, fix


def _reasons(path):
    return {f.no_fix_reason for f in check(path.read_text(), select=["AMP1"]) if f.code == "AMP101"}


def test_a_binary_cross_entropy_inside_a_sum_is_refused():
    path = FIXTURES / "AMP101" / "region_bce_in_own_loss.py"
    reasons = _reasons(path)
    expected = "the autocast region would hold the binary cross-entropy at line 12 (`self.criterion`)"
    assert reasons and all(r and expected in r and "not a line of its own" in r for r in reasons), reasons
    assert fix(path.read_text(), select=["AMP1"]) == path.read_text()


@pytest.mark.parametrize("case,line", [
    ("region_bce_loss_module", '        with torch.autocast("cuda", enabled=False):\n            loss = criterion(out.float(), y.float())\n'),
    ("region_bce_in_model_forward", '            with torch.autocast("cuda", enabled=False):\n                loss = self.criterion(probs.float(), label.float())\n'),
])
def test_a_binary_cross_entropy_on_its_own_line_runs_outside_autocast_on_fp32_inputs(case, line):
    path = FIXTURES / "AMP101" / f"{case}.py"
    assert _reasons(path) == {None}
    migrated = fix(path.read_text(), select=["AMP1"])
    assert line in migrated and "apex" not in migrated.split("\n", 3)[-1]
    assert fix(migrated, select=["AMP1"]) == migrated


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
