"""Recall and precision of `ampmigrate check` on a hand-annotated corpus of public training code.

The corpus is not stored here: each annotation file (annotations/*.toml) names a public repository,
a commit and a path, and lists the lines that must be reported (with their family) and the lines that
must not be. This script copies the `.py` files of each annotated repository at that commit out of its
git mirror into a scratch directory outside the repository (the whole tree, or the `scope` subtrees an
annotation names, so that cross-file analysis sees `main.py` next to `engine.py`), runs
`python -m ampmigrate check` on each repository with every rule selected and default settings, and
scores the findings of the annotated files:

- a must_find entry is hit when a finding of its family is on its line (or on one of its `alt` lines);
- a finding on a must_not line (of the entry's family, or of any family when it names none) is a false
  positive; a finding on a `may` line is neither counted nor listed;
- any other finding in an annotated file is an "unannotated finding": listed for review, counted as a
  false positive only once reviewed.toml marks it `verdict = "fp"` (`"ok"` accepts it).

Run `python bench/recall/score.py --help` for the options; README.md beside this file explains more.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

HERE = Path(__file__).resolve().parent
FAMILIES = ("AMP1", "AMP2", "AMP3", "AMP4")
STAMP = ".recall-stamp"


@dataclass
class Expected:
    lines: Tuple[int, ...]
    family: Optional[str]
    why: str


@dataclass
class Annotation:
    source: Path
    repo: str
    commit: str
    path: str
    scope: Optional[str]
    must_find: List[Expected]
    must_not: List[Expected]
    may: List[Expected]

    @property
    def key(self) -> Tuple[str, str]:
        return self.repo, self.path


@dataclass
class Finding:
    line: int
    code: str
    message: str

    @property
    def family(self) -> str:
        return self.code[:4]


@dataclass
class FileResult:
    annotation: Annotation
    hits: List[Expected] = field(default_factory=list)
    misses: List[Expected] = field(default_factory=list)
    false_positives: List[Tuple[Finding, str]] = field(default_factory=list)
    unannotated: List[Finding] = field(default_factory=list)
    accepted: List[Finding] = field(default_factory=list)


def _entries(raw: Iterable[dict], where: Path, need_family: bool) -> List[Expected]:
    out = []
    for item in raw:
        family = item.get("family")
        if family is not None and family not in FAMILIES:
            raise SystemExit(f"{where}: unknown family {family!r}")
        if need_family and family is None:
            raise SystemExit(f"{where}: must_find entry at line {item.get('line')} has no family")
        lines = (int(item["line"]),) + tuple(int(x) for x in item.get("alt", ()))
        out.append(Expected(lines, family, item.get("why", "")))
    return out


def load_annotations(directory: Path) -> List[Annotation]:
    annotations = []
    for source in sorted(directory.glob("*.toml")):
        data = tomllib.loads(source.read_text(encoding="utf-8"))
        annotations.append(
            Annotation(
                source=source,
                repo=data["repo"],
                commit=data["commit"],
                path=data["path"],
                scope=data.get("scope"),
                must_find=_entries(data.get("must_find", ()), source, need_family=True),
                must_not=_entries(data.get("must_not", ()), source, need_family=False),
                may=_entries(data.get("may", ()), source, need_family=False),
            )
        )
    return annotations


def load_reviewed(path: Path) -> Dict[Tuple[str, str, int, str], dict]:
    """reviewed.toml: [[finding]] tables with repo, path, line, code, verdict ("fp" or "ok"), note."""
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    out = {}
    for item in data.get("finding", ()):
        verdict = item.get("verdict")
        if verdict not in ("fp", "ok"):
            raise SystemExit(f"{path}: verdict must be 'fp' or 'ok', got {verdict!r}")
        out[(item["repo"], item["path"], int(item["line"]), item["code"])] = item
    return out


def git_dir(mirrors: Path, repo: str) -> Optional[Path]:
    base = mirrors / repo.replace("/", "+") / "repo"
    for candidate in (base / ".git", base):
        if (candidate / "HEAD").exists():
            return candidate
    return None


def materialize(gitdir: Path, commit: str, scopes: Optional[List[str]], target: Path) -> None:
    """Copy the commit's .py files (under `scopes`, or all) into `target`, unless already there."""
    stamp = f"{commit} {sorted(scopes) if scopes else 'ALL'}"
    if (target / STAMP).exists() and (target / STAMP).read_text() == stamp:
        return
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    # A scope entry is a folder (its .py files, at any depth) or one .py file.
    pathspecs = (
        [f":(glob){s}" if s.endswith(".py") else f":(glob){s.rstrip('/')}/**/*.py" for s in scopes]
        if scopes
        else [":(glob)**/*.py"]
    )
    archive = subprocess.run(
        ["git", "--git-dir", str(gitdir), "archive", "--format=tar", commit, "--", *pathspecs],
        check=True,
        capture_output=True,
    ).stdout
    tar_path = target / ".recall.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(target, filter="data")
    tar_path.unlink()
    (target / STAMP).write_text(stamp)


