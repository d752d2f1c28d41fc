"""Issue 12, at run time: two apex shapes the safe `fix` migrates, verified against their apex
originals on the emulation, each with a control that verify must reject.

- tests/verify_projects/apex_hf_trainer: the transformers `Trainer` of 2020 (`amp.initialize` in
  `train()`, `amp.scale_loss` in `_training_step()`, gradient accumulation, a clip of
  `amp.master_params` in the stepping branch). The scaler becomes `self.scaler`. Control: the same
  migration without its `self.scaler.unscale_(optimizer)` (a clip of scaled gradients).
- tests/verify_projects/apex_fgm_adversarial: an NER loop with FGM adversarial training (the
  plain `loss_adv.backward()` between the scaled backward and the step is scaled too). FGM reads
  the gradients left by the first backward, scaled after the migration, unscaled in apex: it uses
  them only as grad / ||grad||, which a power-of-two scale leaves unchanged. Control: the migration
  with the adversarial backward left plain (its gradients are divided by the loss scale at the
  `unscale_`, so the adversarial term vanishes from the update). With upstream's epsilon 1.0 and
  lr 3e-3 that control barely shows in 30 steps under AdamW and a clip (0.9%); the tests run a
  stronger adversary (epsilon 5, lr 1e-2) where it does. Run without and with gradient accumulation.
- The same loop with an attack that reads the raw gradient (`epsilon * grad`, no normalization):
  the safe fix refuses it (rules/apex/_window_readers.py); before that refusal it migrated it, and
  verify measured the result 55% apart at step 30.
"""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_verify_apex_programs import _apex_amp_uses, _safe_fix
from test_verify_runs import copy_of, quiet_runs, run_verify  # noqa: F401  (quiet_runs: autouse fixture)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECTS = ROOT / "tests" / "verify_projects"
FGM_ARGS = ["--fp16", "--do_adv", "--adv_epsilon", "5", "--learning_rate", "1e-2"]


def _mean_curve(runs):
    curves = [run["losses"] for run in runs]
    return [sum(values) / len(values) for values in zip(*curves)]


def _max_relative_difference(data):
    before, after = _mean_curve(data["runs"]["before"]), _mean_curve(data["runs"]["after"])
    return max(abs(a - b) / abs(b) for b, a in zip(before, after))


def _check_equivalent(result, data, changed, originals, project):
    assert result.exit_code == 0, result.output
    assert data["verdict"] == "equivalent" and not data["reasons"]
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    assert list(data["migration"]["changed_files"]) == [changed]
    left = [finding.rsplit(" ", 1)[-1] for finding in data["migration"]["remaining_findings"]]
    assert [code for code in left if code.startswith("AMP1")] == [], left
    for run in data["runs"]["before"]:
        assert run["status"] == "completed" and run["precision"].endswith("apex loss scale")
    for run in data["runs"]["after"]:
        assert run["status"] == "completed" and run["apex_emulation"] == [] and run["precision"] == "fp16 + GradScaler"
        assert run["clips_on_scaled_gradients"] == 0 and not run["skipped_steps"]
    # the same numerics: fp16 autocast and a 2**16 loss scale on both sides
    assert _max_relative_difference(data) < 1e-3, _max_relative_difference(data)
    assert {path.name: path.read_text(encoding="utf-8") for path in project.glob("*.py")} == originals


def test_the_2020_transformers_trainer_migrated_by_the_safe_fix_trains_like_the_original(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECTS / "apex_hf_trainer", tmp_path / "apex_hf_trainer")
    originals = {path.name: path.read_text(encoding="utf-8") for path in project.glob("*.py")}
    fixed = _safe_fix(project)
    compile(fixed["trainer.py"], "trainer.py", "exec")
    assert _apex_amp_uses(originals["trainer.py"]) and _apex_amp_uses(fixed["trainer.py"]) == []
    assert fixed["train.py"] == originals["train.py"]
    assert "self.scaler.scale(loss).backward()" in fixed["trainer.py"]

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", "--fp16")

    _check_equivalent(result, data, "trainer.py", originals, project)


