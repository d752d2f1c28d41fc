"""The project index's byte shortcuts (engine/project_index.py) change its speed, never its content.

`summarize(raw, package)` skips the `ast` parse of files that cannot hold any record (a byte test
per record), finds `import`/`from` lines by a substring search instead of running the line regexes
over the whole file, and tests substrings before regexes. `summarize(..., shortcuts=False)` takes
the long way. The two must give equal summaries for every file: checked here over the repository's
own tests and fixtures, a sample of the installed torch package (with `-m slow`: all of it, and
the trees named in `AMPMIGRATE_AGREEMENT_TREES`, e.g. the Lightning tree), and shapes written to
sit at the edge of each byte test.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, fields
from pathlib import Path
from typing import List

import pytest

from ampmigrate.engine import project_index as project_index_module
from ampmigrate.engine.project_index import ModuleSummary, ProjectIndex, _as_data, summarize

from conftest import FIXTURES
from test_prescreen_agreement import TREE_STRIDE

TESTS = Path(__file__).parent
OWN_FILES = sorted(str(p) for p in TESTS.rglob("*.py") if p.is_file())
PACKAGES = ("", "pkg", "pkg.sub")  # relative imports resolve against the package


def _torch_files() -> List[str]:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return []
    return sorted(str(p) for p in Path(spec.origin).parent.rglob("*.py") if p.is_file())


TORCH_FILES = _torch_files()
OTHER_TREES = [Path(p) for p in os.environ.get("AMPMIGRATE_AGREEMENT_TREES", "").split(os.pathsep) if p]


def differences(paths: List[str]) -> List[str]:
    found = []
    for path in paths:
        raw = Path(path).read_bytes()
        for package in PACKAGES:
            fast = summarize(raw, package)
            full = summarize(raw, package, shortcuts=False)
            if asdict(fast) != asdict(full):
                found.append(f"{path} ({package!r}): {asdict(fast)} != {asdict(full)}")
    return found


def test_own_files_and_fixtures_summarize_the_same_with_and_without_shortcuts():
    assert any(p.startswith(str(FIXTURES)) for p in OWN_FILES)
    assert differences(OWN_FILES) == []


@pytest.mark.skipif(not TORCH_FILES, reason="torch is not installed")
def test_a_sample_of_torch_summarizes_the_same():
    sample = TORCH_FILES[::10] + [p for p in TORCH_FILES if "amp" in p or "clip_grad" in p]
    assert differences(sample) == []


SHARDS = 4  # the whole trees in interleaved shards, so that `pytest -n` runs them side by side


@pytest.mark.slow
@pytest.mark.skipif(not TORCH_FILES and not OTHER_TREES, reason="no real tree")
@pytest.mark.parametrize("shard", range(SHARDS))
def test_whole_trees_summarize_the_same(shard):
    files = TORCH_FILES + [str(p) for tree in OTHER_TREES for p in sorted(tree.rglob("*.py")) if p.is_file()]
    assert differences(files[shard::SHARDS * TREE_STRIDE]) == []


# Shapes at the edge of each byte test: each must be recorded (or not) as the long way says,
# and the ones marked "recorded" must be recorded at all (the test would pass vacuously else).
EDGES = {
    "clip through parentheses": (b"import torch\ndef f(m):\n    (torch.nn.utils).clip_grad_norm_(m.parameters(), 1)\n", "clip_helpers"),
    "clip across a comment": (
        b"import torch\ndef f(m):\n    (torch.nn.utils  # the module\n     .clip_grad_norm_)(m.parameters(), 1)\n",
        "clip_helpers",
    ),
    "clip across a continuation": (b"import torch\ndef f(m):\n    torch.nn.utils \\\n .clip_grad_value_(m, 1)\n", "clip_helpers"),
    "clip through clip_grad": (b"import torch\ndef f(m):\n    torch.nn.utils.clip_grad.clip_grad_norm_(m, 1)\n", "clip_helpers"),
    "clip imported with spaces": (
        b"from torch . nn . utils import clip_grad_norm_ as c\ndef f(m):\n    c(m.parameters(), 1)\n",
        "clip_helpers",
    ),
    "clip imported relatively": (
        b"from .torch.nn.utils import clip_grad_norm_\ndef f(m):\n    clip_grad_norm_(m, 1)\n",
        "clip_helpers",
    ),
    "clip imported over lines": (
        b"from \\\n  torch.nn.utils import (\n    clip_grad_norm_,\n)\ndef f(m):\n    clip_grad_norm_(m, 1)\n",
        "clip_helpers",
    ),
    "scaler parameter spaced": (
        b"def step(s, loss, opt):\n    s . scale (loss) . backward()\n    s.step(opt)\n    s.update()\n# clip_grad_norm\n",
        "scaler_params",
    ),
    "scaler parameter through parentheses": (
        b"def step(s, loss, opt):\n    (s.scale)(loss).backward()\n    s.step(opt)\n# clip_grad_norm\n",
        "scaler_params",
    ),
    "scaler made and passed": (
        b"from torch.amp import GradScaler\ndef main():\n    s = GradScaler('cuda')\n    train(s)\n",
        "scaler_passed_to",
    ),
    "apex amp relative import": (b"from .apex import amp\ndef main(m):\n    train(m, amp)\n", "apex_amp_passed_to"),
    "apex amp aliased with spaces": (
        b"import os, apex . amp as A\ndef main(m):\n    train(m, A)\n",
        "apex_amp_passed_to",
    ),
    "apex amp over a continuation": (b"from apex \\\n import amp\ndef main(m):\n    train(m, amp)\n", "apex_amp_passed_to"),
    "apex scale_loss on a parameter": (
        b"# apex\ndef train(amp, loss, opt):\n    with amp.scale_loss(loss, opt) as l:\n        l.backward()\n",
        "apex_amp_params",
    ),
    "backward runner over a continuation": (
        b"class S:\n    def \\\n      __call__(self, loss):\n        loss.backward()\n",
        "backward_runners",
    ),
    "backward runner spaced": (
        b"class S:\n    def __call__(self, loss):\n        loss . backward ()\nx.backward()\n",
        "backward_runners",
    ),
    "grad-norm helper spaced": (
        b"def get_grad_norm(parameters, norm_type=2):\n    total_norm = 0\n    for p in parameters:\n"
        b"        param_norm = p.grad . data . norm (norm_type)\n        total_norm += param_norm.item() ** norm_type\n"
        b"    total_norm = total_norm ** (1. / norm_type)\n    return total_norm\n",
        "grad_norm_helpers",
    ),
    "grad-norm helper after a form feed, torch's form": (
        b"import torch\n\x0cdef gn(ps, t=2.0):\n"
        b"    return torch.norm(torch.stack([(torch.norm)(p.grad.detach(), t) for p in ps]), t)\n",
        "grad_norm_helpers",
    ),
    "grad-norm helper, the norm of a parenthesized, detached gradient across a comment": (
        b"def get_grad_norm(parameters, norm_type=2):\n    total_norm = 0\n    for p in parameters:\n"
        b"        param_norm = ((p.grad)  # the gradient\n . detach ( ) ) . norm(norm_type)\n"
        b"        total_norm += param_norm.item() ** norm_type\n"
        b"    total_norm = total_norm ** (1. / norm_type)\n    return total_norm\n",
        "grad_norm_helpers",
    ),
    "grad-norm helper, `.data` through a continuation": (
        b"def get_grad_norm(parameters):\n    total_norm = 0\n    for p in parameters:\n"
        b"        total_norm += p.grad.data \\\n            .norm(2.0).item() ** 2.0\n"
        b"    return total_norm ** 0.5\n",
        "grad_norm_helpers",
    ),
    "checkpoint saver, async, through parentheses": (
        b"import torch\nasync \\\n def save_all(path, model, optimizer):\n"
        b"    torch.save({'m': (model) . state_dict(), 'o': optimizer.state_dict()}, path)\n",
        "checkpoint_savers",
    ),
}
NOT_RECORDED = {
    "checkpoint saver of attributes only": (
        b"import torch\ndef save_all(self, path):\n    torch.save(self.model.state_dict(), path)\n"
        b"class T:\n    def save(self, model):\n        torch.save(model.state_dict(), 'x')\n"
    ),
    "gradient and normalize": b"def f(m):\n    m.gradient_clip = normalize(m.grad_scale)\n    return m.norm\n",
    "grad norm in a method only": b"class C:\n    def g(self, ps):\n        return sum(p.grad.norm(2) for p in ps)\n",
    "clip named in a string": b"def f(m):\n    return 'clip_grad_norm' + m.utils\n",
    "clip on another object": b"from x import utils2\ndef f(module):\n    return module.clip_grad_norm_(1.0)\n",
    "scale without backward": b"import torch\ndef f(x):\n    return x.scale(2)\n",
    "apex named only": b"import torch\n# apex amp was here\ndef f(loss, opt):\n    pass\n",
    "call without backward": b"class S:\n    def __call__(self, loss):\n        return loss\nx.backward()\n",
    "non-ASCII identifier": "import torch\ndef f(m):\n    torch.nn.\uff55tils.clip_grad_norm_(m, 1)\n".encode(),
    "from inside parentheses": b"from a import (b,\nfrom c import d)\nimport x, y\n  from z import w  # indented\n",
    "carriage returns": b"from a import b\rfrom c import d\r\nimport e\n",
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_shapes_are_recorded_the_same(name):
    raw, record = EDGES[name]
    full = summarize(raw, "pkg", shortcuts=False)
    assert getattr(full, record), f"the long way records no {record}: the case tests nothing"
    assert asdict(summarize(raw, "pkg")) == asdict(full)


@pytest.mark.parametrize("name", sorted(NOT_RECORDED))
def test_near_misses_are_summarized_the_same(name):
    raw = NOT_RECORDED[name]
    assert asdict(summarize(raw, "pkg")) == asdict(summarize(raw, "pkg", shortcuts=False))


def test_line_matches_are_the_regex_matches():
    texts = [*NOT_RECORDED.values(), *(raw for raw, _ in EDGES.values())]
    texts += [Path(p).read_bytes() for p in OWN_FILES[:200]]
    for raw in texts:
        for pattern, keyword in ((project_index_module._FROM, b"from"), (project_index_module._IMPORT, b"import")):
            fast = [m.span() for m in project_index_module._line_matches(pattern, keyword, raw)]
            assert fast == [m.span() for m in pattern.finditer(raw)]


def test_cache_data_is_asdict():
    assert [f.name for f in fields(ModuleSummary)] == list(_as_data(ModuleSummary()))
    for path in OWN_FILES:
        summary = summarize(Path(path).read_bytes(), "pkg")
        assert _as_data(summary) == asdict(summary)


def test_the_index_is_the_same_without_shortcuts(monkeypatch, tmp_path):
    root = FIXTURES
    files = sorted(str(p) for p in root.rglob("*.py"))
    fast = ProjectIndex.build(str(root), files, cache_path=str(tmp_path / "fast.json"))
    monkeypatch.setattr(
        project_index_module, "summarize", lambda raw, package, **kw: summarize(raw, package, shortcuts=False, **kw)
    )
    full = ProjectIndex.build(str(root), files, cache_path=str(tmp_path / "full.json"))
    assert {p: asdict(s) for p, s in fast.modules.items()} == {p: asdict(s) for p, s in full.modules.items()}
    assert [fast.dependency_key(p) for p in files] == [full.dependency_key(p) for p in files]
    assert (tmp_path / "fast.json").read_text() == (tmp_path / "full.json").read_text()


def test_byte_tests_do_not_backtrack_on_comment_banners():
    """A comment is one token of the gaps the byte tests allow between tokens: a banner of `#`
    (or a comment full of spaces) after `utils` / `.scale` / an import must not make the regex
    try every way of splitting it (exponential before)."""
    import time

    banner = b"#" * 60 + b" " * 60 + b"#" * 60
    raw = (
        b"import utils  " + banner + b"\n"
        b"x = utils  " + banner + b"\n"
        b"y.scale  " + banner + b"\n"
        b"# clip_grad_norm GradScaler backward\n"
    ).replace(b"GradScaler", b"Grad_Scaler")
    start = time.process_time()
    fast = summarize(raw, "pkg")
    assert time.process_time() - start < 2.0
    assert asdict(fast) == asdict(summarize(raw, "pkg", shortcuts=False))