def run_check(python: str, src: Path, root: Path, config: Path, jobs: int, extra: List[str]) -> Tuple[list, str]:
    env = dict(os.environ, PYTHONPATH=str(src))
    command = [
        python, "-m", "ampmigrate", "check", "--select", "AMP", "--no-cache", "--exit-zero",
        "--output-format", "json", "--config", str(config), "-j", str(jobs), *extra, str(root),
    ]
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 2):
        raise SystemExit(f"ampmigrate failed on {root} (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    try:
        return json.loads(proc.stdout or "[]"), proc.stderr
    except json.JSONDecodeError as error:
        raise SystemExit(f"ampmigrate printed no JSON for {root}: {error}\n{proc.stdout[:2000]}{proc.stderr[-2000:]}")


def _matches(entry: Expected, finding: Finding) -> bool:
    return finding.line in entry.lines and (entry.family is None or entry.family == finding.family)


def score_file(annotation: Annotation, findings: List[Finding], reviewed: dict) -> FileResult:
    result = FileResult(annotation)
    for entry in annotation.must_find:
        (result.hits if any(_matches(entry, f) for f in findings) else result.misses).append(entry)
    seen: Set[Tuple[int, str]] = set()
    for finding in sorted(findings, key=lambda f: (f.line, f.code)):
        if (finding.line, finding.family) in seen:  # one verdict per line and family
            continue
        seen.add((finding.line, finding.family))
        if any(_matches(e, finding) for e in annotation.must_find):
            continue
        bad = next((e for e in annotation.must_not if _matches(e, finding)), None)
        if bad is not None:
            result.false_positives.append((finding, f"must_not: {bad.why}"))
        elif any(_matches(e, finding) for e in annotation.may):
            continue
        else:
            verdict = reviewed.get((annotation.repo, annotation.path, finding.line, finding.code))
            if verdict is None:
                result.unannotated.append(finding)
            elif verdict["verdict"] == "fp":
                result.false_positives.append((finding, f"reviewed: {verdict.get('note', '')}"))
            else:
                result.accepted.append(finding)
    return result


def summarize(results: List[FileResult]) -> dict:
    table = {}
    for family in FAMILIES + ("ALL",):
        def mine(family_of: Optional[str]) -> bool:
            return family == "ALL" or family_of == family
        must = sum(1 for r in results for e in r.annotation.must_find if mine(e.family))
        hit = sum(1 for r in results for e in r.hits if mine(e.family))
        must_not = sum(
            1 for r in results for e in r.annotation.must_not
            if family == "ALL" or e.family in (None, family)
        )
        fp = sum(1 for r in results for f, _ in r.false_positives if mine(f.family))
        open_ = sum(1 for r in results for f in r.unannotated if mine(f.family))
        table[family] = {
            "must_find": must,
            "hit": hit,
            "recall": hit / must if must else None,
            "must_not": must_not,
            "false_positives": fp,
            "precision": hit / (hit + fp) if hit + fp else None,
            "unreviewed": open_,
            "precision_if_unreviewed_fp": hit / (hit + fp + open_) if hit + fp + open_ else None,
        }
    return table


def _fmt(value: Optional[float]) -> str:
    return "  -  " if value is None else f"{value:.3f}"


def print_table(title: str, results: List[FileResult], table: dict) -> None:
    repos = sorted({r.annotation.repo for r in results})
    print(f"{title}: {len(results)} annotated files from {len(repos)} repositories")
    print()
    print("family  must_find  hit  recall   must_not  FP  precision  unreviewed  precision(if unreviewed FP)")
    for family, row in table.items():
        print(
            f"{family:<6}  {row['must_find']:>9}  {row['hit']:>3}  {_fmt(row['recall'])}  "
            f"{row['must_not']:>8}  {row['false_positives']:>2}  {_fmt(row['precision']):>9}  "
            f"{row['unreviewed']:>10}  {_fmt(row['precision_if_unreviewed_fp'])}"
        )
    print()


def report(results: List[FileResult], table: dict, skipped: List[str], errors: List[str],
           held_out: Optional[Tuple[List[str], List[FileResult], dict]] = None) -> None:
    print_table("corpus", results, table)
    if held_out is not None:
        left_out, held_results, held_table = held_out
        print_table(f"held out (without {', '.join(left_out)})", held_results, held_table)
    print("== misses")
    for r in results:
        for e in r.misses:
            alt = f" (or {', '.join(map(str, e.lines[1:]))})" if len(e.lines) > 1 else ""
            print(f"{e.family} {r.annotation.repo}:{r.annotation.path}:{e.lines[0]}{alt}  {e.why}")
    print()
    print("== false positives")
    for r in results:
        for f, why in r.false_positives:
            print(f"{f.code} {r.annotation.repo}:{r.annotation.path}:{f.line}  {why} | {f.message[:120]}")
    print()
    print("== unannotated findings (review them; mark in reviewed.toml)")
    for r in results:
        for f in r.unannotated:
            print(f"{f.code} {r.annotation.repo}:{r.annotation.path}:{f.line}  {f.message[:140]}")
    if skipped:
        print()
        print("== not scored: mirrors missing (bring each with the fetch tool, e.g. fetch github:OWNER/NAME)")
        for line in skipped:
            print(line)
    if errors:
        print()
        print("== file errors reported by ampmigrate")
        for line in errors:
            print(line)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=HERE.parent.parent,
                        help="ampmigrate source tree put on PYTHONPATH (default: this checkout)")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs ampmigrate")
    parser.add_argument("--mirrors", type=Path, default=Path(os.environ.get("RECALL_MIRRORS", "/work/.mirror")),
                        help="directory of git mirrors, OWNER+NAME/repo (default: /work/.mirror)")
    parser.add_argument("--corpus", type=Path, default=Path(os.environ.get("RECALL_CORPUS", "/work/corpus/recall")),
                        help="scratch directory the files are copied into (outside the repository)")
    parser.add_argument("--annotations", type=Path, default=HERE / "annotations")
    parser.add_argument("--reviewed", type=Path, default=HERE / "reviewed.toml")
    parser.add_argument("--only", action="append", default=[], help="score only this repository (OWNER/NAME)")
    parser.add_argument("--exclude", action="append", default=[],
                        help="leave this repository out (OWNER/NAME), e.g. one a rule author developed against")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="ampmigrate worker processes per run")
    parser.add_argument("--also-without", action="append", default=[], metavar="OWNER/NAME",
                        help="print a second table without these repositories (e.g. those rule authors tuned on)")
    parser.add_argument("--json", type=Path, help="also write the table and every miss/FP here")
    parser.add_argument("--check-arg", action="append", default=[],
                        help="extra argument passed to `ampmigrate check` (repeatable)")
    args = parser.parse_args(argv)

    annotations = [
        a for a in load_annotations(args.annotations)
        if (not args.only or a.repo in args.only) and a.repo not in args.exclude
    ]
    reviewed = load_reviewed(args.reviewed)
    args.corpus.mkdir(parents=True, exist_ok=True)
    config = args.corpus / "recall-config.toml"  # an empty configuration: default settings everywhere
    config.write_text("")

    by_repo: Dict[str, List[Annotation]] = defaultdict(list)
    for a in annotations:
        by_repo[a.repo].append(a)

    results: List[FileResult] = []
    skipped: List[str] = []
    errors: List[str] = []
    for repo, items in sorted(by_repo.items()):
        commits = {a.commit for a in items}
        if len(commits) != 1:
            raise SystemExit(f"{repo}: annotations name several commits {sorted(commits)}")
        commit = commits.pop()
        gitdir = git_dir(args.mirrors, repo)
        if gitdir is None:
            skipped.append(f"github:{repo} (commit {commit}; {len(items)} annotated files)")
            continue
        if subprocess.run(["git", "--git-dir", str(gitdir), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True).returncode != 0:
            skipped.append(f"github:{repo}: mirror {gitdir} lacks commit {commit}")
            continue
        scopes = None if any(a.scope is None for a in items) else sorted({a.scope for a in items})
        root = args.corpus / repo.replace("/", "+")
        materialize(gitdir, commit, scopes, root)
        for a in items:
            if not (root / a.path).exists():
                raise SystemExit(f"{a.source}: {a.path} is not in {repo}@{commit}")
        raw, stderr = run_check(args.python, args.src, root, config, args.jobs, args.check_arg)
        errors.extend(line for line in stderr.splitlines() if line.strip() and "error" in line.lower())
        per_file: Dict[str, List[Finding]] = defaultdict(list)
        for item in raw:
            name = Path(item["filename"])
            rel = (name if name.is_absolute() else root / name).resolve().relative_to(root.resolve()).as_posix()
            per_file[rel].append(Finding(item["location"]["row"], item["code"], item.get("message", "")))
        for a in items:
            results.append(score_file(a, per_file.get(a.path, []), reviewed))

    table = summarize(results)
    held_out = None
    if args.also_without:
        held_results = [r for r in results if r.annotation.repo not in args.also_without]
        held_out = (args.also_without, held_results, summarize(held_results))
    report(results, table, skipped, errors, held_out)
    if args.json:
        payload = {
            "table": table,
            "held_out_table": held_out[2] if held_out else None,
            "files": len(results),
            "repositories": sorted({r.annotation.repo for r in results}),
            "misses": [
                {"repo": r.annotation.repo, "path": r.annotation.path, "line": e.lines[0], "family": e.family,
                 "why": e.why}
                for r in results for e in r.misses
            ],
            "false_positives": [
                {"repo": r.annotation.repo, "path": r.annotation.path, "line": f.line, "code": f.code, "why": why}
                for r in results for f, why in r.false_positives
            ],
            "unannotated": [
                {"repo": r.annotation.repo, "path": r.annotation.path, "line": f.line, "code": f.code,
                 "message": f.message}
                for r in results for f in r.unannotated
            ],
            "skipped": skipped,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 1 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
