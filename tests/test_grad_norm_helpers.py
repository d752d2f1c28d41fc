"""engine/grad_norm_helpers.py: which functions are recognized as a p-norm of their parameter's
gradients (their value then scales linearly with the gradients), and that the project index
records them."""

from __future__ import annotations

import ast

import pytest

from ampmigrate.engine.grad_norm_helpers import grad_norm_call_ok, grad_norm_helpers
from ampmigrate.engine.project_index import ModuleSummary, _as_data, summarize

SWIN = '''import torch


def get_grad_norm(parameters, norm_type=2):
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    parameters = list(filter(lambda p: p.grad is not None, parameters))
    norm_type = float(norm_type)
    total_norm = 0
    for p in parameters:
        param_norm = p.grad.data.norm(norm_type)
        total_norm += param_norm.item() ** norm_type
    total_norm = total_norm ** (1. / norm_type)
    return total_norm
'''

ACCEPTED = {
    "swin": SWIN,
    "literal": "def f(ps):\n    s = 0.0\n    for p in ps:\n        s = s + p.grad.norm(2) ** 2\n    return s ** 0.5\n",
    "guarded": "def f(ps, t=1):\n    s = 0\n    for p in ps:\n        if p.grad is None:\n            continue\n        s += p.grad.detach().norm(t).item() ** t\n    return s ** (1 / t)\n",
    "stack": "import torch\ndef f(ps, t=2.0):\n    n = torch.norm(torch.stack([torch.norm(p.grad.detach(), t) for p in ps if p.grad is not None]), t)\n    return n.item()\n",
}
REFUSED = {
    "squared": SWIN.replace("    total_norm = total_norm ** (1. / norm_type)\n", ""),
    "writes": SWIN.replace("        param_norm =", "        p.grad.zero_()\n        param_norm ="),
    "assigns_grad": SWIN.replace("        param_norm =", "        p.grad = p.grad * 2\n        param_norm ="),
    "offset": SWIN.replace("total_norm = 0\n", "total_norm = 1.0\n"),
    "other_power": SWIN.replace("param_norm.item() ** norm_type", "param_norm.item() ** 2"),
    "other_root": SWIN.replace("(1. / norm_type)", "(1. / 2)"),
    "inf_default": SWIN.replace("norm_type=2)", "norm_type=float('inf'))"),
    "zero_default": SWIN.replace("norm_type=2)", "norm_type=0)"),
    "extra_statement": SWIN.replace("    return total_norm\n", "    log(total_norm)\n    return total_norm\n"),
    "other_iterable": SWIN.replace("for p in parameters:", "for p in model.parameters():"),
    "not_grad": SWIN.replace("p.grad.data.norm", "p.data.norm"),
    "decorated": SWIN.replace("def get_grad_norm", "@torch.no_grad()\ndef get_grad_norm"),
    "redefined": SWIN + "\nget_grad_norm = None\n",
    "rebound_global": SWIN + "\ndef g():\n    global get_grad_norm\n    get_grad_norm = None\n",
    "mixed_literals": "def f(ps):\n    s = 0\n    for p in ps:\n        s += p.grad.norm(2) ** 3\n    return s ** (1. / 3)\n",
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_recognized(case):
    assert list(grad_norm_helpers(ast.parse(ACCEPTED[case]))) == ["get_grad_norm" if case == "swin" else "f"]


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_not_recognized(case):
    assert grad_norm_helpers(ast.parse(REFUSED[case])) == {}


def _args(code: str):
    call = ast.parse(f"f({code})", mode="eval").body
    out = [(None, a) if not isinstance(a, ast.Starred) else (None, None) for a in call.args]
    return out + [(k.arg, k.value) if k.arg else (None, None) for k in call.keywords]


@pytest.mark.parametrize(
    "code, ok",
    [("ps", True), ("ps, 2", True), ("ps, norm_type=3.0", True), ("ps, norm_type=t", False), ("ps, 0", False),
     ("ps, float('inf')", False), ("parameters=ps", False), ("ps, other=2", False), ("*ps", False), ("ps, 2, 3", False)],
)
def test_calls(code, ok):
    record = grad_norm_helpers(ast.parse(SWIN))["get_grad_norm"]
    assert grad_norm_call_ok(record, _args(code)) is ok


def test_the_index_records_them():
    summary = summarize(SWIN.encode(), "utils")
    assert summary.grad_norm_helpers == {"get_grad_norm": (["parameters", "norm_type"], "norm_type")}
    assert summarize(SWIN.encode(), "utils", shortcuts=False).grad_norm_helpers == summary.grad_norm_helpers
    data = _as_data(summary)
    assert list(data) == list(ModuleSummary.__dataclass_fields__)
    assert data["grad_norm_helpers"] == {"get_grad_norm": (["parameters", "norm_type"], "norm_type")}


def _index(tmp_path, files):
    from ampmigrate.engine.project_index import ProjectIndex

    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return ProjectIndex.build(str(tmp_path), sorted(str(p) for p in tmp_path.rglob("*.py")))


MAIN = "from utils import get_grad_norm\nimport torch\nx = torch.zeros(1)\nx.backward()\n"
SQUARED = REFUSED["squared"]


def test_the_helper_beside_the_script(tmp_path):
    index = _index(tmp_path, {"a/main.py": MAIN, "a/utils.py": SWIN, "b/utils.py": SQUARED})
    found = index.grad_norm_helper("utils.get_grad_norm", str(tmp_path / "a" / "main.py"))
    assert found == (str(tmp_path / "a" / "utils.py"), (["parameters", "norm_type"], "norm_type"))
    assert index.grad_norm_helper("utils.get_grad_norm") is None  # `utils` alone is ambiguous
    # The squared look-alike beside another script is no helper.
    assert index.grad_norm_helper("utils.get_grad_norm", str(tmp_path / "b" / "main.py")) is None


def test_two_candidates_that_disagree(tmp_path):
    """`utils` names the top-level utils.py (`python -m pkg.main`) or pkg/utils.py (`python
    pkg/main.py`): both must be the helper."""
    index = _index(tmp_path, {"pkg/main.py": MAIN, "pkg/utils.py": SWIN, "utils.py": SQUARED})
    assert index.grad_norm_helper("utils.get_grad_norm", str(tmp_path / "pkg" / "main.py")) is None
    index = _index(tmp_path, {"utils.py": SWIN})
    assert index.grad_norm_helper("utils.get_grad_norm", str(tmp_path / "pkg" / "main.py")) is not None


def test_the_dependency_key_follows_the_helper_beside(tmp_path):
    index = _index(tmp_path, {"a/main.py": MAIN, "a/utils.py": SWIN, "b/utils.py": SQUARED})
    before = index.dependency_key(str(tmp_path / "a" / "main.py"))
    index = _index(tmp_path, {"a/utils.py": SQUARED})
    assert index.dependency_key(str(tmp_path / "a" / "main.py")) != before
