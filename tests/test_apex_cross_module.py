"""apex's amp module passed across files (rules/apex/cross_module.py, the index's apex records).

The positive shapes are multi-file fixtures (tests/fixtures/AMP101/*.project, run by
test_project_index.py); here: the index records, the messages naming the other file, what is
left alone, and a training function of another file taking the GradScaler in apex's place
(rules/apex/_passed_training.py): both sides migrate, or neither does.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from ampmigrate.engine.cache import Cache
from ampmigrate.engine.project_index import ProjectIndex, summarize
from ampmigrate.engine.runner import Job, run_files

from conftest import FIXTURES, make_settings

ROOT = Path(__file__).resolve().parents[1]
TRAINER = FIXTURES / "AMP101" / "amp_passed_to_trainer.project"
METHOD = FIXTURES / "AMP101" / "amp_passed_to_method.project"


def _check(root: Path, cache=None):
    files = sorted(str(p) for p in root.rglob("*.py"))
    index = ProjectIndex.build(str(root), files, cache_path=cache.index_path if cache is not None else None)
    return run_files(files, make_settings({"select": ["AMP1"]}), Job("check"), jobs=1, cache=cache, index=index)


def test_index_records_who_passes_apex_amp_and_who_scales_with_it():
    main = summarize((TRAINER / "main.py").read_bytes(), "")
    assert main.apex_amp_passed_to == [("train", 8)]
    assert main.apex_amp_params == {}
    trainer = summarize((TRAINER / "trainer.py").read_bytes(), "")
    assert trainer.apex_amp_params == {"train": ["amp"]}
    assert trainer.apex_amp_passed_to == []  # names no apex import: its `amp` is a parameter
    engine = summarize((METHOD / "engine.py").read_bytes(), "")
    assert engine.apex_amp_params == {"Trainer.step": ["amp"]}


def test_a_non_apex_amp_argument_is_not_recorded():
    raw = b"from mylib import amp\ntrain(model, opt, amp)\n"
    assert summarize(raw, "").apex_amp_passed_to == []


def test_messages_name_the_file_the_amp_module_comes_from():
    for project, path in ((TRAINER, "trainer.py"), (METHOD, "engine.py")):
        crossed = [f for f in _check(project).findings if f.path.endswith(path)]
        assert len(crossed) == 1
        assert "(apex's amp passed in from main.py)" in crossed[0].message
    # a method (`engine.step(batch, amp=amp)`) is left alone, with the reason
    method = [f for f in _check(METHOD).findings if f.path.endswith("engine.py")][0]
    assert method.fix is None and "comes from main.py" in method.no_fix_reason


def test_a_parameter_no_file_passes_apex_amp_is_left_alone(tmp_path):
    shutil.copy(TRAINER / "trainer.py", tmp_path / "trainer.py")
    (tmp_path / "main.py").write_text("from trainer import train\nimport mylib\ntrain(1, 2, mylib.amp)\n")
    assert _check(tmp_path).findings == []


def _fix(project: Path) -> dict:
    subprocess.run(
        [sys.executable, "-m", "ampmigrate", "fix", "--no-cache", "--select", "AMP1", str(project)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        check=False,
    )
    return {str(p.relative_to(project)): p.read_text() for p in project.rglob("*.py")}


def test_fix_passes_the_scaler_in_apex_place_to_the_training_function(tmp_path):
    """rules/apex/_passed_training.py: main.py makes the GradScaler and passes it where it passed
    apex's module; the trainer's parameter takes it, renamed."""
    project = tmp_path / "p"
    shutil.copytree(TRAINER, project)
    after = _fix(project)
    assert "apex" not in after["main.py"] + after["trainer.py"]
    assert 'scaler = torch.amp.GradScaler("cuda")\ntrain(model, opt, scaler)\n' in after["main.py"]
    assert "def train(model, opt, scaler):\n" in after["trainer.py"]
    assert '        with torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled()):\n' in after["trainer.py"]
    assert "        scaler.scale(loss).backward()\n        scaler.step(opt)\n        scaler.update()\n" in after["trainer.py"]
    assert _fix(project) == after  # a second fix changes nothing


def _stereo_shape(project: Path) -> None:
    """stereo-transformer's shape: apex only under a flag (`amp = None` otherwise), the training
    function tests `amp is not None`."""
    (project / "utils").mkdir(parents=True)
    (project / "utils" / "__init__.py").write_text("")
    (project / "utils" / "train.py").write_text(
        "import torch\n\n\n"
        "def train_one_epoch(model, loader, optimizer, max_norm=0.0, amp=None):\n"
        "    for inputs, targets in loader:\n"
        "        loss = torch.nn.functional.mse_loss(model(inputs), targets)\n"
        "        optimizer.zero_grad()\n"
        "        if amp is not None:\n"
        "            with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
        "                scaled_loss.backward()\n"
        "        else:\n"
        "            loss.backward()\n"
        "        if max_norm > 0:\n"
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
        "        optimizer.step()\n"
    )
    (project / "main.py").write_text(
        "import torch\n\nfrom utils.train import train_one_epoch\n\n\n"
        "def main(args, model, loader):\n"
        "    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
        "    if args.apex:\n"
        "        from apex import amp\n"
        "        model, optimizer = amp.initialize(model, optimizer, opt_level='O1')\n"
        "    else:\n"
        "        amp = None\n"
        "    for epoch in range(args.epochs):\n"
        "        train_one_epoch(model, loader, optimizer, args.clip_max_norm, amp)\n"
    )


def test_a_flagged_setup_and_a_presence_test_in_the_training_function(tmp_path):
    project = tmp_path / "p"
    _stereo_shape(project)
    after = _fix(project)
    both = after["main.py"] + after["utils/train.py"]
    assert "from apex" not in both and "amp.initialize" not in both and "amp.scale_loss" not in both
    assert "    scaler = torch.amp.GradScaler('cuda', enabled=bool(args.apex))\n" in after["main.py"]
    assert "        train_one_epoch(model, loader, optimizer, args.clip_max_norm, scaler)\n" in after["main.py"]
    train = after["utils/train.py"]
    assert "def train_one_epoch(model, loader, optimizer, max_norm=0.0, scaler=None):\n" in train
    # `amp` was None exactly where the caller's scaler is disabled
    assert "        if scaler.is_enabled():\n            scaler.scale(loss).backward()\n" in train
    assert "            scaler.unscale_(optimizer)\n            torch.nn.utils.clip_grad_norm_" in train
    assert "        scaler.step(optimizer)\n        scaler.update()\n" in train
    for text in after.values():
        compile(text, "<fixed>", "exec")
    assert _fix(project) == after


def test_a_call_without_the_module_stops_both_sides(tmp_path):
    """Another file calls the training function without apex's module: it would now get no
    GradScaler (`scaler.is_enabled()` on None), so neither side changes."""
    project = tmp_path / "p"
    _stereo_shape(project)
    (project / "evaluate.py").write_text("from utils.train import train_one_epoch\n\n\ndef again(m, l, o):\n    train_one_epoch(m, l, o)\n")
    before = {str(p.relative_to(project)): p.read_text() for p in project.rglob("*.py")}
    reasons = {f.path.rsplit("/", 1)[-1]: f.no_fix_reason for f in _check(project).findings if f.code == "AMP101"}
    assert "evaluate.py calls `train_one_epoch()` (utils/train.py) at line 5 without apex's amp module" in reasons["train.py"]
    assert "evaluate.py calls `train_one_epoch()`" in reasons["main.py"]
    assert _fix(project) == before


def test_a_training_function_the_fix_cannot_follow_stops_the_caller(tmp_path):
    """The function hands apex's module on (`helper(amp)`): no fix there, so the caller keeps apex too."""
    project = tmp_path / "p"
    _stereo_shape(project)
    train = project / "utils" / "train.py"
    train.write_text(train.read_text() + "        log_scale(amp)\n")
    before = {str(p.relative_to(project)): p.read_text() for p in project.rglob("*.py")}
    reasons = {f.path.rsplit("/", 1)[-1]: f.no_fix_reason for f in _check(project).findings if f.code == "AMP101"}
    assert "cannot take the GradScaler" in reasons["main.py"]
    assert _fix(project) == before


