"""Engine semantics: rounds to a fixed point, atomic group fixes, selection, noqa, safety nets."""

from __future__ import annotations

import libcst as cst

from ampmigrate.engine.pipeline import Engine
from ampmigrate.rules.legacy_api.amp201_legacy_autocast import LegacyAutocast

from conftest import check, codes, fix, make_settings

NESTED = "import torch\nwith torch.cuda.amp.autocast(enabled=torch.cuda.amp.GradScaler().is_enabled()):\n    pass\n"


def test_overlapping_fixes_settle_over_rounds():
    # The GradScaler call sits inside the autocast call: one round cannot apply both.
    fixed = fix(NESTED)
    assert fixed == 'import torch\nwith torch.amp.autocast("cuda", enabled=torch.amp.GradScaler("cuda").is_enabled()):\n    pass\n'
    assert check(fixed) == []


def test_fix_reports_how_many_findings_it_resolved():
    result = Engine(make_settings()).fix_text(NESTED, "x.py")
    assert result.fixed == 2 and result.findings == []


GROUP = (
    "from torch.cuda.amp import GradScaler, autocast\n"
    "scaler = GradScaler()\n"
    "with autocast():\n    pass\n"
)


def test_group_fix_needs_every_code_it_changes_selected():
    findings = check(GROUP, select=["AMP201"])
    assert codes(findings) == ["AMP201"]
    assert findings[0].fix is None
    assert "AMP202" in findings[0].no_fix_reason
    assert fix(GROUP, select=["AMP201"]) == GROUP  # nothing half-migrated
    assert fix(GROUP, select=["AMP2"]) == (
        'from torch.amp import GradScaler, autocast\nscaler = GradScaler("cuda")\nwith autocast("cuda"):\n    pass\n'
    )


def test_noqa_on_one_use_blocks_the_shared_import_fix():
    text = GROUP.replace("scaler = GradScaler()", "scaler = GradScaler()  # noqa: AMP202")
    findings = check(text, select=["AMP2"])
    assert codes(findings) == ["AMP208", "AMP201"]  # the import line, and the use not suppressed
    assert all(f.fix is None and "noqa" in f.no_fix_reason for f in findings)
    assert fix(text) == text


def test_noqa_forms():
    line = "import torch\nwith torch.cuda.amp.autocast():{}\n    pass\n"
    assert codes(check(line.format(""))) == ["AMP201"]
    assert check(line.format("  # noqa")) == []
    assert check(line.format("  # noqa: AMP201")) == []
    # AMP202 suppresses nothing there: reported as an unused suppression (AMP001, informational).
    assert codes(check(line.format("  # NOQA:AMP201,AMP202"))) == ["AMP001"]
    assert codes(check(line.format("  # noqa: AMP202"))) == ["AMP201", "AMP001"]
    assert check("# ampmigrate: noqa\n" + line.format("")) == []
    assert check("# ampmigrate: noqa: AMP201\n" + line.format("")) == []
    assert codes(check("# ampmigrate: noqa: AMP202\n" + line.format(""))) == ["AMP201"]
    # Inside a string it is not a comment.
    assert codes(check('x = "# ampmigrate: noqa"\n' + line.format(""))) == ["AMP201"]


def test_min_torch_below_the_modern_api_silences_the_rule():
    text = "import torch\nscaler = torch.cuda.amp.GradScaler()\nwith torch.cuda.amp.autocast():\n    pass\n"
    assert codes(check(text, **{"min-torch": "2.2"})) == ["AMP201"]  # torch.amp.autocast: 1.12
    assert codes(check(text, **{"min-torch": "1.11"})) == []


def test_group_fix_withheld_when_one_member_needs_newer_torch():
    findings = check(GROUP, **{"min-torch": "2.2"})
    assert codes(findings) == ["AMP208", "AMP201"]  # GradScaler is not deprecated for 2.2 users
    assert all(f.fix is None and "2.3" in f.no_fix_reason for f in findings)


def test_files_without_triggers_are_not_parsed():
    engine = Engine(make_settings())
    result = engine.check_text("def broken(:\n", "x.py")  # would be a syntax error if parsed
    assert result.findings == [] and result.errors == [] and not result.parsed


