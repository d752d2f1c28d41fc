"""The pre-commit hooks, run by the real `pre-commit` against a committed copy of this checkout.

pre-commit clones a hook repository at a revision, so the test commits a copy of the package
(the files `pip install .` needs, as they are in the working tree now) into a temporary
repository and points a user repository's `.pre-commit-config.yaml` at it. The hook
environment is built once per test session (PRE_COMMIT_HOME in a temporary directory); it
installs ampmigrate's runtime dependencies from the package index, and must not get torch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow

# What `pip install .` of the hook repository needs.
PACKAGE_FILES = (".pre-commit-hooks.yaml", "pyproject.toml", "README.md", "ampmigrate", "rules")

LEGACY_TRAINING = '''import torch
from torch.cuda.amp import autocast


def train(model, loader, optimizer, epochs):
    scaler = torch.cuda.amp.GradScaler()
    for epoch in range(epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            with autocast():
                loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        torch.save({"model": model.state_dict(), "scaler": scaler.state_dict()}, f"ckpt-{epoch}.pt")
'''

FIXED_TRAINING = LEGACY_TRAINING.replace("from torch.cuda.amp import autocast", "from torch.amp import autocast").replace(
    "torch.cuda.amp.GradScaler()", 'torch.amp.GradScaler("cuda")'
).replace("with autocast():", 'with autocast("cuda"):')


def _git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(cwd),  # no user-level git configuration (hooks, templates, signing)
    }
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture(scope="session")
def hook_repository(tmp_path_factory) -> Dict[str, str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path_factory.mktemp("hook-repo")
    for name in PACKAGE_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, repo / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, repo / name)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "ampmigrate under test")
    home = tmp_path_factory.mktemp("pre-commit-home")
    return {"path": str(repo), "rev": _git(repo, "rev-parse", "HEAD"), "home": str(home)}


@pytest.fixture
def user_repository(tmp_path, hook_repository) -> Path:
    repo = tmp_path / "project"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / ".pre-commit-config.yaml").write_text(
        "repos:\n"
        f"  - repo: {hook_repository['path']}\n"
        f"    rev: {hook_repository['rev']}\n"
        "    hooks:\n"
        "      - id: ampmigrate\n"
        "      - id: ampmigrate-fix\n",
        encoding="utf-8",
    )
    # The hooks read the project's configuration: a V100 fleet keeps float16, so the fix hook's
    # safe fixes leave nothing behind.
    (repo / "pyproject.toml").write_text('[tool.ampmigrate]\ntarget-dtype = "float16"\n', encoding="utf-8")
    return repo


def _pre_commit(repo: Path, hook_repository, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PRE_COMMIT_HOME": hook_repository["home"], "HOME": str(repo.parent)}
    env.pop("PRE_COMMIT", None)
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_check_hook_fails_fix_hook_rewrites_then_everything_passes(user_repository, hook_repository):
    repo = user_repository
    (repo / "train.py").write_text(LEGACY_TRAINING, encoding="utf-8")
    _git(repo, "add", "-A")

    check = _pre_commit(repo, hook_repository, "ampmigrate")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "ampmigrate (legacy mixed-precision code)" in check.stdout and "Failed" in check.stdout
    # Concise findings, one a line, naming the file and the rule.
    assert "train.py:6:14: AMP202 [*] `torch.cuda.amp.GradScaler` is deprecated" in check.stdout
    assert "train.py:10:18: AMP201 [*] `torch.cuda.amp.autocast` is deprecated" in check.stdout
    assert (repo / "train.py").read_text(encoding="utf-8") == LEGACY_TRAINING  # check never writes

    fix = _pre_commit(repo, hook_repository, "ampmigrate-fix")
    assert fix.returncode == 1, fix.stdout + fix.stderr
    assert "files were modified by this hook" in fix.stdout
    assert "Fixed 3 findings in 1 file." in fix.stdout
    assert (repo / "train.py").read_text(encoding="utf-8") == FIXED_TRAINING

    _git(repo, "add", "-u")
    again = _pre_commit(repo, hook_repository)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("Passed") == 2


def test_hook_environment_has_no_torch(user_repository, hook_repository):
    (user_repository / "clean.py").write_text("print('no legacy code here')\n", encoding="utf-8")
    _git(user_repository, "add", "-A")
    result = _pre_commit(user_repository, hook_repository, "ampmigrate")
    assert result.returncode == 0, result.stdout + result.stderr
    pythons = sorted(Path(hook_repository["home"]).glob("repo*/py_env-*/bin/python"))
    assert pythons, "pre-commit built no python hook environment"
    for python in pythons:
        probe = subprocess.run(
            [
                str(python),
                "-c",
                "import importlib.util as u; import ampmigrate.cli, libcst, click, rich; "
                "print(u.find_spec('torch') is None)",
            ],
            capture_output=True,
            text=True,
        )
        assert probe.stdout.strip() == "True", probe.stdout + probe.stderr


def test_no_python_files_staged_passes_quietly(user_repository, hook_repository):
    (user_repository / "notes.md").write_text("# notes\n", encoding="utf-8")
    (user_repository / "train.py").write_text(LEGACY_TRAINING, encoding="utf-8")  # not staged
    _git(user_repository, "add", "notes.md", ".pre-commit-config.yaml")
    result = _pre_commit(user_repository, hook_repository)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("(no files to check)Skipped") == 2
    assert "AMP2" not in result.stdout + result.stderr
    assert (user_repository / "train.py").read_text(encoding="utf-8") == LEGACY_TRAINING
