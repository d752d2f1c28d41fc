"""The rules' `ast` screens (run before LibCST, engine/prefilter.py) must agree with the rules:
a screen that says a file cannot hold a finding of its rule is right, over whole real trees.

Three levels:
- shapes each sharper screen must keep (AMP207, AMP405/406, AMP408, AMP409, the AMP3 protocol
  rules): each text has a finding, and the filter drops none of them;
- shapes each screen drops (so that the screens do screen files out);
- the property over whole trees: for every file of a tree where the screens drop some rule that
  the trigger regexes let through, the findings with and without the screens are the same. A
  sample of the installed torch package runs in the quick suite; with `-m slow`, every file of
  the trees named in `AMPMIGRATE_AGREEMENT_TREES` (paths separated by `os.pathsep`, e.g. the
  Lightning tree and repositories fetched under /work/corpus/) and of torch.
"""

from __future__ import annotations

import ast
from typing import List, Tuple

import pytest

from ampmigrate.engine.pipeline import Engine
from ampmigrate.rules import all_rules
from ampmigrate.source import SourceError, SourceFile

from conftest import make_settings
from test_prescreen_agreement import OTHER_TREES, TORCH_FILES, TREE_STRIDE, tree_files


def _report(engine: Engine, text: str, path: str, rules) -> List[Tuple]:
    result = engine.check_text(text, path, rules=rules)
    return sorted((f.location.row, f.location.column, f.code, f.message) for f in result.findings)


def disagreement(engine: Engine, path: str, text: str) -> List[Tuple]:
    """Findings of the rules the triggers let through that the screened rules miss (should be [])."""
    unscreened = engine.rules_for(text, path, screen=False)
    if not unscreened:
        return []
    screened = engine.rules_for(text, path)
    if len(screened) == len(unscreened):
        return []  # the screens dropped nothing here
    full = _report(engine, text, path, unscreened)
    kept = _report(engine, text, path, screened) if screened else []
    return [f for f in full if f not in kept]


def tree_disagreements(engine: Engine, files: List[str]):
    found = {}
    for path in files:
        try:
            text = SourceFile.read(path).text
        except SourceError:
            continue
        try:
            missed = disagreement(engine, path, text)
        except RecursionError:
            continue
        if missed:
            found[path] = missed
    return found


# ---------------------------------------------------------------------------------- shapes kept
KEPT = {
    "AMP207": [
        "import torch\nwith torch.autocast('cuda', False):\n    pass\n",
        "import torch\nargs = ()\nwith torch.autocast('cuda', True, *args):\n    pass\n",
    ],
    "AMP405": [
        "from lightning import Trainer\nTrainer(precision=16)\n",
        "from lightning import Trainer\np = '16-mixed'\nTrainer(precision=p)\n",
        "from lightning import Trainer\ndef main(precision=16):\n    Trainer(precision=precision)\nmain()\n",
        "from lightning import Trainer\ncfg = {'precision': 16, 'max_epochs': 1}\nTrainer(**cfg)\n",
        "from lightning import Trainer\nTrainer(**dict(precision='16-mixed'))\n",
        "from lightning import Trainer\nimport argparse\np = argparse.ArgumentParser()\n"
        "p.add_argument('--precision', default=16)\nargs = p.parse_args()\nTrainer(precision=args.precision)\n",
        "from lightning import Trainer\nclass M:\n    def __init__(self):\n        self.precision = '16'\n"
        "    def fit(self):\n        Trainer(precision=self.precision)\n",
        "from dataclasses import dataclass\nfrom lightning import Trainer\n@dataclass\nclass Cfg:\n    precision: int = 16\n"
        "def run(cfg: Cfg):\n    Trainer(precision=cfg.precision)\n",
        "from lightning import Trainer\nimport sys\nTrainer(precision=16 if sys.argv else 32)\n",
    ],
    "AMP406": [
        "from lightning import Trainer\nTrainer(precision='bf16')\n",
        "from lightning.fabric import Fabric\nP = 'bf16'\nFabric(precision=P)\n",
    ],
    "AMP408": [
        "import deepspeed\nconfig = {'train_batch_size': 8, 'fp16': {'enabled': True, 'loss_scale': 0}}\n"
        "deepspeed.initialize(config=config)\n",
    ],
    "AMP409": [
        "import torch\ndef train(model):\n    model.half()\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
    ],
    "AMP301": [
        "import torch\nscaler = torch.cuda.amp.GradScaler()\ndef step(model, opt, loss):\n"
        "    scaler.scale(loss).backward()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "    scaler.step(opt)\n    scaler.update()\n",
        "import torch\ndef step(model, opt, loss, scaler: 'torch.cuda.amp.GradScaler'):\n"
        "    scaler.scale(loss).backward()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "    scaler.step(opt)\n    scaler.update()\n",
    ],
}


