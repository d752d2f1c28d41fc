"""Threaded apex helpers reached through module imports, and imports resolved the way Python would.

engine/import_resolution.py finds which file of the run an import names (the importer's own folder
and the folders above it, and those of the files importing it; anywhere where `sys.path` may be
edited); engine/caller_uses.py reads a caller's file again to find every call of a helper however
it is spelled (`utils.store(...)`, `ckpt.store(...)` after `import utils as ckpt`, `from utils
import *`). The fixture tests/fixtures/AMP101/apex_checkpoint_subprojects.project is a repository
of two sub-projects (written from scratch): `swin/` (main.py calls the checkpoint helpers of its
utils.py as `ckpt.restore(...)`; evaluate.py holds a stale call that cannot bind) and `darts/`
(its own `utils` package): darts's `from utils import meters` is not swin's utils.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ampmigrate.engine.apex_checkpoint import decide_state, state_helpers_called
from ampmigrate.engine.import_resolution import candidates, importers
from ampmigrate.engine.project_index import summarize

from conftest import FIXTURES
from test_apex_threading import _compiles_and_is_stable, _edit, _fix, _index, _refused

SUBPROJECTS = FIXTURES / "AMP101" / "apex_checkpoint_subprojects.project"


def _copy(tmp_path: Path) -> Path:
    project = tmp_path / "p"
    shutil.copytree(SUBPROJECTS, project)
    return project


def test_index_records_plain_and_star_imports_of_every_file():
    plain = summarize(b"import os\nimport utils as U, pkg.tools\nfrom utils import *\nfrom x import y\n", "")
    assert plain.module_imports == ["os", "pkg.tools", "utils"]
    assert plain.star_imports == ["utils"]
    assert not plain.edits_sys_path
    assert summarize(b"import sys\nsys.path.insert(0, '../other')\n", "").edits_sys_path


def test_imports_resolve_within_each_sub_project(tmp_path):
    project = _copy(tmp_path)
    index = _index(project)
    swin_utils = str(project / "swin" / "utils.py")
    assert candidates(index, str(project / "darts" / "core" / "augment.py"), "utils") == [str(project / "darts" / "utils" / "__init__.py")]
    assert candidates(index, str(project / "swin" / "main.py"), "utils") == [swin_utils]
    # `darts/search.py` runs `core/augment.py`: its folder is a root of augment.py's imports too
    assert candidates(index, str(project / "darts" / "core" / "augment.py"), "core.augment") == [str(project / "darts" / "core" / "augment.py")]
    found = {Path(p).name: (sorted(how.names), how.module, how.star) for p, how in importers(index, swin_utils)}
    assert found == {"main.py": (["build_logger"], ["utils"], False), "evaluate.py": ([], ["utils"], False)}


def test_module_attribute_calls_are_followed(tmp_path):
    project = _copy(tmp_path)
    index = _index(project)
    for name in ("restore", "store"):
        decision = decide_state(index, str(project / "swin" / "utils.py"), name)
        assert decision.migrate and decision.callers == ("swin/main.py",), decision.reason
    assert state_helpers_called(index, str(project / "swin" / "main.py")) == {
        "ckpt.restore": (str(project / "swin" / "utils.py"), "restore"),
        "ckpt.store": (str(project / "swin" / "utils.py"), "store"),
    }


def test_fix_passes_the_scaler_through_module_attribute_calls(tmp_path):
    project = _copy(tmp_path)
    _fix(project)
    main = (project / "swin" / "main.py").read_text()
    helpers = (project / "swin" / "utils.py").read_text()
    assert "first = ckpt.restore(args, net, optimizer, logger, scaler=scaler)" in main
    assert "ckpt.store(args, epoch, net, optimizer, logger, scaler=scaler)" in main
    assert "def restore(args, net, optimizer, logger, scaler):" in helpers
    assert 'state["amp"] = scaler.state_dict()' in helpers
    assert "from apex" not in main and "from apex" not in helpers
    # the stale call cannot bind before nor after; darts is another program
    assert (project / "swin" / "evaluate.py").read_text() == (SUBPROJECTS / "swin" / "evaluate.py").read_text()
    for path in (project / "darts").rglob("*.py"):
        assert path.read_text() == (SUBPROJECTS / path.relative_to(project)).read_text()
    _compiles_and_is_stable(project)


def test_a_module_caller_that_can_bind_and_has_no_amp_refuses(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "swin" / "evaluate.py", 'utils.restore(net, "weights.pth")', "utils.restore(args, net, None, None)")
    _edit(project / "swin" / "evaluate.py", "def evaluate(net, batches):", "def evaluate(args, net, batches):")
    reasons = _refused(project)
    assert "swin/evaluate.py calls `restore()` and has no `amp.initialize`" in reasons["utils.py"]
    assert "swin/evaluate.py calls `restore()` and has no `amp.initialize`" in reasons["main.py"]


def test_an_extra_positional_argument_is_not_a_stale_call(tmp_path):
    """`restore(a, b, c, d, e)` fails before, but would bind `e` to the new parameter: a caller."""
    project = _copy(tmp_path)
    _edit(project / "swin" / "evaluate.py", 'utils.restore(net, "weights.pth")', "utils.restore(1, 2, 3, 4, 5)")
    reasons = _refused(project)
    assert "swin/evaluate.py calls `restore()` and has no `amp.initialize`" in reasons["utils.py"]


@pytest.mark.parametrize(
    "line, reason",
    [
        ("helpers = utils", "swin/evaluate.py uses the module `utils` (swin/utils.py) otherwise than through its attributes"),
        ("hook = utils.store", "swin/evaluate.py uses `store()` otherwise than by calling it"),
    ],
)
def test_a_module_or_helper_handed_on_refuses(tmp_path, line, reason):
    project = _copy(tmp_path)
    _edit(project / "swin" / "evaluate.py", "    net.eval()\n", f"    net.eval()\n    {line}\n")
    assert reason in _refused(project)["utils.py"]


def test_star_import_callers(tmp_path):
    """`from utils import *`: a call sees the helper, unless a top-level `def` of the same name
    (run after the import, called only inside functions) replaces it."""
    project = _copy(tmp_path)
    (project / "swin" / "export.py").write_text(
        "from utils import *\n\n\ndef export(args, net):\n    store(args, 0, net, None, build_logger('x'))\n"
    )
    reasons = _refused(project)
    assert "swin/export.py calls `store()` and has no `amp.initialize`" in reasons["utils.py"]
    (project / "swin" / "export.py").write_text(
        "import torch\nfrom utils import *\n\n\ndef export(args, net):\n    store(net, args.out)\n\n\n"
        "def store(net, path):\n    torch.save(net.state_dict(), path)\n"
    )
    _fix(project)
    assert "scaler.state_dict()" in (project / "swin" / "utils.py").read_text()
    _compiles_and_is_stable(project)


def test_a_star_import_rebinding_the_name_refuses(tmp_path):
    project = _copy(tmp_path)
    (project / "swin" / "export.py").write_text(
        "from utils import *\n\nif True:\n    store = print\n\n\ndef export(args, net):\n    store(args)\n"
    )
    reasons = _refused(project)
    assert "swin/export.py imports `*` from swin/utils.py and binds `store` itself" in reasons["utils.py"]


def test_an_edited_sys_path_keeps_the_loose_resolution(tmp_path):
    """A script that edits `sys.path` may reach another folder: its imports (and those of the files
    it imports) may name any file of the run that ends so, and the group refuses."""
    project = _copy(tmp_path)
    _edit(project / "darts" / "search.py", "from core.augment", "import sys\n\nsys.path.insert(0, '../swin')\nfrom core.augment")
    _edit(project / "darts" / "core" / "augment.py", "from utils import meters", "from utils import meters, store as save")
    index = _index(project)
    augment = str(project / "darts" / "core" / "augment.py")
    assert str(project / "swin" / "utils.py") in candidates(index, augment, "utils")
    reasons = _refused(project)
    assert "darts/core/augment.py imports `utils`, which may be swin/utils.py or another file of the run" in reasons["utils.py"]
    assert "darts/core/augment.py imports `utils`" in reasons["main.py"]


def test_a_re_export_of_the_helper_refuses(tmp_path):
    """`from utils import *` in a module others import `store` from: their calls are not followed."""
    project = _copy(tmp_path)
    (project / "swin" / "common.py").write_text("from utils import *  # noqa: F403\n")
    (project / "swin" / "export.py").write_text("from common import store\n\n\ndef export(args, net):\n    store(args, 0, net, None, None)\n")
    reasons = _refused(project)
    assert "swin/common.py re-exports `store()`" in reasons["utils.py"]


def test_a_script_importing_a_path_setup_module_is_loose(tmp_path):
    """`import _init_paths` (a module that inserts a folder into `sys.path`) then `from utils import
    store`: the script may reach `swin/utils.py` (or darts's `utils`) from another folder: the
    group refuses."""
    project = _copy(tmp_path)
    (project / "tools").mkdir()
    (project / "tools" / "_init_paths.py").write_text("import os\nimport sys\n\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'swin'))\n")
    (project / "tools" / "export.py").write_text(
        "import _init_paths  # noqa: F401\nfrom utils import store\n\n\ndef export(args, net):\n    store(args, 0, net, None, None)\n"
    )
    index = _index(project)
    assert str(project / "swin" / "utils.py") in candidates(index, str(project / "tools" / "export.py"), "utils")
    reasons = _refused(project)
    assert "tools/export.py imports `utils`, which may be swin/utils.py or another file of the run" in reasons["utils.py"]


@pytest.mark.parametrize("spelling", ["from . import utils as ckpt", "import swin.utils as ckpt", "from swin import utils as ckpt"])
def test_package_spellings_of_the_module(tmp_path, spelling):
    """`swin` as a package run with `python -m swin.main`: relative and dotted module imports."""
    project = _copy(tmp_path)
    (project / "swin" / "__init__.py").write_text("")
    _edit(project / "swin" / "main.py", "import utils as ckpt\nfrom utils import build_logger", f"{spelling}\nfrom .utils import build_logger")
    _fix(project)
    assert "first = ckpt.restore(args, net, optimizer, logger, scaler=scaler)" in (project / "swin" / "main.py").read_text()
    assert "def store(args, epoch, net, optimizer, logger, scaler):" in (project / "swin" / "utils.py").read_text()
    _compiles_and_is_stable(project)


def test_binds():
    """A call binds unless it lacks a required argument or names a keyword the function has not
    (and that is not the parameter the fix adds): those raise `TypeError` before and after."""
    from ampmigrate.engine.caller_uses import Call, Signature, binds

    sig = Signature(("cfg", "model", "optimizer", "logger", "ema"), 4, ("tag",), (), False, False)
    assert binds(sig, Call(1, 4, frozenset(), False), "scaler")
    assert binds(sig, Call(1, 2, frozenset({"optimizer", "logger"}), False), "scaler")
    assert binds(sig, Call(1, 6, frozenset(), False), "scaler")  # one too many: binds `scaler` after
    assert binds(sig, Call(1, 1, frozenset(), True), "scaler")  # unpacked: may bind
    assert binds(sig, Call(1, 4, frozenset({"scaler"}), False), "scaler")
    assert not binds(sig, Call(1, 2, frozenset(), False), "scaler")
    assert not binds(sig, Call(1, 4, frozenset({"epochs"}), False), "scaler")


def _fixable(project: Path, cache) -> list:
    """Check with the cache: (file name, whether its AMP101 findings carry a fix)."""
    from conftest import make_settings

    from ampmigrate.engine.project_index import ProjectIndex
    from ampmigrate.engine.runner import Job, run_files

    files = sorted(str(p) for p in project.rglob("*.py"))
    index = ProjectIndex.build(str(project), files, cache_path=cache.index_path)
    result = run_files(files, make_settings({"select": ["AMP1"]}), Job("check"), jobs=1, cache=cache, index=index)
    return sorted({(Path(f.path).name, f.fix is not None) for f in result.findings if f.code == "AMP101"})


@pytest.mark.parametrize("case", ["checkpoint", "split"])
def test_a_cached_result_follows_a_new_call_through_the_module(tmp_path, case):
    """A plain script's new call through a module it already imported (`utils.restore(...)`,
    `trainer.do_train(...)`) flips the group: the cached results of both sides are not reused
    (the importers' bytes are in their keys)."""
    from ampmigrate.engine.cache import Cache

    cache = Cache(str(tmp_path / "cache"), "key")
    if case == "checkpoint":
        project = _copy(tmp_path)
        script, old, new = project / "swin" / "evaluate.py", 'utils.restore(net, "weights.pth")', "utils.restore(None, net, None, None)"
        sides = ("main.py", "utils.py")
    else:
        project = tmp_path / "p"
        shutil.copytree(FIXTURES / "AMP101" / "amp_split_init_and_step.project", project)
        script, old, new = project / "other.py", "print(trainer.__doc__)", "trainer.do_train(1, 2, 3, 4)"
        script.write_text(f"import trainer\n\n{old}\n")
        sides = ("train_net.py", "trainer.py")
    assert _fixable(project, cache) == [(sides[0], True), (sides[1], True)]
    assert _fixable(project, cache) == [(sides[0], True), (sides[1], True)]  # from the cache
    _edit(script, old, new)
    assert _fixable(project, cache) == [(sides[0], False), (sides[1], False)]


def test_an_ambiguous_from_import_of_another_name_does_not_block(tmp_path):
    """Where `sys.path` may be edited, darts's `from utils import meters` may be swin's utils.py:
    it brings `meters`, not a helper, so the helpers still migrate; `from utils import store` there
    would not."""
    project = _copy(tmp_path)
    _edit(project / "darts" / "search.py", "from core.augment", "import sys\n\nsys.path.insert(0, '.')\nfrom core.augment")
    _fix(project)
    assert "scaler.state_dict()" in (project / "swin" / "utils.py").read_text()
    _compiles_and_is_stable(project)


def test_importers_reads_only_the_files_that_spell_a_name_of_the_target(tmp_path):
    # A monorepo's files that import nothing of the target must not be read per query:
    # `importers` ran once per apex file over every file's imports (quadratic; 6000 files took
    # 2.5x the time of the code before it).
    project = _copy(tmp_path)
    for number in range(50):
        (project / f"unrelated_{number}.py").write_text(f"import os\nfrom collections import OrderedDict as O{number}\n")
    index = _index(project)
    target = str(project / "swin" / "utils.py")
    list(importers(index, target))  # the first query may read every file once

    reads = []

    class Counted:
        def __init__(self, summary):
            self._summary = summary

        def __getattr__(self, name):
            reads.append(name)
            return getattr(self._summary, name)

    for path in list(index.modules):
        if "unrelated_" in path:
            index.modules[path] = Counted(index.modules[path])
    found = {Path(p).name for p, _ in importers(index, target)}
    assert found == {"main.py", "evaluate.py"}
    assert reads == []
