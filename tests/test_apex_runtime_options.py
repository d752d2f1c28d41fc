"""Run-time `amp.initialize` options (the fixture AMP101/runtime_loss_scale_options, apex's
ImageNet example's command line): the migrated program is run with each value apex took, and the
GradScaler it builds, or the error it stops with, is checked against apex's meaning."""

from __future__ import annotations

import argparse
import runpy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

EXPECTED = Path(__file__).parent / "fixtures" / "AMP101" / "runtime_loss_scale_options.expected.py"
DYNAMIC = {"init_scale": 65536.0, "growth_interval": 2000}  # apex's dynamic LossScaler defaults
STATIC_128 = {"init_scale": 128.0, "growth_interval": 2**31 - 1}


@pytest.fixture
def built(monkeypatch):
    """The keyword arguments of every GradScaler the migrated program makes."""
    made = []
    real = torch.amp.GradScaler

    def recording(*args, **kwargs):
        made.append(kwargs)
        return real("cpu", **kwargs)

    monkeypatch.setattr(torch.amp, "GradScaler", recording)
    return made


def _run(opt_level="O1", keep_batchnorm_fp32=None, loss_scale=None):
    program = runpy.run_path(str(EXPECTED))
    args = argparse.Namespace(opt_level=opt_level, keep_batchnorm_fp32=keep_batchnorm_fp32, loss_scale=loss_scale)
    program["main"](args)


@pytest.mark.parametrize(
    "loss_scale, expected",
    [(None, DYNAMIC), ("dynamic", DYNAMIC), ("128", STATIC_128), ("128.0", STATIC_128), (128.0, STATIC_128)],
)
def test_the_loss_scale_keeps_its_meaning(built, loss_scale, expected):
    _run(loss_scale=loss_scale)
    assert len(built) == 1
    assert {k: built[0][k] for k in expected} == expected


@pytest.mark.parametrize("value", [None, "True", True])
def test_batchnorm_values_autocast_matches_migrate(built, value):
    _run(opt_level="O2", keep_batchnorm_fp32=value)
    assert built and built[0]["enabled"] is True


@pytest.mark.parametrize("value", ["False", False])
def test_fp16_batchnorm_stops_where_apex_was_set_up(built, value):
    with pytest.raises(ValueError, match="keep_batchnorm_fp32=False"):
        _run(opt_level="O2", keep_batchnorm_fp32=value)
    assert not built


def test_o0_disables_the_scaler_and_o3_stops(built):
    _run(opt_level="O0")
    assert built[0]["enabled"] is False
    with pytest.raises(ValueError, match="O3"):
        _run(opt_level="O3")


def test_a_run_time_loss_scale_the_scaler_cannot_read_where_it_is_made_stays_unsafe():
    """A builder function sets apex up and an optimizer wrapper class holds the scaler, made in its
    `__init__` (fixture AMP101/class_wrapper_builder): the builder's `config.loss_scale` cannot be
    read there, so the scaler keeps GradScaler's dynamic defaults and the fix says so, unsafe."""
    from conftest import FIXTURES, check, fix

    code = (FIXTURES / "AMP101" / "class_wrapper_builder.py").read_text(encoding="utf-8")
    code = code.replace('loss_scale="dynamic"', "loss_scale=config.loss_scale")
    assert fix(code, select=["AMP1"]) == code  # no safe fix
    fixed = fix(code, select=["AMP1"], unsafe_fixes=True)
    assert 'self.scaler = torch.amp.GradScaler("cuda")' in fixed and "init_scale" not in fixed
    messages = [f.fix.message for f in check(code, select=["AMP1"], unsafe_fixes=True) if f.fix is not None]
    assert messages and all("`loss_scale=config.loss_scale` is only known at run time; the rewrite assumes a dynamic loss scale" in m for m in messages)
