"""Scaler discovery (ampmigrate/analysis/scalers.py): creations, annotations, attributes, and
parameters that a call site of this file binds to a scaler."""

from __future__ import annotations

import textwrap

import libcst as cst

from ampmigrate.analysis.scalers import escapes, family, find_scalers
from ampmigrate.config import Settings
from ampmigrate.engine.context import FileContext


def _scalers(code: str):
    text = textwrap.dedent(code)
    ctx = FileContext("x.py", text, cst.parse_module(text), Settings())
    return ctx, {s.display: s for s in find_scalers(ctx)}


def test_every_spelling_and_annotation():
    ctx, found = _scalers(
        """
        import torch
        from torch.cuda.amp import GradScaler as LegacyScaler

        a = torch.amp.GradScaler("cuda")
        b = torch.GradScaler("cuda")
        c = LegacyScaler()
        a.update(), b.update(), c.update()

        def f(d: torch.amp.GradScaler, e: "Optional[int]" = None):
            d.step(e)
        """
    )
    assert set(found) == {"a", "b", "c", "d"}
    assert found["d"].calls("step") and not found["d"].creations


def test_parameters_bound_to_a_scaler_at_a_call_site_are_scalers():
    ctx, found = _scalers(
        """
        import torch

        def train_one_epoch(model, loader, optimizer, scaler):
            scaler.step(optimizer)

        def step(*, scaler, optimizer):
            scaler.update()

        def main(model, loader, optimizer):
            grad_scaler = torch.amp.GradScaler("cuda")
            train_one_epoch(model, loader, optimizer, grad_scaler)
            step(scaler=grad_scaler, optimizer=optimizer)
        """
    )
    main = found["grad_scaler"]
    params = [s for s in find_scalers(ctx) if s.display == "scaler"]
    assert len(params) == 2  # one per function: `train_one_epoch`'s and `step`'s parameter
    assert sorted(u.method for p in params for u in p.uses) == ["step", "update"]
    assert set(map(id, family(main))) == {id(main), *map(id, params)}
    assert escapes(ctx.names, main) == []


def test_constructor_and_self_attribute_chain():
    ctx, found = _scalers(
        """
        import torch

        class Trainer:
            def __init__(self, model, scaler):
                self.model = model
                self.scaler = scaler

            def step(self, optimizer):
                self.scaler.step(optimizer)
                self.scaler.update()

        def main(model):
            trainer = Trainer(model, scaler=torch.amp.GradScaler("cuda"))
            s = torch.amp.GradScaler("cuda")
            other = Trainer(model, s)
        """
    )
    assert "self.scaler" in found
    assert [u.method for u in found["self.scaler"].uses] == ["step", "update"]
    assert found["s"] in family(found["self.scaler"])


def test_escapes_and_harmless_references():
    ctx, found = _scalers(
        """
        import torch
        from utils import save_checkpoint

        def train(use_amp):
            scaler = torch.amp.GradScaler("cuda") if use_amp else None
            if scaler is not None and not scaler.is_enabled():
                pass
            save_checkpoint({"scaler": scaler})
        """
    )
    scaler = found["scaler"]
    assert len(scaler.creations) == 1
    assert [ctx.code(ref) for ref in escapes(ctx.names, scaler)] == ["scaler"]
    assert len(scaler.other_refs) == 2  # the `is not None` test and the dict value


def test_disabled_only_when_every_creation_says_so():
    ctx, found = _scalers(
        """
        import torch
        a = torch.amp.GradScaler("cuda", enabled=False)
        b = torch.amp.GradScaler("cuda", enabled=use_amp)
        a.update()
        b.update()
        """
    )
    assert found["a"].disabled and not found["b"].disabled


def test_unrelated_calls_bind_nothing():
    ctx, found = _scalers(
        """
        import torch
        from elsewhere import train

        def local(x):
            return x

        scaler = torch.amp.GradScaler("cuda")
        train(scaler)
        local(1)
        """
    )
    assert set(found) == {"scaler"}
    assert escapes(ctx.names, found["scaler"]) != []


def test_scalers_in_tuples_dict_entries_and_class_fields():
    ctx, found = _scalers(
        """
        import torch
        from dataclasses import dataclass, field

        class Trainer:
            def __init__(self, model):
                self.model, self.scaler = model, torch.amp.GradScaler("cuda")

            def step(self, loss, opt):
                self.scaler.scale(loss).backward()
                self.scaler.step(opt)

        def local(model, opt, loss):
            net, scaler = model, torch.amp.GradScaler("cuda")
            scaler.update()
            scalers = {"gen": torch.amp.GradScaler("cuda"), "disc": torch.amp.GradScaler("cuda")}
            scalers["gen"].scale(loss).backward()
            scalers["disc"].update()
            not_a_scaler = {"gen": 1}
            not_a_scaler["gen"].update()

        @dataclass
        class State:
            scaler: torch.amp.GradScaler = field(default_factory=lambda: torch.amp.GradScaler("cuda"))

        def state_step(state: State, loss, opt):
            state.scaler.scale(loss).backward()
            state.scaler.step(opt)
        """
    )
    assert {"self.scaler", "scaler", 'scalers["gen"]', 'scalers["disc"]', "state.scaler"} <= set(found)
    assert 'not_a_scaler["gen"]' not in found
    assert [u.method for u in found["self.scaler"].uses] == ["scale", "step"]
    assert len(found["self.scaler"].creations) == 1
    assert [u.method for u in found['scalers["gen"]'].uses] == ["scale"]
    assert [u.method for u in found["state.scaler"].uses] == ["scale", "step"]
