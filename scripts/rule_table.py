"""The README's rule table, from the catalogue. `--write` updates README.md in place.

tests/test_readme.py keeps the two in sync.
"""

import re
import sys
from pathlib import Path

from ampmigrate.catalogue import load_catalogue

README = Path(__file__).resolve().parent.parent / "README.md"


def rule_table() -> str:
    lines = ["| code | name | fix | severity | what |", "| --- | --- | --- | --- | --- |"]
    for code, doc in sorted(load_catalogue().items()):
        summary = doc.summary.replace("|", "\\|")
        lines.append(f"| {code} | `{doc.name}` | {doc.fix} | {doc.severity} | {summary} |")
    return "\n".join(lines) + "\n"


def write_readme() -> None:
    text = README.read_text(encoding="utf-8")
    table = re.compile(r"\| code \| name \| fix \| severity \| what \|\n(?:\|.*\|\n)+")
    README.write_text(table.sub(lambda _: rule_table(), text, count=1), encoding="utf-8")


if __name__ == "__main__":
    if "--write" in sys.argv:
        write_readme()
    else:
        print(rule_table(), end="")
