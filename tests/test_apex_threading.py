"""apex.amp split across two files: `amp.initialize` in A, `amp.scale_loss` in B's `do_train`
(engine/apex_threading.py decides, rules/apex/_cross_threading.py rewrites both sides).

The fixture tests/fixtures/AMP101/amp_split_init_and_step.project is the maskrcnn-benchmark
shape (tools/train_net.py + engine/trainer.py), written from scratch. Both sides must migrate
together or not at all: a third file calling `do_train` without apex, a caller passing the
optimizer elsewhere, or an `amp.initialize` the split migration cannot take make both refuse.
"""

from __future__ import annotations

import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ampmigrate.engine.apex_threading import decide, initializer_targets
from ampmigrate.engine.project_index import ProjectIndex, summarize

from conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[1]
SPLIT = FIXTURES / "AMP101" / "amp_split_init_and_step.project"


def _copy(tmp_path: Path, source: Path = SPLIT) -> Path:
    project = tmp_path / "p"
    shutil.copytree(source, project)
    return project


def _fix(project: Path, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ampmigrate", "fix", "--no-cache", "--exit-zero", *extra, "."],
        cwd=project,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout + done.stderr


def _check_json(project: Path):
    import json

    done = subprocess.run(
        [sys.executable, "-m", "ampmigrate", "check", "--no-cache", "--exit-zero", "--select", "AMP1", "--output-format", "json", "."],
        cwd=project,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    return json.loads(done.stdout)


def _snapshot(project: Path):
    return {p.relative_to(project).as_posix(): p.read_text() for p in sorted(project.rglob("*.py"))}


def _compiles_and_is_stable(project: Path) -> None:
    """Every file compiles, and a second fix changes nothing."""
    for path in project.rglob("*.py"):
        py_compile.compile(str(path), doraise=True)
    before = _snapshot(project)
    _fix(project)
    assert _snapshot(project) == before


def _index(project: Path) -> ProjectIndex:
    return ProjectIndex.build(str(project), sorted(str(p) for p in project.rglob("*.py")))


def test_index_records_both_sides():
    a = summarize((SPLIT / "train_net.py").read_bytes(), "")
    assert (a.apex_init_function, a.apex_init_problem) == ("train", "")
    assert a.apex_init_calls == [("do_train", 16, 2, "", 1)]
    b = summarize((SPLIT / "trainer.py").read_bytes(), "")
    assert b.apex_step_functions == {"do_train": (["model", "data_loader", "optimizer", "max_iter"], "optimizer", "scaler", "")}
    assert b.apex_init_function == ""


def test_the_facts_read_apex_spelled_out_beside_an_amp_import():
    """`import apex` and `from apex import amp` in one file, the step spelled `apex.amp.scale_loss`
    (ujiuji1259/wiki_en's files): the spelled uses are the module's too."""
    text = (SPLIT / "trainer.py").read_text().replace("from apex import amp\n", "import apex\nfrom apex import amp\n")
    text = text.replace("with amp.scale_loss(", "with apex.amp.scale_loss(")
    assert "apex.amp.scale_loss(" in text
    b = summarize(text.encode(), "")
    assert b.apex_step_functions == {"do_train": (["model", "data_loader", "optimizer", "max_iter"], "optimizer", "scaler", "")}


def test_both_sides_decide_the_same(tmp_path):
    project = _copy(tmp_path)
    index = _index(project)
    decision = decide(index, str(project / "trainer.py"), "do_train")
    assert decision.migrate and decision.callers == ("train_net.py",) and decision.scaler == "scaler"
    targets, reason = initializer_targets(index, str(project / "train_net.py"))
    assert reason is None and targets == [(str(project / "trainer.py"), "do_train")]


def test_fix_threads_one_scaler_through_both_files(tmp_path):
    project = _copy(tmp_path)
    _fix(project)
    a = (project / "train_net.py").read_text()
    b = (project / "trainer.py").read_text()
    assert "apex" not in a and "apex" not in b
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=amp_opt_level != "O0")' in a
    assert "do_train(model, data_loader, optimizer, cfg.max_iter, scaler=scaler)" in a
    assert "def do_train(model, data_loader, optimizer, max_iter, scaler):" in b
    assert 'with torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled()):' in b
    assert "scaler.scale(losses).backward()\n        scaler.step(optimizer)\n        scaler.update()\n" in b
    assert "import torch" in b
    _compiles_and_is_stable(project)


def test_literal_o2_and_o0(tmp_path):
    for level, enabled in (('"O2"', ""), ('"O0"', ", enabled=False")):
        project = _copy(tmp_path / level.strip('"'))
        main = project / "train_net.py"
        main.write_text(main.read_text().replace("opt_level=amp_opt_level", f"opt_level={level}"))
        _fix(project)
        assert f'scaler = torch.amp.GradScaler("cuda"{enabled})' in main.read_text()
        assert "scaler.scale(losses).backward()" in (project / "trainer.py").read_text()


def _refused(project: Path) -> dict:
    """Fix the project, check that no file changed, and return {file name: AMP101 reason}."""
    before = _snapshot(project)
    _fix(project)
    assert _snapshot(project) == before
    return {f["filename"].rsplit("/", 1)[-1]: f["no_fix_reason"] for f in _check_json(project) if f["code"] == "AMP101"}


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_a_third_caller_without_amp_makes_both_refuse(tmp_path):
    project = _copy(tmp_path)
    (project / "finetune.py").write_text(
        "from trainer import do_train\n\n\ndef finetune(model, loader, optimizer):\n    do_train(model, loader, optimizer, 10)\n"
    )
    reasons = _refused(project)
    assert "finetune.py calls `do_train()` and has no `amp.initialize`" in reasons["trainer.py"]
    assert "finetune.py calls `do_train()` and has no `amp.initialize`" in reasons["train_net.py"]


def test_a_module_import_calling_the_trainer_without_amp_makes_both_refuse(tmp_path):
    """`import trainer` then `trainer.do_train(...)` in a plain script is a call of B (engine/caller_uses.py)."""
    project = _copy(tmp_path)
    (project / "other.py").write_text("import trainer\n\ntrainer.do_train(1, 2, 3, 4)\n")
    reasons = _refused(project)
    assert "other.py calls `do_train()` and has no `amp.initialize`" in reasons["trainer.py"]
    assert "other.py calls `do_train()` and has no `amp.initialize`" in reasons["train_net.py"]


@pytest.mark.parametrize(
    "imports, call",
    [("import trainer", "trainer.do_train"), ("import trainer as T", "T.do_train"), ("from trainer import do_train as run", "run")],
)
def test_the_initializer_may_call_the_trainer_through_its_module(tmp_path, imports, call):
    project = _copy(tmp_path)
    _edit(project / "train_net.py", "from trainer import do_train", imports)
    _edit(project / "train_net.py", "    do_train(", f"    {call}(")
    (project / "other.py").write_text("import trainer\n\nprint(trainer.__doc__)\n")  # imports B, never calls it
    _fix(project)
    assert f"{call}(model, data_loader, optimizer, cfg.max_iter, scaler=scaler)" in (project / "train_net.py").read_text()
    assert "scaler.scale(losses).backward()" in (project / "trainer.py").read_text()
    _compiles_and_is_stable(project)


def test_optimizer_passed_in_another_parameter_refuses(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "train_net.py", "do_train(model, data_loader, optimizer, cfg.max_iter)", "do_train(model, optimizer, data_loader, cfg.max_iter)")
    reasons = _refused(project)
    assert "passes the optimizer to `do_train()` as `data_loader`, not as `optimizer`" in reasons["train_net.py"]


def test_run_time_opt_level_migrates_with_the_o3_guard(tmp_path):
    project = _copy(tmp_path)
    main = project / "train_net.py"
    _edit(main, "opt_level=amp_opt_level", "opt_level=cfg.opt_level")
    _fix(project)
    text = main.read_text()
    assert 'if cfg.opt_level == "O3":\n        raise ValueError(' in text
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=cfg.opt_level != "O0")' in text
    assert "scaler.scale(losses).backward()" in (project / "trainer.py").read_text()
    _compiles_and_is_stable(project)


