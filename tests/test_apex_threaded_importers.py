"""A function the fix hands the GradScaler to as a new parameter, called from another file
(rules/apex/_threaded_importers.py): that call would pass no scaler after the migration, so the
fix refuses, naming the file and line; a file importing something else of the module changes
nothing. The per-file cache follows the importers' bytes (engine/project_index.py
`dependency_key`): adding the call later refuses on the next, cached, run."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import project_findings

TRAIN = '''\
import torch
from apex import amp

LR = 0.1


def train_step(model, optimizer, x):
    loss = model(x).sum()
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()


def main():
    model = torch.nn.Linear(4, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for _ in range(10):
        train_step(model, optimizer, torch.randn(2, 4).cuda())
'''

FROM_IMPORT_CALL = '''\
from train import train_step


def fine_tune(model, optimizer, x):
    train_step(model, optimizer, x)
'''

MODULE_CALL = '''\
import train


def fine_tune(model, optimizer, x):
    train.train_step(model, optimizer, x)
'''

PASSED_ON = '''\
from train import train_step

STEPS = {"default": train_step}
'''

OTHER_NAME = '''\
from train import LR

print(LR)
'''

UNUSED_IMPORT = '''\
from train import train_step
'''


def _project(tmp_path: Path, other: str) -> Path:
    project = tmp_path / "p"
    project.mkdir()
    (project / "train.py").write_text(TRAIN, encoding="utf-8")
    (project / "finetune.py").write_text(other, encoding="utf-8")
    return project


@pytest.mark.parametrize(
    "other, why",
    [
        (FROM_IMPORT_CALL, "finetune.py calls it at line 5 without one"),
        (MODULE_CALL, "finetune.py calls it at line 5 without one"),
        (PASSED_ON, "finetune.py uses it otherwise than by calling it"),
    ],
    ids=["from_import", "module_attribute", "passed_on"],
)
def test_a_function_gaining_the_scaler_used_by_another_file_refuses(cli, tmp_path, other, why):
    findings = project_findings(cli, _project(tmp_path, other), "--no-cache")
    assert len(findings) == 2
    for finding in findings:
        assert finding["fix"] is None
        assert finding["no_fix_reason"] == (
            f"`train_step()` takes the GradScaler as a new parameter, and {why}: migrate that file's use of it too"
        )


@pytest.mark.parametrize("other", [OTHER_NAME, UNUSED_IMPORT], ids=["other_name", "unused_import"])
def test_a_file_importing_without_calling_it_changes_nothing(cli, tmp_path, other):
    findings = project_findings(cli, _project(tmp_path, other), "--no-cache")
    assert [f["fix"]["applicability"] for f in findings] == ["safe", "safe"]


def test_a_call_added_later_in_another_file_reaches_the_cached_result(cli, tmp_path):
    project = _project(tmp_path, UNUSED_IMPORT)  # the same names imported before and after
    cache = tmp_path / "cache"
    assert [f["fix"]["applicability"] for f in project_findings(cli, project, "--cache-dir", str(cache))] == ["safe", "safe"]
    (project / "finetune.py").write_text(FROM_IMPORT_CALL, encoding="utf-8")
    findings = project_findings(cli, project, "--cache-dir", str(cache))
    assert [f["fix"] for f in findings] == [None, None]
