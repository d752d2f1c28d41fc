"""apex's amp module reached through `from library import *` (engine/apex_star.py).

The positive shapes are multi-file fixtures (tests/fixtures/AMP101/star_import_*.project, run by
test_project_index.py); here: what `fix` makes of them (the importer migrated, the provider's
import gone only when every star user migrates), and the shapes left unresolved: `__all__`
without the name, a later star import of an outside module, a provider whose `amp` is
torch.cuda.amp, a module of the chain rebinding it, the file rebinding it.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path
from typing import Dict

import libcst as cst
import pytest
from conftest import FIXTURES, make_settings

from ampmigrate.engine import apex_star
from ampmigrate.engine.names import NameIndex
from ampmigrate.engine.project_index import ProjectIndex, summarize
from ampmigrate.engine.runner import Job, run_files, write_changes

LIBRARY = FIXTURES / "AMP101" / "star_import_library.project"
CHAIN = FIXTURES / "AMP101" / "star_import_chain.project"

TRAIN = textwrap.dedent(
    """\
    from library import *


    def main(model, optimizer, loader):
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
    """
)
PROVIDER = "import torch\nfrom apex import amp\n"


def _write(root: Path, files: Dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def _run(root: Path, mode: str = "check", select=("AMP1",)):
    files = sorted(str(p) for p in root.rglob("*.py"))
    index = ProjectIndex.build(str(root), files)
    job = Job(mode) if mode == "check" else Job("fix")
    result = run_files(files, make_settings({"select": list(select)}), job, jobs=1, index=index)
    if mode == "fix":
        assert not write_changes(result)
    return result


def _findings(result, name: str):
    return [f for f in result.findings if Path(f.path).name == name]


def _copy(source: Path, tmp_path: Path) -> Path:
    project = tmp_path / "p"
    shutil.copytree(source, project)
    return project


# ------------------------------------------------------------------------------- the index
def test_the_index_records_the_names_an_apex_import_binds_at_top_level():
    raw = b"import torch\nfrom apex import amp\nimport apex.amp as apex_amp\ndef f():\n    from apex import amp as local\n"
    assert summarize(raw, "").apex_star_exports == ["amp", "apex_amp"]
    assert summarize(b"from torch.cuda import amp\n", "").apex_star_exports == []


def test_star_bound_follows_the_chain_in_order(tmp_path):
    root = _write(tmp_path, {"library.py": PROVIDER, "train.py": TRAIN})
    files = sorted(str(p) for p in root.rglob("*.py"))
    index = ProjectIndex.build(str(root), files)
    assert index.star_bound(str(root / "train.py")) == {"amp": "apex.amp", "torch": "torch"}
    assert apex_star.star_providers(index, str(root / "train.py")) == [str(root / "library.py")]
    assert index.star_bound(str(root / "library.py")) == {}
    assert index.dependency_key(str(root / "train.py"))


def test_the_resolver_takes_the_star_bound_names_only_where_the_file_binds_none():
    module = cst.parse_module("from library import *\namp.initialize(m)\ndef f(amp):\n    amp.initialize(m)\n")
    names = NameIndex(module, {"amp": "apex.amp"})
    loads = [n for n in names.loads if n.value == "amp"]
    assert [names.qualified_names(n) for n in loads] == [frozenset({"apex.amp"}), frozenset()]


# ------------------------------------------------------------------------------- fix
def test_fix_migrates_the_importer_and_drops_the_provider_import(tmp_path):
    project = _copy(LIBRARY, tmp_path)
    _run(project, "fix")
    train = (project / "train.py").read_text()
    library = (project / "library.py").read_text()
    assert not re.search(r"\bamp\.(?!GradScaler)", train) and "scaler = torch.amp.GradScaler(" in train
    assert "scaler.scale(loss / accumulate).backward()" in train
    # `nn` comes from the star import too: its clip reads the gradients, unscaled first
    assert "scaler.unscale_(optimizer)\n            nn.utils.clip_grad_norm_(" in train
    assert "import torch\n" not in train  # `torch` comes from the star import already
    assert "apex" not in library
    for path in project.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")
    again = _run(project, "fix")
    assert not again.findings and not any(r.new_text for r in again.results)


def test_fix_of_a_chain_keeps_an_import_that_all_lists(tmp_path):
    project = _copy(CHAIN, tmp_path)
    _run(project, "fix")
    train = (project / "code" / "train.py").read_text()
    assert not re.search(r"\bamp\.(?!GradScaler)", train) and "scaler.scale(loss).backward()" in train
    common = (project / "code" / "common.py").read_text()
    assert "from apex import amp" in common  # `__all__` names it: AMP111 says why it stays


def test_the_provider_import_stays_while_a_star_user_is_not_migrated(tmp_path):
    o3 = TRAIN.replace('opt_level="O1"', 'opt_level="O3"')
    root = _write(tmp_path, {"library.py": PROVIDER, "train.py": TRAIN, "eval.py": o3})
    result = _run(root)
    (provider,) = _findings(result, "library.py")
    assert provider.fix is None and "eval.py uses `amp` through `*` imports and is not migrated" in provider.no_fix_reason
    _run(root, "fix")
    assert "from apex import amp" in (root / "library.py").read_text()
    assert "amp.initialize" not in (root / "train.py").read_text()


FALLBACK_PROVIDER = "import torch\ntry:\n    from apex import amp\nexcept ImportError:\n    amp = None\n"


def test_a_none_fallback_in_the_except_of_the_import_leaves_apex_amp(tmp_path):
    """flair's trainers (ACE): `try: from apex import amp / except ImportError: amp = None`, then
    `from .trainer import *` in the sibling trainers."""
    root = _write(tmp_path, {"library.py": FALLBACK_PROVIDER, "train.py": TRAIN})
    index = ProjectIndex.build(str(root), sorted(str(p) for p in root.rglob("*.py")))
    assert index.star_bound(str(root / "train.py"))["amp"] == "apex.amp"
    assert len(_findings(_run(root), "train.py")) == 2


def test_another_fallback_in_the_except_leaves_it_unresolved(tmp_path):
    provider = FALLBACK_PROVIDER.replace("    amp = None\n", "    from torch.cuda import amp\n")
    _unresolved(tmp_path, {"library.py": provider, "train.py": TRAIN})


def test_the_provider_migrates_its_own_uses_and_keeps_the_import_for_a_star_user_left_alone(tmp_path):
    own = TRAIN.replace("from library import *\n", FALLBACK_PROVIDER)
    o3 = TRAIN.replace('opt_level="O1"', 'opt_level="O3"')
    root = _write(tmp_path, {"library.py": own, "eval.py": o3})
    found = _findings(_run(root), "library.py")
    assert sorted(f.location.row for f in found) == [3, 9, 13]  # the import, `initialize`, `scale_loss`
    init = next(f for f in found if f.location.row == 9)
    assert init.fix is not None and "the apex import stays: other files reach it through `*` imports" in init.fix.message
    _run(root, "fix")
    library = (root / "library.py").read_text()
    assert "amp.initialize" not in library and "scaler.scale(loss).backward()" in library
    assert FALLBACK_PROVIDER in library  # eval.py still reads `amp` through its star import
    assert (root / "eval.py").read_text() == o3
    again = _run(root, "fix")
    assert not any(r.new_text for r in again.results)
    (left,) = _findings(again, "library.py")  # the import, with the reason it stays
    assert left.fix is None and "eval.py uses `amp` through `*` imports and is not migrated" in left.no_fix_reason


# ------------------------------------------------------------------------------- unresolved
def _unresolved(tmp_path, files: Dict[str, str]):
    root = _write(tmp_path, files)
    result = _run(root)
    assert _findings(result, "train.py") == []
    return result


def test_all_without_the_name_leaves_it_unresolved(tmp_path):
    result = _unresolved(tmp_path, {"library.py": PROVIDER + '__all__ = ["torch"]\n', "train.py": TRAIN})
    (provider,) = _findings(result, "library.py")
    assert provider.fix is None and "train.py may use `amp`" in provider.no_fix_reason


def test_a_later_star_import_of_an_outside_module_may_rebind_it(tmp_path):
    train = TRAIN.replace("from library import *\n", "from library import *\nfrom albumentations import *\n")
    _unresolved(tmp_path, {"library.py": PROVIDER, "train.py": train})


def test_an_earlier_star_import_of_an_outside_module_does_not(tmp_path):
    train = TRAIN.replace("from library import *\n", "from albumentations import *\nfrom library import *\n")
    root = _write(tmp_path, {"library.py": PROVIDER, "train.py": train})
    assert len(_findings(_run(root), "train.py")) == 2


def test_a_provider_whose_amp_is_torch_cuda_amp(tmp_path):
    _unresolved(tmp_path, {"library.py": "import torch\nfrom torch.cuda import amp\n", "train.py": TRAIN})


def test_a_module_of_the_chain_rebinding_it(tmp_path):
    train = TRAIN.replace("from library import *\n", "from library import *\nfrom utils import *\n")
    _unresolved(tmp_path, {"library.py": PROVIDER, "utils.py": "from torch.cuda import amp\n", "train.py": train})


def test_a_conditional_rebinding_in_the_provider(tmp_path):
    provider = PROVIDER + "if os.environ.get('NO_APEX'):\n    amp = None\n"
    _unresolved(tmp_path, {"library.py": "import os\n" + provider, "train.py": TRAIN})


def test_the_file_rebinding_it(tmp_path):
    train = TRAIN.replace("from library import *\n", "from library import *\n\namp = None\n")
    _unresolved(tmp_path, {"library.py": PROVIDER, "train.py": train})


def test_a_name_assigned_through_global_in_the_provider(tmp_path):
    provider = PROVIDER + "def reset():\n    global amp\n    amp = None\n"
    _unresolved(tmp_path, {"library.py": provider, "train.py": TRAIN})


def test_a_cycle_of_star_imports(tmp_path):
    """After its apex import, library.py star-imports the half-run train.py back: unknown. Before
    it, the apex import binds last, as Python runs it."""
    root = _write(tmp_path, {"library.py": PROVIDER + "from train import *\n", "train.py": TRAIN})
    assert _findings(_run(root), "train.py") == []
    (root / "library.py").write_text("from train import *\n" + PROVIDER)
    assert len(_findings(_run(root), "train.py")) == 2


def test_a_run_beside_a_pending_index_finds_them_too(tmp_path):
    """A cold run of 64 files or more screens every file before the index is built: a file with
    a star import is flagged then, and screened again once the index says what it binds."""
    project = _copy(LIBRARY, tmp_path)
    for i in range(70):
        (project / f"pad_{i}.py").write_text(f"x = {i}\n")
    from ampmigrate.engine.index_builder import IndexBeside

    files = sorted(str(p) for p in project.rglob("*.py"))
    index = IndexBeside.start(str(project), files, None, 0)
    try:
        result = run_files(files, make_settings({"select": ["AMP1"]}), Job("check"), jobs=1, index=index)
    finally:
        index.close()
    assert len(_findings(result, "train.py")) == 2


def test_cache_keys_follow_both_ends(tmp_path):
    """The importer's result depends on the chain's files, the provider's on its star users."""
    root = _write(tmp_path, {"library.py": PROVIDER, "train.py": TRAIN, "other.py": "x = 1\n"})

    def keys():
        files = sorted(str(p) for p in root.rglob("*.py"))
        index = ProjectIndex.build(str(root), files)
        return {Path(p).name: index.dependency_key(p) for p in files}

    before = keys()
    (root / "train.py").write_text(TRAIN.replace("opt_level=\"O1\"", "opt_level=\"O2\""))
    after_user = keys()
    assert after_user["library.py"] != before["library.py"]
    (root / "library.py").write_text(PROVIDER + "SEED = 1\n")
    assert keys()["train.py"] != after_user["train.py"]
    assert keys()["other.py"] == before["other.py"]


