"""The project index (engine/project_index.py) and the multi-file fixtures that need it.

A multi-file fixture is a directory `tests/fixtures/<CODE>/<case>.project/` of Python files with
`<case>.project.findings` next to it: one `path:row:col CODE` line per finding of a `check` of
the whole directory (its own family selected, as for single-file fixtures), in the order
`check` reports them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ampmigrate.engine import project_index as project_index_module
from ampmigrate.engine import runner
from ampmigrate.engine.cache import Cache
from ampmigrate.engine.project_index import ProjectIndex, summarize
from ampmigrate.engine.runner import Job, run_files

from conftest import FIXTURES, make_settings

UPDATE = os.environ.get("AMPMIGRATE_UPDATE_FIXTURES") == "1"
PROJECTS = sorted(p for p in FIXTURES.glob("AMP*/*.project") if p.is_dir())


def _check(root: Path, *, jobs: int = 1, cache=None, select=None):
    files = sorted(str(p) for p in root.rglob("*.py"))
    settings = make_settings({"select": select or [root.parent.name[:4]]})
    cache_path = cache.index_path if cache is not None else None
    index = ProjectIndex.build(str(root), files, cache_path=cache_path)
    return run_files(files, settings, Job("check"), jobs=jobs, cache=cache, index=index)


def _text(root: Path, result) -> str:
    return "".join(
        f"{Path(f.path).relative_to(root).as_posix()}:{f.location.row}:{f.location.column} {f.code}\n" for f in result.findings
    )


@pytest.mark.parametrize("project", PROJECTS, ids=[f"{p.parent.name}/{p.name}" for p in PROJECTS])
def test_project_fixture(project: Path):
    expected = project.with_name(project.name + ".findings")
    found = _text(project, _check(project))
    if UPDATE:
        expected.write_text(found, encoding="utf-8")
    assert found == expected.read_text(encoding="utf-8")


@pytest.mark.parametrize("project", PROJECTS, ids=[f"{p.parent.name}/{p.name}" for p in PROJECTS])
def test_project_fixture_needs_the_index(project: Path):
    """Each multi-file fixture shows something single-file analysis cannot: without the index,
    the findings (or what their messages or their fixes say) differ."""
    files = sorted(str(p) for p in project.rglob("*.py"))
    settings = make_settings({"select": [project.parent.name[:4]]})
    alone = run_files(files, settings, Job("check"), jobs=1)
    together = _check(project)

    def described(result):
        return [(f.path, f.location.row, f.code, f.message, f.no_fix_reason) for f in result.findings]

    assert described(alone) != described(together)


def test_workers_get_the_index(tmp_path, monkeypatch):
    project = tmp_path / "p"
    shutil.copytree(FIXTURES / "AMP301" / "clip_helper_elsewhere.project", project)
    for i in range(3):
        (project / f"other{i}.py").write_text("import torch\nx = torch.zeros(1)\n", encoding="utf-8")
    monkeypatch.setattr(runner, "PARALLEL_THRESHOLD", 1)
    serial = _text(project, _check(project, select=["AMP301"]))
    parallel = _text(project, _check(project, jobs=2, select=["AMP301"]))
    assert serial == parallel and "train.py:13:9 AMP301" in parallel


def test_summaries_are_cached_and_results_follow_the_other_file(tmp_path, monkeypatch):
    project = tmp_path / "p"
    shutil.copytree(FIXTURES / "AMP301" / "clip_helper_elsewhere.project", project)
    cache = Cache(str(tmp_path / "cache"), "key")
    assert "train.py:13:9 AMP301" in _text(project, _check(project, cache=cache, select=["AMP301"]))
    assert os.path.exists(cache.index_path)

    def no_parse(*args, **kwargs):
        raise AssertionError("a cached summary was summarized again")

    monkeypatch.setattr(project_index_module, "summarize", no_parse)
    assert "train.py:13:9 AMP301" in _text(project, _check(project, cache=cache, select=["AMP301"]))
    monkeypatch.undo()
    # The helper learns to unscale: train.py's cached result must not be reused.
    utils = project / "utils.py"
    utils.write_text(utils.read_text().replace("    clip_grad_norm_(model", "    model.scaler.unscale_(None)\n    clip_grad_norm_(model"))
    assert "train.py:13:9" not in _text(project, _check(project, cache=cache, select=["AMP301"]))


def test_summary_of_a_module():
    summary = summarize(
        b"""
