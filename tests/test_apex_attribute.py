"""apex's amp module stored in an attribute by another file (engine/apex_attrs.py,
rules/apex/amp_attribute.py): reported, never fixed; no finding where any store to the
attribute in the run may be something else."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from conftest import FIXTURES, make_settings

from ampmigrate.engine.apex_attrs import apex_attr_stores
from ampmigrate.engine.project_index import ProjectIndex, summarize
from ampmigrate.engine.runner import Job, run_files

PROJECT = FIXTURES / "AMP101" / "amp_in_attribute.project"


def _run(root: Path, mode: str = "check"):
    files = sorted(str(p) for p in root.rglob("*.py"))
    index = ProjectIndex.build(str(root), files)
    return run_files(files, make_settings({"select": ["AMP1"]}), Job(mode), jobs=1, index=index)


def _model_findings(result):
    return [f for f in result.findings if Path(f.path).name == "models.py"]


def _copy(tmp_path: Path) -> Path:
    project = tmp_path / "p"
    shutil.copytree(PROJECT, project)
    return project


def test_the_index_records_what_attributes_named_like_amp_hold():
    tree = ast.parse(
        "from apex import amp\n"
        "def f(m, x):\n    m.amp = amp\n    m.amp_handle = x\n    m.other = amp\n"
        "class C:\n    amp = None\n    def g(self):\n        self.amp, self.b = None, 1\n"
    )
    assert apex_attr_stores(tree) == {"amp": ["apex", "none"], "amp_handle": ["other"]}
    assert apex_attr_stores(ast.parse("setattr(args, key, value)\n")) == {"*": ["other"]}
    assert apex_attr_stores(ast.parse("setattr(args, 'lr', 1)\n")) == {}
    assert summarize(b"def f(m):\n    from apex import amp\n    m.amp = amp\n", "").apex_attr_stores == {"amp": ["apex"]}
    # a file without apex is only marked: its records are read when some file stores apex's module
    plain = summarize(b"def f(m):\n    m.amp = True\n", "")
    assert plain.apex_attr_stores == {} and plain.apex_attr_candidate


def test_without_an_apex_store_no_other_file_is_read(tmp_path, monkeypatch):
    from ampmigrate.engine import project_index

    (tmp_path / "config.py").write_text("class Args:\n    pass\nargs = Args()\nargs.amp = True\n")
    (tmp_path / "train.py").write_text("import torch\nrun = torch.compile\n")
    read = []
    monkeypatch.setattr(project_index, "source_tree", lambda index, path: read.append(path))
    index = ProjectIndex.build(str(tmp_path), sorted(str(p) for p in tmp_path.rglob("*.py")))
    assert index.apex_attr("amp") is None and index.apex_attrs_key() == "" and read == []


def test_the_calls_are_reported_naming_the_file_and_not_fixed():
    found = _model_findings(_run(PROJECT))
    assert [f.location.row for f in found] == [17, 25]
    assert all(f.fix is None and "utils.py sets" in f.no_fix_reason for f in found)
    assert "stored in `.amp` by src/utils.py" in found[0].message


def test_fix_leaves_the_files_alone(tmp_path):
    project = _copy(tmp_path)
    result = _run(project, "fix")
    assert not any(r.new_text for r in result.results if Path(r.path).name == "models.py")


def test_another_store_to_the_attribute_anywhere_in_the_run(tmp_path):
    project = _copy(tmp_path)
    (project / "config.py").write_text("class Args:\n    pass\nargs = Args()\nargs.amp = True\n")
    assert _model_findings(_run(project)) == []


def test_a_setattr_of_a_computed_name(tmp_path):
    project = _copy(tmp_path)
    (project / "config.py").write_text("def load(obj, cfg):\n    for k, v in cfg.items():\n        setattr(obj, k, v)\n")
    assert _model_findings(_run(project)) == []


def test_the_module_stored_from_a_parameter(tmp_path):
    project = _copy(tmp_path)
    utils = project / "src" / "utils.py"
    utils.write_text("def initialize_amp(trainer, amp):\n    trainer.amp = amp\n")
    assert _model_findings(_run(project)) == []


def test_the_cache_key_follows_every_store(tmp_path):
    project = _copy(tmp_path)

    def key():
        files = sorted(str(p) for p in project.rglob("*.py"))
        return ProjectIndex.build(str(project), files).dependency_key(str(project / "src" / "models.py"))

    before = key()
    (project / "config.py").write_text("args.amp = True\n")
    assert key() != before


def _reference_stores(tree: ast.Module, monkeypatch) -> dict:
    """apex_attr_stores with every scope's names resolved (no shortcut)."""
    from ampmigrate.engine import apex_attrs
    from ampmigrate.engine.apex_values import name_scopes

    with monkeypatch.context() as patch:
        patch.setattr(apex_attrs, "_scopes", lambda tree, everything: name_scopes(tree))
        patch.setattr(apex_attrs, "walk_order", lambda tree: list(ast.walk(tree)))
        return apex_attrs.apex_attr_stores(tree)


def test_the_shortcuts_record_what_resolving_every_scope_records(monkeypatch):
    # Scopes are resolved only in a file storing to an attribute named like amp, and names'
    # kinds only where an import binds apex's amp: the records are the same as without.
    sources = [
        "x.timestamp = None\nf(self.sample)\n",  # stores, no apex import: kinds skipped
        "import foo\ndef f(m):\n    m.amp = foo\n    m.ramp = None\n",
        "from apex import amp\nf(x.sample)\n",  # no store: scopes skipped
        "from apex import amp\ndef f(m):\n    m.amp = amp\n    global g\n    g = amp\nx.amp = g\n",
        "import apex.amp as A\nclass C:\n    y.amp = None\n    def h(self):\n        self.amp = A\n",
    ]
    trees = [ast.parse(source) for source in sources]
    trees += [ast.parse(p.read_text(encoding="utf-8")) for p in sorted(FIXTURES.rglob("*.py"))]
    for tree in trees:
        assert apex_attr_stores(tree) == _reference_stores(tree, monkeypatch)