def test_an_unsafe_side_makes_every_fix_of_the_group_unsafe(tmp_path):
    project = _copy(tmp_path)
    main = project / "train_net.py"
    _edit(main, "opt_level=amp_opt_level", "opt_level=amp_opt_level, min_loss_scale=cfg.min_loss_scale")
    before = _snapshot(project)
    _fix(project)
    assert _snapshot(project) == before  # a safe fix changes neither side
    findings = [f for f in _check_json(project) if f["code"] == "AMP101"]
    assert len(findings) == 2
    assert all(f["fix"]["applicability"] == "unsafe" for f in findings)
    assert all("GradScaler has no `min_loss_scale`" in f["fix"]["message"] for f in findings), findings
    _fix(project, "--unsafe-fixes")  # both sides, or neither
    assert "scaler = torch.amp.GradScaler(" in main.read_text()
    assert "scaler.scale(losses).backward()" in (project / "trainer.py").read_text()


def test_a_body_that_uses_the_scaled_loss_again_migrates_on_both_sides(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "trainer.py", "scaled_losses.backward()\n", "scaled_losses.backward()\n            logger.info(scaled_losses.item())\n")
    _fix(project)
    trainer = (project / "trainer.py").read_text()
    assert "        scaled_losses = scaler.scale(losses)\n        scaled_losses.backward()\n        logger.info(scaled_losses.item())\n" in trainer
    assert "scaler = torch.amp.GradScaler(" in (project / "train_net.py").read_text()
    _compiles_and_is_stable(project)


