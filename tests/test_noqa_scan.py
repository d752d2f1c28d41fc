"""engine/noqa.py's regex scan for comments (`_scanned_comments`) must find exactly the comments,
with the same rows, that tokenize finds (`_comments`) in every text Python's parser accepts:
`parse_suppressions` reads `# noqa` comments through it."""

from __future__ import annotations

import ast
import importlib.util
import sys
import warnings
from pathlib import Path
from typing import List

import pytest

from ampmigrate.engine import noqa

from conftest import FIXTURES

REPO = Path(__file__).resolve().parent.parent

SNIPPETS = {
    "hash-in-strings": "a = '# noqa'  # noqa: AMP201\nb = \"#\" + '#'\nc = f\"{x['#']}\"  # real\n",
    "triple-quoted": "'''# noqa\n'' ' # still string\n'''  # noqa: E501\n\"\"\"a \"\" # \"b\"\"\"\n# after\n",
    "escapes": "a = 'it\\'s # no'  # c1\nb = r'\\'# raw'  # c2\nc = \"\\\\\"  # c3\nd = b'\\x23#'\n",
    "continued-string": "s = 'one \\\n# two' # three\nt = \"x\\\r\ny\"  # four\n",
    "crlf": "import torch\r\n\r\nx = 1  # noqa\r\n# alone\r\ny = '''a\r\n# b\r\n'''  # c\r\n",
    "lone-cr": "x = 1  # a\ry = '#'  # b\r\r# c\r",
    "no-final-newline": "x = 1\n# last",
    "continuation-comment": "x = (1,  # one\n     2)  # two\ny = [\n    # inside\n]\n",
    "prefixes": "a = rb'#'  # p1\nb = Rb\"\"\"#\n\"\"\"  # p2\nc = u'#' f'#' F\"#\"  # p3\n",
    "unicode": "s = 'héllo # ✓'  # ünïcode noqa\n\t# tab\n\f# form feed\n",
    "quotes-in-comments": "# it's\nx = 1  # \"half\n# '''not a string\ny = 2\n",
    "empty": "",
    "decorators": "@dec  # d\n# between\ndef f():  # noqa: AMP201\n    '''doc # not'''\n    return 1  # r\n",
}

NOT_PYTHON = {
    "unterminated": "x = 'abc\n# noqa: AMP201\n",
    "unterminated-triple": "x = '''abc\n# noqa\n",
}


def tokenized(text: str, spelling: str) -> List:
    return [(row, comment) for row, comment, _ in noqa._comments(text) if spelling in comment.lower()]


def assert_same(text: str) -> None:
    for spelling in ("", "noqa"):
        assert list(noqa._scanned_comments(text, spelling)) == tokenized(text, spelling)


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_snippets(name):
    ast.parse(SNIPPETS[name])  # each is Python
    assert_same(SNIPPETS[name])


@pytest.mark.parametrize("name", sorted(NOT_PYTHON))
def test_text_python_rejects_is_read_as_tokenize_reads_it(name):
    assert_same(NOT_PYTHON[name])


def test_suppressions_of_strings_and_comments():
    text = "a = '# noqa: AMP201'\nb = 1  # noqa: AMP202, AMP203\nc = '''\n# noqa\n'''  # NOQA\n"
    assert noqa.parse_suppressions(text).lines == {2: frozenset({"AMP202", "AMP203"}), 5: noqa.ALL}


def _python_files(roots) -> List[Path]:
    files: List[Path] = []
    for root in roots:
        files.extend(sorted(Path(root).rglob("*.py")))
    return files


def _check_tree(paths) -> int:
    checked = 0
    for path in paths:
        try:
            text = path.read_bytes().decode("utf-8")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ast.parse(text)
        except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError):
            continue
        text = text.replace("\x00", "")
        try:
            assert list(noqa._scanned_comments(text, "")) == tokenized(text, ""), path
        except RecursionError:  # tokenize's own limits
            continue
        checked += 1
    return checked


def _package(name: str) -> List[Path]:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return []
    return [Path(spec.origin).parent]


def test_fixtures_and_real_files():
    roots = [FIXTURES, REPO / "ampmigrate", *_package("libcst")]
    roots += [root / "amp" for root in _package("torch")] + [root / "cuda" for root in _package("torch")]
    assert _check_tree(_python_files(roots)) > 300


@pytest.mark.slow
def test_the_standard_library_and_torch_nn():
    # Every installed file (site-packages and the standard library, 2026-11-26): equal too, in
    # 16 minutes on a busy machine. Here the standard library's own modules and a few of its
    # packages (its test suite aside: 90 s of the full suite for little more), and torch.nn.
    stdlib = Path(sys.modules["ast"].__file__).parent  # type: ignore[arg-type]
    files = sorted(stdlib.glob("*.py"))
    files += _python_files([stdlib / name for name in ("json", "email", "asyncio", "importlib", "unittest")])
    files += _python_files([root / "nn" for root in _package("torch")])
    assert _check_tree(files) > 400
