"""rules/apex/_optimizer_alias.py: the optimizer `amp.scale_loss` is given, stepped under another
name. apex returns the optimizer it is given, so `net, optimizer = amp.initialize(model, optim)`
makes `optimizer` and `optim` one object (DconnNet), and `step_optimizer = optimizer` then
`model, step_optimizer = amp.initialize(model, optimizer)` makes `step_optimizer` it too
(open_lth). The fixtures tests/fixtures/AMP101/optimizer_alias_*.py hold the migrations; here,
the rebindings that make another name a different object refuse."""

from __future__ import annotations

from conftest import FIXTURES, check, fix

DIR = FIXTURES / "AMP101"


def _reasons(code: str):
    return {f.no_fix_reason for f in check(code, select=["AMP1"]) if f.code == "AMP101"}


def test_both_shapes_migrate_and_step_through_the_scaler():
    for name, step in (("optimizer_alias_returned", "scaler.step(optim)"), ("optimizer_alias_step_copy", "scaler.step(step_optimizer)")):
        migrated = fix((DIR / f"{name}.py").read_text(), select=["AMP1"])
        code = migrated.split('"""')[2]  # past the docstring
        assert step in code and "amp.scale_loss(" not in code and "amp.initialize(" not in code


def test_a_rebound_source_is_another_object():
    code = (DIR / "optimizer_alias_returned.py").read_text().replace(
        "    for x, y in loader:\n", "    optim = torch.optim.SGD(model.parameters(), lr=0.1)\n    for x, y in loader:\n"
    )
    reasons = _reasons(code)
    assert reasons and all(r and "no `optimizer.step()` follows `amp.scale_loss`" in r for r in reasons), reasons
    assert "amp.initialize" in fix(code, select=["AMP1"])


def test_a_copy_bound_otherwise_too_is_another_object():
    code = (DIR / "optimizer_alias_step_copy.py").read_text().replace(
        "    step_optimizer = optimizer\n", "    step_optimizer = optimizer\n    if fp16 is None:\n        step_optimizer = make()\n"
    )
    assert "amp.initialize" in fix(code, select=["AMP1"])


SELF_STORE = (DIR / "self_attribute_module_store.py").read_text()


def test_a_self_attribute_holding_apex_only_for_its_calls_goes_with_the_import():
    migrated = fix(SELF_STORE, select=["AMP1"])
    code = migrated.split('"""')[2]
    assert "self.amp = amp" not in code and "from apex" not in code and "del scaled_loss" not in code
    assert "        self.scaler = torch.amp.GradScaler(\"cuda\")\n" in code


def test_a_self_attribute_read_otherwise_still_refuses():
    code = SELF_STORE.replace("        self.optimizer.zero_grad()\n", "        self.optimizer.zero_grad()\n        assert self.amp is not None\n")
    reasons = _reasons(code)
    assert reasons and all(r and "apex.amp is used as a value at line 21" in r for r in reasons), reasons


def test_the_scaled_loss_read_after_its_block_stays_bound():
    # `with ... as scaled_loss` leaves the name bound after the block; `scaler.scale(loss)` binds it.
    code = SELF_STORE.replace("        del scaled_loss\n", "        print(scaled_loss.item())\n")
    assert _reasons(code) == {None}
    migrated = fix(code, select=["AMP1"]).split('"""')[2]
    assert "        scaled_loss = self.scaler.scale(loss)\n        scaled_loss.backward()\n" in migrated
    assert "        print(scaled_loss.item())\n" in migrated


def test_the_scaled_loss_read_after_a_block_that_may_leave_early_refuses():
    code = SELF_STORE.replace("        del scaled_loss\n", "        print(scaled_loss.item())\n").replace(
        "            scaled_loss.backward()\n", "            scaled_loss.backward()\n            if x is None:\n                return None\n"
    )
    reasons = _reasons(code)
    assert reasons and all(r and "uses `scaled_loss` or apex, or leaves the block early" in r for r in reasons), reasons