def _kept():
    for code, texts in KEPT.items():
        for i, text in enumerate(texts):
            yield pytest.param(code, text, id=f"{code}-{i}")


@pytest.mark.parametrize("code, text", list(_kept()))
def test_screens_keep_the_shapes_their_rules_report(code, text):
    engine = Engine(make_settings({"min-torch": "2.4"}))
    unfiltered = Engine(make_settings({"min-torch": "2.4"}), prefilter=False).check_text(text, "train.py")
    assert code in {f.code for f in unfiltered.findings}, "the shape must have a finding"
    assert code in {r.code for r in engine.rules_for(text, "train.py")}
    assert disagreement(engine, "train.py", text) == []


# ---------------------------------------------------------------------------------- shapes dropped
DROPPED = {
    # a literal 16 that no `precision` setting can reach (a parameter without a default)
    "AMP406": "from lightning import Trainer\nimport pytest\n@pytest.mark.parametrize('p', ['16-mixed'])\n"
    "def test_fit(p):\n    x = [16, 'bf16']\n    Trainer(precision=p)\n",
    "AMP405": "from lightning import Trainer\nsize = 16\nTrainer(precision='bf16-mixed', max_epochs=size)\n",
    # "fp16" as a key whose section is read, not a dict display enabling it
    "AMP408": "config = {}\nif 'fp16' in config:\n    config['fp16'] = {'enabled': True}\n",
    # a conversion returned by a method (only module-level builders are followed to other files)
    "AMP409": "import torch\nclass Q:\n    def weight(self, w):\n        w = w.to(dtype=torch.float16)\n        return w\n",
    # a bool that is not the second positional argument
    "AMP207": "import torch\nwith torch.autocast('cuda', enabled=False):\n    pass\nf(1, x=True)\n",
    # GradScaler in a docstring and a Sphinx cross-reference only
    "AMP301": "'''Uses a GradScaler.'''\nimport torch\nnitpick = [('py:class', 'torch.amp.grad_scaler.GradScaler')]\n"
    "x = torch.ones(1).scale(2)\n",
}


@pytest.mark.parametrize("code", sorted(DROPPED))
def test_screens_drop_files_their_rules_cannot_report_on(code):
    text = DROPPED[code]
    engine = Engine(make_settings({"min-torch": "2.4"}))
    assert code in {r.code for r in engine.rules_for(text, "train.py", screen=False)}, "the triggers let it through"
    assert code not in {r.code for r in engine.rules_for(text, "train.py")}


def test_the_property_fails_where_a_screen_is_too_narrow(monkeypatch):
    """The check can fail: a screen that drops every file disagrees with its rule."""
    rule = next(r for r in all_rules() if r.code == "AMP406")
    monkeypatch.setattr(type(rule), "screen", lambda self, tree: False)
    engine = Engine(make_settings())
    assert disagreement(engine, "train.py", KEPT["AMP406"][0]) != []


# ---------------------------------------------------------------------------------- whole trees
# The same trees as the name screen's agreement test (tests/test_prescreen_agreement.py).


@pytest.mark.skipif(not TORCH_FILES, reason="torch is not installed")
def test_screens_and_rules_agree_on_a_sample_of_torch():
    sample = TORCH_FILES[::40] + [p for p in TORCH_FILES if "/amp/" in p or "/cuda/amp" in p]
    assert tree_disagreements(Engine(make_settings()), sample) == {}


@pytest.mark.slow
@pytest.mark.skipif(not TORCH_FILES and not OTHER_TREES, reason="no real tree")
@pytest.mark.parametrize("min_torch", [None, "2.4"])
def test_screens_and_rules_agree_on_whole_trees(min_torch):
    files = TORCH_FILES + [f for tree in OTHER_TREES for f in tree_files(tree)]
    engine = Engine(make_settings({"min-torch": min_torch} if min_torch else {}))
    assert tree_disagreements(engine, files[::TREE_STRIDE]) == {}


def test_the_screens_parse_what_they_are_given():
    """Sanity: each sharper screen answers on a bare module without raising."""
    tree = ast.parse("x = 1\n")
    for rule in all_rules():
        if rule.has_screen():
            assert rule.screen(tree) in (True, False)


def test_the_shared_node_index_keeps_ast_walk_order():
    """engine/ast_nodes.nodes_of indexes every node but the context and operator leaves, in
    `ast.walk` order: the screens see the lists `ast.walk` would give them."""
    from ampmigrate.engine.ast_nodes import _UNINDEXED_KINDS, _indexed_order

    from conftest import FIXTURES

    for path in sorted(FIXTURES.rglob("*.py")):
        try:
            tree = ast.parse(path.read_bytes())
        except SyntaxError:
            continue
        expected = [id(n) for n in ast.walk(tree) if type(n) not in _UNINDEXED_KINDS]
        assert [id(n) for n in _indexed_order(tree)] == expected, path
