"""The AMP4 (precision) family beyond its golden fixtures: target dtypes, how its fixes compose
across rounds, and the core helpers it added (value following, item removal, blank lines)."""

from __future__ import annotations

import libcst as cst
import pytest

from ampmigrate.analysis.values import Follower, argparse_option
from ampmigrate.config import Settings
from ampmigrate.diagnostics import Fix
from ampmigrate.engine import fixer
from ampmigrate.engine.context import FileContext, without_items

from conftest import FIXTURES, check, codes, fix

AMP4_FIXTURES = sorted(p for d in FIXTURES.glob("AMP4*") for p in d.glob("*.py") if not p.name.endswith(".expected.py"))
# What the family still reports for a float16 (V100/T4) fleet: deprecations, pure fp16 and loss
# scaling written by hand (GradScaler is the float16 answer too).
FLOAT16_TARGET_CODES = {"AMP404", "AMP406", "AMP409", "AMP411"}


@pytest.mark.parametrize("case", AMP4_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_float16_target_reports_only_deprecations_and_pure_fp16(case):
    findings = check(case.read_text(encoding="utf-8"), str(case), **{"target-dtype": "float16"})
    assert {c for c in codes(findings) if c.startswith("AMP4")} <= FLOAT16_TARGET_CODES


def test_float16_target_leaves_fp16_training_alone():
    text = (FIXTURES / "AMP401" / "explicit_dtype.py").read_text(encoding="utf-8")
    assert fix(text, **{"target-dtype": "float16", "unsafe-fixes": True}) == text


# ------------------------------------------------------------------ composition of AMP401 and AMP402
@pytest.mark.parametrize("name", ["explicit_dtype", "implicit_default", "argparse_dtype", "runtime_train"])
def test_dtype_switch_then_scaler_removal_in_separate_runs_converges(name):
    """Fixing AMP401 alone, then AMP402 alone, gives what fixing both together gives."""
    text = (FIXTURES / "AMP401" / f"{name}.py").read_text(encoding="utf-8")
    together = fix(text, **{"unsafe-fixes": True, "select": ["AMP2", "AMP4"]})
    switched = fix(text, **{"unsafe-fixes": True, "select": ["AMP2", "AMP401"]})
    assert "GradScaler(" in switched  # the scaler waits for the switch
    assert fix(switched, **{"unsafe-fixes": True, "select": ["AMP2", "AMP402"]}) == together
    assert fix(together, **{"unsafe-fixes": True}) == together


def test_scaler_is_never_removed_while_the_autocast_is_float16():
    text = (FIXTURES / "AMP401" / "explicit_dtype.py").read_text(encoding="utf-8")
    assert fix(text, **{"unsafe-fixes": True, "select": ["AMP402"]}) == text
    assert "AMP402" not in codes(check(text))


def test_scaler_stays_when_an_autocast_cannot_be_switched():
    text = """
import torch
amp_dtype = torch.float16
def train(model, loader, optimizer):
    scaler = torch.amp.GradScaler("cuda")
    model.to(amp_dtype)
    for x, y in loader:
        with torch.autocast("cuda", dtype=amp_dtype):
            loss = model(x)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
"""
    findings = check(text, **{"unsafe-fixes": True})
    assert codes(findings) == ["AMP401"] and findings[0].fix is None
    assert fix(text, **{"unsafe-fixes": True}) == text


def test_scaler_removal_keeps_blank_lines_and_drops_the_unused_import():
    text = """from torch.amp import GradScaler, autocast
import torch

model = torch.nn.Linear(4, 4)

scaler = GradScaler("cuda")
for x in loader:
    with autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).sum()
    scaler.scale(loss * 2).backward()
    scaler.step(opt); scaler.update()
"""
    assert (
        fix(text, **{"unsafe-fixes": True})
        == """from torch.amp import autocast
import torch

model = torch.nn.Linear(4, 4)

for x in loader:
    with autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).sum()
    (loss * 2).backward()
    opt.step()
"""
    )


def test_tf32_fix_respects_min_torch():
    text = "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n"
    findings = check(text, **{"min-torch": "1.11"})
    assert codes(findings) == ["AMP410"] and findings[0].fix is None
    assert "1.12" in findings[0].no_fix_reason


# ------------------------------------------------------------------ following values
def _context(text: str) -> FileContext:
    return FileContext("x.py", text, cst.parse_module(text), Settings())


def _last_call_argument(ctx: FileContext) -> cst.BaseExpression:
    calls = []

    class _Visitor(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            calls.append(node)

    ctx.module.visit(_Visitor())
    return calls[-1].args[0].value


def test_follower_reaches_an_argparse_default_through_a_parse_function():
    ctx = _context("""
import argparse
def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixed-precision", default="fp16", choices=["no", "fp16", "bf16"])
    args = parser.parse_args()
    return args
def main():
    args = get_args()
    run(args.mixed_precision)
""")
    followed = Follower(ctx).follow(_last_call_argument(ctx))
    assert followed.complete and followed.values() == {"fp16"}
    assert followed.sources[0].choices == ("no", "fp16", "bf16")


def test_follower_gives_up_on_options_the_code_overwrites():
    ctx = _context("""
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--dtype", default="float16")
args = parser.parse_args()
args.dtype = "bfloat16" if bf16_ok else args.dtype
run(args.dtype)
""")
    assert argparse_option(ctx, _last_call_argument(ctx)) is None
    assert not Follower(ctx).follow(_last_call_argument(ctx)).complete


def test_follower_names_the_other_use_that_blocks_an_edit():
    ctx = _context("""
precision = 16
build(precision)
run(precision)
""")
    followed = Follower(ctx).follow(_last_call_argument(ctx))
    assert followed.values() == {16}
    assert followed.blocker is not None and "line 3" in followed.blocker


# ------------------------------------------------------------------ core helpers
def _without(code: str, drop) -> str:
    node = cst.parse_expression(code)
    items = node.args if isinstance(node, cst.Call) else node.elements
    return cst.Module([]).code_for_node(without_items(node, [items[i] for i in drop]))


@pytest.mark.parametrize(
    "code,drop,expected",
    [
        ('{"a": 1, "b": 2}', [1], '{"a": 1}'),
        ('{"a": 1, "b": 2, "c": 3}', [1], '{"a": 1, "c": 3}'),
        ('{"a": 1, "b": 2}', [0], '{"b": 2}'),
        ('{"a": 1}', [0], "{}"),
        ('{\n    "a": 1,\n    "b": 2,\n}', [1], '{\n    "a": 1,\n}'),
        ('{\n    "a": 1,\n    "b": 2\n}', [1], '{\n    "a": 1\n}'),
        ("f(a, b=1, c=2)", [1, 2], "f(a)"),
        ("(a, b)", [1], "(a,)"),
    ],
)
def test_without_items_keeps_the_layout_valid(code, drop, expected):
    assert _without(code, drop) == expected


def test_without_items_on_a_from_import():
    statement = cst.parse_statement("from torch.amp import GradScaler, autocast\n").body[0]
    new = without_items(statement, [statement.names[0]])
    assert cst.Module([]).code_for_node(new) == "from torch.amp import autocast"


def test_removing_a_statement_keeps_the_blank_lines_before_it():
    module = cst.parse_module("import torch\n\nscaler = make()\nrun()\n\nx = 1\n\ny = 2\n")
    removal = Fix(
        "remove",
        "safe",
        changes=((module.body[1], cst.RemovalSentinel.REMOVE), (module.body[3], cst.RemovalSentinel.REMOVE)),
    )
    assert fixer.apply_fixes(module, [removal]) == "import torch\n\nrun()\n\ny = 2\n"


def test_precision_choice_is_not_reported_in_test_files():
    text = (FIXTURES / "AMP401" / "explicit_dtype.py").read_text(encoding="utf-8")
    assert "AMP401" in codes(check(text, "train.py"))
    for name in ("test_amp.py", "amp_test.py", "tests/conftest.py"):
        assert [c for c in codes(check(text, name)) if c.startswith("AMP4")] == []
    lightning = "import lightning as L\ntrainer = L.Trainer(precision=16)\n"
    assert codes(check(lightning, "train.py")) == ["AMP405"]
    assert codes(check(lightning, "test_train.py")) == ["AMP406"]  # still a deprecated alias there


def test_bf16_autocast_fix_respects_min_torch():
    text = "import torch\nfor x in loader:\n    with torch.autocast('cuda'):\n        loss = model(x)\n    loss.backward()\n"
    assert "bfloat16" in fix(text, **{"unsafe-fixes": True})
    findings = check(text, **{"min-torch": "1.9"})
    assert codes(findings) == ["AMP401"] and findings[0].fix is None and "1.10" in findings[0].no_fix_reason
