"""engine/positions.py must give every node exactly LibCST's PositionProvider position."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from ampmigrate.engine.positions import Positions

from conftest import FIXTURES

SNIPPETS = {
    "empty": "",
    "newline-only": "\n",
    "no-trailing-newline": "import torch\nx = torch.cuda.amp.autocast()",
    "crlf": "import torch\r\n\r\ndef f(a,\r\n      b):\r\n    return (a +\r\n            b)  # c\r\n",
    "lone-cr": "x = 1\ry = (2,\r     3)\r",
    "tabs-and-unicode": "def f():\n\tif True:\n\t\treturn 'héllo ✓', \"\"\"a\nb\"\"\"\n",
    "decorators-comments": "# header\n\n@dec(1)\n# between\n@other\nclass A(B, metaclass=M):\n    '''doc'''\n    x: int = 1\n",
    "continuations": "x = 1 + \\\n    2\nwith a as b, c as d:\n    pass\n",
    "footer-and-no-newline": "x = 1\r\n\r\n# last words\r\n  # indented\n\ny = 2  # end",
    "footer": "x = 1\n\n# trailing comment\n  # more\n\n",
    "cr-then-lf-statements": "x = (1,\r  2)\r\ny = 3\r\n\rz = 4\n",
}


def assert_same_positions(module: cst.Module) -> None:
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    assert len(expected) > 0 or module.code == ""
    # The code is generated as far as asked: in the order of the text (a statement at a time),
    # backwards (all at once), and a node of each statement first, then the rest.
    by_start = sorted(expected, key=lambda node: (expected[node].start.line, expected[node].start.column))
    statements = [node for node in module.body if node in expected]
    for order in (by_start, by_start[::-1], statements + by_start):
        fast = Positions(module)
        for node in order:
            assert fast[node] == expected[node], (type(node).__name__, module.code_for_node(node)[:60])


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_snippets(name):
    assert_same_positions(cst.parse_module(SNIPPETS[name]))


@pytest.mark.parametrize("path", sorted(FIXTURES.rglob("*.py")), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_fixtures(path: Path):
    assert_same_positions(cst.parse_module(path.read_bytes().decode("utf-8")))


def _torch_files():
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return []
    root = Path(spec.origin).parent
    names = ["amp/grad_scaler.py", "amp/autocast_mode.py", "cuda/amp/autocast_mode.py", "nn/modules/rnn.py"]
    return [root / name for name in names if (root / name).exists()]


@pytest.mark.parametrize("path", _torch_files(), ids=lambda p: p.name)
def test_real_files(path: Path):
    assert_same_positions(cst.parse_module(path.read_bytes()))


def test_the_code_is_generated_only_as_far_as_asked():
    module = cst.parse_module("a = 1\nb = 2\nc = 3\n# footer\n")
    fast = Positions(module)
    assert fast[module.body[0]].start.line == 1
    assert not fast._finished and fast._next == 1
    assert fast[module.footer[0]].start.line == 4
    assert fast._finished
