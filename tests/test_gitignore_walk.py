"""Discovery's .gitignore handling agrees with git itself on a tree full of directory-only
patterns, negations and nested .gitignore files (the walk skips re-matching a file's parents
against directory-only patterns, since it never enters an ignored directory)."""

import os
import shutil
import subprocess

import pytest

from ampmigrate.config import Settings
from ampmigrate.discovery import discover

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

TREE = {
    ".gitignore": "build/\n*.gen.py\n!keep.gen.py\n/top_only/\ndocs/**/tmp/\nlogs\n",
    "pkg/.gitignore": "local/\n!important.py\ncache\n",
    "a.py": "", "keep.gen.py": "", "x.gen.py": "",
    "build/b.py": "", "src/build/c.py": "", "src/build": None,
    "top_only/d.py": "", "src/top_only/e.py": "",
    "docs/x/tmp/f.py": "", "docs/x/g.py": "", "docs/tmp/h.py": "",
    "logs/i.py": "", "src/logs.py": "",
    "pkg/local/j.py": "", "pkg/k.py": "", "pkg/sub/local/l.py": "", "pkg/cache/m.py": "", "pkg/sub/cache": None,
    "build.py": "", "src/buildx/n.py": "",
}


def _make(root):
    for path, text in TREE.items():
        full = os.path.join(root, path)
        if text is None:
            continue
        os.makedirs(os.path.dirname(full) or root, exist_ok=True)
        with open(full, "w") as handle:
            handle.write(text)


def test_discovery_matches_git_ls_files(tmp_path):
    _make(str(tmp_path))
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    listed = subprocess.run(
        ["git", "ls-files", "--others", "--exclude-standard"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split()
    expected = sorted(p for p in listed if p.endswith(".py"))
    found = discover([str(tmp_path)], Settings()).files
    got = sorted(os.path.relpath(f, tmp_path).replace(os.sep, "/") for f in found)
    assert got == expected
    assert "src/build/c.py" not in got and "pkg/sub/local/l.py" not in got  # directory-only, nested
    assert "src/buildx/n.py" in got and "build.py" in got  # near misses stay
