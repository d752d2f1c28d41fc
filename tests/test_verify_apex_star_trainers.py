"""Issue 12, at run time: trainers that reach apex's amp module through `from trainer import *`
(engine/apex_star.py), the provider importing it in a `try` with `amp = None` as the fallback, and
a model that computes its own loss in one of two methods (flair's trainers, as vendored in
Alibaba-NLP/ACE). The project tests/verify_projects/apex_star_trainers (written for these tests)
trains with the base trainer or the fine-tuning one (distilling from a teacher, accumulating two
micro-batches); the safe fix migrates both files and drops the provider's apex import, and the
migrated program trains like the apex original."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, assert_trains_like_the_apex_original
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = ROOT / "tests" / "verify_projects" / "apex_star_trainers"


def _safe_fix_of_the_project(cli, project, tmp_path) -> dict:
    """`ampmigrate fix` of a copy of the whole project (the star import needs the project index):
    {name: new text} of the files it changed."""
    copy = copy_of(project, tmp_path / "fixed")
    result = cli("fix", "--no-cache", "--select", "AMP1", str(copy))
    assert result.exit_code == 0 and "Fixed 5 findings in 2 files" in result.output, result.output
    return {
        path.name: path.read_text(encoding="utf-8")
        for path in sorted(copy.glob("*.py"))
        if path.read_text(encoding="utf-8") != (project / path.name).read_text(encoding="utf-8")
    }


@pytest.mark.parametrize("mode", ["base", "distill"])
def test_star_imported_trainers_migrated_by_the_safe_fix_train_like_the_original(cli, monkeypatch, tmp_path, mode):
    project = copy_of(PROJECT, tmp_path / "apex_star_trainers")
    originals = {name: (project / name).read_text(encoding="utf-8") for name in ("trainer.py", "finetune.py", "train.py")}
    migrated = _safe_fix_of_the_project(cli, project, tmp_path)
    assert set(migrated) == {"trainer.py", "finetune.py"}
    for name, text in migrated.items():
        compile(text, name, "exec")
        assert _apex_amp_uses(originals[name]) and _apex_amp_uses(text) == []
    assert "    from apex import amp\n" not in migrated["trainer.py"] and "\n    amp = None\n" not in migrated["trainer.py"]
    assert "                    loss = self.model.distillation_loss(batch, teacher_logits)\n" in migrated["finetune.py"]

    result, data = run_verify(
        cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--fp16", "--mode", mode
    )

    assert_trains_like_the_apex_original(result, data)
    for name, text in originals.items():
        assert (project / name).read_text(encoding="utf-8") == text
