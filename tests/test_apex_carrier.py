"""apex's amp module carried on an object (`args.amp = amp`, UER-py's shape;
rules/apex/_amp_carrier.py): migrated where the file stores and reads it itself, refused where the
attribute's route may cross files (the project index's records)."""

from __future__ import annotations

from pathlib import Path

from conftest import FIXTURES, make_settings

from ampmigrate.engine.apex_attrs import apex_attr_loads
from ampmigrate.engine.project_index import ProjectIndex
from ampmigrate.engine.runner import Job, run_files, write_changes

CARRIER = (FIXTURES / "AMP101" / "carrier_args_amp.py").read_text(encoding="utf-8")

READER = '''\
def train_step(args, model, optimizer, loss):
    with args.amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
'''


def _run(root: Path, mode: str):
    files = sorted(str(p) for p in root.rglob("*.py"))
    index = ProjectIndex.build(str(root), files)
    result = run_files(files, make_settings({"select": ["AMP1"]}), Job(mode), jobs=1, index=index)
    if mode == "fix":
        assert not write_changes(result)
    return result


def _write(root: Path, files: dict) -> Path:
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_the_byte_scan_records_the_attributes_apex_functions_are_read_from():
    raw = b"with args.amp.scale_loss(l, o) as s:\n    pass\nself.amp_handle . state_dict()\nx.damp.step()\nx.lamp.y()\n"
    assert apex_attr_loads(raw) == ["amp", "amp_handle"]


def test_two_programs_carrying_their_own_module_are_both_migrated(tmp_path):
    root = _write(tmp_path / "p", {"run_a.py": CARRIER, "run_b.py": CARRIER})
    _run(root, "fix")
    for name in ("run_a.py", "run_b.py"):
        text = (root / name).read_text(encoding="utf-8")
        assert "args.amp_scaler = scaler" in text and "with args.amp." not in text and "from apex" not in text, name
    assert _run(root, "check").findings == []


def test_a_file_reading_the_attribute_without_storing_it_keeps_the_route(tmp_path):
    root = _write(tmp_path / "p", {"run_a.py": CARRIER, "steps.py": READER})
    result = _run(root, "fix")
    assert (root / "run_a.py").read_text(encoding="utf-8") == CARRIER  # renaming `.amp` would break steps.py
    reasons = {f.no_fix_reason for f in result.findings if Path(f.path).name == "run_a.py"}
    assert any("steps.py reads `.amp` without storing it" in (r or "") for r in reasons), reasons


def test_two_carrying_files_where_one_imports_the_other_are_left_alone(tmp_path):
    importing = "import run_a\n" + CARRIER
    root = _write(tmp_path / "p", {"run_a.py": CARRIER, "run_b.py": importing})
    result = _run(root, "fix")
    assert (root / "run_a.py").read_text(encoding="utf-8") == CARRIER
    assert (root / "run_b.py").read_text(encoding="utf-8") == importing
    reasons = {f.no_fix_reason for f in result.findings}
    assert any("one file imports the other" in (r or "") for r in reasons), reasons


def test_a_store_of_something_else_in_the_attribute_elsewhere_keeps_the_route(tmp_path):
    other = "def setup(args, handle):\n    args.amp = handle\n"
    root = _write(tmp_path / "p", {"run_a.py": CARRIER, "setup.py": other})
    _run(root, "fix")
    assert (root / "run_a.py").read_text(encoding="utf-8") == CARRIER
