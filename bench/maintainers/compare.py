"""Compare `ampmigrate fix` with what maintainers did by hand (issue 18).

For every pair in pairs.toml (a commit in which maintainers migrated mixed precision: repository,
the commit before, the commit after, the files), this script takes each file as it was before,
runs the fix engine on it, and compares the result with the maintainers' after on the
mixed-precision API only: an `ast` extraction of imports of torch.amp / torch.cuda.amp / apex,
autocast and GradScaler constructions (callee resolved through the file's imports, device,
keywords), custom_fwd/custom_bwd, the scaler protocol calls (scale/unscale_/step/update) and
apex amp calls. Pairs whose extractions differ are judged by hand in pairs.toml (`verdict`,
`why`): agree / better / partial / miss / wrong.

By default each before is fixed as `ampmigrate fix` does (safe fixes only); `--unsafe-fixes` runs
`fix --unsafe-fixes --target-dtype float16` instead (the maintainers kept float16), judged by a
pair's `unsafe_verdict`/`unsafe_why` where the result differs from the safe one.

Repositories are read from the fetch mirror (/work/.mirror/<owner>+<name>/repo, a bare git
directory); nothing fetched is ever committed here. A missing one is named with what to fetch.

    python bench/maintainers/compare.py [--show REPO] [--diff]
"""

from __future__ import annotations

import argparse
import ast
import collections
import os
import re
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

try:
    import tomllib
except ImportError:  # pragma: no cover - Python < 3.11
    import tomli as tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from ampmigrate.config import Settings  # noqa: E402
from ampmigrate.engine.pipeline import Engine  # noqa: E402

MIRROR = os.environ.get("AMPMIGRATE_MIRROR", "/work/.mirror")
_LEGACY_PARAMS = {
    "autocast": ("enabled", "dtype", "cache_enabled"),
    "GradScaler": ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"),
}
_SCALER_METHODS = {"scale", "unscale_", "step", "update"}
_APEX_AMP = {"initialize", "scale_loss", "master_params", "state_dict", "load_state_dict"}


def git_dir(repo: str) -> Optional[str]:
    path = os.path.join(MIRROR, repo.replace("/", "+"), "repo")
    return path if os.path.isdir(path) else None


def show(gdir: str, commit: str, path: str) -> Optional[str]:
    proc = subprocess.run(["git", "--git-dir", gdir, "show", f"{commit}:{path}"], capture_output=True)
    if proc.returncode != 0:
        return None
    return proc.stdout.decode("utf-8", "replace")


# ---------------------------------------------------------------------------------- extraction
class _Extractor(ast.NodeVisitor):
    """The mixed-precision API a module uses, as a multiset of normalized strings."""

    def __init__(self) -> None:
        self.aliases: Dict[str, str] = {}
        self.items: collections.Counter = collections.Counter()
        self.parent: Dict[ast.AST, ast.AST] = {}

    def visit(self, node: ast.AST):
        for child in ast.iter_child_nodes(node):
            self.parent[child] = node
        return super().visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
            if alias.name.startswith("apex"):  # torch imports are compared through their uses
                self.items[f"import {alias.name}"] += 1

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for alias in node.names:
            self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
            if module.startswith("apex"):
                self.items[f"from {module} import {alias.name}"] += 1

    def qualify(self, expr: ast.AST) -> str:
        parts: List[str] = []
        while isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        if isinstance(expr, ast.Name):
            parts.append(self.aliases.get(expr.id, expr.id))
        elif isinstance(expr, ast.Call):
            parts.append(self.qualify(expr.func) + "()")
        else:
            parts.append("?")
        return ".".join(reversed(parts))

    def visit_Call(self, node: ast.Call) -> None:
        name = self.qualify(node.func)
        last = name.rsplit(".", 1)[-1]
        if last in ("autocast", "GradScaler", "custom_fwd", "custom_bwd", "ShardedGradScaler") or (
            last == "partial" and node.args and self.qualify(node.args[0]).endswith("autocast")
        ):
            self.items[_call_signature(name, node, self)] += 1
        elif isinstance(node.func, ast.Attribute) and last in _SCALER_METHODS and "scaler" in name.lower():
            self.items[f"scaler.{last}({len(node.args)})"] += 1
        elif "apex" in name or (name.startswith("amp.") and last in _APEX_AMP):
            self.items[f"apex {name}"] += 1
        elif last in ("clip_grad_norm_", "clip_grad_value_"):
            self.items[f"clip {last}"] += 1
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        # a legacy object used as a value or in an annotation (not called: calls are above)
        name = self.qualify(node)
        if _legacy(name) and name.rsplit(".", 1)[-1] in ("autocast", "GradScaler", "custom_fwd", "custom_bwd"):
            if not (isinstance(self.parent.get(node), ast.Call) and self.parent[node].func is node):
                self.items[f"ref {name}"] += 1
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        # a legacy object reached through a from-import, used as a value, base class or annotation
        name = self.aliases.get(node.id, "")
        if _legacy(name) and name.rsplit(".", 1)[-1] in ("autocast", "GradScaler", "custom_fwd", "custom_bwd"):
            parent = self.parent.get(node)
            if not (isinstance(parent, ast.Call) and parent.func is node):
                self.items[f"ref {name}"] += 1

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and ("torch.cuda.amp." in node.value or "torch.amp." in node.value) and len(node.value) < 60:
            self.items[f"string {node.value}"] += 1