def test_a_body_that_may_leave_early_makes_both_refuse(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "trainer.py", "scaled_losses.backward()\n", "scaled_losses.backward()\n            if not losses:\n                break\n")
    reasons = _refused(project)
    assert "may leave the block early" in reasons["train_net.py"]


def test_the_trainer_may_import_apex_amp_as_a_module(tmp_path):
    # `import apex.amp as amp` binds the same module as `from apex import amp`.
    project = _copy(tmp_path)
    _edit(project / "trainer.py", "from apex import amp\n", "import apex.amp as amp\n")
    _fix(project)
    assert "amp" not in (project / "trainer.py").read_text().replace("torch.amp", "")
    assert "scaler = torch.amp.GradScaler(" in (project / "train_net.py").read_text()
    _compiles_and_is_stable(project)


def test_no_caller_leaves_the_trainer_alone(tmp_path):
    project = _copy(tmp_path)
    (project / "train_net.py").unlink()
    assert "no file of the run imports trainer.py, so the `amp.initialize`" in _refused(project)["trainer.py"]
    (project / "evaluate.py").write_text("import trainer\n\nprint(trainer.__doc__)\n")
    assert "no file of the run calls `do_train()`" in _refused(project)["trainer.py"]


ENGINE = '''import torch


def train_epoch(model, loader, optimizer, fp16=False, clip=0.0):
    criterion = torch.nn.CrossEntropyLoss()
    for x, y in loader:
        output = model(x)
        loss = criterion(output, y)
        optimizer.zero_grad()
        if fp16:
            from apex import amp
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        if clip > 0:
            if fp16:
                torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), clip)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
'''
MAIN = '''import torch

from pkg.engine import train_epoch

try:
    from apex import amp
except ImportError:
    amp = None


def main(args):
    model = torch.nn.Linear(4, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for epoch in range(args.epochs):
        train_epoch(model, args.loader, optimizer=optimizer, fp16=args.fp16, clip=args.clip)
'''


def _conditional(tmp_path: Path, engine: str = ENGINE) -> Path:
    project = tmp_path / "c"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "engine.py").write_text(engine)
    (project / "main.py").write_text(MAIN)
    return project


