"""How much real apex.amp code `ampmigrate fix` migrates: per-site rates on a hand-annotated corpus.

Issue 12 asks that a safe `fix` migrate >= 85% of the `apex.amp` sites of public repositories it has
never seen, that every output compiles, that a second `fix` changes nothing and that every site left
alone carries a reason. This script takes that measure. The code is not stored here: each annotation
file (annotations/<CORPUS>/*.toml, format in annotations/README.md) names a public repository, a commit
and the lines of every apex.amp use, counted by hand before the tool ran on it.

For each repository and each mode (safe, unsafe, unsafe16) it copies the commit's `.py` files out of
the git mirror, runs `ampmigrate fix` on a copy, then:

- compiles every file the fix changed, and runs `fix` a second time (it must change nothing);
- runs `check` on the result and maps each site's original line to its lines after the fix (difflib);
- a site is *migrated* when the fix changed its line and no AMP1 finding is left on what became of it;
  a site whose line the fix left alone, or that still has an AMP1 finding, is *left*, with the
  finding's reason (`no_fix_reason`).

Reasons are written to the JSON report and printed only with `--reasons`, so that a held-out corpus can
be measured without its refusals being read.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
MODES = {
    "safe": [],
    "unsafe": ["--unsafe-fixes"],
    "unsafe16": ["--unsafe-fixes", "--target-dtype", "float16"],
}


def _recall_score():
    # The mirror lookup and the copy at a commit are the recall benchmark's; one implementation.
    spec = importlib.util.spec_from_file_location("recall_score", HERE.parent / "recall" / "score.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


@dataclass
class Site:
    path: str
    line: int
    api: str
    why: str


@dataclass
class RepoAnnotation:
    repo: str
    commit: str
    scope: Optional[List[str]]
    sites: List[Site]


@dataclass
class RepoResult:
    repo: str
    sites: int
    migrated: int = 0
    left: List[dict] = field(default_factory=list)
    changed_files: int = 0
    compile_failures: List[str] = field(default_factory=list)
    not_idempotent: List[str] = field(default_factory=list)
    internal_errors: List[str] = field(default_factory=list)
    exit_code: int = 0


def load(directory: Path) -> List[RepoAnnotation]:
    out = []
    for path in sorted(directory.glob("*.toml")):
        raw = tomllib.loads(path.read_text())
        scope = raw.get("scope")
        sites = [Site(s["path"], int(s["line"]), s.get("api", ""), s.get("why", "")) for s in raw.get("sites", [])]
        out.append(RepoAnnotation(raw["repo"], raw["commit"], [scope] if isinstance(scope, str) else scope, sites))
    return out


def run_fix(python: str, src: Path, root: Path, config: Path, extra: List[str], jobs: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(src))
    command = [python, "-m", "ampmigrate", "fix", "--no-cache", "--exit-zero", "--config", str(config),
               "-j", str(jobs), *extra, str(root)]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)


def run_check(python: str, src: Path, root: Path, config: Path, extra: List[str], jobs: int) -> list:
    env = dict(os.environ, PYTHONPATH=str(src))
    command = [python, "-m", "ampmigrate", "check", "--no-cache", "--exit-zero", "--output-format", "json",
               "--config", str(config), "-j", str(jobs), *extra, str(root)]
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    try:
        return json.loads(proc.stdout or "[]")
    except json.JSONDecodeError as error:
        raise SystemExit(f"ampmigrate check printed no JSON for {root}: {error}\n{proc.stderr[-2000:]}")


def snapshot(root: Path) -> Dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*.py") if p.is_file()}


def line_map(before: List[str], after: List[str]) -> Dict[int, Tuple[bool, range]]:
    """Original 1-based line -> (changed by the fix, the 1-based lines it became)."""
    mapping: Dict[int, Tuple[bool, range]] = {}
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        for i in range(i1, i2):
            if tag == "equal":
                mapping[i + 1] = (False, range(j1 + (i - i1) + 1, j1 + (i - i1) + 2))
            else:
                mapping[i + 1] = (True, range(j1 + 1, j2 + 1))
    return mapping


def measure_repo(annotation: RepoAnnotation, original: Path, work: Path, args, extra: List[str]) -> RepoResult:
    result = RepoResult(annotation.repo, len(annotation.sites))
    if work.exists():
        shutil.rmtree(work)
    # a link into a part of the repository outside `scope` (determined's test fixtures) is left out
    shutil.copytree(original, work, ignore_dangling_symlinks=True)
    before = snapshot(work)
    fixed = run_fix(args.python, args.src, work, args.config, extra, args.jobs)
    result.exit_code = fixed.returncode
    result.internal_errors = [line for line in fixed.stderr.splitlines() + fixed.stdout.splitlines()
                              if "internal error" in line]
    after = snapshot(work)
    changed = [name for name, data in after.items() if before.get(name) != data]
    result.changed_files = len(changed)
    for name in changed:
        try:
            compile((work / name).read_bytes(), name, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as error:
            result.compile_failures.append(f"{name}: {error}")
    run_fix(args.python, args.src, work, args.config, extra, args.jobs)
    result.not_idempotent = sorted(name for name, data in snapshot(work).items() if after.get(name) != data)
    findings: Dict[str, Dict[int, List[dict]]] = {}
    # Plain `check` (its --unsafe-fixes would fix): which apex findings are left, with their reasons.
    for finding in run_check(args.python, args.src, work, args.config, [], args.jobs):
        if finding["code"].startswith("AMP1"):
            name = str(Path(finding["filename"]).resolve().relative_to(work.resolve()))
            findings.setdefault(name, {}).setdefault(finding["location"]["row"], []).append(finding)
    maps: Dict[str, Dict[int, Tuple[bool, range]]] = {}
    for site in annotation.sites:
        if site.path not in before:
            result.left.append({"path": site.path, "line": site.line, "api": site.api, "reason": "file not in the copy"})
            continue
        if site.path not in maps:
            old = before[site.path].decode("utf-8", "replace").splitlines()
            new = after.get(site.path, b"").decode("utf-8", "replace").splitlines()
            maps[site.path] = line_map(old, new)
        changed_line, new_lines = maps[site.path].get(site.line, (False, range(0)))
        remaining = [f for n in new_lines for f in findings.get(site.path, {}).get(n, [])]
        if changed_line and not remaining:
            result.migrated += 1
            continue
        if remaining:
            reason = remaining[0].get("no_fix_reason") or remaining[0]["message"]
        else:
            reason = "line unchanged and no AMP1 finding on it (not found, or found elsewhere)"
        result.left.append({"path": site.path, "line": site.line, "api": site.api, "reason": reason})
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", help="annotations/<CORPUS> folder name, or a path to a folder of .toml files")
    parser.add_argument("--mode", action="append", choices=sorted(MODES), help="safe (default), unsafe, unsafe16")
    parser.add_argument("--src", type=Path, default=HERE.parent.parent, help="ampmigrate source tree (default: this checkout)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--mirrors", type=Path, default=Path(os.environ.get("RECALL_MIRRORS", "/work/.mirror")))
    parser.add_argument("--scratch", type=Path, default=Path(os.environ.get("APEX_SCRATCH", "/work/corpus/apex")),
                        help="where the copies go (outside the repository)")
    parser.add_argument("--only", action="append", default=[], help="only this repository (OWNER/NAME)")
    parser.add_argument("-j", "--jobs", type=int, default=1)
    parser.add_argument("--reasons", action="store_true", help="print every site left and its reason")
    parser.add_argument("--json", type=Path, help="write per-repository results, reasons included, here")
    args = parser.parse_args(argv)
    folder = Path(args.corpus) if Path(args.corpus).is_dir() else HERE / "annotations" / args.corpus
    name = folder.name
    recall = _recall_score()
    annotations = [a for a in load(folder) if not args.only or a.repo in args.only]
    scratch = args.scratch / name
    scratch.mkdir(parents=True, exist_ok=True)
    args.config = scratch / "empty-config.toml"  # default settings everywhere
    args.config.write_text("")
    args.src = args.src.resolve()
    report: Dict[str, List[dict]] = {}
    for mode in args.mode or ["safe"]:
        results: List[RepoResult] = []
        for annotation in annotations:
            gitdir = recall.git_dir(args.mirrors, annotation.repo)
            if gitdir is None:
                print(f"missing mirror: fetch github:{annotation.repo}", file=sys.stderr)
                continue
            original = scratch / annotation.repo.replace("/", "+") / "orig"
            recall.materialize(gitdir, annotation.commit, annotation.scope, original)
            work = scratch / annotation.repo.replace("/", "+") / mode
            results.append(measure_repo(annotation, original, work, args, MODES[mode]))
        print_table(name, mode, results, args.reasons)
        report[mode] = [vars(r) for r in results]
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


def print_table(corpus: str, mode: str, results: List[RepoResult], reasons: bool) -> None:
    print(f"\n## corpus {corpus}, {mode} fix")
    print(f"{'repository':48} {'sites':>5} {'migr':>5} {'files':>5} {'nocomp':>6} {'2nd':>4} {'ierr':>4} {'exit':>4}")
    for r in results:
        print(f"{r.repo:48} {r.sites:5} {r.migrated:5} {r.changed_files:5} {len(r.compile_failures):6} "
              f"{len(r.not_idempotent):4} {len(r.internal_errors):4} {r.exit_code:4}")
    sites = sum(r.sites for r in results)
    migrated = sum(r.migrated for r in results)
    rate = f"{100 * migrated / sites:.0f}%" if sites else "-"
    print(f"{'TOTAL':48} {sites:5} {migrated:5}  ({rate}); compile failures "
          f"{sum(len(r.compile_failures) for r in results)}, not idempotent {sum(len(r.not_idempotent) for r in results)}, "
          f"internal errors {sum(len(r.internal_errors) for r in results)}")
    for r in results:
        for problem in r.compile_failures + [f"second fix changed {n}" for n in r.not_idempotent] + r.internal_errors:
            print(f"  {r.repo}: {problem}")
        if reasons:
            for site in r.left:
                print(f"  {r.repo} {site['path']}:{site['line']} {site['api']}: {site['reason']}")


if __name__ == "__main__":
    sys.exit(main())
