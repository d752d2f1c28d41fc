"""apex's amp module handed by keyword to a checkpoint loader that restores every keyword
argument (SwAV's `restart_from_checkpoint(..., amp=apex.amp)`): engine/state_loaders.py records
the loader, rules/apex/_state_loader_args.py puts the GradScaler in the module's place under a
new checkpoint key on both sides.

The fixture tests/fixtures/AMP101/apex_state_loader.project (main.py + utils.py) is written from
scratch in that shape.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from ampmigrate.engine.project_index import ProjectIndex, summarize
from ampmigrate.engine.state_loaders import state_loaders

from conftest import FIXTURES
from test_apex_threading import _compiles_and_is_stable, _edit, _fix, _refused

PROJECT = FIXTURES / "AMP101" / "apex_state_loader.project"

LOADER = '''
def restore(path, **kwargs):
    checkpoint = load(path)
    for key, value in kwargs.items():
        if key in checkpoint and value is not None:
            value.load_state_dict(checkpoint[key])
'''


def _copy(tmp_path: Path) -> Path:
    project = tmp_path / "p"
    shutil.copytree(PROJECT, project)
    return project


def test_the_index_records_the_loader():
    assert summarize((PROJECT / "utils.py").read_bytes(), "").state_loaders == ["restart_from_checkpoint"]
    assert summarize((PROJECT / "main.py").read_bytes(), "").state_loaders == []
    assert state_loaders(ast.parse(LOADER)) == ["restore"]


@pytest.mark.parametrize(
    "old, new",
    [
        ("value.load_state_dict(checkpoint[key])", "value.load_state_dict(checkpoint[key]); keep.append(value)"),
        ("    checkpoint = load(path)\n", "    checkpoint = load(path)\n    other(**kwargs)\n"),
        ("value.load_state_dict(checkpoint[key])", "value.load(checkpoint[key])"),
        ("for key, value in kwargs.items():", "for value in kwargs.values():"),
    ],
    ids=["value-stored", "kwargs-passed-on", "no-load-state-dict", "values-only"],
)
def test_a_loader_that_does_anything_else_with_its_values_is_not_one(old, new):
    assert old in LOADER
    assert state_loaders(ast.parse(LOADER.replace(old, new))) == []


def test_fix_hands_the_scaler_to_the_loader_under_a_new_key(tmp_path):
    project = _copy(tmp_path)
    utils_before = (project / "utils.py").read_text()
    _fix(project)
    main = (project / "main.py").read_text()
    assert "apex" not in main
    assert '    scaler = torch.amp.GradScaler("cuda", enabled=bool(args.use_fp16))\n' in main
    assert "        optimizer=optimizer,\n        scaler=scaler,\n    )\n" in main
    assert '            save_dict["scaler"] = scaler.state_dict()\n' in main
    assert (project / "utils.py").read_text() == utils_before
    _compiles_and_is_stable(project)


def test_the_migrated_loader_resumes_old_and_new_checkpoints(tmp_path):
    """What the new key buys: a checkpoint apex saved (`amp`: `{"loss_scaler0": ...}`, which
    `GradScaler.load_state_dict` rejects) is skipped by the loader, and one the migrated program
    saved restores the scale."""
    torch = pytest.importorskip("torch")
    namespace: dict = {}
    exec(compile((PROJECT / "utils.py").read_text(), "utils.py", "exec"), namespace)
    restart = namespace["restart_from_checkpoint"]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    old = tmp_path / "old.pth"
    torch.save({"amp": {"loss_scaler0": {"loss_scale": 8.0, "unskipped": 3}}}, old)
    with pytest.raises(KeyError):
        scaler.load_state_dict(torch.load(old)["amp"])  # the name apex used would fail this way
    restart(str(old), scaler=scaler)
    assert scaler.get_scale() == 2.0**10
    saved = torch.amp.GradScaler("cpu", init_scale=2.0**5)
    new = tmp_path / "new.pth"
    torch.save({"scaler": saved.state_dict()}, new)
    restart(str(new), scaler=scaler)
    assert scaler.get_scale() == 2.0**5


def test_a_save_under_another_key_refuses(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "main.py", 'save_dict["amp"] = ', 'save_dict["amp_state"] = ')
    reasons = _refused(project)
    assert "restores apex's state from the checkpoint entry `amp`, which this file does not save" in reasons["main.py"]


def test_a_taken_key_refuses(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "main.py", '"epoch": epoch + 1,', '"epoch": epoch + 1, "scaler": None,')
    reasons = _refused(project)
    assert "the checkpoint key `scaler` for the GradScaler's state is already used in this file" in reasons["main.py"]


def _monorepo(tmp_path: Path) -> Path:
    """The SwAV project as one sub-project of a repository whose other sub-project has its own
    `src/utils.py` with a function of the same name that is no loader (it keeps its values)."""
    mono = tmp_path / "mono"
    swav = mono / "swav"
    shutil.copytree(PROJECT, swav)
    (swav / "src").mkdir()
    (swav / "utils.py").rename(swav / "src" / "utils.py")
    _edit(swav / "main.py", "from utils import restart_from_checkpoint", "from src.utils import restart_from_checkpoint")
    (mono / "eval" / "src").mkdir(parents=True)
    (mono / "eval" / "src" / "utils.py").write_text(
        "KEPT = {}\n\n\ndef restart_from_checkpoint(path, **kwargs):\n    KEPT.update(kwargs)\n"
    )
    (mono / "eval" / "evaluate.py").write_text("from src.utils import restart_from_checkpoint\n")
    return mono


def test_the_loader_is_found_where_python_finds_it_whatever_the_root(tmp_path):
    """Two sub-projects each with `src/utils.py`: from the repository's root `src.utils` names
    both, but the SwAV script imports its own (its folder comes first on `sys.path`)."""
    mono = _monorepo(tmp_path)
    main = mono / "swav" / "main.py"
    index = ProjectIndex.build(str(mono), sorted(str(p) for p in mono.rglob("*.py")))
    assert index.module_for("src.utils") is None  # by name alone: two files
    assert index.module_for("src.utils", str(main)) == str(mono / "swav" / "src" / "utils.py")
    assert index.state_loader("src.utils.restart_from_checkpoint", str(main)) == str(mono / "swav" / "src" / "utils.py")
    evaluate = mono / "eval" / "evaluate.py"
    assert index.state_loader("src.utils.restart_from_checkpoint", str(evaluate)) is None  # its own keeps its values
    _fix(mono)
    migrated = main.read_text()
    assert "apex" not in migrated
    assert "        optimizer=optimizer,\n        scaler=scaler,\n    )\n" in migrated
    _compiles_and_is_stable(mono)


def test_a_cached_result_follows_the_loader_python_finds(tmp_path):
    """The cache key of main.py covers the `src/utils.py` its import resolves to, though the
    name alone fits two files: the loader turned into something else is seen on the next run."""
    import json
    import subprocess
    import sys

    mono = _monorepo(tmp_path)

    def fixable() -> bool:
        done = subprocess.run(
            [sys.executable, "-m", "ampmigrate", "check", "--exit-zero", "--select", "AMP101", "--output-format", "json", "."],
            cwd=mono, env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"},
            capture_output=True, text=True, check=True,
        )
        return all(f["fix"] is not None for f in json.loads(done.stdout) if f["filename"].endswith("main.py"))

    assert fixable()
    _edit(mono / "swav" / "src" / "utils.py", "value.load_state_dict(", "KEEP.append(value) or value.load_state_dict(")
    assert not fixable()


def test_a_loader_brought_by_a_star_import_is_followed(tmp_path):
    """`from utils import *` (SwAV's copies do this) binds the loader as the named import did."""
    project = _copy(tmp_path)
    _edit(project / "main.py", "from utils import restart_from_checkpoint", "from utils import *")
    _fix(project)
    main = (project / "main.py").read_text()
    assert "apex" not in main
    assert "        optimizer=optimizer,\n        scaler=scaler,\n    )\n" in main
    _compiles_and_is_stable(project)


@pytest.mark.parametrize(
    "star_imports",
    ["from utils import *\nfrom torchvision.models import *", "from utils import *\nfrom others import *"],
    ids=["then-a-library-star", "then-another-module-defining-it"],
)
def test_a_star_bound_loader_another_star_import_may_rebind_refuses(tmp_path, star_imports):
    project = _copy(tmp_path)
    (project / "others.py").write_text("def restart_from_checkpoint(path, **kwargs):\n    return kwargs\n")
    _edit(project / "main.py", "from utils import restart_from_checkpoint", star_imports)
    reasons = _refused(project)
    assert "apex.amp is used as a value" in reasons["main.py"]
