"""A gradient-norm helper imported from a package that re-exports it (`from utils import
get_grad_norm`, with `utils/__init__.py` doing `from .misc import get_grad_norm`: GroupViT and
other Swin-style repositories): the index follows the re-export to the defining file
(ProjectIndex._reexported_helper), so the norm read on every micro-batch is divided by the loss
scale as for a helper imported from its own module. Fixture: AMP101/grad_norm_reexport.project."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import FIXTURES
from test_apex_threading import _compiles_and_is_stable, _edit, _fix, _index, _refused

PROJECT = FIXTURES / "AMP101" / "grad_norm_reexport.project"


def _copy(tmp_path: Path) -> Path:
    project = tmp_path / "p"
    shutil.copytree(PROJECT, project)
    return project


def test_the_index_follows_the_packages_reexport(tmp_path):
    project = _copy(tmp_path)
    index = _index(project)
    found = index.grad_norm_helper("utils.get_grad_norm", str(project / "train.py"))
    assert found == (str(project / "utils" / "misc.py"), (["parameters", "norm_type"], "norm_type"))
    assert index.grad_norm_helper("utils.seed_everything", str(project / "train.py")) is None


def test_the_norm_on_every_micro_batch_is_divided_by_the_scale(tmp_path):
    project = _copy(tmp_path)
    _fix(project)
    fixed = (project / "train.py").read_text()
    assert "log(get_grad_norm([p for group in optimizer.param_groups for p in group['params']]) / scaler.get_scale())" in (
        fixed.replace('"params"', "'params'")
    ), fixed
    assert "apex" not in fixed
    _compiles_and_is_stable(project)


def test_a_reexport_of_something_else_is_not_followed(tmp_path):
    project = _copy(tmp_path)
    # the package now re-exports a function of another module that is no norm helper
    (project / "utils" / "other.py").write_text("def get_grad_norm(parameters):\n    return 0.0\n")
    _edit(project / "utils" / "__init__.py", "from .misc import get_grad_norm, seed_everything", "from .misc import seed_everything\nfrom .other import get_grad_norm")
    reasons = _refused(project)
    assert "get_grad_norm(...)" in reasons["train.py"], reasons
