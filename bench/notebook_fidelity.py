"""Notebook fidelity over real notebooks: are they read, and do fixes keep every other byte?

    python bench/notebook_fidelity.py DIR [DIR ...]

For every `*.ipynb` under the directories (copied to a temporary folder first; nothing under
DIR is written):
  1. read: valid nbformat 4 JSON, and its code cells joined (magics as placeholders) parse;
  2. untouched: `ampmigrate fix` on the copy leaves the notebook byte-identical;
  3. planted: legacy code (`scaler = torch.cuda.amp.GradScaler()`) appended to the last code cell
     (its layout kept by the notebook's own serialiser); after `fix`, the file must equal the planted
     file with only that line changed, every other byte (outputs, metadata, ids, layout) kept.
Prints counts; a notebook whose JSON layout cannot be reproduced is counted, not failed
(`fix` refuses to write it, with an error).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import libcst as cst

from ampmigrate.notebook import Notebook, NotebookError

PLANT = "import torch\nscaler = torch.cuda.amp.GradScaler()"


def fix(folder: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "ampmigrate", "fix", "--no-cache", "--select", "AMP202", "."]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env)


def main(roots) -> None:
    files = sorted(p for root in roots for p in Path(root).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    counts = dict(total=len(files), invalid=0, parse_failures=0, layout_unreproducible=0)
    with tempfile.TemporaryDirectory() as tmp:
        untouched, planted = Path(tmp, "untouched"), Path(tmp, "planted")
        untouched.mkdir(), planted.mkdir()
        hashes, expected = {}, {}
        for number, path in enumerate(files):
            raw = path.read_bytes()
            name = f"nb{number:04d}.ipynb"
            (untouched / name).write_bytes(raw)
            hashes[name] = hashlib.sha256(raw).hexdigest()
            try:
                nb = Notebook(raw.decode("utf-8"))
            except (NotebookError, UnicodeDecodeError):
                counts["invalid"] += 1
                continue
            try:
                cst.parse_module(nb.python_text)
            except Exception:
                counts["parse_failures"] += 1
                continue
            if not nb.cells:
                continue
            try:
                dump = nb._serializer()
            except NotebookError:
                counts["layout_unreproducible"] += 1
                continue
            data = json.loads(nb.text)
            last = data["cells"][nb.cells[-1].index - 1]
            as_list = isinstance(last["source"], list)
            source = "".join(last["source"]) if as_list else last["source"]
            planted_source = source + ("\n" if source and not source.endswith("\n") else "") + PLANT
            last["source"] = planted_source.splitlines(keepends=True) if as_list else planted_source
            planted_text = dump(data)
            if "torch.cuda.amp.GradScaler()" not in Notebook(planted_text).python_text:
                counts["planted_in_skipped_cell"] = counts.get("planted_in_skipped_cell", 0) + 1
                continue  # the last cell is not Python (a cell magic, broken code): skipped by design
            (planted / name).write_text(planted_text, encoding="utf-8")
            quote = "'" if nb.python_text.count("'") + planted_source.count("'") > nb.python_text.count('"') + planted_source.count('"') else '"'
            fixed_call = json.dumps(f"torch.amp.GradScaler({quote}cuda{quote})", ensure_ascii=False)[1:-1]
            expected[name] = planted_text.replace("torch.cuda.amp.GradScaler()", fixed_call, 1)
        run = fix(untouched)
        changed = [n for n, h in hashes.items() if hashlib.sha256((untouched / n).read_bytes()).hexdigest() != h]
        counts["untouched_changed_by_fix"] = len(changed)
        run = fix(planted)
        counts["planted"] = len(expected)
        wrong = [n for n, text in expected.items() if (planted / n).read_text(encoding="utf-8") != text]
        counts["planted_not_exact"] = len(wrong)
        for name in wrong[:3]:
            got = (planted / name).read_text(encoding="utf-8").splitlines()
            print("not exact:", name, *list(difflib.unified_diff(expected[name].splitlines(), got, lineterm="", n=0))[2:8], sep="\n  ", file=sys.stderr)
        errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        counts["fix_errors"] = len(errors)
        for line in errors[:5]:
            print(line, file=sys.stderr)
    print(json.dumps(counts, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:] or ["."])
