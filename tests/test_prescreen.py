"""The pre-filter (trigger regexes + `ast` name screen) must never drop a file that has a finding.

Soundness is checked the direct way: the engine with and without the pre-filter must report the
same findings on every fixture, every catalogue example and valid snippet, a set of tricky
alias spellings, and real files from the installed torch package. Unit tests pin down what the
screen follows (imports, aliases, `self.x`) and that it does screen files out.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from pathlib import Path

import pytest

from ampmigrate.catalogue import load_catalogue
from ampmigrate.engine.pipeline import Engine
from ampmigrate.engine.prescreen import QualifiedNameScreen
from ampmigrate.rules import all_rules
from ampmigrate.source import SourceError, SourceFile

from conftest import FIXTURES, make_settings

LEGACY = ("torch.cuda.amp", "torch.cpu.amp")


def reach(text: str, prefixes=LEGACY):
    return QualifiedNameScreen(prefixes).reachable(text)


# ---------------------------------------------------------------------------------- the screen
@pytest.mark.parametrize(
    "text",
    [
        "import torch\nwith torch.cuda.amp.autocast(): pass\n",
        "import torch as th\nth.cuda.amp.GradScaler()\n",
        "import torch.cuda.amp\n",  # binds torch; the chain is not spelled, but see below
        "from torch.cuda import amp\n",
        "from torch.cuda.amp import autocast as ac\n",
        "import torch.cuda.amp as amp\n",
        "from torch import cuda\ncuda.amp.autocast()\n",
        "import torch\ncu = torch.cuda\ncu.amp.autocast()\n",
        "import torch\nx = torch\ny = x\nz = y.cuda\nz.amp\n",
        "import torch\nac = torch.cuda if new else torch.cpu\nac.amp\n",
        "import torch\na, b = torch.cuda, 1\na.amp\n",
        "import torch\nm: object = torch.cuda\nm.amp\n",
        "import torch\nclass T:\n    def __init__(self):\n        self.c = torch.cuda\n    def f(self):\n        return self.c.amp.autocast()\n",
        "def f():\n    import torch\n    return torch.cpu.amp.autocast()\n",
        "import importlib\ndef f():\n    global a\n    a = importlib.import_module('torch.cuda.amp')\n",
        "from importlib import import_module\nclass T:\n    def __init__(self):\n        self.c = import_module('torch.cuda')\n    def f(self):\n        return self.c.amp\n",
    ],
)
def test_screen_follows_imports_and_aliases(text):
    found = reach(text)
    if text == "import torch.cuda.amp\n":
        assert found == frozenset()  # `import torch.cuda.amp` binds `torch`; no chain reaches amp
    else:
        assert found, text


HIDING_PLACES = [
    "import torch\n@torch.cuda.amp.custom_fwd\ndef f(ctx, x):\n    pass\n",
    "import torch\n\n@decorate(\n    torch.cuda.amp.autocast,\n)\n\nclass A:\n    pass\n",
    "import torch\nclass A(torch.cuda.amp.GradScaler):\n    pass\n",
    "import torch\nwith (\n    torch.cuda\n    .amp\n    .autocast()\n):\n    pass\n",
    "import torch\nx = torch.cuda.\\\n    amp\n",
    "import torch\na = 1; b = torch.cuda.amp\n",
    "import torch\ntry:\n    pass\nexcept torch.cuda.amp.Error:\n    pass\n",
    "import torch\nmatch x:\n    case 1 if torch.cuda.amp.autocast:\n        pass\n",
    "import torch\nf = lambda a=torch.cuda.amp.autocast: a\n",
    "import torch\nys = [torch.cuda.amp.autocast for _ in range(3)]\n",
    "import torch\ns = f'{torch.cuda.amp.autocast()}'\n",
    "import torch\ndef f(x=torch.cuda.amp.GradScaler()) -> torch.cpu.amp.autocast:\n    pass\n",
    "import torch\r\n\r\n\rif x:\r    print(torch.cuda.amp.autocast)\r\n",
    "import torch\nif a:\n    pass\nelif torch.cuda.amp:\n    pass\nelse:\n    for i in torch.cpu.amp.x:\n        pass\n",
    "def f():\n    s = '''\n\n'''\n    import torch\n    return torch.cuda.amp\n",
    "import torch\nx = (torch.cuda  # a comment between\n     .amp)\n",
]


@pytest.mark.parametrize("text", HIDING_PLACES, ids=[f"place{i}" for i in range(len(HIDING_PLACES))])
def test_screen_finds_chains_anywhere(text):
    assert reach(text), text


@pytest.mark.parametrize(
    "text",
    [
        "import torch\ntorch.cuda.synchronize()\namp = 1\n",  # cuda and amp, never chained
        "from . import amp\namp.autocast()\n",  # relative: not torch's
        "from torch.cuda import *\namp.autocast()\n",  # the resolver does not follow star imports
        "import torch\nx = torch.nn\nx.cuda.amp\n",  # torch.nn.cuda.amp is not under torch.cuda.amp
        "# torch.cuda.amp.autocast in a comment\ns = 'torch.cuda.amp'\n",
        "import apex\napex.amp.initialize()\n",
        "import importlib\namp = importlib.import_module(name)\namp.autocast()\n",  # not a literal
        "import importlib\namp = importlib.import_module('.amp', 'torch.cuda')\n",  # relative to a package
    ],
)
def test_screen_screens_out(text):
    assert reach(text) == frozenset()


def test_screen_reports_each_prefix_separately():
    text = "import torch\ntorch.autocast('cuda')\n"
    assert reach(text, ("torch.autocast", "torch.cuda.amp")) == {"torch.autocast"}


def test_screen_terminates_on_alias_cycles():
    assert reach("import torch\ny = z\nz = y.cuda\ny.amp\n") == frozenset()
    # Flow-insensitive: x may be torch or x.cuda, so x.amp may be torch.cuda.amp (and
    # torch.cuda.cuda... is not followed: it can never get under a prefix).
    assert reach("import torch\nx = x.cuda\nx = torch\nx.amp\n") == {"torch.cuda.amp"}


def test_unparsable_text_is_not_screened():
    assert reach("def f(:\n    torch.cuda.amp\n") is None
    assert reach("import torch\nx = torch" + ".cuda" * 5000 + ".amp\n") is None  # too deep to follow
    engine = Engine(make_settings())
    # A syntax error in a file that triggers still reaches LibCST, which reports it.
    result = engine.check_text("import torch\ntorch.cuda.amp.autocast(\n", "broken.py")
    assert result.errors and "syntax error" in result.errors[0].message


def test_rules_without_prefixes_fall_back_to_triggers():
    from ampmigrate.rules.base import Rule

    class Loose(Rule):
        code = "AMP201"
        triggers = (r"\bamp\b",)
        qualified_prefixes = None

    class Strict(Rule):
        code = "AMP202"
        triggers = (r"\bamp\b",)
        qualified_prefixes = LEGACY

    from ampmigrate.engine.prefilter import Prefilter

    prefilter = Prefilter([Loose(), Strict()])
    assert [r.code for r in prefilter.rules_for("amp = 1\n")] == ["AMP201"]
    assert [r.code for r in prefilter.rules_for("import torch\ntorch.cuda.amp\n")] == ["AMP201", "AMP202"]
    assert [r.code for r in prefilter.rules_for("import torch\namp = 1\n", screen=False)] == ["AMP201", "AMP202"]
    # A qualified name starts at an import, so a file that never spells `torch` is out by text alone.
    assert [r.code for r in prefilter.rules_for("amp = 1\n", screen=False)] == ["AMP201"]


LIGHTNING_SPELLINGS = [
    "import lightning as L\nL.Trainer(precision=16)\n",
    "from lightning import Trainer\nTrainer(precision=16)\n",
    "from lightning.pytorch import *\nTrainer(precision=16)\n",
    "import pytorch_lightning.trainer.trainer as t\nt.Trainer(precision=16)\n",
    "import lightning\nT = lightning.Fabric\nT(precision=16)\n",
    "import lightning\ndef f(t: 'lightning.Trainer'):\n    t.fit(precision=16)\n",
]


@pytest.mark.parametrize("text", LIGHTNING_SPELLINGS)
def test_the_last_part_of_a_prefix_is_spelled_wherever_the_rule_can_report(text):
    """Every way the resolver reaches `lightning.Trainer` spells `Trainer` (prefilter._requirements):
    the text stage keeps the Lightning rules for each of these, the screens too."""
    engine = Engine(make_settings({"select": ["AMP405", "AMP406"]}))
    assert {r.code for r in engine.rules_for(text, "train.py", screen=False)} == {"AMP405", "AMP406"}


def test_a_file_that_never_spells_the_last_part_is_not_parsed(monkeypatch):
    """Lightning's own modules say `precision=` and `lightning` everywhere; only about half spell
    `Trainer` or `Fabric`. The others are dropped by the text stage, before any `ast` parse."""
    import ampmigrate.engine.prefilter as prefilter_module

    parsed = []
    monkeypatch.setattr(prefilter_module, "parse", lambda text: parsed.append(text))
    engine = Engine(make_settings({"select": ["AMP405", "AMP406"]}))
    text = "from lightning.fabric.plugins import Precision\n\n\ndef f(precision='16-mixed'):\n    return Precision(precision=precision)\n"
    assert engine.rules_for(text, "plugin.py") == [] and parsed == []


def test_requires_and_the_ast_screen():
    from ampmigrate.engine.prefilter import Prefilter
    from ampmigrate.rules.base import Rule

    screened = []

    class Both(Rule):
        code = "AMP409"
        triggers = ("half",)
        requires = ("optim",)

        def screen(self, tree):
            screened.append(tree)
            return any(isinstance(node, ast.Call) for node in ast.walk(tree))

    prefilter = Prefilter([Both()])
    assert prefilter.rules_for("half = 1\n") == []  # `requires` not met: never parsed
    assert screened == []
    assert prefilter.rules_for("half = optim\n") == []  # parsed once, screened out
    assert len(screened) == 1
    assert [r.code for r in prefilter.rules_for("half(optim)\n")] == ["AMP409"]
    assert [r.code for r in prefilter.rules_for("half = optim\n", screen=False)] == ["AMP409"]
    assert [r.code for r in prefilter.rules_for("half(optim\n")] == ["AMP409"]  # `ast` fails: LibCST decides


def test_every_rule_declares_prefixes_or_says_it_cannot():
    for rule in all_rules():
        prefixes = rule.qualified_prefixes
        assert prefixes is None or (prefixes and all(isinstance(p, str) and p for p in prefixes)), rule


# ---------------------------------------------------------------------------------- soundness
def _report(text: str, path: str, engine: Engine):
    result = engine.check_text(text, path)
    return [(f.location.row, f.location.column, f.code, f.message) for f in result.findings]


def assert_filter_drops_nothing(text: str, path: str = "example.py", **options) -> None:
    settings = make_settings(options)
    filtered = _report(text, path, Engine(settings))
    unfiltered = _report(text, path, Engine(settings, prefilter=False))
    assert filtered == unfiltered, path


def _texts():
    for path in sorted(FIXTURES.rglob("*.py")):
        yield pytest.param(path.read_bytes().decode("utf-8"), id=str(path.relative_to(FIXTURES)))
    for code, doc in sorted(load_catalogue().items()):
        for i, example in enumerate(doc.examples):
            yield pytest.param(example.before, id=f"{code}-example{i}")
            yield pytest.param(example.after, id=f"{code}-after{i}")
        for i, snippet in enumerate(doc.valid):
            yield pytest.param(snippet, id=f"{code}-valid{i}")


@pytest.mark.parametrize("text", list(_texts()))
def test_filter_drops_no_finding_in_fixtures_and_catalogue(text):
    assert_filter_drops_nothing(text)
    assert_filter_drops_nothing(text, **{"min-torch": "2.2"})


ALIAS_ZOO = [
    "import torch\ncu = torch.cuda\nwith cu.amp.autocast():\n    pass\n",
    "import torch\nAC = torch.cuda.amp.autocast\nwith AC():\n    pass\n",
    "import torch as t\nclass Trainer:\n    def __init__(self):\n        self.ac = t.cuda.amp.autocast\n    def step(self):\n        with self.ac():\n            pass\n",
    "import torch\nscaler_cls = torch.cuda.amp.GradScaler if torch.cuda.is_available() else None\nscaler = scaler_cls()\n",
    "from torch.cuda import amp as a\nwith a.autocast(enabled=True):\n    pass\n",
    "from torch.cuda.amp import GradScaler\n",
    "import torch.cuda.amp as amp\nscaler = amp.GradScaler(2.0 ** 16)\n",
    "import importlib\namp = importlib.import_module('apex.amp')\nhandle = amp.init()\n",
    "import importlib\ndef f(m, o):\n    global amp\n    amp = importlib.import_module('apex.amp')\n    return amp.initialize(m, o)\n",
    "import torch\nx, y = torch.cuda, 0\nwith x.amp.autocast():\n    pass\n",
    "import torch\ndef f(s: torch.cuda.amp.GradScaler):\n    return isinstance(s, torch.cuda.amp.GradScaler)\n",
    "import torch\nfrom functools import partial\nac = partial(torch.cuda.amp.autocast, dtype=torch.float16)\n",
    "import torch\n@torch.cuda.amp.custom_fwd\ndef forward(ctx, x):\n    return x\n",
    "import torch\ntorch.set_autocast_gpu_dtype(torch.float16)\nprint(torch.get_autocast_cpu_dtype())\n",
    "import torch as th\nf = th.is_autocast_cpu_enabled\nf()\n",
    "import torch\nwith torch.autocast('cuda', False):\n    pass\n",
    "from torch import autocast\nwith autocast('cuda', True):\n    pass\n",
    "import torch\nac = torch.amp.autocast\nwith ac('cpu', False):\n    pass\n",
    "import torch\ntry:\n    from torch.amp import autocast\nexcept ImportError:\n    from torch.cuda.amp import autocast\n",
]


@pytest.mark.parametrize("text", ALIAS_ZOO, ids=[f"zoo{i}" for i in range(len(ALIAS_ZOO))])
def test_filter_drops_no_finding_through_aliases(text):
    assert Engine(make_settings(), prefilter=False).check_text(text, "zoo.py").findings, "the zoo must have findings"
    assert_filter_drops_nothing(text)


# ---------------------------------------------------------------------------------- real files
def _torch_sample():
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return []
    root = Path(spec.origin).parent
    everything = re.compile("|".join(f"(?:{t})" for rule in all_rules() for t in rule.triggers))
    sample = []
    for path in sorted(root.rglob("*.py")):
        try:
            size = path.stat().st_size
            if size > 80_000:
                continue  # keep the suite quick; the bench runs the whole tree
            text = SourceFile.read(str(path)).text
        except (OSError, SourceError):
            continue
        if everything.search(text):
            sample.append(pytest.param(str(path), id=os.path.relpath(path, root)))
    return sample


TORCH_SAMPLE = _torch_sample()


@pytest.mark.slow
@pytest.mark.skipif(not TORCH_SAMPLE, reason="torch is not installed")
@pytest.mark.parametrize("path", TORCH_SAMPLE)
def test_filter_drops_no_finding_in_real_torch_files(path):
    """Every torch file that matches a trigger (these are the files where the screen decides)."""
    assert_filter_drops_nothing(SourceFile.read(path).text, path)


def test_star_imports_of_known_modules_reach_what_they_export():
    assert reach("from apex.fp16_utils import *\nto_python_float(x)\n", ("apex",)) == {"apex"}
    assert reach("from apex.fp16_utils import *\n", ("apex.fp16_utils.network_to_half",)) == {
        "apex.fp16_utils.network_to_half"
    }
    assert reach("from somewhere import *\n", ("apex",)) == frozenset()
    assert_filter_drops_nothing("from apex.fp16_utils import *\nmodel = network_to_half(model)\n")


def test_a_prefix_that_leads_to_a_longer_prefix_is_still_followed():
    """`torch.cuda.amp` is one rule's prefix and on the way to another's (`torch.cuda.amp.autocast`)."""
    from ampmigrate.engine.prescreen import QualifiedNameScreen

    screen = QualifiedNameScreen(["torch.cuda.amp", "torch.cuda.amp.autocast", "torch.cpu.amp"])
    alias = "import torch\nctx = torch.cuda.amp.autocast\nwith ctx():\n    pass\n"
    assert screen.reachable(alias) == {"torch.cuda.amp", "torch.cuda.amp.autocast"}
    via_import = "from torch.cuda import amp\nwith amp.autocast():\n    pass\n"
    assert screen.reachable(via_import) == {"torch.cuda.amp", "torch.cuda.amp.autocast"}


# ---------------------------------------------------------------------------------- AMP409's screen
_FP16_TRAINING = [
    # the optimizer is given a name that holds the parameters
    "import torch\ndef main(model):\n    model.half()\n    params = [p for p in model.parameters() if p.requires_grad]\n"
    "    opt = torch.optim.SGD(params, lr=0.1)\n",
    # at module level, through an alias of the optimizer class
    "import torch\nfrom torch.optim import AdamW as Opt\nmodel = Net().cuda().to(dtype=torch.float16)\n"
    "opt = Opt([{'params': model.parameters()}])\n",
    # train mode instead of an optimizer, in a method
    "import torch\nclass T:\n    def fit(self):\n        self.model = self.model.half()\n        self.model.train()\n",
    # the dtype in a variable, the optimizer's parameters starred
    "import torch\nDT = torch.float16\ndef f(model):\n    model.to(DT)\n"
    "    return torch.optim.Adam(*[model.parameters()])\n",
]


@pytest.mark.parametrize("text", _FP16_TRAINING)
def test_amp409_screen_keeps_what_it_reports(text):
    unfiltered = Engine(make_settings({"select": ["AMP409"]}), prefilter=False).check_text(text, "train.py")
    assert [f.code for f in unfiltered.findings] == ["AMP409"], text
    assert_filter_drops_nothing(text, "train.py", select=["AMP409"])


def test_amp409_screen_drops_a_conversion_never_trained_in_its_scope():
    from ampmigrate.rules.precision.amp409_pure_fp16_training import PureFp16Training

    rule = PureFp16Training()
    apart = (
        "import torch\ndef export(model):\n    model.half()\n    torch.save(model, 'm.pt')\n"
        "def fit(model):\n    opt = torch.optim.SGD(model.parameters())\n    model.train()\n"
    )
    together = apart.replace("    torch.save(model, 'm.pt')\n", "    model.train()\n")
    assert rule.screen(ast.parse(apart)) is False
    assert rule.screen(ast.parse(together)) is True
    assert Engine(make_settings({"select": ["AMP409"]})).rules_for(apart) == []


def test_walk_order_is_ast_walk():
    """engine/ast_nodes.walk_order: ast.walk's nodes in ast.walk's order (the screens see the
    same lists), over every fixture."""
    import ast as python_ast

    from ampmigrate.engine.ast_nodes import walk_order

    for path in sorted(FIXTURES.rglob("*.py")):
        try:
            tree = python_ast.parse(path.read_bytes())
        except SyntaxError:
            continue
        assert [id(n) for n in walk_order(tree)] == [id(n) for n in python_ast.walk(tree)]