def test_conditional_apex_a_local_import_and_a_clip_of_master_params(tmp_path):
    project = _conditional(tmp_path)
    _fix(project)
    main = (project / "main.py").read_text()
    engine = (project / "pkg" / "engine.py").read_text()
    assert "apex" not in main and "apex" not in engine
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16))' in main  # hoisted out of the `if`
    assert "fp16=args.fp16, clip=args.clip, scaler=scaler)" in main
    assert "def train_epoch(model, loader, optimizer, fp16=False, clip=0.0, *, scaler):" in engine
    assert "            scaler.scale(loss).backward()\n        else:\n            loss.backward()\n" in engine
    assert "                scaler.unscale_(optimizer)\n                torch.nn.utils.clip_grad_norm_([p for group in" in engine
    assert "        if fp16:\n            scaler.step(optimizer)\n            scaler.update()\n        else:\n            optimizer.step()\n" in engine
    _compiles_and_is_stable(project)


def test_a_side_whose_own_plan_stops_stops_the_other(tmp_path):
    """The index facts do not see a closure passed to `optimizer.step`; B's planner refuses it,
    and A, which plans B from the bytes the index read, refuses with the same reason."""
    project = _conditional(tmp_path, ENGINE.replace("        optimizer.step()\n", "        optimizer.step(lambda: loss)\n"))
    reasons = _refused(project)
    assert "pkg/engine.py cannot be migrated with it: `optimizer.step(lambda: loss)` passes a closure" in reasons["main.py"]
    assert "pkg/engine.py cannot be migrated with it" in reasons["engine.py"]


def test_amp_initialize_at_module_level(tmp_path):
    project = tmp_path / "m"
    project.mkdir()
    (project / "train.py").write_text(
        "import torch\nfrom apex import amp\n\nfrom loop import fit\n\n"
        "model = torch.nn.Linear(4, 2).cuda()\noptimizer = torch.optim.Adam(model.parameters())\n"
        'model, optimizer = amp.initialize(model, optimizer, opt_level="O2")\n\n'
        'if __name__ == "__main__":\n    fit(model, optimizer, [])\n'
    )
    (project / "loop.py").write_text(
        "from apex import amp\n\n\ndef fit(net, opt, batches):\n    for x, y in batches:\n        opt.zero_grad()\n"
        "        loss = (net(x) - y).pow(2).mean()\n        with amp.scale_loss(loss, opt) as scaled:\n"
        "            scaled.backward()\n        opt.step()\n"
    )
    _fix(project)
    main = (project / "train.py").read_text()
    loop = (project / "loop.py").read_text()
    assert 'scaler = torch.amp.GradScaler("cuda")\n' in main and "fit(model, optimizer, [], scaler=scaler)" in main
    assert "def fit(net, opt, batches, scaler):" in loop and "scaler.step(opt)\n        scaler.update()" in loop
    assert "apex" not in main + loop
    _compiles_and_is_stable(project)


def test_a_side_cached_result_follows_the_other_side(tmp_path):
    """The closure in B changes no index fact, but B's bytes are part of A's cache key: A's
    cached fix is not reused once B cannot be migrated."""
    from ampmigrate.engine.cache import Cache
    from ampmigrate.engine.runner import Job, run_files

    from conftest import make_settings

    project = _conditional(tmp_path)
    cache = Cache(str(tmp_path / "cache"), "key")

    def main_fix():
        files = sorted(str(p) for p in project.rglob("*.py"))
        index = ProjectIndex.build(str(project), files, cache_path=cache.index_path)
        result = run_files(files, make_settings({"select": ["AMP1"]}), Job("check"), jobs=1, cache=cache, index=index)
        return [f.fix is not None for f in result.findings if f.path.endswith("main.py") and f.code == "AMP101"]

    assert main_fix() == [True]
    assert main_fix() == [True]  # from the cache
    _edit(project / "pkg" / "engine.py", "        optimizer.step()\n", "        optimizer.step(lambda: loss)\n")
    assert main_fix() == [False]


