"""Write one large Python file full of legacy-AMP code, for timing the per-file stages.

The file is this repository's rule fixtures (real legacy-AMP training loops: apex.amp,
torch.cuda.amp, GradScaler protocols, precision policies) one after another until it has the
lines asked for, each copy's top-level functions and classes renamed so that every definition
is its own. Every stage of `check` (parse, name pass, rules, positions) must stay linear in the
size of such a file: `python bench/bench.py --big-file 6500` times `check` on it against
LibCST's parse of it.

    python bench/big_amp_file.py 6500 /tmp/big_amp.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parent.parent
_TOP_LEVEL = re.compile(r"^(def|class|async def) (\w+)", re.MULTILINE)


def fixture_sources() -> List[str]:
    fixtures = sorted(REPO.glob("tests/fixtures/AMP*/*.py"))
    return [p.read_text(encoding="utf-8") for p in fixtures if not p.name.endswith(".expected.py")]


def big_file(lines: int) -> str:
    sources = fixture_sources()
    parts: List[str] = []
    count = copy = 0
    while count < lines:
        source = sources[copy % len(sources)]
        suffix = f"_{copy}"
        names = {m.group(2) for m in _TOP_LEVEL.finditer(source)}
        if names:
            source = re.sub(r"\b(%s)\b" % "|".join(map(re.escape, sorted(names))), lambda m: m.group(1) + suffix, source)
        part = source.rstrip("\n") + "\n\n\n"
        parts.append(part)
        count += part.count("\n")
        copy += 1
    return "".join(parts)


def main(argv: List[str]) -> int:
    lines = int(argv[1]) if len(argv) > 1 else 6500
    out = argv[2] if len(argv) > 2 else "big_amp.py"
    Path(out).write_text(big_file(lines), encoding="utf-8")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
