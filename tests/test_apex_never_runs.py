"""A gradient read in both arms of one test never runs (rules/apex/_amp_steps.py
`_never_runs_under`). Fixture: AMP101/master_params_never_runs.py; here, the arm that writes what
the test reads, where the read may run after all."""

from __future__ import annotations

from conftest import FIXTURES, check, fix

FIXTURE = (FIXTURES / "AMP101" / "master_params_never_runs.py").read_text(encoding="utf-8")


def test_the_read_that_never_runs_gets_no_unscale():
    fixed = fix(FIXTURE, select=["AMP1"])
    assert "amp.master_params(optimizer)" not in fixed and "from apex" not in fixed
    assert "scaler.unscale_(" not in fixed


def test_an_arm_writing_the_tested_value_keeps_the_refusal():
    text = FIXTURE.replace("            loss.backward()\n", "            loss.backward()\n            opt.amp = opt.retry_amp\n")
    assert text != FIXTURE
    (finding,) = [f for f in check(text, select=["AMP1"]) if "initialize" in f.message]
    assert finding.fix is None
    assert "reads gradients outside the backward/step window" in finding.no_fix_reason


def test_an_arm_handing_the_tested_object_to_a_call_keeps_the_refusal():
    text = FIXTURE.replace("            loss.backward()\n", "            loss.backward()\n            retry_with_amp(opt)\n")
    assert text != FIXTURE
    (finding,) = [f for f in check(text, select=["AMP1"]) if "initialize" in f.message]
    assert finding.fix is None