def test_syntax_error_is_one_error_naming_the_position():
    result = Engine(make_settings()).check_text("import torch.cuda.amp\ndef f(:\n", "bad.py")
    assert len(result.errors) == 1
    assert result.errors[0].path == "bad.py" and "syntax error at 2:" in result.errors[0].message


class _BrokenFix(LegacyAutocast):
    """Reports every legacy autocast with a fix whose output does not parse."""

    def check(self, ctx):
        for ref, _ in ctx.names.find({"torch.cuda.amp.autocast"}):
            statement = ctx.names.statement_of(ref)
            broken = cst.SimpleStatementLine([cst.Expr(cst.Name("def"))])
            ctx.report(ref, "broken", fix=ctx.fix("break it").replace(statement, broken).build())


class _Crashes(LegacyAutocast):
    def check(self, ctx):
        raise RuntimeError("boom")


def test_a_fix_that_would_break_the_file_is_dropped_and_reported():
    text = "import torch\nx = torch.cuda.amp.autocast()\n"
    result = Engine(make_settings(), rules=[_BrokenFix()]).fix_text(text, "x.py")
    assert result.new_text is None
    assert any("produced invalid code" in e.message and "AMP201" in e.message for e in result.errors)


def test_a_crashing_rule_is_an_internal_error_and_the_others_still_run():
    text = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
    from ampmigrate.rules.legacy_api.amp202_legacy_grad_scaler import LegacyGradScaler

    result = Engine(make_settings(), rules=[_Crashes(), LegacyGradScaler()]).check_text(text, "x.py")
    assert codes(result.findings) == ["AMP202"]
    assert [e.message for e in result.errors] == ["internal error in AMP201: RuntimeError: boom"]


def test_fix_adds_import_torch_when_the_fix_needs_it():
    text = '"""Doc."""\nfrom torch import cuda\n\nwith cuda.amp.autocast():\n    pass\n'
    assert fix(text) == '"""Doc."""\nfrom torch import cuda\nimport torch\n\nwith torch.amp.autocast("cuda"):\n    pass\n'


def test_edits_for_json_are_minimal_and_reproduce_the_fix():
    from ampmigrate.engine.fixer import text_edits

    text = "import torch\nwith torch.cuda.amp.autocast(True):\n    pass\n"
    result = Engine(make_settings()).check_text(text, "x.py", want_edits=True)
    (edit,) = result.findings[0].fix.edits
    assert (edit.location.row, edit.location.column) == (2, 12)
    assert edit.content.startswith("amp.autocast(")
    lines = text.splitlines(keepends=True)
    start = sum(len(l) for l in lines[: edit.location.row - 1]) + edit.location.column - 1
    end = sum(len(l) for l in lines[: edit.end_location.row - 1]) + edit.end_location.column - 1
    assert text[:start] + edit.content + text[end:] == fix(text)
    assert text_edits("a\nb\n", "a\nb\n") == ()


def test_quote_style_follows_the_file():
    text = "import torch\nname = 'x'\nwith torch.cuda.amp.autocast():\n    pass\n"
    assert "torch.amp.autocast('cuda')" in fix(text)


class _UnboundFix(LegacyAutocast):
    """Reports every legacy autocast with a fix that reads `scaler` before the line binding it."""

    def check(self, ctx):
        for ref, _ in ctx.names.find({"torch.cuda.amp.autocast"}):
            statement = ctx.names.statement_of(ref)
            uses = cst.parse_statement("scaler.update()\n")
            made = cst.parse_statement("scaler = None\n")
            ctx.report(ref, "unbound", fix=ctx.fix("read first").replace(statement, cst.FlattenSentinel([uses, made])).build())


def test_a_fix_that_reads_a_name_before_binding_it_is_dropped_and_reported():
    text = "import torch\n\n\ndef f():\n    x = torch.cuda.amp.autocast()\n"
    result = Engine(make_settings(), rules=[_UnboundFix()]).fix_text(text, "x.py")
    assert result.new_text is None
    assert any("would read `scaler` in `f()`" in e.message and "AMP201" in e.message for e in result.errors)
