"""What the protocol analysis (ampmigrate/analysis/scaler_protocol.py) observes on small loops."""

from __future__ import annotations

import textwrap
from typing import Dict

import libcst as cst

from ampmigrate.analysis.scaler_protocol import analyses
from ampmigrate.config import Settings
from ampmigrate.engine.context import FileContext

HEADER = "import torch\nfrom torch.nn.utils import clip_grad_norm_ as clip\n\n"


def _units(code: str) -> Dict[str, object]:
    text = HEADER + textwrap.dedent(code)
    ctx = FileContext("x.py", text, cst.parse_module(text), Settings())
    out = {}
    for unit in analyses(ctx):
        name = unit.owner.name.value if isinstance(unit.owner, cst.FunctionDef) else "<module>"
        out[name] = unit
    out["ctx"] = ctx
    return out


def _calls(units, table: str, name: str = "train"):
    """The source of the calls an observation table holds."""
    ctx = units["ctx"]
    return sorted(ctx.code(node) for node in getattr(units[name], table))


def test_clip_between_backward_and_step_is_found_with_its_optimizer():
    units = _units(
        """
        def train(model, loader, opt):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                clip(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
        """
    )
    findings = list(units["train"].clip_findings.values())
    assert len(findings) == 1
    assert [units["ctx"].code(s.optimizer_expr) for s in findings[0].steps] == ["opt"]


def test_unscale_on_one_path_only_keeps_the_clip_silent():
    """`if amp: unscale_` then an unconditional clip: unsure, so silent."""
    units = _units(
        """
        def train(model, loader, opt, amp, fast):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                if amp:
                    scaler.unscale_(opt)
                clip(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
        """
    )
    assert units["train"].clip_findings == {}


def test_a_backward_between_the_clip_and_the_step_drops_the_clip():
    units = _units(
        """
        def train(model, loader, opt):
            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                scaler.scale(model(x)).backward()
                clip(model.parameters(), 1.0)
                scaler.scale(model(y)).backward()
                scaler.step(opt)
                scaler.update()
        """
    )
    assert units["train"].clip_findings == {}


def test_an_opaque_call_makes_the_history_unknown():
    units = _units(
        """
        from helpers import maybe_unscale

        def train(model, loader, opt):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                maybe_unscale(scaler, opt)
                clip(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
        """
    )
    assert units["train"].clip_findings == {}


def test_unscale_every_micro_step_is_seen_across_iterations():
    units = _units(
        """
        def train(model, loader, opt, accum):
            scaler = torch.amp.GradScaler("cuda")
            for i, x in enumerate(loader):
                scaler.scale(model(x)).backward()
                scaler.unscale_(opt)
                if (i + 1) % accum == 0:
                    scaler.step(opt)
                    scaler.update()
                    opt.zero_grad()
        """
    )
    assert _calls(units, "unscales_before_accumulation") == ["scaler.unscale_(opt)"]
    assert _calls(units, "repeat_unscales") == ["scaler.unscale_(opt)"]


def test_flags_that_cannot_hold_together_are_not_a_skipped_step():
    """`args.amp` and `scaler is not None` mean the same here; the scenario where only the first
    holds never steps at all, so it does not count as "unscale_ without step"."""
    units = _units(
        """
        def train(model, loader, opt, args):
            scaler = torch.amp.GradScaler("cuda") if args.amp else None
            for x in loader:
                loss = model(x)
                if args.amp:
                    scaler.scale(loss).backward()
                    scaler.unscale_(opt)
                else:
                    loss.backward()
                clip(model.parameters(), 1.0)
                if scaler is not None:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
                opt.zero_grad()
        """
    )
    unit = units["train"]
    assert not unit.repeat_unscales and not unit.unscales_before_accumulation and not unit.clip_findings


def test_update_on_non_stepping_iterations():
    units = _units(
        """
        def train(model, loader, opt, accum):
            scaler = torch.amp.GradScaler("cuda")
            for i, x in enumerate(loader):
                scaler.scale(model(x)).backward()
                if (i + 1) % accum == 0:
                    scaler.step(opt)
                    opt.zero_grad()
                scaler.update()
        """
    )
    assert _calls(units, "updates_without_step") == ["scaler.update()"]


def test_step_repeated_without_update_and_plain_step():
    units = _units(
        """
        def train(model, loader, opt, opt2):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.step(opt)
                opt2.step()
                opt.zero_grad()
        """
    )
    assert _calls(units, "repeat_steps") == ["scaler.step(opt)"]
    assert _calls(units, "plain_steps") == []  # nothing says `opt2` is an optimizer


def test_plain_step_of_a_known_optimizer():
    units = _units(
        """
        def train(model, loader):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                opt.step()
                opt.zero_grad()
        """
    )
    assert _calls(units, "plain_steps") == ["opt.step()"]


def test_helpers_of_the_file_are_followed():
    units = _units(
        """
        def clip_all(optimizer, max_norm):
            clip([p for g in optimizer.param_groups for p in g["params"]], max_norm)

        def log_grads(model):
            return sum(p.grad.norm() ** 2 for p in model.parameters())

        def train(model, loader, opt):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                clip_all(opt, 1.0)
                log_grads(model)
                scaler.step(opt)
                scaler.update()
        """
    )
    kinds = sorted((f.kind, f.detail) for f in units["train"].clip_findings.values())
    assert kinds == [("clip", "clip_all"), ("read", "log_grads")]


def test_a_helper_that_receives_the_scaler_starts_with_scaled_gradients():
    units = _units(
        """
        def clip_and_step(scaler, optimizer, model):
            clip(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()

        def train(model, loader, opt):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                clip_and_step(scaler, opt, model)
        """
    )
    assert units["clip_and_step"].entry == "scaled"
    assert len(units["clip_and_step"].clip_findings) == 1
    assert units["train"].entry == "fresh"


def test_a_helper_is_unknown_when_the_scaler_is_unscaled_somewhere():
    units = _units(
        """
        def clip_and_step(scaler, optimizer, model):
            clip(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()

        def train(model, loader, opt):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.unscale_(opt)
                clip_and_step(scaler, opt, model)
        """
    )
    assert units["clip_and_step"].entry == "unknown"
    assert units["clip_and_step"].clip_findings == {}


def test_inherited_methods_of_unknown_bases_are_opaque():
    units = _units(
        """
        from framework import BaseTrainer

        class Trainer(BaseTrainer):
            def __init__(self):
                self.scaler = torch.amp.GradScaler("cuda")

            def train_step(self, loss):
                self.scaler.scale(loss).backward()
                self.clip_gradients()
                self.scaler.step(self.optimizer)
                self.scaler.update()
        """
    )
    assert units["train_step"].clip_findings == {}
    assert units["train_step"].updates_without_step == {}


def test_disabled_scalers_are_ignored():
    units = _units(
        """
        def train(model, loader, opt):
            scaler = torch.amp.GradScaler("cuda", enabled=False)
            for x in loader:
                scaler.scale(model(x)).backward()
                clip(model.parameters(), 1.0)
                scaler.step(opt)
        """
    )
    assert "train" not in units


def test_keyword_optimizer_arguments_are_read():
    units = _units(
        """
        def train(model, loader, opt):
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.unscale_(optimizer=opt)
                clip(model.parameters(), 1.0)
                scaler.step(optimizer=opt)
                scaler.update()
        """
    )
    unit = units["train"]
    assert unit.clip_findings == {} and not unit.double_unscales and not unit.repeat_unscales
