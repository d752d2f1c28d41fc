"""`amp.init()` beside `amp.initialize` in one function (rules/apex/_amp_migration.py
`_without_init_beside_initialize`): the bare call goes with the migration; where the opt level may
be O0 (apex's fp32 path, which `amp.init()` still patched to float16) the fix is unsafe and says
why; a handle that is used, or a call in another function, keeps the file refused."""

from __future__ import annotations

from conftest import FIXTURES, check, fix

CODE = (FIXTURES / "AMP101" / "init_call_beside_initialize.py").read_text(encoding="utf-8")


def _fixes(code: str):
    return {f.code: f.fix for f in check(code, select=["AMP1"])}


def test_the_bare_init_goes_with_a_safe_migration_at_o1():
    migrated = fix(CODE, select=["AMP1"])
    assert "\n    amp.init()" not in migrated and "from apex" not in migrated
    assert _fixes(CODE)["AMP104"].applicability == "safe"


def test_an_opt_level_that_may_be_o0_makes_it_unsafe():
    code = CODE.replace("def main(loader, epochs):", "def main(loader, epochs, opt_level):").replace(
        'opt_level="O1")', "opt_level=opt_level)"
    )
    found = _fixes(code)["AMP104"]
    assert found.applicability == "unsafe"
    assert "under O0, `amp.init()` at line 14 still patched torch's functions to run in float16" in found.message
    assert fix(code, select=["AMP1"]) == code
    assert "\n    amp.init()" not in fix(code, select=["AMP1"], **{"unsafe-fixes": True})


def test_a_used_handle_or_an_init_elsewhere_stays_refused():
    used = CODE.replace("    amp.init()  # register functions", "    handle = amp.init()\n    print(handle)")
    elsewhere = CODE.replace("    amp.init()  # register functions\n", "") + "\n\ndef register():\n    amp.init()\n"
    for code in (used, elsewhere):
        assert fix(code, select=["AMP1"]) == code
        assert all(f is None for f in _fixes(code).values())
