"""The runs of `verify` import the ampmigrate that started them (its harness, its apex emulation's
reporting), also from a source tree or a git worktree that is not the installed copy."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

import ampmigrate
from ampmigrate.verify.isolation import with_this_ampmigrate


def test_a_child_of_verify_imports_this_ampmigrate(tmp_path):
    env = with_this_ampmigrate({"PYTHONPATH": os.pathsep.join(["/somewhere/else", ""])})
    assert env["PYTHONPATH"].split(os.pathsep) == ["/somewhere/else", str(ROOT)]  # the user's entries first
    assert with_this_ampmigrate(dict(env))["PYTHONPATH"] == env["PYTHONPATH"]  # added once
    child = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", "import ampmigrate; print(ampmigrate.__file__)"],
        cwd=tmp_path, env=with_this_ampmigrate(child), capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.stdout.strip() == ampmigrate.__file__, done.stderr


def test_an_installed_ampmigrate_is_not_put_on_the_path(monkeypatch, tmp_path):
    package = tmp_path / "lib" / "site-packages" / "ampmigrate"
    package.mkdir(parents=True)
    monkeypatch.setattr(ampmigrate, "__file__", str(package / "__init__.py"))
    assert "PYTHONPATH" not in with_this_ampmigrate({})
