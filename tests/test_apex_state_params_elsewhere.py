"""apex's amp module handed to a checkpoint helper of another file that only saves or restores its
state (rules/apex/_state_params_elsewhere.py): the caller passes the GradScaler in its place, the
helper guards its `load_state_dict`, and both ends migrate together or neither does. The positive
shape is tests/fixtures/AMP101/amp_state_helper_elsewhere.project (its findings are checked by
test_project_index.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Dict

from conftest import FIXTURES, make_settings

from ampmigrate.engine.project_index import ProjectIndex
from ampmigrate.engine.runner import Job, run_files, write_changes

PROJECT = FIXTURES / "AMP101" / "amp_state_helper_elsewhere.project"


def _run(root: Path, mode: str = "check"):
    files = sorted(str(p) for p in root.rglob("*.py"))
    index = ProjectIndex.build(str(root), files)
    result = run_files(files, make_settings({"select": ["AMP1"]}), Job(mode), jobs=1, index=index)
    if mode == "fix":
        assert not write_changes(result)
    return result


def _copy(tmp_path: Path, changes: Dict[str, tuple] = {}) -> Path:
    root = tmp_path / "p"
    shutil.copytree(PROJECT, root)
    for name, (old, new) in changes.items():
        text = (root / name).read_text()
        assert old in text
        (root / name).write_text(text.replace(old, new))
    return root


def _reasons(result, name: str):
    return [f.no_fix_reason for f in result.findings if Path(f.path).name == name]


def test_both_ends_migrate_and_a_second_fix_changes_nothing(tmp_path):
    root = _copy(tmp_path)
    result = _run(root, "fix")
    assert not result.errors and not result.findings
    train, state = (root / "train.py").read_text(), (root / "state.py").read_text()
    assert "load_checkpoint(args.resume, model, amp=scaler)" in train and "state.track_amp_state(scaler)" in train
    assert "apex" not in train
    # `amp.state_dict()` reads a GradScaler alike; the load is guarded against apex's layout
    assert "        self.amp_state = amp.state_dict()\n" in state
    assert '        if "scale" in checkpoint["amp"]:  # a GradScaler state' in state
    for path in root.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")
    assert sum(r.fixed for r in result.results if Path(r.path).name == "state.py") == 2
    again = _run(root, "fix")
    assert not again.findings and not any(r.new_text for r in again.results)


def test_a_helper_reading_master_params_keeps_both_ends(tmp_path):
    root = _copy(tmp_path, {"state.py": ("        self.amp_state = amp.state_dict()\n", "        self.amp_state = amp.state_dict()\n        self.params = list(amp.master_params(None))\n")})
    result = _run(root)
    assert any("`TrainingState.track_amp_state()` (state.py) reads `amp.master_params(...)`" in r for r in _reasons(result, "train.py"))
    assert all(r and "master_params" in r for r in _reasons(result, "state.py"))
    before = {p.name: p.read_text() for p in root.rglob("*.py")}
    _run(root, "fix")
    assert {p.name: p.read_text() for p in root.rglob("*.py")} == before


def test_another_caller_left_alone_keeps_both_ends(tmp_path):
    root = _copy(tmp_path)
    o3 = (root / "train.py").read_text().replace('opt_level="O1"', 'opt_level="O3"')
    (root / "evaluate.py").write_text(o3)
    result = _run(root)
    assert any("evaluate.py also hands apex's amp module to `load_checkpoint()` and is not migrated" in r for r in _reasons(result, "train.py"))
    assert all(r and "is not migrated" in r for r in _reasons(result, "state.py"))


def test_two_scripts_handing_apex_to_the_helpers_and_a_relay_migrate_together(tmp_path):
    """Two training scripts hand apex's module to state.py's helpers, one through a relay of
    state.py that only hands it on to `load_checkpoint` (from a nested function, as a signal
    handler would): each side plans the others, which plan it again, and the group still gets one
    answer, here that all migrate."""
    root = _copy(tmp_path)
    relay = (
        "\n\ndef resume_later(path, model, amp=None):\n"
        "    def handler():\n        load_checkpoint(path, model, amp=amp)\n    return handler\n"
    )
    (root / "state.py").write_text((root / "state.py").read_text() + relay)
    train = (root / "train.py").read_text()
    second = train.replace("from state import TrainingState, load_checkpoint", "from state import TrainingState, resume_later")
    second = second.replace("        load_checkpoint(args.resume, model, amp=amp)\n", "        resume_later(args.resume, model, amp)()\n")
    (root / "finetune.py").write_text(second)
    result = _run(root, "fix")
    assert not result.errors and not result.findings, [(f.path, f.no_fix_reason) for f in result.findings]
    finetune = (root / "finetune.py").read_text()
    assert "        resume_later(args.resume, model, scaler)()\n" in finetune and "state.track_amp_state(scaler)" in finetune
    assert "apex" not in finetune + (root / "train.py").read_text()
    again = _run(root, "fix")
    assert not again.findings and not any(r.new_text for r in again.results)


def test_a_static_method_is_matched_by_keyword_only(tmp_path):
    static = (
        "    @staticmethod\n    def save(model, amp):\n        return {\"model\": model.state_dict(), \"amp\": amp.state_dict()}\n\n"
        "    def track_amp_state(self, amp):"
    )
    root = _copy(tmp_path, {"state.py": ("    def track_amp_state(self, amp):", static)})
    train = (root / "train.py").read_text()
    (root / "train.py").write_text(train.replace("    state.track_amp_state(amp)\n", "    TrainingState.save(model, amp)\n"))
    assert any("apex.amp is used as a value" in r for r in _reasons(_run(root), "train.py"))
    (root / "train.py").write_text(train.replace("    state.track_amp_state(amp)\n", "    TrainingState.save(model, amp=amp)\n"))
    assert not [r for r in _reasons(_run(root), "train.py") if r]


def test_a_name_two_imported_files_define_is_not_followed(tmp_path):
    root = _copy(tmp_path)
    (root / "other_state.py").write_text("def load_checkpoint(path, model, amp=None):\n    amp.load_state_dict(path)\n")
    train = (root / "train.py").read_text()
    (root / "train.py").write_text(train.replace("from state import", "import other_state\nfrom state import"))
    assert any("apex.amp is used as a value" in r for r in _reasons(_run(root), "train.py"))
