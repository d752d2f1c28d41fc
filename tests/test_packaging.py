"""The wheel as a user gets it: a fresh virtual environment without torch.

`check`/`fix` must run there (a lint-only CI job or pre-commit hook must not download PyTorch),
the catalogue must come from inside the wheel, and `verify` must explain what it needs.
"""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow  # builds a wheel and a fresh virtual environment

LEGACY = "import torch\nwith torch.cuda.amp.autocast():\n    pass\n"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("ampmigrate-*.whl")
    return path


@pytest.fixture(scope="module")
def torchless_env(tmp_path_factory, wheel) -> Path:
    env = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    python = env / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
        check=True,
        capture_output=True,
    )
    return env


def test_wheel_ships_the_catalogue(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "ampmigrate/_catalogue/AMP201.toml" in names
    requires = [
        line
        for line in zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode().splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert not any("torch" in line for line in requires), requires


def test_check_and_fix_work_without_torch(torchless_env, tmp_path):
    python = torchless_env / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True)
    assert probe.returncode != 0, "torch must not be installed in this environment"
    target = tmp_path / "legacy.py"
    target.write_text(LEGACY)
    exe = torchless_env / "bin" / "ampmigrate"
    checked = subprocess.run([str(exe), "check", str(target), "--output-format", "concise"], capture_output=True, text=True, cwd=tmp_path)
    assert checked.returncode == 1 and "AMP201" in checked.stdout, checked.stderr
    fixed = subprocess.run([str(exe), "fix", str(target)], capture_output=True, text=True, cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert 'torch.amp.autocast("cuda")' in target.read_text()
    listing = subprocess.run([str(exe), "rule", "--all"], capture_output=True, text=True, cwd=tmp_path)
    assert listing.returncode == 0 and "AMP201" in listing.stdout
    where = subprocess.run(
        [str(python), "-c", "from ampmigrate.catalogue import catalogue_dir; print(catalogue_dir())"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert "site-packages/ampmigrate/_catalogue" in where.stdout
    imported = subprocess.run(
        [str(python), "-c", "import sys, ampmigrate.cli, ampmigrate.engine.pipeline; print('torch' in sys.modules)"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert imported.stdout.strip() == "False"


def test_verify_without_torch_says_what_to_install(torchless_env, tmp_path):
    (tmp_path / "train.py").write_text(LEGACY)
    exe = torchless_env / "bin" / "ampmigrate"
    result = subprocess.run([str(exe), "verify", "train.py"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode != 0
    assert "ampmigrate[verify]" in result.stderr