def _legacy(name: str) -> bool:
    return name.startswith("torch.cuda.amp") or name.startswith("torch.cpu.amp")


def _call_signature(name: str, node: ast.Call, ex: _Extractor) -> str:
    """`torch.amp.autocast(device=cuda, enabled, dtype)`; keyword order and spelling of the
    device (first positional or device_type=/device=) do not matter."""
    if name.rsplit(".", 1)[-1] == "partial":
        inner = ex.qualify(node.args[0]).replace("torch.autocast", "torch.amp.autocast")
        parts = [f"device={ast.unparse(a)}" if i == 0 else f"#{i}" for i, a in enumerate(node.args[1:])]
        parts += [f"device={ast.unparse(k.value)}" if k.arg in ("device_type", "device") else str(k.arg) for k in node.keywords]
        return f"partial({inner}, {', '.join(sorted(p.replace(chr(39), chr(34)) for p in parts))})"
    canonical = name.replace("torch.autocast", "torch.amp.autocast").replace("torch.GradScaler", "torch.amp.GradScaler")
    canonical = canonical.replace("torch.amp.autocast_mode.", "torch.amp.").replace("torch.amp.grad_scaler.", "torch.amp.")
    args = list(node.args)
    parts = []
    last = canonical.rsplit(".", 1)[-1]
    legacy = re.match(r"torch\.(cuda|cpu)\.amp\.(?:autocast_mode\.|grad_scaler\.)?(\w+)$", canonical)
    if legacy:
        # the same call in torch.amp's spelling: the device made explicit, positionals named
        device, last = legacy.groups()
        canonical = f"torch.amp.{last}"
        if last in _LEGACY_PARAMS:
            parts.append(f'device="{device}"')
            parts.extend(_LEGACY_PARAMS[last][i] if i < len(_LEGACY_PARAMS[last]) else f"#{i}" for i, _ in enumerate(args))
            args = []
        elif last in ("custom_fwd", "custom_bwd"):
            parts.append(f'device="{device}"')
    elif canonical.startswith("torch.amp.") and args and last not in ("custom_fwd", "custom_bwd"):
        parts.append("device=" + ast.unparse(args.pop(0)).replace("'", '"'))
        if last == "autocast":
            parts.extend(("dtype", "enabled", "cache_enabled")[i] if i < 3 else f"#{i}" for i, _ in enumerate(args))
            args = []
        elif last == "GradScaler":
            parts.extend(_LEGACY_PARAMS["GradScaler"][i] if i < 5 else f"#{i}" for i, _ in enumerate(args))
            args = []
    parts.extend(f"#{i}" for i, _ in enumerate(args))
    if canonical == "torch.amp.GradScaler" and not any(p.startswith("device=") for p in parts):
        if not any(k.arg == "device" for k in node.keywords):
            parts.append('device="cuda"')  # torch.amp.GradScaler's default device
    for kw in node.keywords:
        if kw.arg in ("device_type", "device"):
            parts.append("device=" + ast.unparse(kw.value).replace("'", '"'))
        else:
            parts.append(str(kw.arg))
    return f"{canonical}({', '.join(sorted(parts))})"


