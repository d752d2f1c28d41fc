"""timm's ApexScaler whose scaler and autocast variable go to files of the repository
(rules/apex/_timm_remote.py), and the fix's other shapes around the timm arm (O2, `with X(kw=)`).

The fixture tests/fixtures/AMP101/timm_scaler_engine.project (written from scratch): `main.py`
chooses apex or native AMP the timm way, passes the loss scaler to its own `CheckpointSaver`
(`checkpoint_saver.py`, storing it as `self.amp_scaler`, asking only its state) and the scaler and
autocast variable to a DeiT-style `train_one_epoch` and `evaluate` (`engine.py`), and star-imports
its model (`models/net.py`). The apex arm becomes the native arm in `main.py` alone; each use the
other files make outside the protocol of timm's scalers stops it, naming the file and line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, check
from test_apex_threading import ROOT, _compiles_and_is_stable, _edit, _fix, _snapshot

from ampmigrate.diagnostics import SAFE, UNSAFE

ENGINE = FIXTURES / "AMP101" / "timm_scaler_engine.project"
BASIC = (FIXTURES / "AMP101" / "timm_scaler_basic.py").read_text(encoding="utf-8")


def _copy(tmp_path: Path) -> Path:
    project = tmp_path / "p"
    shutil.copytree(ENGINE, project)
    return project


def _initialize_finding(project: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "ampmigrate", "check", "--no-cache", "--exit-zero", "--select", "AMP1",
         "--output-format", "json", "."],
        cwd=project,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    found = [f for f in json.loads(done.stdout) if f["code"] == "AMP101" and f["filename"].endswith("main.py")]
    assert len(found) == 1
    return found[0]


def test_the_apex_arm_becomes_the_native_arm_in_the_script_alone(tmp_path):
    project = _copy(tmp_path)
    before = _snapshot(project)
    _fix(project)
    after = _snapshot(project)
    assert {k for k in after if after[k] != before[k]} == {"main.py"}
    main = after["main.py"]
    assert "amp.initialize" not in main and "ApexScaler" not in main and "from apex import amp" not in main
    assert 'amp_autocast = functools.partial(torch.autocast, "cuda", dtype=torch.float16)' in main
    assert "        loss_scaler = NativeScaler()\n        amp_autocast = functools.partial" in main
    _compiles_and_is_stable(project)


def test_the_fix_says_where_the_other_files_clip_and_save(tmp_path):
    finding = _initialize_finding(_copy(tmp_path))
    assert finding["fix"]["applicability"] == "safe"
    message = finding["fix"]["message"]
    assert "the clip at engine.py:14 now covers `model.parameters()`" in message
    assert "under the key `amp_scaler`" in message


@pytest.mark.parametrize(
    "path, old, new, reason",
    [
        (
            "checkpoint_saver.py",
            "            self.amp_scaler.load_state_dict(state[self.amp_scaler.state_dict_key])\n",
            "            self.amp_scaler.load_state_dict(state[self.amp_scaler.state_dict_key])\n            self.amp_scaler.update()\n",
            "`self.amp_scaler.update` at checkpoint_saver.py:27 is not part of the protocol",
        ),
        (
            "checkpoint_saver.py",
            "        self.checkpoint_dir = checkpoint_dir\n",
            "        self.checkpoint_dir = checkpoint_dir\n        self.amp_scaler = None\n",
            "is assigned again at checkpoint_saver.py:14",
        ),
        (
            "main.py",
            "        saver.save(epoch, top1)\n",
            "        saver.save(epoch, top1)\n        saver.amp_scaler.update()\n",
            "`saver.amp_scaler` at line 37 may reach `self.amp_scaler`",
        ),
        (
            "checkpoint_saver.py",
            "class CheckpointSaver:",
            "class CheckpointSaver(Base):",
            "a class with base classes this fix does not follow",
        ),
        (
            "engine.py",
            "        optimizer.zero_grad()\n        if loss_scaler",
            "        optimizer.zero_grad()\n        print(loss_scaler)\n        if loss_scaler",
            "the loss scaler is used at engine.py:13 in a way this fix cannot follow",
        ),
        (
            "engine.py",
            "clip_grad=args.clip_grad, parameters=model.parameters(), create_graph=False)",
            "clip_grad=args.clip_grad)",
            "engine.py:14 clips without `parameters=`",
        ),
        (
            "engine.py",
            "        with amp_autocast():\n            loss",
            "        ctx = amp_autocast\n        with ctx():\n            loss",
            "`amp_autocast` is used at engine.py:10 other than as `with amp_autocast():`",
        ),
        (
            "engine.py",
            "            correct += (model(images).argmax(-1)",
            "            correct += (model(images.half()).argmax(-1)",
            "engine.py:26 casts to half",
        ),
        (
            "models/net.py",
            "import torch.nn as nn\n",
            "from functools import partial\n\nimport torch.nn as nn\n",
            "`from models.net import *` (line 10) binds `partial`",
        ),
    ],
)
def test_uses_outside_the_protocol_stop_the_fix(tmp_path, path, old, new, reason):
    project = _copy(tmp_path)
    _edit(project / path, old, new)
    before = _snapshot(project)
    _fix(project)
    assert _snapshot(project) == before
    finding = _initialize_finding(project)
    assert finding["fix"] is None
    assert reason in finding["no_fix_reason"], finding["no_fix_reason"]


def test_a_clip_of_other_parameters_there_is_unsafe(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "engine.py", "parameters=model.parameters(), create_graph", "parameters=args.trained, create_graph")
    finding = _initialize_finding(project)
    assert finding["fix"]["applicability"] == "unsafe"
    assert "NativeScaler clips `args.trained` (engine.py:14)" in finding["fix"]["message"]


def test_a_star_exported_list_without_functools_leaves_the_name_free(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "models" / "net.py", "import torch.nn as nn\n", 'import functools\n\nimport torch.nn as nn\n\n__all__ = ["tiny_net"]\n')
    _fix(project)
    assert "functools.partial(torch.autocast" in (project / "main.py").read_text()
    _compiles_and_is_stable(project)
    project2 = tmp_path / "q"
    shutil.copytree(ENGINE, project2)
    _edit(project2 / "models" / "net.py", "import torch.nn as nn\n", "import functools\nimport torch.nn as nn\n")
    finding = _initialize_finding(project2)
    assert finding["fix"] is None and "`from models.net import *` (line 10) binds `functools`" in finding["no_fix_reason"]


def test_an_autocast_entered_with_a_dtype_there_is_unsafe(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "engine.py", "        with amp_autocast():\n            correct", "        with amp_autocast(dtype=torch.bfloat16):\n            correct")
    finding = _initialize_finding(project)
    assert finding["fix"]["applicability"] == "unsafe"
    assert "`amp_autocast(dtype=...)` at engine.py:25" in finding["fix"]["message"]
    assert "its dtype overrides apex's fp16" in finding["fix"]["message"]


# ---------------------------------------------------------------------- in one file
def _initialize(code: str):
    return next(f for f in check(code, select=["AMP1"]) if f.code == "AMP101" and "initialize" in f.message)


def test_o2_is_migrated_as_the_in_file_planner_does():
    finding = _initialize(BASIC.replace('opt_level="O1")', 'opt_level="O2", keep_batchnorm_fp32=True)'))
    assert finding.fix is not None and finding.fix.applicability == SAFE
    assert "apex O2 cast the model to fp16 with fp32 master weights" in finding.fix.message
    fp16_bn = _initialize(BASIC.replace('opt_level="O1")', 'opt_level="O2", keep_batchnorm_fp32=False)'))
    assert fp16_bn.fix is not None and fp16_bn.fix.applicability == UNSAFE
    assert "`keep_batchnorm_fp32=False` differs from what autocast does" in fp16_bn.fix.message


def test_o2_with_half_inputs_outside_the_autocast_stops():
    code = BASIC.replace('opt_level="O1")', 'opt_level="O2")').replace(
        "def main(args, model, loader):", "def warmup(model, x):\n    return model(x.half())\n\n\ndef main(args, model, loader):"
    )
    finding = _initialize(code)
    assert finding.fix is None and "casts to half in `warmup()`" in finding.no_fix_reason


def test_a_keyword_entering_the_do_nothing_context_is_unsafe():
    finding = _initialize(BASIC.replace("with amp_autocast():\n            output", "with amp_autocast(dtype=args.dtype):\n            output"))
    assert finding.fix is not None and finding.fix.applicability == UNSAFE
    assert "`amp_autocast(dtype=...)` at line" in finding.fix.message and "raises TypeError" in finding.fix.message


def test_the_scripts_cache_key_follows_the_files_it_imports(tmp_path):
    from test_apex_threading import _index

    project = _copy(tmp_path)
    main = str(project / "main.py")
    keys = [_index(project).dependency_key(main)]
    _edit(project / "engine.py", "        optimizer.zero_grad()\n", "        optimizer.zero_grad()\n        print(loss_scaler)\n")
    keys.append(_index(project).dependency_key(main))
    _edit(project / "models" / "net.py", "import torch.nn as nn\n", "import functools\nimport torch.nn as nn\n")
    keys.append(_index(project).dependency_key(main))
    assert keys[0] and len(set(keys)) == 3