import torch
from torch.nn.utils import clip_grad_value_ as clip
from .engine import train_one_epoch

def clip_all(model):
    clip(model.parameters(), 1.0)

def protocol(model, scaler):
    scaler.unscale_(None)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

def step(model, loss, loss_scaler, opt):
    loss_scaler.scale(loss).backward()
    loss_scaler.step(opt)

def main():
    scaler = torch.cuda.amp.GradScaler()
    train_one_epoch(None, scaler)
""",
        "pkg",
    )
    assert summary.clip_helpers == {"clip_all": "clip"}
    assert summary.scaler_params == {"step": ["loss_scaler"]}
    assert summary.scaler_passed_to == [("train_one_epoch", 19)]
    assert summary.trains and "pkg.engine" in summary.imports


def test_files_without_training_words_are_not_parsed():
    assert summarize(b"def f(:\n", "").imports == []  # not even parsed: no error either
    assert summarize(b"x.backward(\n", "").imports == []  # a syntax error: an empty summary


def test_unreadable_files_are_left_to_the_per_file_pass(tmp_path):
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    index = ProjectIndex.build(str(tmp_path), [str(fifo), str(tmp_path / "missing.py")])
    assert index.modules == {}


def test_messages_name_the_other_file():
    clip = _check(FIXTURES / "AMP301" / "clip_helper_elsewhere.project").findings
    assert [f.message for f in clip if "(defined in utils.py)" in f.message]
    origin = _check(FIXTURES / "AMP301" / "scaler_from_main.project").findings
    assert [f.message for f in origin if "(the GradScaler comes from main.py)" in f.message]
    model = _check(FIXTURES / "AMP401" / "model_trained_elsewhere.project").findings
    assert [f.message for f in model if "(its backward runs in train.py)" in f.message]


def test_a_module_name_that_two_files_end_with_resolves_to_the_full_name(tmp_path):
    (tmp_path / "pkg").mkdir()
    for path in (tmp_path / "utils.py", tmp_path / "pkg" / "utils.py", tmp_path / "pkg" / "other.py"):
        path.write_text("x = 1\n", encoding="utf-8")
    index = ProjectIndex.build(str(tmp_path), [str(p) for p in tmp_path.rglob("*.py")])
    assert index.module_for("utils") == str(tmp_path / "utils.py")
    assert index.module_for("pkg.utils") == str(tmp_path / "pkg" / "utils.py")
    assert index.module_for("other") == str(tmp_path / "pkg" / "other.py")
    assert index.module_for("missing") is None


# ------------------------------------------------------------------ AMP409 across files
def test_trained_results_record_builders_whose_result_is_trained():
    summary = summarize(
        b"""
import torch
from models.build import build_model, build_teacher, build_head
from models import loaders


