"""A `check` whose files are all cached imports neither LibCST nor the rules (issue 14: warm
`check` <= 0.04 x the parse floor; interpreter start-up with LibCST imported was half of it).
A run with a file to analyse imports the engine once, in the parent, before the workers fork."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from ampmigrate.cli import main
sys.argv = ["ampmigrate", "check", ".", "--cache-dir", "cache", "--output-format", "concise"]
try:
    main()
except SystemExit as exit:
    code = exit.code
print("libcst" in sys.modules, "ampmigrate.rules.apex.amp101_apex_amp" in sys.modules, code, file=sys.stderr)
"""

LEGACY = "import torch\nwith torch.cuda.amp.autocast():\n    pass\n"


def _run(cwd: Path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    env.pop("AMPMIGRATE_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=cwd, capture_output=True, text=True, env=env, timeout=120)
    return done.stdout, done.stderr.strip().splitlines()[-1]


def test_a_warm_check_imports_no_libcst(tmp_path):
    (tmp_path / "train.py").write_text(LEGACY)
    (tmp_path / "other.py").write_text("x = 1\n")
    cold_out, cold = _run(tmp_path)
    warm_out, warm = _run(tmp_path)
    assert cold == "True True 1"  # analysed: the engine was imported
    assert warm == "False False 1"  # every file from the cache
    assert "AMP201" in cold_out and warm_out == cold_out
