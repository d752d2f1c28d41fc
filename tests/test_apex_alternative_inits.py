"""`amp.initialize` alternatives below the arms of one `if`/`else` (_multi_init.py).

The fixture tests/fixtures/AMP101/multi_init_if_else_guarded_arms.py (written from scratch) calls
`amp.initialize` in both arms of `if torch.cuda.device_count() > 1:`, each under the same inner
`if use_amp:`: exactly one runs, so it is one setup and the GradScaler is created before the outer
`if` (whose test has side effects but is no condition of the scaler), enabled by the inner test.
Where the inner tests differ, or a call is no longer first in its arm, the fix keeps refusing.
"""

from __future__ import annotations

import pytest

from conftest import FIXTURES, check, fix

GUARDED = FIXTURES / "AMP101" / "multi_init_if_else_guarded_arms.py"


def _reasons(code: str):
    return {f.no_fix_reason for f in check(code, select=["AMP1"]) if f.code == "AMP101"}


def test_guarded_alternatives_become_one_scaler_before_the_outer_if():
    migrated = fix(GUARDED.read_text(), select=["AMP1"])
    assert "amp.initialize" not in migrated and "apex" not in migrated
    assert migrated.count("GradScaler(") == 1
    before, after = migrated.split("    if torch.cuda.device_count() > 1:")
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=bool(use_amp))' in before
    assert "if use_amp:\n            net" not in after  # both inner `if`s went with their calls
    compile(migrated, "migrated.py", "exec")


def test_different_inner_conditions_keep_refusing():
    reasons = _reasons((FIXTURES / "AMP101" / "multi_init_if_else_guarded_arms_differ.py").read_text())
    assert reasons and all("run under different conditions within their arms" in (r or "") for r in reasons), reasons


def test_different_inner_conditions_under_a_pure_test_are_no_reinitialization():
    # Before: the second call counted as a re-initialization, and the scaler followed the first arm's tests only.
    code = GUARDED.read_text().replace("torch.cuda.device_count() > 1", "multi_gpu").replace("use_amp):", "use_amp, multi_gpu):")
    code = code.replace("    else:\n        if use_amp:", "    else:\n        if use_amp or multi_gpu:")
    reasons = _reasons(code)
    assert reasons and all("different conditions" in (r or "") for r in reasons), reasons


@pytest.mark.parametrize(
    "edit",
    [
        # code before the inner test in one arm: the scaler would read the test too early
        ("    else:\n        if use_amp:", "    else:\n        use_amp = not use_amp\n        if use_amp:"),
        # other options in one arm
        ('opt_level="O1")\n        core = net\n', 'opt_level="O2", loss_scale=128.0)\n        core = net\n'),
    ],
)
def test_arms_that_are_no_alternatives_keep_refusing(edit):
    code = GUARDED.read_text()
    assert edit[0] in code
    assert all(r for r in _reasons(code.replace(edit[0], edit[1])))


def test_a_run_time_opt_level_guards_o3_in_both_arms():
    code = (FIXTURES / "AMP101" / "multi_init_if_else_guarded_arms_runtime_level.py").read_text()
    (finding,) = [f for f in check(code, select=["AMP1"]) if f.code == "AMP101" and f.location.row == 9]
    assert finding.fix is not None and finding.fix.applicability == "safe", finding.no_fix_reason
    migrated = fix(code, select=["AMP1"])
    assert migrated.count('if opt_level == "O3":') == 2 and migrated.count("GradScaler(") == 1
    assert 'GradScaler("cuda", enabled=opt_level != "O0")' in migrated.split("if torch.cuda.device_count()")[0]


def test_run_time_opt_levels_of_other_expressions_are_no_alternatives():
    code = (FIXTURES / "AMP101" / "multi_init_if_else_guarded_arms_runtime_level.py").read_text()
    code = code.replace("def train(net, opt, batches, opt_level):", "def train(net, opt, batches, opt_level, level2):")
    head, tail = code.split("    else:\n", 1)
    tail = tail.replace("opt_level=opt_level", "opt_level=level2", 1)
    reasons = _reasons(head + "    else:\n" + tail)
    assert reasons and all(reasons), reasons


def test_arms_listing_other_models_are_one_setup_under_o1_or_where_the_extra_one_is_none():
    """Distillation (`[model, teacher]` in one arm): O1 left the models as they were, O2 cast the
    ones it was given to fp16. Under O2 the arms are one setup only where the `if` tests the extra
    model against None (it cannot run uncast in the arm that leaves it out), not where it tests a
    flag (the teacher may exist there and run in fp32)."""
    code = (FIXTURES / "AMP101" / "alternatives_o1_other_models.py").read_text(encoding="utf-8")
    fixed = fix(code, select=["AMP1"])
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=mixed_precision)' in fixed and "amp.initialize" not in fixed
    o2 = code.replace('opt_level="O1"', 'opt_level="O2"')
    fixed_o2 = fix(o2, select=["AMP1"])
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=mixed_precision)' in fixed_o2 and "amp.initialize" not in fixed_o2
    flag = o2.replace("mixed_precision=True):", "mixed_precision=True, distill=False):").replace(
        "        if teacher is not None:\n            [model, teacher]", "        if distill:\n            [model, teacher]"
    )
    assert flag != o2 and fix(flag, select=["AMP1"]) == flag
