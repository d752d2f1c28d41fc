"""The apex arm of a transformers Trainer subclass (rules/apex/_hf_apex_arms.py), run: the
migrated `training_step` keeps the native arm's behaviour and stops, with the reason, only where
transformers' apex backend had been chosen."""

from __future__ import annotations

import sys
import types

import pytest
from conftest import FIXTURES, make_settings

from ampmigrate.engine.pipeline import Engine

CASE = FIXTURES / "AMP101" / "hf_trainer_apex_arm.py"


class _Loss:
    def __init__(self, log):
        self.log = log

    def backward(self):
        self.log.append("backward")

    def detach(self):
        return self


class _Scaled(_Loss):
    def backward(self):
        self.log.append("scaled backward")


class _Scaler:
    def __init__(self, log):
        self.log = log

    def scale(self, loss):
        return _Scaled(self.log)


def _stub_transformers(monkeypatch):
    module = types.ModuleType("transformers")

    class Trainer:  # the attributes transformers 4.x sets from its TrainingArguments
        def __init__(self, use_amp=False, use_apex=False):
            self.use_amp, self.use_apex, self.log = use_amp, use_apex, []
            self.scaler = _Scaler(self.log)

        def compute_loss(self, model, inputs):
            return _Loss(self.log)

    module.Trainer = Trainer
    module.is_apex_available = lambda: False  # apex.amp is gone: the import guard skips it
    monkeypatch.setitem(sys.modules, "transformers", module)


def _migrated() -> str:
    engine = Engine(make_settings({"select": ["AMP1"]}))
    result = engine.fix_text(CASE.read_text(encoding="utf-8"), str(CASE))
    assert result.new_text is not None and result.findings == []
    assert "amp.scale_loss" not in result.new_text and "from apex" not in result.new_text
    return result.new_text


class _Model:
    def train(self):
        pass


@pytest.mark.parametrize("use_amp, expected", [(True, ["scaled backward"]), (False, ["backward"])])
def test_the_native_and_fp32_arms_run_as_before(monkeypatch, use_amp, expected):
    _stub_transformers(monkeypatch)
    namespace: dict = {}
    exec(compile(_migrated(), str(CASE), "exec"), namespace)
    trainer = namespace["CTCTrainer"](use_amp=use_amp)
    trainer.training_step(_Model(), {})
    assert trainer.log == expected


def test_the_apex_backend_stops_with_the_reason(monkeypatch):
    _stub_transformers(monkeypatch)
    namespace: dict = {}
    exec(compile(_migrated(), str(CASE), "exec"), namespace)
    for name in ("CTCTrainer", "PreTrainer"):
        trainer = namespace[name](use_apex=True)
        with pytest.raises(RuntimeError, match="half_precision_backend='apex'"):
            trainer.training_step(_Model(), {})
        assert trainer.log == []  # no unscaled backward in place of apex's scaled one