def main(cfg):
    teacher = build_teacher(cfg)  # never trained here
    head = build_head(cfg)
    head.eval()
    model = build_model(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(teacher(cfg.x)).sum()
    loss.backward()


def late(cfg):
    opt = torch.optim.AdamW(net.parameters())  # `net` is built after: not this builder's result
    net = build_head(cfg)
""",
        "",
    )
    assert summary.trained_results == ["models.build.build_model"]


def test_trained_results_need_a_training_file():
    summary = summarize(b"from models import build_model\nmodel = build_model()\nmodel.train()\n", "")
    assert summary.trained_results == []  # nothing calls backward or makes a scaler: not training code


def test_half_builder_result_follows_the_training_file(tmp_path):
    project = tmp_path / "p"
    shutil.copytree(FIXTURES / "AMP409" / "half_builder_elsewhere.project", project)
    cache = Cache(str(tmp_path / "cache"), "key")
    assert "models/build.py:8:15 AMP409" in _text(project, _check(project, cache=cache, select=["AMP409"]))
    # train.py stops training the built model: build.py's cached finding must not be reused.
    train = project / "train.py"
    train.write_text(train.read_text().replace("model.parameters()", "teacher.parameters()").replace("    model.train()\n", ""))
    assert "models/build.py" not in _text(project, _check(project, cache=cache, select=["AMP409"]))


# ------------------------------------------------------------------ AMP308 across files
def test_checkpoint_savers_record_the_parameters_whose_state_is_saved():
    summary = summarize(
        b"""
import torch
from utils import save_on_master


def save_checkpoint(model, optimizer, epoch, path):
    save_on_master({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)


def save_all(model, optimizer, loss_scaler, path):
    torch.save({"optimizer": optimizer.state_dict(), "scaler": loss_scaler.state_dict()}, path)


def describe(model, optimizer):
    return {"optimizer": optimizer.state_dict()}  # nothing saved here
""",
        "",
    )
    assert summary.checkpoint_savers == {
        "save_checkpoint": (["model", "optimizer", "epoch", "path"], ["model", "optimizer"])
    }


def test_checkpoint_saver_result_follows_the_helper_file(tmp_path):
    project = tmp_path / "p"
    shutil.copytree(FIXTURES / "AMP308" / "saver_elsewhere.project", project)
    cache = Cache(str(tmp_path / "cache"), "key")
    assert "train.py:16:9 AMP308" in _text(project, _check(project, cache=cache, select=["AMP308"]))
    # The helper learns to save a scaler it finds on the model: train.py's cached result must go.
    helper = project / "checkpoint.py"
    helper.write_text(helper.read_text().replace('"epoch": epoch}', '"epoch": epoch, "scaler": model.scaler.state_dict()}', 1))
    assert "train.py:16" not in _text(project, _check(project, cache=cache, select=["AMP308"]))


# ------------------------------------------------------------------ AMP402 across files
def test_scaler_param_uses_record_the_methods_a_helper_calls():
    summary = summarize(
        b"""
def load_checkpoint(path, model, optimizer, loss_scaler):
    if loss_scaler is not None and "scaler" in ckpt:
        loss_scaler.load_state_dict(ckpt["scaler"])


def keep(loss_scaler):
    registry.append(loss_scaler)
""",
        "",
    )
    assert summary.scaler_param_uses == {
        "load_checkpoint": (["path", "model", "optimizer", "loss_scaler"], {"loss_scaler": ["load_state_dict"]}),
        "keep": (["loss_scaler"], {"loss_scaler": ["*"]}),
    }


def test_a_scaler_handed_to_a_helper_elsewhere_is_disabled_only_where_that_helper_cannot_tell():
    found = _check(FIXTURES / "AMP402" / "disabled_across_files.project", select=["AMP402"]).findings
    fixed = {Path(f.path).name: f.fix is not None for f in found}
    assert fixed == {"train.py": True, "train_reported.py": False}


def test_links_follow_the_file_python_imports_in_a_repository_of_sub_projects(tmp_path):
    """`from model import Net` in two sub-projects, each with its own model.py: each import links
    to its own folder's file (the name alone fits both), whatever the run's root."""
    for project in ("gan", "cls"):
        (tmp_path / project).mkdir()
        (tmp_path / project / "model.py").write_text("import torch\n\n\nclass Net(torch.nn.Module):\n    pass\n")
    (tmp_path / "gan" / "train.py").write_text(
        "from model import Net\n\nnet = Net()\nloss = net(x).sum()\nloss.backward()\n"
    )
    (tmp_path / "cls" / "export.py").write_text("from model import Net\n\nprint(Net)\n")
    files = sorted(str(p) for p in tmp_path.rglob("*.py"))
    index = ProjectIndex.build(str(tmp_path), files)
    assert index.module_for("model") is None
    assert index.trained_with(str(tmp_path / "gan" / "model.py"), "Net") == str(tmp_path / "gan" / "train.py")
    assert index.trained_with(str(tmp_path / "cls" / "model.py"), "Net") is None