def test_the_model_may_be_an_attribute(tmp_path):
    """`controller.model_main, optimizer = amp.initialize(controller.model_main, optimizer, ...)`
    (Cream's CDARTS retrain.py): only the optimizer has to be a name."""
    project = _copy(tmp_path)
    _edit(project / "train_net.py", "    model, optimizer = amp.initialize(model, optimizer, opt_level=amp_opt_level)\n",
          "    cfg.model, optimizer = amp.initialize(cfg.model, optimizer, opt_level=amp_opt_level)\n")
    _fix(project)
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=amp_opt_level != "O0")' in (project / "train_net.py").read_text()
    assert "scaler.scale(losses).backward()" in (project / "trainer.py").read_text()
    _compiles_and_is_stable(project)


def test_a_trainer_of_another_sub_project_is_not_confused(tmp_path):
    """`from core.trainer import do_train` in `a/train_net.py` where `a/core/trainer.py` and
    `b/core/trainer.py` are both in the run: Python finds the one under `a/` (the script's folder
    or a folder above it; engine/import_resolution.py), so the pair migrates."""
    project = tmp_path / "p"
    for side in ("a", "b"):
        (project / side / "core").mkdir(parents=True)
    shutil.copy(SPLIT / "trainer.py", project / "a" / "core" / "trainer.py")
    (project / "b" / "core" / "trainer.py").write_text("def do_train(*args):\n    pass\n")
    main = (SPLIT / "train_net.py").read_text().replace("from trainer import", "from core.trainer import")
    (project / "a" / "train_net.py").write_text(main)
    _fix(project)
    assert "scaler=scaler" in (project / "a" / "train_net.py").read_text()
    assert "scaler.scale(losses).backward()" in (project / "a" / "core" / "trainer.py").read_text()
    assert (project / "b" / "core" / "trainer.py").read_text() == "def do_train(*args):\n    pass\n"
    _compiles_and_is_stable(project)


def test_an_import_that_may_name_the_trainer_makes_both_refuse(tmp_path):
    """`from core.trainer import do_train` in `a/x/train_net.py` where `a/x/core/trainer.py` and
    `a/core/trainer.py` are both in the run: run as a script it finds the first, run as
    `python -m x.train_net` from `a/` the second; B cannot take a new parameter."""
    project = tmp_path / "p"
    (project / "a" / "x" / "core").mkdir(parents=True)
    (project / "a" / "core").mkdir(parents=True)
    shutil.copy(SPLIT / "trainer.py", project / "a" / "core" / "trainer.py")
    (project / "a" / "x" / "core" / "trainer.py").write_text("def do_train(*args):\n    pass\n")
    main = (SPLIT / "train_net.py").read_text().replace("from trainer import", "from core.trainer import")
    (project / "a" / "x" / "train_net.py").write_text(main)
    reasons = _refused(project)
    assert "a/x/train_net.py imports `core.trainer`, which may be a/core/trainer.py or another file of the run" in reasons["trainer.py"]

def test_a_file_importing_the_function_without_using_it_does_not_stop_the_group(tmp_path):
    """VL-BERT's forks: `from common.trainer import train` in a script that never calls it."""
    project = _copy(tmp_path)
    (project / "explain.py").write_text("from trainer import do_train\n\nprint('explain')\n")
    _fix(project)
    assert "amp" not in (project / "trainer.py").read_text()
    assert "scaler" in (project / "train_net.py").read_text()
    assert (project / "explain.py").read_text() == "from trainer import do_train\n\nprint('explain')\n"
    _compiles_and_is_stable(project)


def test_a_file_handing_the_unused_import_on_still_stops_the_group(tmp_path):
    project = _copy(tmp_path)
    (project / "explain.py").write_text("from trainer import do_train\n")
    (project / "finetune.py").write_text(
        "from explain import do_train\n\n\ndef finetune(model, loader, optimizer):\n    do_train(model, loader, optimizer, 10)\n"
    )
    reasons = _refused(project)  # the package-like relay is followed to the file that calls it
    assert "finetune.py calls `do_train()` and has no `amp.initialize`" in reasons["trainer.py"]


