"""apex's amp module passed across files (rules/apex/cross_module.py, the index's apex records).

The positive shapes are multi-file fixtures (tests/fixtures/AMP101/*.project, run by
test_project_index.py); here: the index records, the messages naming the other file, what is
left alone, and that `fix` edits neither side while the scaler cannot be threaded.
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
        assert "comes from main.py" in crossed[0].no_fix_reason


def test_a_parameter_no_file_passes_apex_amp_is_left_alone(tmp_path):
    shutil.copy(TRAINER / "trainer.py", tmp_path / "trainer.py")
    (tmp_path / "main.py").write_text("from trainer import train\nimport mylib\ntrain(1, 2, mylib.amp)\n")
    assert _check(tmp_path).findings == []


def test_fix_edits_neither_side(tmp_path):
    project = tmp_path / "p"
    shutil.copytree(TRAINER, project)
    before = {p.name: p.read_bytes() for p in project.glob("*.py")}
    subprocess.run(
        [sys.executable, "-m", "ampmigrate", "fix", str(project)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        check=False,
    )
    assert {p.name: p.read_bytes() for p in project.glob("*.py")} == before


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
