"""AMP202/AMP208 on subclasses of the legacy GradScaler (issue 18): when rebasing on
torch.amp.GradScaler keeps every instantiation's meaning (safe), when only calls this file
cannot see could break (unsafe, with the reason), and when it does not (no fix, with the reason).
The fixtures tests/fixtures/AMP202/subclass_*.py hold the rewritten shapes."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ampmigrate.config import Settings
from ampmigrate.engine.pipeline import Engine
from ampmigrate.engine.project import ProjectImports

NO_INIT = textwrap.dedent(
    """\
    from torch.cuda.amp.grad_scaler import GradScaler, OptState


    class ClosureGradScaler(GradScaler):
        def force_ready(self, optimizer):
            self._per_optimizer_states[id(optimizer)]["stage"] = OptState.READY


    def make(use_amp):
        return ClosureGradScaler(enabled=use_amp)
    """
)


def _scan(root: Path, files: dict) -> ProjectImports:
    paths = []
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths.append(str(path))
    return ProjectImports.scan(str(root), paths)


def _scaler_findings(text: str, path: str, project=None, unsafe=False):
    engine = Engine(Settings(unsafe_fixes=unsafe), project=project)
    return [f for f in engine.check_text(text, path).findings if f.code in ("AMP202", "AMP208")]


def test_no_init_is_safe_where_the_project_scan_shows_no_other_importer(tmp_path):
    project = _scan(tmp_path, {"pkg/scaler.py": NO_INIT, "pkg/train.py": "from pkg.model import Net\n"})
    findings = _scaler_findings(NO_INIT, str(tmp_path / "pkg" / "scaler.py"), project)
    assert [f.code for f in findings] == ["AMP208", "AMP202"]
    assert all(f.fix is not None and f.fix.applicability == "safe" for f in findings)
    fixed = Engine(Settings(), project=project).fix_text(NO_INIT, str(tmp_path / "pkg" / "scaler.py")).new_text
    assert "from torch.amp.grad_scaler import GradScaler, OptState" in fixed
    assert "class ClosureGradScaler(GradScaler):" in fixed


def test_no_init_imported_by_another_module_is_unsafe(tmp_path):
    project = _scan(
        tmp_path,
        {"pkg/scaler.py": NO_INIT, "pkg/sam.py": "from pkg.scaler import ClosureGradScaler\nscaler = ClosureGradScaler()\n"},
    )
    findings = _scaler_findings(NO_INIT, str(tmp_path / "pkg" / "scaler.py"), project)
    assert all(f.fix is not None and f.fix.applicability == "unsafe" for f in findings)
    assert "other modules of the project import it" in findings[0].fix.message


def test_no_init_unknown_importers_or_all_is_unsafe():
    findings = _scaler_findings(NO_INIT, "scaler.py")  # no project scan, no index: not known
    assert findings[0].fix.applicability == "unsafe"
    assert "whether other modules import it is not known here" in findings[0].fix.message
    exported = "__all__ = ['ClosureGradScaler']\n" + NO_INIT
    findings = _scaler_findings(exported, "scaler.py", ProjectImports("."))
    assert findings[0].fix.applicability == "unsafe"
    assert "it is exported (`__all__`)" in findings[0].fix.message


def test_no_init_used_as_a_value_is_unsafe():
    text = NO_INIT + "\nFACTORIES = {'closure': ClosureGradScaler}\n"
    findings = _scaler_findings(text, "scaler.py", ProjectImports("."))
    assert findings[0].fix.applicability == "unsafe"
    assert "it is used as a value at line 12" in findings[0].fix.message


def test_no_init_local_class_is_safe_without_a_project():
    text = textwrap.dedent(
        """\
        import torch


        def make(use_amp):
            class Quiet(torch.cuda.amp.GradScaler):
                pass

            return Quiet(init_scale=1024.0, enabled=use_amp)
        """
    )
    (finding,) = _scaler_findings(text, "train.py")
    assert finding.fix.applicability == "safe"
    assert finding.fix.message == "Subclass `torch.amp.GradScaler`"


def test_positional_instantiation_is_not_fixed():
    text = NO_INIT + "\nlegacy = ClosureGradScaler(2.0**14)\n"
    findings = _scaler_findings(text, "scaler.py", ProjectImports("."), unsafe=True)
    assert [f.fix for f in findings] == [None, None]
    assert findings[0].no_fix_reason.startswith(
        "`ClosureGradScaler` has no `__init__` of its own and is instantiated with positional arguments at line 12"
    )


def test_subclass_of_a_subclass_without_init_is_unsafe():
    text = NO_INIT + "\n\nclass Warm(ClosureGradScaler):\n    def __init__(self):\n        super().__init__(1024.0)\n"
    findings = _scaler_findings(text, "scaler.py", ProjectImports("."))
    assert findings[0].fix.applicability == "unsafe"
    assert "used as a value at line 13" in findings[0].fix.message


def test_shapes_the_fix_cannot_follow():
    cases = {
        "class S(torch.cuda.amp.GradScaler, Mixin):\n    pass\n": "has other bases",
        "@register\nclass S(torch.cuda.amp.GradScaler):\n    pass\n": "is decorated",
        "class S(torch.cuda.amp.GradScaler):\n    def __init__(self):\n        super(Mixin, self).__init__()\n": "names another class",
        "class S(torch.cuda.amp.GradScaler):\n    __init__ = make_init()\n": "`S.__init__` is assigned",
        "class S(torch.cpu.amp.GradScaler):\n    pass\n": 'defaulting to "cuda", not "cpu"',
    }
    for body, reason in cases.items():
        (finding,) = _scaler_findings("import torch\n\n" + body, "scaler.py", ProjectImports("."), unsafe=True)
        assert finding.fix is None, body
        assert reason in finding.no_fix_reason, (body, finding.no_fix_reason)


def test_super_init_gets_the_device_only_where_positional():
    text = textwrap.dedent(
        """\
        import torch


        class A(torch.cuda.amp.GradScaler):
            def __init__(self, scale, **kwargs):
                super(A, self).__init__(scale, **kwargs)


        class B(torch.cuda.amp.GradScaler):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
        """
    )
    fixed = Engine(Settings()).fix_text(text, "train.py").new_text
    assert 'super(A, self).__init__("cuda", scale, **kwargs)' in fixed
    assert "super().__init__(**kwargs)" in fixed
    assert "torch.cuda" not in fixed