def extract(text: str) -> Optional[collections.Counter]:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    ex = _Extractor()
    ex.visit(tree)
    return ex.items


# ---------------------------------------------------------------------------------- comparison
def run_pair(engines: Dict[bool, Engine], pair: dict, show_diff: bool, unsafe: bool) -> Tuple[str, List[str]]:
    gdir = git_dir(pair["repo"])
    if gdir is None:
        return "missing", [f"fetch github:{pair['repo']}"]
    notes: List[str] = []
    same = True
    for path in pair["paths"]:
        before = show(gdir, pair["before"], path)
        after = show(gdir, pair["after"], path)
        if before is None:
            notes.append(f"{path}: not in {pair['before'][:10]}")
            continue
        result = engines[unsafe].fix_text(before, path)
        fixed = result.new_text if result.new_text is not None else before
        for error in result.errors:
            notes.append(f"{path}: engine error: {error}")
        got = extract(fixed) or collections.Counter()
        want = extract(after) if after is not None else collections.Counter()
        if want is None:
            notes.append(f"{path}: the maintainers' after does not parse")
            continue
        if got != want:
            same = False
            only_tool = got - want
            only_human = want - got
            notes.append(f"{path}:")
            notes.extend(f"    tool only : {k} x{v}" for k, v in sorted(only_tool.items()))
            notes.extend(f"    human only: {k} x{v}" for k, v in sorted(only_human.items()))
            if show_diff:
                remaining = [f"{f.code} {f.location.row}:{f.location.column} {f.message[:110]} ({f.no_fix_reason or 'fixable'})" for f in result.findings]
                notes.extend(f"    left: {r}" for r in remaining)
    return ("same" if same else "differs"), notes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default=os.path.join(HERE, "pairs.toml"))
    parser.add_argument("--show", help="only pairs whose repo contains this")
    parser.add_argument("--diff", action="store_true", help="also list what the tool left reported")
    parser.add_argument(
        "--unsafe-fixes",
        action="store_true",
        help="run `fix --unsafe-fixes` (verdicts from `unsafe_verdict`/`unsafe_why` where a pair has them)",
    )
    args = parser.parse_args(argv)
    with open(args.pairs, "rb") as handle:
        data = tomllib.load(handle)
    pairs = data["pair"]
    excluded = data.get("excluded", [])
    # The maintainers kept float16: `--unsafe-fixes` compares the migrations the tool withholds as
    # unsafe, with `target-dtype = "float16"` so its bfloat16 recommendation stays out of it.
    engines = {False: Engine(Settings()), True: Engine(Settings(unsafe_fixes=True, target_dtype="float16"))}
    tally: collections.Counter = collections.Counter()
    missing = []
    for pair in pairs:
        if args.show and args.show not in pair["repo"]:
            continue
        status, notes = run_pair(engines, pair, args.diff, args.unsafe_fixes)
        if status == "missing":
            missing.append(pair["repo"])
            continue
        judged = pair
        if args.unsafe_fixes and "unsafe_verdict" in pair:
            judged = {"verdict": pair["unsafe_verdict"], "why": pair.get("unsafe_why", "")}
        verdict = "agree" if status == "same" else judged.get("verdict", "UNJUDGED")
        tally[verdict] += 1
        print(f"[{verdict:8}] {pair['repo']} {pair['before'][:10]}..{pair['after'][:10]} ({pair.get('kind', '')}) {judged.get('why', '')}")
        for note in notes:
            print("    " + note)
    total = sum(tally.values())
    good = tally["agree"] + tally["better"]
    print()
    print(f"pairs: {total}  " + "  ".join(f"{k}: {v}" for k, v in sorted(tally.items())))
    if total:
        print(f"agree or better: {good}/{total} = {100.0 * good / total:.1f}%  wrong: {tally['wrong']}")
    for item in excluded:
        print(f"excluded: {item['repo']} {item['after'][:10]}: {item['reason']}")
    for repo in sorted(set(missing)):
        print(f"missing mirror: fetch github:{repo}")
    return 1 if tally["wrong"] or tally["UNJUDGED"] else 0


if __name__ == "__main__":
    sys.exit(main())