def test_a_file_importing_amp_itself_sees_torch_from_its_star_import(tmp_path):
    """`from apex import amp` in the file and `from util import *` for torch (a package whose
    `__all__` lists it): the clip on every micro-step is torch's own, so it is kept exact with its
    threshold scaled, as where the file imports torch itself."""
    train = textwrap.dedent(
        """\
        from apex import amp
        from util import *


        def main(model, optimizer, loader, accumulate):
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for i, (x, y) in enumerate(loader):
                loss = torch.nn.functional.mse_loss(model(x), y) / accumulate
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
                if (i + 1) % accumulate == 0:
                    optimizer.step()
                    optimizer.zero_grad()
        """
    )
    root = _write(tmp_path, {"train.py": train, "util/__init__.py": "import torch\n\n__all__ = ['torch']\n"})
    fixed = (_run(root, "fix") and (root / "train.py").read_text(encoding="utf-8"))
    assert "clip_grad_norm_([p for group in optimizer.param_groups for p in group[" in fixed, fixed
    assert "1.0 * scaler.get_scale())" in fixed and "apex" not in fixed


def test_a_file_importing_amp_in_its_function_sees_torch_from_its_star_import(tmp_path):
    """As above, apex's amp imported only in the function that sets it up (`if args.apex_level:
    from apex import amp`, a reward-model trainer's shape): the star import's `torch` is still torch."""
    train = textwrap.dedent(
        """\
        from util import *


        def main(model, optimizer, loader, accumulate):
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for i, (x, y) in enumerate(loader):
                loss = torch.nn.functional.mse_loss(model(x), y) / accumulate
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
                if (i + 1) % accumulate == 0:
                    optimizer.step()
                    optimizer.zero_grad()
        """
    )
    root = _write(tmp_path, {"train.py": train, "util/__init__.py": "import torch\n\n__all__ = ['torch']\n"})
    fixed = (_run(root, "fix") and (root / "train.py").read_text(encoding="utf-8"))
    assert "1.0 * scaler.get_scale())" in fixed and "apex" not in fixed, fixed


