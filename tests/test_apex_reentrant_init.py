"""A method that sets apex up under a flag it flips, run every epoch (nnU-Net's `_maybe_init_amp`,
tests/fixtures/AMP101/class_reentrant_init.py), migrated and run: the scaler the first call makes
serves every later epoch, and autocast stays on (made before the `if`, the second call replaced it
by a disabled scaler and training went on in fp32)."""

from __future__ import annotations

import contextlib

import pytest
from conftest import FIXTURES, make_settings

from ampmigrate.engine.pipeline import Engine

torch = pytest.importorskip("torch")

CASE = FIXTURES / "AMP101" / "class_reentrant_init.py"


class _Scaler:
    made = []

    def __init__(self, device, enabled=True):
        self.enabled = enabled
        _Scaler.made.append(self)

    def is_enabled(self):
        return self.enabled

    def scale(self, loss):
        return loss

    def step(self, optimizer):
        optimizer.step()

    def update(self):
        pass


def test_every_epoch_after_the_first_keeps_the_scaler_and_autocast(monkeypatch):
    migrated = Engine(make_settings({"select": ["AMP1"]})).fix_text(CASE.read_text(encoding="utf-8"), str(CASE)).new_text
    assert migrated is not None and "= amp.initialize(" not in migrated
    autocast_enabled = []

    @contextlib.contextmanager
    def autocast(device, dtype=None, enabled=True):
        autocast_enabled.append(enabled)
        yield

    _Scaler.made = []
    monkeypatch.setattr(torch.amp, "GradScaler", _Scaler)
    monkeypatch.setattr(torch, "autocast", autocast)
    namespace: dict = {}
    exec(compile(migrated, str(CASE), "exec"), namespace)
    network = torch.nn.Linear(3, 1)
    trainer = namespace["Trainer"](network, torch.optim.SGD(network.parameters(), lr=0.1), fp16=True)
    loader = [(torch.randn(4, 3), torch.randn(4, 1))]
    for _ in range(3):
        trainer.run_epoch(loader)
    assert [s.enabled for s in _Scaler.made] == [False, True]  # `__init__`'s default, then the first epoch's
    assert trainer.scaler is _Scaler.made[1]
    assert autocast_enabled == [True, True, True]
