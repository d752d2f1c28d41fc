"""The project a run resolves imports in is the one of the paths it is given, wherever it is run from.

A run from another folder (`ampmigrate fix ~/src/project` in a shell whose working directory is
another git repository, or no repository) took that folder as the root: the files of the project
then had no dotted names but their own, so `from pkg.model_setup import prepare` named no file of
the run and every cross-file migration refused ("`amp.scale_loss` is not used in this file").
On facebookresearch/DPR run from another repository, 0 of its 5 apex sites migrated; run from
DPR's own folder, 5. The project here is the setup-helper fixture with the helper moved into a
package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ampmigrate.cli import _naming_root, _project_root
from ampmigrate.config import Settings

from conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[1]
HELPER = FIXTURES / "AMP101" / "apex_setup_helper.project"


def _packaged_project(at: Path) -> Path:
    """The fixture with `model_setup.py` in a package `pkg` that `train.py` imports it from."""
    project = at / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("")
    shutil.copy(HELPER / "model_setup.py", project / "pkg" / "model_setup.py")
    train = (HELPER / "train.py").read_text()
    assert "from model_setup import prepare\n" in train
    (project / "train.py").write_text(train.replace("from model_setup import prepare\n", "from pkg.model_setup import prepare\n"))
    return project


def _fix(cwd: Path, target: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ampmigrate", "fix", "--no-cache", "--exit-zero", target],
        cwd=cwd,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout + done.stderr


def _texts(project: Path) -> dict:
    return {str(p.relative_to(project)): p.read_text() for p in sorted(project.rglob("*.py"))}


@pytest.fixture
def migrated_in_place(tmp_path):
    """The project fixed from its own folder: what every other working directory must give."""
    project = _packaged_project(tmp_path / "inside")
    _fix(project, ".")
    texts = _texts(project)
    assert "scaler.scale(loss).backward()" in texts["train.py"]
    assert "amp.initialize" not in texts["pkg/model_setup.py"]
    return texts


@pytest.mark.parametrize("elsewhere", ["git repository", "plain folder"])
def test_a_run_from_another_folder_migrates_as_one_from_the_project(tmp_path, migrated_in_place, elsewhere):
    project = _packaged_project(tmp_path / "target")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    if elsewhere == "git repository":
        (cwd / ".git").mkdir()
    output = _fix(cwd, str(project))
    assert "not used in this file" not in output and "not called in this file" not in output, output
    assert _texts(project) == migrated_in_place


def test_the_root_is_the_working_repository_when_the_paths_are_in_it(tmp_path, monkeypatch):
    repository = tmp_path / "repo"
    (repository / ".git").mkdir(parents=True)
    (repository / "src").mkdir()
    monkeypatch.chdir(repository / "src")
    settings = Settings(root=str(repository / "src"))
    assert _project_root(settings, ["."]) == str(repository)
    assert _project_root(settings, []) == str(repository)


def test_the_project_of_paths_elsewhere_is_their_repository(tmp_path, monkeypatch):
    here = tmp_path / "here"
    (here / ".git").mkdir(parents=True)
    monkeypatch.chdir(here)
    settings = Settings(root=str(here))
    other = tmp_path / "other"
    (other / ".git").mkdir(parents=True)
    (other / "a" / "b").mkdir(parents=True)
    (other / "a" / "b" / "m.py").write_text("")
    assert _project_root(settings, [str(other / "a" / "b" / "m.py")]) == str(other)
    assert _naming_root(settings, [str(other / "a" / "b" / "m.py")], str(other)) == str(other)
    # no repository there: no project to scan (`fix` looks only at the paths), named from their folder
    plain = tmp_path / "plain"
    (plain / "x").mkdir(parents=True)
    (plain / "y").mkdir()
    paths = [str(plain / "x"), str(plain / "y")]
    assert _project_root(settings, paths) is None
    assert _naming_root(settings, paths, None) == str(plain)
    # a folder beside the working repository's, with its name as a prefix, is not in it
    (tmp_path / "here-2").mkdir()
    assert _project_root(settings, [str(tmp_path / "here-2")]) is None
    assert _naming_root(settings, [str(tmp_path / "here-2")], None) == str(tmp_path / "here-2")
    # devices and pipes named on the command line take no part (`/dev/zero` would make it `/`)
    assert _project_root(settings, ["/dev/zero", "."]) == str(here)
    assert _naming_root(settings, ["/dev/zero"], None) == str(here)


def test_no_repository_anywhere_keeps_the_working_directory_for_paths_inside_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if any(os.path.exists(os.path.join(p, ".git")) for p in [str(tmp_path), *map(str, tmp_path.parents)]):
        pytest.skip("the temporary folder is inside a git repository")
    (tmp_path / "src").mkdir()
    settings = Settings(root=str(tmp_path))
    assert _project_root(settings, ["src"]) is None
    assert _naming_root(settings, ["src"], None) == str(tmp_path)
