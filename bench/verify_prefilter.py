#!/usr/bin/env python3
"""Check a whole tree with and without the pre-filter and compare (slow: LibCST on every file).

    python bench/verify_prefilter.py [TREE]      # default: the installed torch package

The unit tests do this for the fixtures, the catalogue and a sample of torch files; this script
does it for every file of a tree, both stages of the filter at once (trigger regexes and the
`ast` name screen). It exits 1 and lists the files where the findings differ.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ampmigrate.config import Settings  # noqa: E402
from ampmigrate.discovery import discover  # noqa: E402
from ampmigrate.engine.pipeline import Engine  # noqa: E402
from ampmigrate.source import SourceError, SourceFile  # noqa: E402

_ENGINES = {}


def _init(settings: Settings) -> None:
    _ENGINES[True] = Engine(settings, prefilter=True)
    _ENGINES[False] = Engine(settings, prefilter=False)


def _findings(path: str, prefilter: bool):
    engine = _ENGINES[prefilter]
    text = SourceFile.read(path).text
    return [(f.location.row, f.location.column, f.code, f.message) for f in engine.check_text(text, path).findings]


def compare(path: str):
    try:
        with_filter = _findings(path, True)
        without_filter = _findings(path, False)
    except SourceError:
        return path, None, 0
    return path, with_filter == without_filter, len(without_filter)


def main() -> int:
    if len(sys.argv) > 1:
        tree = sys.argv[1]
    else:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            raise SystemExit("torch is not installed; pass a tree")
        tree = os.path.dirname(spec.origin)
    # Excludes relative to the tree itself: an installed package sits in site-packages / .venv.
    settings = Settings(respect_gitignore=False, root=os.path.abspath(tree))
    files = discover([tree], settings).files
    if not files:
        raise SystemExit(f"no Python files found in {tree}")
    start = time.perf_counter()
    differing, findings = [], 0
    with ProcessPoolExecutor(initializer=_init, initargs=(settings,)) as pool:
        for path, same, count in pool.map(compare, files, chunksize=4):
            findings += count
            if same is False:
                differing.append(path)
    print(f"{len(files)} files, {findings} findings without the filter, {time.perf_counter() - start:.0f} s")
    for path in differing:
        print(f"DIFFERS: {path}")
    print("the pre-filter dropped no finding" if not differing else f"{len(differing)} files differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