def test_the_trainer_migration_without_its_unscale_is_rejected(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECTS / "apex_hf_trainer", tmp_path / "apex_hf_trainer")
    migrated = _safe_fix(project)["trainer.py"]
    unscale = "                        self.scaler.unscale_(optimizer)\n"
    assert migrated.count(unscale) == 1
    (project / "trainer_no_unscale.py").write_text(migrated.replace(unscale, ""), encoding="utf-8")
    train = (project / "train.py").read_text(encoding="utf-8")
    (project / "train_no_unscale.py").write_text(train.replace("from trainer import", "from trainer_no_unscale import"), encoding="utf-8")

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--after", "train_no_unscale.py", "--steps", "20", "--runs", "2", "--", "--fp16")

    assert result.exit_code == 1, result.output
    assert data["runs"]["after"][0]["clips_on_scaled_gradients"] > 0
    assert any("clips gradients that a GradScaler scaled" in reason for reason in data["reasons"]), data["reasons"]


@pytest.mark.parametrize("accumulation", ["1", "2"])
def test_fgm_adversarial_training_migrated_by_the_safe_fix_trains_like_the_original(cli, monkeypatch, tmp_path, accumulation):
    """With accumulation, FGM reads the sum of the micro-batches' gradients so far (apex: unscaled,
    set aside and added back by each `scale_loss`; after: all under the same scale)."""
    project = copy_of(PROJECTS / "apex_fgm_adversarial", tmp_path / "apex_fgm_adversarial")
    originals = {path.name: path.read_text(encoding="utf-8") for path in project.glob("*.py")}
    fixed = _safe_fix(project)["run_ner.py"]
    compile(fixed, "run_ner.py", "exec")
    assert _apex_amp_uses(originals["run_ner.py"]) and _apex_amp_uses(fixed) == []
    assert "scaler.scale(loss_adv).backward()" in fixed

    result, data = run_verify(cli, monkeypatch, project, "run_ner.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", *FGM_ARGS, "--gradient_accumulation_steps", accumulation)

    _check_equivalent(result, data, "run_ner.py", originals, project)


def test_fgm_with_the_adversarial_backward_left_unscaled_is_rejected(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECTS / "apex_fgm_adversarial", tmp_path / "apex_fgm_adversarial")
    migrated = _safe_fix(project)["run_ner.py"]
    assert migrated.count("scaler.scale(loss_adv).backward()") == 1
    (project / "adv_unscaled.py").write_text(migrated.replace("scaler.scale(loss_adv).backward()", "loss_adv.backward()"), encoding="utf-8")

    result, data = run_verify(cli, monkeypatch, project, "run_ner.py", "--after", "adv_unscaled.py", "--steps", "30", "--runs", "2", "--", *FGM_ARGS)

    assert result.exit_code == 1, result.output
    assert data["verdict"] == "not equivalent" and data["reasons"], data
    assert _max_relative_difference(data) > 0.1  # measured: 27% at step 30 (the adversarial term lost)


_NORMALIZED_ATTACK = """                norm = torch.norm(param.grad)
                if norm != 0 and not torch.isnan(norm):
                    r_at = self.epsilon * param.grad / norm
                    param.data.add_(r_at)"""
_RAW_ATTACK = "                param.data.add_(self.epsilon * param.grad)  # a raw gradient step, not normalized\n"


def test_an_attack_that_reads_raw_gradients_is_refused_or_migrated_equivalently(cli, monkeypatch, tmp_path):
    """The same loop with an attack that steps by `epsilon * grad` (no normalization): after the
    migration it reads gradients multiplied by the loss scale (65536x the perturbation apex made).
    Either the safe fix refuses it, or what it writes trains like the original. (Equivalent, and
    measured so: `scaler.unscale_(optimizer)` before `fgm.attack()` and the adversarial backward
    left plain, as apex had it, where there is no gradient accumulation.)"""
    project = copy_of(PROJECTS / "apex_fgm_adversarial", tmp_path / "apex_fgm_adversarial")
    source = (project / "run_ner.py").read_text(encoding="utf-8")
    assert source.count(_NORMALIZED_ATTACK) == 1
    (project / "run_ner.py").write_text(source.replace(_NORMALIZED_ATTACK + "\n", _RAW_ATTACK), encoding="utf-8")
    if _apex_amp_uses(_safe_fix(project)["run_ner.py"]):
        return  # refused (apex.amp left in place)

    args = ["--fp16", "--do_adv", "--adv_epsilon", "50", "--learning_rate", "1e-2"]
    result, data = run_verify(cli, monkeypatch, project, "run_ner.py", "--no-unsafe-fixes", "--steps", "30", "--runs", "2", "--", *args)

    assert result.exit_code == 0 and data["verdict"] == "equivalent", data["reasons"]
