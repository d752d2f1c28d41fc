"""engine/workers.py: a worker sends one message per file ("done" also starts the next file's
budget). A worker that dies, or is stopped over budget, in the middle of a batch must cost only
that file: the files before it are reported, those after it analysed by another worker. Run in a
subprocess with a timeout, as tests/test_reliability.py does, with the screening step (round one,
every file) or the analysis (LibCST) patched to crash or spin for the files so named."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_reliability import LEGACY, MISBEHAVE, TIMEOUT, _env, _errors

_PATCH = MISBEHAVE + textwrap.dedent(
    """
    original = getattr(pipeline.Engine, sys.argv.pop(1))
    def patched(self, text, path, *args, _original=original, **kwargs):
        misbehave(path)
        return _original(self, text, path, *args, **kwargs)
    setattr(pipeline.Engine, original.__name__, patched)

    from ampmigrate.cli import main
    sys.argv[0] = "ampmigrate"
    main()
    """
)


def _tree(root: Path, before: int) -> int:
    """`before` legacy files, crash.py, 20 more, spin.py, 20 more (in discovery's order)."""
    names = [f"a{i:03d}.py" for i in range(before)] + ["crash.py"]
    names += [f"e{i:03d}.py" for i in range(20)] + ["spin.py"] + [f"t{i:03d}.py" for i in range(20)]
    for name in names:
        (root / name).write_text(LEGACY, encoding="utf-8")
    (root / "pyproject.toml").write_text("[tool.ampmigrate]\nfile-time-limit = 1\n", encoding="utf-8")
    return len(names) - 2


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("method, before", [("rules_for", 37), ("check_text", 7)])
def test_a_worker_lost_in_the_middle_of_a_batch_costs_only_its_file(tmp_path, jobs, method, before):
    """`rules_for` runs for every file in the first round (82 files: the index is built beside
    it); `check_text` with fewer files than the index builder's minimum, small ones analysed in
    the first round's batches."""
    good = _tree(tmp_path, before)
    result = subprocess.run(
        [sys.executable, "-c", _PATCH, method, "check", "--output-format", "concise", "-j", jobs, "."],
        cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT, env=_env(),
    )
    assert result.returncode == 2, result.stderr
    assert _errors(result.stderr) == [
        "error: crash.py: internal error: the process analysing this file died (killed by SIGSEGV); file skipped",
        "error: spin.py: skipped: analysing it took more than 1 s (file-time-limit)",
    ]
    assert result.stdout.count("AMP201") == good