RELAY = FIXTURES / "AMP101" / "amp_split_relay.project"


def test_the_index_records_the_function_relaying_the_optimizer():
    summary = summarize((RELAY / "engine.py").read_bytes(), "")
    assert summary.apex_step_relays == {"train_one_epoch": "fit"}
    assert summary.apex_step_functions["fit"] == (["model", "optimizer", "loader", "epochs"], "optimizer", "scaler", "")
    assert summary.apex_step_functions["train_one_epoch"][3] == ""


def test_the_scaler_threads_through_the_relaying_function(tmp_path):
    project = _copy(tmp_path, RELAY)
    _fix(project)
    engine = (project / "engine.py").read_text()
    assert "def fit(model, optimizer, loader, epochs=10, *, scaler):\n" in engine
    assert "        last = train_one_epoch(model, optimizer, loader, scaler=scaler)\n" in engine
    assert "def train_one_epoch(model, optimizer, loader, clip=1.0, *, scaler):\n" in engine
    assert "amp" not in engine.replace("torch.amp", "")
    assert "    fit(model, optimizer, loader, epochs=args.epochs, scaler=scaler)\n" in (project / "train.py").read_text()
    _compiles_and_is_stable(project)


def test_another_file_calling_the_step_function_itself_makes_both_refuse(tmp_path):
    project = _copy(tmp_path, RELAY)
    (project / "evaluate.py").write_text("from engine import train_one_epoch\n\ntrain_one_epoch(None, None, [])\n")
    assert "evaluate.py uses `train_one_epoch()` of engine.py, which only `fit()` there" in _refused(project)["train.py"]


def test_a_relay_used_in_its_own_file_or_given_another_optimizer_refuses(tmp_path):
    project = _copy(tmp_path, RELAY)
    _edit(project / "engine.py", "        print(f\"epoch", "        fit(model, optimizer, loader, 0)\n        print(f\"epoch")
    assert "`train_one_epoch()` is also used in its own file" in _refused(project)["engine.py"]
    project = _copy(tmp_path / "b", RELAY)
    _edit(project / "engine.py", "train_one_epoch(model, optimizer, loader)", "train_one_epoch(model, make(), loader)")
    assert "`train_one_epoch()` is also used in its own file" in _refused(project)["engine.py"]


def test_accumulation_with_delay_unscale_migrates_across_files(tmp_path):
    project = _copy(tmp_path, RELAY)
    _edit(
        project / "engine.py",
        "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n            scaled_loss.backward()\n        optimizer.step()\n",
        "        with amp.scale_loss(loss, optimizer, delay_unscale=len(loader) > 1) as scaled_loss:\n"
        "            scaled_loss.backward()\n        optimizer.step()\n",
    )
    _fix(project)
    engine = (project / "engine.py").read_text()
    assert "        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n" in engine
    assert "delay_unscale" not in engine
    _compiles_and_is_stable(project)


# ---- the setup's own checkpoint, and optimizer helpers beside the step function (corpus Z: a
# person-search project saves `'amp': amp.state_dict()` in its train.py; a detection project's
# train script hands the optimizer to `adjust_lr()` of the trainer's file too)
_SAVE = '    torch.save({"model": model.state_dict(), "amp": amp.state_dict()}, "last.pth")\n'


def test_the_setups_own_state_dict_becomes_the_scalers(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "train_net.py", "    return model\n", _SAVE + "    return model\n")
    assert summarize((project / "train_net.py").read_bytes(), "").apex_init_problem == ""
    _fix(project)
    a = (project / "train_net.py").read_text()
    assert '"amp": scaler.state_dict()' in a and "apex" not in a
    assert "scaler.scale(losses).backward()" in (project / "trainer.py").read_text()
    _compiles_and_is_stable(project)


