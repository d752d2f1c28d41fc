"""Removing a GradScaler keeps the program's protection against inf/NaN steps, or is withheld (issue 16)."""

from __future__ import annotations

from conftest import check, codes, fix

UNGUARDED = """
import torch

def train(model, loader, optimizer, use_amp):
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        if use_amp:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss = model(x, y)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if torch.isfinite(norm):
                optimizer.step()
        optimizer.zero_grad()
"""


def test_scaler_stays_where_only_it_guarded_the_mixed_precision_step():
    findings = [f for f in check(UNGUARDED, **{"unsafe-fixes": True}) if f.code == "AMP402"]
    assert len(findings) == 1 and findings[0].fix is None
    reason = findings[0].no_fix_reason
    assert "`scaler.step(optimizer)` at line 13" in reason and "line 20" in reason and "finiteness" in reason
    assert fix(UNGUARDED, **{"unsafe-fixes": True}) == UNGUARDED


def test_scaler_goes_where_the_mixed_precision_step_is_guarded_too():
    guarded = UNGUARDED.replace(
        "            scaler.step(optimizer)\n",
        "            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "            if norm.isfinite():\n"
        "                scaler.step(optimizer)\n",
    ).replace("            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n            norm", "            norm", 1)
    fixed = fix(guarded, **{"unsafe-fixes": True})
    assert "GradScaler" not in fixed and "                optimizer.step()\n" in fixed


def test_scaler_goes_where_no_step_of_the_function_is_guarded():
    plain = UNGUARDED.replace("            if torch.isfinite(norm):\n                optimizer.step()", "            optimizer.step()")
    assert codes(check(plain, **{"unsafe-fixes": True})) == ["AMP402"]
    assert "GradScaler" not in fix(plain, **{"unsafe-fixes": True})