def test_amp_passed_to_a_function_of_the_same_file(tmp_path):
    (tmp_path / "train.py").write_text(
        "def train(model, opt, amp):\n"
        "    loss = model(1)\n"
        "    with amp.scale_loss(loss, opt) as scaled:\n"
        "        scaled.backward()\n"
        "    clip(amp.master_params(opt), 1.0)\n"
        "    opt.step()\n"
        "\n"
        "\n"
        "def main(model, opt):\n"
        "    from apex import amp\n"
        "    model, opt = amp.initialize(model, opt)\n"
        "    train(model, opt, amp)\n"
    )
    findings = _check(tmp_path).findings
    # The in-file migration follows the module into `train` (rules/apex/_amp_refs.py); this
    # rule stays out of it, so each site is reported once, with the fix.
    assert not [f for f in findings if "passed in" in f.message]
    assert {(f.location.row, f.code) for f in findings if f.location.row in (3, 5)} == {(3, "AMP101"), (5, "AMP101")}
    assert all(f.fix is not None for f in findings if f.location.row in (3, 5))


def test_the_trainer_result_follows_the_caller_through_the_cache(tmp_path):
    project = tmp_path / "p"
    shutil.copytree(TRAINER, project)
    cache = Cache(str(tmp_path / "cache"), "key")

    def crossed():
        return [f.location.row for f in _check(project, cache).findings if f.path.endswith("trainer.py")]

    assert crossed() == [5]
    assert crossed() == [5]  # from the cache
    main = project / "main.py"
    main.write_text(main.read_text().replace("train(model, opt, amp)", "train(model, opt, None)"))
    assert crossed() == []