def test_the_setups_own_state_load_is_guarded(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "train_net.py", "    do_train(", '    amp.load_state_dict(cfg.resume["amp"])\n    do_train(')
    _fix(project)
    a = (project / "train_net.py").read_text()
    assert "scaler.load_state_dict(cfg.resume[\"amp\"])" in a and "amp.load_state_dict" not in a
    _compiles_and_is_stable(project)


def test_a_state_dict_in_another_function_of_the_setup_file_refuses(tmp_path):
    project = _copy(tmp_path)
    (project / "train_net.py").write_text(
        (project / "train_net.py").read_text() + '\n\ndef save(model):\n    torch.save({"amp": amp.state_dict()}, "x.pth")\n'
    )
    assert summarize((project / "train_net.py").read_bytes(), "").apex_init_problem == "the file also uses `amp.state_dict`"
    reasons = _refused(project)
    assert "the file also uses `amp.state_dict`" in reasons["trainer.py"]


_ADJUST = "\n\ndef adjust_lr(optimizer, epoch, decay=0.1):\n    for group in optimizer.param_groups:\n        group[\"lr\"] *= decay ** epoch\n"


def test_an_optimizer_helper_beside_the_step_function_needs_no_scaler(tmp_path):
    project = _copy(tmp_path)
    (project / "trainer.py").write_text((project / "trainer.py").read_text() + _ADJUST)
    assert summarize((project / "trainer.py").read_bytes(), "").apex_plain_functions == ["adjust_lr"]
    _edit(project / "train_net.py", "from trainer import do_train", "from trainer import adjust_lr, do_train")
    _edit(project / "train_net.py", "    do_train(", "    adjust_lr(optimizer, 0)\n    do_train(")
    _fix(project)
    a = (project / "train_net.py").read_text()
    assert "    adjust_lr(optimizer, 0)\n    do_train(model, data_loader, optimizer, cfg.max_iter, scaler=scaler)" in a
    assert "def adjust_lr(optimizer, epoch, decay=0.1):" in (project / "trainer.py").read_text()
    _compiles_and_is_stable(project)


@pytest.mark.parametrize(
    "body",
    [
        "    optimizer.step()\n",  # steps the optimizer itself
        "    do_train(None, [], optimizer, 0)\n",  # hands it to the step function
        "    amp.master_params(optimizer)\n",  # reads apex
        "    return other.train(optimizer)\n",  # hands it to a function the index does not follow
    ],
)
def test_a_helper_that_steps_relays_or_reads_apex_is_no_plain_helper(tmp_path, body):
    project = _copy(tmp_path)
    (project / "trainer.py").write_text((project / "trainer.py").read_text() + "\n\ndef helper(optimizer):\n" + body)
    assert summarize((project / "trainer.py").read_bytes(), "").apex_plain_functions == []
    _edit(project / "train_net.py", "from trainer import do_train", "from trainer import do_train, helper")
    _edit(project / "train_net.py", "    do_train(", "    helper(optimizer)\n    do_train(")
    assert "train_net.py" in _refused(project)


def test_a_side_whose_migration_would_not_be_written_stops_the_group(tmp_path):
    """`amp.load_state_dict` before `amp.initialize`: A's plan would read the scaler before it is
    made, which the engine refuses to write; B must not migrate without it."""
    project = _copy(tmp_path)
    _edit(project / "train_net.py", "    model, optimizer = amp.initialize(", '    amp.load_state_dict(cfg.resume["amp"])\n    model, optimizer = amp.initialize(')
    reasons = _refused(project)
    assert "train_net.py cannot be migrated with it: its migration would read `scaler` in `train()`" in reasons["trainer.py"]


# ------------------------------------------------------------------ a package re-exporting the step function
def _packaged(tmp_path: Path) -> Path:
    """trainer.py moved into an `engine/` package whose `__init__.py` re-exports `do_train`;
    train_net.py imports it from the package."""
    project = _copy(tmp_path)
    (project / "engine").mkdir()
    (project / "trainer.py").rename(project / "engine" / "trainer.py")
    (project / "engine" / "__init__.py").write_text("from .trainer import do_train\n")
    _edit(project / "train_net.py", "from trainer import do_train\n", "from engine import do_train\n")
    return project


