"""Calls between the scaled backward and the step into code this file cannot read
(rules/apex/_window_readers.py `_hands_over_gradients`, rules/apex/_remote_grad_reads.py).

Handed the model or the optimizer (or an object made from them), such a call may read or change
`.grad`, which apex had unscaled by then: it gets `scaler.unscale_` first where it runs once per
step, and the migration is refused where it runs on every micro-batch, unless the project index
shows its body reads the gradients only in ways a loss scale cannot change (FGM's
`epsilon * grad / norm`). Fixtures: AMP101/window_opaque_*.py, AMP101/window_remote_fgm.project."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import FIXTURES, check, fix
from test_apex_threading import _compiles_and_is_stable, _edit, _fix, _refused

PROJECT = FIXTURES / "AMP101" / "window_remote_fgm.project"


def _read(name: str) -> str:
    return (FIXTURES / "AMP101" / name).read_text(encoding="utf-8")


def test_an_imported_helper_handed_the_model_gets_unscale_first():
    fixed = fix(_read("window_opaque_call.py"))
    assert "scaler.unscale_(optimizer)\n        add_bn_sparsity(model.features, sparsity)" in fixed


def test_logging_a_scheduler_and_the_forward_are_no_readers():
    code = _read("window_opaque_object.py").replace("            guard.perturb_embeddings()\n", "")
    assert "unscale_(optimizer)" not in fix(code)
    assert "unscale_(optimizer)" in fix(_read("window_opaque_object.py"))


def test_a_value_computed_from_the_model_is_no_reader():
    """`penalty = reg(model)` is a loss (the forward's business), not a call run for its effect."""
    code = _read("window_opaque_call.py").replace(
        "        add_bn_sparsity(model.features, sparsity)\n", "        penalty = add_bn_sparsity(model.features, sparsity)\n"
    )
    assert "unscale_(optimizer)" not in fix(code)


def test_on_every_micro_batch_it_is_refused():
    (finding,) = [f for f in check(_read("window_opaque_call_micro_steps.py"), select=["AMP1"]) if "initialize" in f.message]
    assert finding.fix is None
    assert "`add_bn_sparsity(...)` runs code of another file or a library" in finding.no_fix_reason


def _copy(tmp_path: Path) -> Path:
    project = tmp_path / "p"
    shutil.copytree(PROJECT, project)
    return project


def test_a_scale_invariant_fgm_of_another_file_is_read_through_the_index(tmp_path):
    project = _copy(tmp_path)
    _fix(project)
    fixed = (project / "train.py").read_text()
    assert "scaler.scale(loss_adv).backward()" in fixed and "unscale_(" not in fixed and "apex" not in fixed
    _compiles_and_is_stable(project)


def test_an_fgm_that_reads_the_scaled_gradient_refuses(tmp_path):
    project = _copy(tmp_path)
    _edit(project / "adversarial.py", "self.epsilon * param.grad / norm", "self.epsilon * param.grad")
    reasons = _refused(project)
    assert "`fgm.attack(...)` runs code of another file or a library" in reasons["train.py"], reasons


def test_the_cached_result_follows_the_other_files_body(tmp_path):
    import json
    import subprocess
    import sys

    from conftest import ROOT

    project = _copy(tmp_path)

    def initialize_fixable() -> bool:
        done = subprocess.run(
            [sys.executable, "-m", "ampmigrate", "check", "--exit-zero", "--output-format", "json",
             "--cache-dir", str(tmp_path / "cache"), "."],
            cwd=project, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True,
        )
        found = [f for f in json.loads(done.stdout) if f["code"] == "AMP101" and "initialize" in f["message"]]
        return found[0]["fix"] is not None

    assert initialize_fixable() and initialize_fixable()  # the second run from the cache
    _edit(project / "adversarial.py", "self.epsilon * param.grad / norm", "self.epsilon * param.grad")
    assert not initialize_fixable()


def test_a_gradscalers_own_calls_and_a_tpu_path_are_no_readers():
    """A file with both a native-AMP and an apex path (transformers' 2020 Trainer): the native
    branch's `self.scaler.unscale_(opt)` and a TPU branch's `xm.optimizer_step(opt)` (torch_xla:
    apex, CUDA only, never ran beside it) are not calls that read apex's scaled gradients."""
    code = _read("window_opaque_call.py").replace(
        "        add_bn_sparsity(model.features, sparsity)\n",
        "        if native:\n            native_scaler.unscale_(optimizer)\n        if tpu:\n            xm.optimizer_step(optimizer)\n",
    ).replace("from slimming import add_bn_sparsity\n", "import torch_xla.core.xla_model as xm\n")
    assert "unscale_(optimizer)\n        if native" not in fix(code)


# pix2pix's models: `self.set_requires_grad(self.netD, False)` between the scaled backward and
# the step runs a method the class inherits from `BaseModel` of `models/base_model.py`, read
# through the index like any other file's function.
_BASE = '''\
class BaseModel:
    def set_requires_grad(self, nets, requires_grad=False):
        if not isinstance(nets, list):
            nets = [nets]
        for net in nets:
            for param in net.parameters():
                param.requires_grad = requires_grad
'''
_GAN = '''\
import torch
import torch.nn.functional as F
from apex import amp

from .base_model import BaseModel


class GanModel(BaseModel):
    def __init__(self, opt, netG, netD):
        self.netG, self.netD = netG, netD
        self.optimizer_G = torch.optim.Adam(netG.parameters())
        self.optimizer_D = torch.optim.Adam(netD.parameters())
        [self.netG, self.netD], [self.optimizer_G, self.optimizer_D] = amp.initialize(
            [self.netG, self.netD], [self.optimizer_G, self.optimizer_D], opt_level=opt.opt_level)

    def optimize_parameters(self, real, target):
        self.optimizer_D.zero_grad()
        loss_D = F.mse_loss(self.netD(self.netG(real).detach()), target)
        with amp.scale_loss(loss_D, self.optimizer_D) as scaled:
            scaled.backward()
        self.optimizer_D.step()
        self.optimizer_G.zero_grad()
        loss_G = F.mse_loss(self.netD(self.netG(real)), target)
        with amp.scale_loss(loss_G, self.optimizer_G) as scaled:
            scaled.backward()
        self.set_requires_grad(self.netD, True)
        self.optimizer_G.step()
'''


def _inheriting(tmp_path: Path, base: str = _BASE) -> Path:
    project = tmp_path / "p"
    (project / "models").mkdir(parents=True)
    (project / "models" / "__init__.py").write_text("")
    (project / "models" / "base_model.py").write_text(base)
    (project / "models" / "gan_model.py").write_text(_GAN)
    return project


def test_an_inherited_method_reading_no_gradient_is_no_reader(tmp_path):
    project = _inheriting(tmp_path)
    _fix(project)
    fixed = (project / "models" / "gan_model.py").read_text()
    assert "amp.initialize" not in fixed and "self.scaler.step(self.optimizer_G)" in fixed
    assert "unscale_" not in fixed
    _compiles_and_is_stable(project)


def test_an_inherited_method_reading_gradients_stays_a_reader(tmp_path):
    reading = _BASE + "        print(sum(p.grad.norm() for n in nets for p in n.parameters()))\n"
    project = _inheriting(tmp_path, reading)
    _fix(project)
    assert "amp.initialize" in (project / "models" / "gan_model.py").read_text()
    _fix(project, "--unsafe-fixes")
    assert "amp.initialize" not in (project / "models" / "gan_model.py").read_text()


def test_an_inherited_method_of_an_ambiguous_module_stays_a_reader(tmp_path):
    """A second `base_model.py` the module's name alone could denote: the index would not put
    the base's file in this file's cache key, so its body is not read."""
    project = _inheriting(tmp_path)
    (project / "base_model.py").write_text(_BASE.replace("param.requires_grad = requires_grad", "print(param.grad)"))
    _fix(project)
    assert "amp.initialize" in (project / "models" / "gan_model.py").read_text()
