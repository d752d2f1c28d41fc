"""apex set up under `if __name__ == "__main__":`, whose block binds the names the scaler's
`enabled=` reads (rules/apex/_scaler_access.py `_enter_defining_ifs`, `_only_run_in_arm`): the
scaler is made in that block, where the module-level functions reading it run from. Before,
the scaler went above the block and read `args` before any binding (cascade-stereo and
TransMVSNet, corpus N: a NameError at start; analysis/unbound.py now stops such a fix too)."""

from __future__ import annotations

from conftest import FIXTURES, check, fix

SCRIPT = (FIXTURES / "AMP101" / "main_guard_script_functions.py").read_text()


def _reasons(code: str):
    return {f.no_fix_reason for f in check(code, select=["AMP1"]) if f.code == "AMP101"}


def test_the_scaler_is_made_in_the_main_block_before_the_setup():
    migrated = fix(SCRIPT, select=["AMP1"])
    main = migrated.split('if __name__ == "__main__":\n')[1]
    assert main.index('    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16 and args.opt_level != "O0")\n') < main.index(
        "    if args.fp16:\n"
    )
    assert migrated.split('if __name__ == "__main__":\n')[0].count("GradScaler(") == 0
    assert fix(migrated, select=["AMP1"]) == migrated


def test_a_function_using_the_scaler_called_before_it_is_made_refuses():
    code = SCRIPT.replace(
        "    model = nn.Linear(4, 2).cuda()\n",
        "    model = nn.Linear(4, 2).cuda()\n    train(model, torch.optim.SGD(model.parameters(), lr=0.1), [], args)\n",
    )
    reasons = _reasons(code)
    assert reasons and all("`args` is set inside the `if` at line 33" in r for r in reasons), reasons


def test_a_function_called_outside_the_main_block_refuses():
    code = SCRIPT + "\n\ndef main_again(model, optimizer, args):\n    train(model, optimizer, [], args)\n\n\nmain_again(None, None, None)\n"
    assert all(r and "there is no place to make it that every use sees" in r for r in _reasons(code))


HALF_EVAL = (FIXTURES / "AMP101" / "half_own_eval_network.py").read_text()


def test_an_evaluation_network_built_and_halved_in_place_does_not_stop_the_migration():
    migrated = fix(HALF_EVAL, select=["AMP1"])
    assert "amp.initialize(" not in migrated.split('"""')[2] and "        net.half()\n" in migrated


def test_the_network_apex_set_up_halved_elsewhere_still_stops_it():
    code = HALF_EVAL.replace("def evaluate(cfg, loader):\n    net = build_network(cfg).cuda()\n", "def evaluate(cfg, loader, net):\n")
    reasons = _reasons(code)
    assert reasons and all(r and "casts to half in `evaluate()`" in r for r in reasons), reasons


OPTIONS_IN_ARM = (FIXTURES / "AMP101" / "options_bound_in_setup_arm.py").read_text()


def test_options_bound_in_the_setup_arm_make_the_scaler_there_with_a_disabled_else():
    migrated = fix(OPTIONS_IN_ARM, select=["AMP1"])
    assert '    else:\n        scaler = torch.amp.GradScaler("cuda", enabled=False)\n' in migrated
    assert 'enabled=scaler.is_enabled()' in migrated and fix(migrated, select=["AMP1"]) == migrated


def test_an_arm_with_an_else_of_its_own_still_refuses():
    code = OPTIONS_IN_ARM.replace("    for x, y in loader:\n", "    else:\n        print('fp32')\n    for x, y in loader:\n", 1)
    reasons = _reasons(code)
    assert reasons and all(r and "`loss_scale` is set inside the `if` at line 10" in r for r in reasons), reasons