def test_a_step_function_reexported_by_a_package_threads_the_scaler(tmp_path):
    project = _packaged(tmp_path)
    decision = decide(_index(project), str(project / "engine" / "trainer.py"), "do_train")
    assert decision.migrate and decision.callers == ("train_net.py",)
    _fix(project)
    a = (project / "train_net.py").read_text()
    b = (project / "engine" / "trainer.py").read_text()
    assert "apex" not in a and "apex" not in b
    assert "do_train(model, data_loader, optimizer, cfg.max_iter, scaler=scaler)" in a
    assert "def do_train(model, data_loader, optimizer, max_iter, scaler):" in b
    assert (project / "engine" / "__init__.py").read_text() == "from .trainer import do_train\n"
    _compiles_and_is_stable(project)


def test_a_file_scaling_itself_sees_a_step_function_behind_a_package(tmp_path):
    """It hands its optimizer to the package's `do_train`: before the relay was followed it
    migrated alone, leaving `do_train`'s `amp.scale_loss` on an optimizer apex never set up."""
    project = _packaged(tmp_path)
    _edit(
        project / "train_net.py",
        "    do_train(model, data_loader, optimizer, cfg.max_iter)\n",
        "    for images, targets in data_loader:\n        loss = model(images, targets)\n"
        "        with amp.scale_loss(loss, optimizer) as scaled:\n            scaled.backward()\n"
        "        optimizer.step()\n    do_train(model, data_loader, optimizer, cfg.max_iter)\n",
    )
    reasons = _refused(project)
    assert "hands the optimizer to `do_train()` of engine/trainer.py" in reasons["train_net.py"]


# ------------------------------------------------------------------ a second step function nobody calls
_WARMUP = (
    "\n\ndef warmup(model, data_loader, optimizer, steps):\n"
    "    for step, (images, targets) in enumerate(data_loader):\n"
    "        loss = model(images, targets).sum()\n"
    "        with amp.scale_loss(loss, optimizer) as scaled:\n            scaled.backward()\n"
    "        optimizer.step()\n        if step >= steps:\n            break\n"
)


def test_a_step_function_no_file_calls_takes_the_scaler_beside_one_that_runs(tmp_path):
    """ninpy's `utils.py`: `warmup()` is imported by the script beside `train()` but never called."""
    project = _copy(tmp_path)
    (project / "trainer.py").write_text((project / "trainer.py").read_text() + _WARMUP)
    _edit(project / "train_net.py", "from trainer import do_train\n", "from trainer import do_train, warmup\n")
    index = _index(project)
    assert not decide(index, str(project / "trainer.py"), "warmup", alone=True).migrate
    assert decide(index, str(project / "trainer.py"), "warmup").migrate
    _fix(project)
    b = (project / "trainer.py").read_text()
    assert "apex" not in b and "def warmup(model, data_loader, optimizer, steps, scaler):" in b
    assert "do_train(model, data_loader, optimizer, cfg.max_iter, scaler=scaler)" in (project / "train_net.py").read_text()
    _compiles_and_is_stable(project)


def test_a_step_function_no_file_calls_stays_when_nothing_else_of_its_file_migrates(tmp_path):
    project = _copy(tmp_path)
    (project / "trainer.py").write_text((project / "trainer.py").read_text() + _WARMUP)
    (project / "finetune.py").write_text(
        "from trainer import do_train\n\n\ndef finetune(model, loader, optimizer):\n    do_train(model, loader, optimizer, 10)\n"
    )
    decision = decide(_index(project), str(project / "trainer.py"), "warmup")
    assert not decision.migrate
    assert decision.reason == "no file of the run calls `warmup()` from trainer.py after `amp.initialize`"
    assert "finetune.py calls `do_train()` and has no `amp.initialize`" in _refused(project)["trainer.py"]