def test_a_function_other_files_import_is_not_followed(tmp_path):
    """`train` is imported by another file of the run, whose calls may pass anything (or `amp=`
    by name): the module is not followed into it, and its `amp.scale_loss` keeps no fix."""
    (tmp_path / "train.py").write_text(
        "def train(model, opt, amp):\n"
        "    loss = model(1)\n"
        "    with amp.scale_loss(loss, opt) as scaled:\n"
        "        scaled.backward()\n"
        "    opt.step()\n"
        "\n"
        "\n"
        "def main(model, opt):\n"
        "    from apex import amp\n"
        "    model, opt = amp.initialize(model, opt)\n"
        "    train(model, opt, amp)\n"
    )
    (tmp_path / "finetune.py").write_text("from train import train\n\n\ndef run(model, opt, amp):\n    train(model, opt, amp=amp)\n")
    findings = [f for f in _check(tmp_path).findings if f.path.endswith("train.py") and f.location.row == 3]
    assert findings and all(f.fix is None for f in findings)


def test_a_training_function_its_own_file_calls_stops_both_sides(tmp_path):
    project = tmp_path / "p"
    _stereo_shape(project)
    train = project / "utils" / "train.py"
    train.write_text(train.read_text() + "\n\ndef smoke(model, loader, optimizer):\n    train_one_epoch(model, loader, optimizer)\n")
    before = {str(p.relative_to(project)): p.read_text() for p in project.rglob("*.py")}
    reasons = {f.path.rsplit("/", 1)[-1]: f.no_fix_reason for f in _check(project).findings if f.code == "AMP101"}
    assert "is also used in its own file (line 19), where no GradScaler is made" in reasons["train.py"]
    assert _fix(project) == before