def test_an_importer_with_its_own_apex_import_lets_the_provider_go_in_the_same_run(tmp_path):
    """`from apex import amp` in the training script and in the star-imported module: the script's
    `amp` is apex's either way; once its migration removes every use, the provider's import (and its
    own inference setup) go in the same run, so a second `fix` changes nothing."""
    train = textwrap.dedent(
        """\
        import torch
        from apex import amp
        from model import *


        def main(model, optimizer, loader):
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
        """
    )
    provider = textwrap.dedent(
        """\
        import torch
        from apex import amp


        def predict(model, x):
            model = amp.initialize(model, opt_level="O1")
            return model(x)
        """
    )
    root = _write(tmp_path, {"train.py": train, "model.py": provider})
    _run(root, "fix")
    once = {p.name: p.read_text(encoding="utf-8") for p in root.glob("*.py")}
    assert all("apex" not in text for text in once.values()), once
    _run(root, "fix")
    assert {p.name: p.read_text(encoding="utf-8") for p in root.glob("*.py")} == once


@pytest.mark.parametrize("folder", [".idem_copy/pkg", "owner+repo.v2/pkg"])
def test_relative_star_imports_resolve_under_a_folder_that_is_no_identifier(tmp_path, folder):
    """A package below `.idem_copy/` or `owner+repo.v2/` (the run's root above it): its dotted
    names start below that folder, so `from .library import *` still names `library.py` and the
    provider keeps the import an unmigrated user needs (a second `fix` then changes nothing)."""
    o3 = TRAIN.replace('opt_level="O1"', 'opt_level="O3"').replace("from library import *", "from .library import *")
    train = TRAIN.replace("from library import *", "from .library import *")
    package = tmp_path / folder
    _write(package, {"__init__.py": "", "library.py": PROVIDER, "train.py": train, "eval.py": o3})
    index = ProjectIndex.build(str(tmp_path), sorted(str(p) for p in tmp_path.rglob("*.py")))
    assert index.module_names(str(package / "library.py")) == ["pkg.library", "library"]
    result = _run(tmp_path)
    (provider,) = _findings(result, "library.py")
    assert provider.fix is None and "eval.py uses `amp` through `*` imports and is not migrated" in provider.no_fix_reason
