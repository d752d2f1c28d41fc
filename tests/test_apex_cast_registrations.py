"""apex.amp cast registrations that torch.autocast would not honour (engine/apex_cast_registrations.py
and `_Planner._check_casts_left_behind`): a registration autocast already matches is no fact, one it
does not is, however apex and torch are spelled; the migration of a file beside one, or of any file
of a run holding one elsewhere, is an unsafe fix naming it; the per-file cache follows the other
file's registrations."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import FIXTURES, fix, project_findings

from ampmigrate.engine.apex_cast_registrations import cast_registrations

TRAIN = (Path(__file__).parent / "fixtures" / "AMP101" / "region_inner_blank_line.py").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "code, expected",
    [
        ('from apex import amp\nimport torch\namp.register_float_function(torch, "sigmoid")\n', ["sigmoid"]),
        ('import apex\nimport torch\napex.amp.register_float_function(torch, "sigmoid")\n', ["sigmoid"]),
        ('import apex.amp as A\nimport torch\nA.register_half_function(torch, "sigmoid")\n', ["sigmoid"]),
        ('from apex import amp\nimport torch.nn.functional as F\namp.register_float_function(F, "softmax")\n', []),
        ('from apex import amp\nfrom torch.nn import functional as F\namp.register_float_function(F, "softmax")\n', []),
        ('from apex import amp\nfrom torch import nn\namp.register_float_function(nn.functional, "softmax")\n', []),
        ('from apex import amp\nimport torch\namp.register_half_function(torch, "einsum")\n', []),
        ('from apex import amp\nimport torch\namp.register_float_function(torch, "matmul")\n', ["matmul"]),
        ('from apex import amp\nimport torch\namp.register_promote_function(torch, "cat")\n', ["cat"]),
        ('import torch\nfrom mylib import amp\namp.register_float_function(torch, "sigmoid")\n', []),
    ],
    ids=["from_import", "import_apex", "import_as", "F_softmax", "from_torch_nn", "nn_functional", "half_einsum",
         "float_matmul", "promote", "not_apex"],
)
def test_only_registrations_autocast_would_not_honour_are_facts(code, expected):
    found = cast_registrations(ast.parse(code))
    assert [re.search(r"['\"](\w+)['\"]", call).group(1) for call, _ in found] == expected
    assert all(line == 3 for _, line in found)


def test_a_registration_in_another_file_of_the_run_makes_the_migration_unsafe(cli, tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    (project / "train.py").write_text(TRAIN, encoding="utf-8")
    (project / "losses.py").write_text(
        'import torch\nfrom apex import amp\n\namp.register_half_function(torch, "einsum")\n', encoding="utf-8"
    )
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert {f["fix"]["applicability"] for f in project_findings(cli, project, *cache)} == {"safe"}
    (project / "losses.py").write_text(
        'import torch\nfrom apex import amp\n\namp.register_float_function(torch, "sigmoid")\n', encoding="utf-8"
    )
    findings = project_findings(cli, project, *cache)  # the same cache: train.py's entry must not be reused
    assert {f["fix"]["applicability"] for f in findings} == {"unsafe"}
    assert "`amp.register_float_function(torch, 'sigmoid')` (losses.py:4) changed how apex ran that op" in findings[0]["fix"]["message"]


def test_the_migration_beside_a_registration_is_unsafe_and_keeps_it():
    code = (FIXTURES / "AMP101" / "register_float_sigmoid_unsafe.py").read_text(encoding="utf-8")
    assert fix(code, select=["AMP1"]) == code
    migrated = fix(code, select=["AMP1"], **{"unsafe-fixes": True})
    assert 'amp.register_float_function(torch, "sigmoid")' in migrated and "from apex import amp" in migrated
    assert "amp.initialize" not in migrated and "amp.scale_loss" not in migrated
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=use_apex)' in migrated
    compile(migrated, "migrated.py", "exec")
