"""What each module of the run does for training, for rules that need another file's view.

Per-file rules see one file; real projects split a training step across files: the GradScaler
made in main.py and used in engine.py, a `clip_gradients(model, max_norm)` helper in utils.py
called between `scaler.scale(loss).backward()` and `scaler.step(opt)`, a model whose forward
autocasts to float16 in model.py and whose backward runs in train.py. Before the per-file pass,
the runner builds this index with one cheap pass over every file of the run (the same file
set: what is not checked is not known): a byte search rules out most files, the rest are read
with `ast` (never LibCST) into a `ModuleSummary`. Rules query it; nothing flows back.

Summaries depend only on a file's bytes, so they are cached by content hash (one JSON file
per run key next to the per-file results: engine/cache.py). A file's result depends on the
summaries of the modules it imports and on which training modules import it;
`dependency_key(path)` is folded into the per-file cache key so that editing one changes the
other's entry.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from ampmigrate.engine.project import ProjectImports
from ampmigrate.source import SourceError, read_bytes

# A file spelling none of these cannot train, clip or pass a scaler: not parsed at all.
_RELEVANT = re.compile(rb"backward|GradScaler|clip_grad|training_step")
_CLIP_CALLEES = frozenset({"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"})
_CLIP_MODULES = ("torch.nn.utils", "torch.nn.utils.clip_grad", "nn.utils", "utils")
_FORMAT = 1


@dataclass
class ModuleSummary:
    trains: bool = False  # calls `.backward()`, makes a GradScaler or defines `training_step`
    imports: List[str] = field(default_factory=list)  # modules it imports (absolute, dotted)
    # Functions (top level, `Class.method`) that clip gradients ("clip") or only read their
    # norm ("read") and never unscale: a clip wherever they are called.
    clip_helpers: Dict[str, str] = field(default_factory=dict)
    # Functions and the parameters they use as a GradScaler (analysis/scaler_typing.py's shape).
    scaler_params: Dict[str, List[str]] = field(default_factory=dict)
    # Calls passing a GradScaler this module makes: (callee as written, its line).
    scaler_passed_to: List[Tuple[str, int]] = field(default_factory=list)


class ProjectIndex:
    def __init__(self, root: str) -> None:
        self.root = Path(os.path.abspath(root))
        self.modules: Dict[str, ModuleSummary] = {}  # absolute path -> summary
        self._by_name: Dict[str, List[str]] = {}  # dotted module name (and its suffixes) -> paths
        self._importers: Dict[str, List[str]] = {}  # path -> the files of the run importing it
        self._trained_names: Dict[str, Dict[str, str]] = {}  # path -> name -> a training file importing it
        # `from X import a, b` of every file (a byte regex, engine/project.py): who imports what by name.
        self.imports = ProjectImports(root)

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, root: str, files: Iterable[str], cache_path: Optional[str] = None, max_size: int = 0) -> "ProjectIndex":
        index = cls(root)
        cached = _load(cache_path)
        fresh: Dict[str, Tuple[str, dict]] = {}
        for path in files:
            absolute = os.path.abspath(path)
            raw = _read(absolute, max_size)
            if raw is None:
                continue
            digest = hashlib.blake2b(raw, digest_size=16).hexdigest()
            entry = cached.get(absolute)
            if entry is not None and entry[0] == digest:
                data = entry[1]
            else:
                data = asdict(summarize(raw, index.module_names(absolute)))
            fresh[absolute] = (digest, data)
            if b"import" in raw:
                index.imports.add_source(raw)
            index._add(absolute, ModuleSummary(**{k: v for k, v in data.items()}))
        if cache_path is not None and fresh != cached:
            _store(cache_path, fresh)
        index._link()
        return index

    def _link(self) -> None:
        """Who imports whom, once (queries are per file; a scan per query would be quadratic)."""
        self._importers: Dict[str, List[str]] = {}
        self._trained_names: Dict[str, Dict[str, str]] = {}
        for path, summary in sorted(self.modules.items()):
            targets = {self.module_for(spec) for spec in summary.imports}
            for target in targets:
                if target is not None and target != path:
                    self._importers.setdefault(target, []).append(path)
            if not summary.trains:
                continue
            for spec in summary.imports:  # `from model import Net`: recorded as "model" and "model.Net"
                module, _, name = spec.rpartition(".")
                target = self.module_for(module) if module else None
                if target is not None and target != path:
                    self._trained_names.setdefault(target, {}).setdefault(name, path)

    def _add(self, path: str, summary: ModuleSummary) -> None:
        summary.scaler_passed_to = [tuple(item) for item in summary.scaler_passed_to]
        self.modules[path] = summary
        for name in self.module_names(path):
            self._by_name.setdefault(name, []).append(path)

    def module_names(self, path: str) -> List[str]:
        """Dotted names a file can be imported under: a/b/c.py -> a.b.c, b.c, c."""
        absolute = Path(os.path.abspath(path))
        try:
            parts = list(absolute.relative_to(self.root).with_suffix("").parts)
        except ValueError:
            parts = [absolute.stem]
        if parts and parts[-1] == "__init__":
            parts = parts[:-1]
        return [".".join(parts[i:]) for i in range(len(parts))]

    # ------------------------------------------------------------------ queries
    def module_for(self, dotted: str) -> Optional[str]:
        """The one file of the run that `dotted` (a module name as imported) denotes."""
        paths = self._by_name.get(dotted.lstrip("."), [])
        return paths[0] if len(paths) == 1 else None

    def function(self, qname: str) -> Optional[Tuple[str, str]]:
        """For `pkg.utils.clip_gradients` (a qualified name from engine/names.py): the file of
        the run defining it and the function's name there."""
        module, _, name = qname.rpartition(".")
        path = self.module_for(module) if module else None
        return (path, name) if path is not None else None

    def clip_helper(self, qname: str) -> Optional[Tuple[str, str]]:
        """("clip" | "read", the defining file) when `qname` is a helper of another file of the
        run that clips (or reads the norm of) gradients and never unscales."""
        found = self.function(qname)
        if found is None:
            return None
        path, name = found
        kind = self.modules[path].clip_helpers.get(name)
        return (kind, path) if kind else None

    def trained_with(self, path: str, name: str) -> Optional[str]:
        """Another file of the run that trains (calls `.backward()`, makes a GradScaler, ...) and
        imports `name` (a function or class) from the module at `path` by name, if any."""
        return self._trained_names.get(os.path.abspath(path), {}).get(name)

    def scaler_made_in(self, path: str, function: str) -> Optional[str]:
        """A file of the run that passes a GradScaler it makes to `function` of the module at `path`."""
        for other in self._importers.get(os.path.abspath(path), ()):
            if any(callee.rpartition(".")[2] == function for callee, _ in self.modules[other].scaler_passed_to):
                return other
        return None

    def imported_from(self, path: str) -> FrozenSet[str]:
        """Names other files of the run import from the module at `path`."""
        return self.imports.imported_from(path)

    def dependency_key(self, path: str) -> str:
        """What of the index a file's result may depend on, as a short hash ("" if nothing)."""
        absolute = os.path.abspath(path)
        summary = self.modules.get(absolute)
        parts: List[str] = []
        if summary is not None:
            for spec in sorted(set(summary.imports)):
                other = self.module_for(spec)
                if other is not None and other != absolute:
                    parts.append(f"{spec}={json.dumps(asdict(self.modules[other]), sort_keys=True)}")
        exported = self.imported_from(absolute)
        if exported:
            parts.append("exports=" + ",".join(sorted(exported)))
        for name, trainer in sorted(self._trained_names.get(absolute, {}).items()):
            parts.append(f"trained:{name}={trainer}")
        for other in self._importers.get(absolute, ()):
            if self.modules[other].scaler_passed_to:
                parts.append(f"scaler_from={other}:{self.modules[other].scaler_passed_to}")
        if not parts:
            return ""
        return hashlib.blake2b("\n".join(parts).encode(), digest_size=8).hexdigest()

    def relative(self, path: str) -> str:
        try:
            return Path(path).relative_to(self.root).as_posix()
        except ValueError:
            return os.path.basename(path)


# ---------------------------------------------------------------------------------- reading
def _read(path: str, max_size: int) -> Optional[bytes]:
    """The one place the index reads a file: unreadable or oversized files are left out (the
    per-file pass reports them)."""
    try:
        if max_size and os.path.getsize(path) > max_size:
            return None
        return read_bytes(path)
    except (OSError, SourceError):
        return None


def _load(cache_path: Optional[str]) -> Dict[str, Tuple[str, dict]]:
    if cache_path is None:
        return {}
    try:
        with open(cache_path, "r", encoding="utf-8") as handle:
            data = json.load(handle)
        if data.get("format") != _FORMAT:
            return {}
        return {path: (entry[0], entry[1]) for path, entry in data["modules"].items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return {}


def _store(cache_path: str, modules: Dict[str, Tuple[str, dict]]) -> None:
    try:
        os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        temporary = f"{cache_path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump({"format": _FORMAT, "modules": {p: list(e) for p, e in modules.items()}}, handle)
        os.replace(temporary, cache_path)
    except OSError:
        pass  # a read-only cache directory: go without


# ---------------------------------------------------------------------------------- one module
def summarize(raw: bytes, module_names: List[str]) -> ModuleSummary:
    summary = ModuleSummary()
    if not _RELEVANT.search(raw):
        return summary
    try:
        tree = ast.parse(raw)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return summary
    package = module_names[0].rpartition(".")[0] if module_names else ""
    try:
        _Summarizer(summary, package).run(tree)
    except RecursionError:
        return ModuleSummary()
    return summary


class _Summarizer:
    def __init__(self, summary: ModuleSummary, package: str) -> None:
        self.summary = summary
        self.package = package
        self.clip_imports: Set[str] = set()  # bare names imported from torch.nn.utils
        self.grad_scaler_names: Set[str] = {"GradScaler", "ShardedGradScaler"}

    def run(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = self._absolute(node)
                if module:
                    self.summary.imports.append(module)
                    self.summary.imports.extend(f"{module}.{a.name}" for a in node.names)
                if (node.module or "").startswith("torch.nn.utils"):
                    self.clip_imports.update(a.asname or a.name for a in node.names if a.name in _CLIP_CALLEES)
            elif isinstance(node, ast.Import):
                self.summary.imports.extend(a.name for a in node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "training_step":
                self.summary.trains = True
            elif isinstance(node, ast.Call):
                callee = _dotted(node.func)
                if callee.endswith(".backward") or callee.rpartition(".")[2] in self.grad_scaler_names:
                    self.summary.trains = True
        self.summary.imports = sorted(set(self.summary.imports))
        for name, function in _functions(tree):
            self._function(name, function)
        self._scaler_calls(tree)

    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = self.package.split(".") if self.package else []
        base = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
        return ".".join([*base, *([node.module] if node.module else [])])

    def _function(self, name: str, function: ast.AST) -> None:
        clips: Optional[str] = None
        unscales = False
        scaled: Set[str] = set()
        followed: Set[str] = set()
        params = {a.arg for a in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]}
        for node in _own_nodes(function):
            if not isinstance(node, ast.Call) or not isinstance(node.func, (ast.Attribute, ast.Name)):
                continue
            callee = _dotted(node.func)
            last = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if last == "unscale_" or last == "scale":
                unscales = True  # knows the protocol (or a scaler is at hand): not a plain clip
            if (last in _CLIP_CALLEES and callee.rpartition(".")[0] in _CLIP_MODULES) or callee in self.clip_imports:
                clips = "clip"
            if last == "backward" and isinstance(node.func, ast.Attribute):
                inner = node.func.value
                if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "scale":
                    receiver = inner.func.value
                    if isinstance(receiver, ast.Name) and receiver.id in params:
                        scaled.add(receiver.id)
            if last in ("step", "unscale_", "update") and isinstance(node.func, ast.Attribute):
                receiver = node.func.value
                if isinstance(receiver, ast.Name):
                    followed.add(receiver.id)
        if clips and not unscales:
            self.summary.clip_helpers[name] = clips
        typed = sorted(scaled & followed)
        if typed:
            self.summary.scaler_params[name] = typed

    def _scaler_calls(self, tree: ast.Module) -> None:
        """`train_one_epoch(..., scaler, ...)` where `scaler = GradScaler(...)` in the same function."""
        for _, function in [("", tree), *_functions(tree)]:
            made: Set[str] = set()
            calls: List[ast.Call] = []
            for node in _own_nodes(function):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                    if _dotted(node.value.func).rpartition(".")[2] in self.grad_scaler_names:
                        made.update(t.id for t in node.targets if isinstance(t, ast.Name))
                elif isinstance(node, ast.Call):
                    calls.append(node)
            if not made:
                continue
            for call in calls:
                values = [*call.args, *(k.value for k in call.keywords)]
                if any(isinstance(v, ast.Name) and v.id in made for v in values):
                    callee = _dotted(call.func)
                    if callee and callee.rpartition(".")[2] not in self.grad_scaler_names:
                        self.summary.scaler_passed_to.append((callee, call.lineno))


def _functions(tree: ast.Module) -> List[Tuple[str, ast.AST]]:
    """Top-level functions by name, methods as `Class.method`."""
    found: List[Tuple[str, ast.AST]] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.append((f"{node.name}.{item.name}", item))
    return found


def _own_nodes(function: ast.AST) -> Iterable[ast.AST]:
    """The nodes of a function's body (or a module's top level), not of functions nested in it."""
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
    stack = [node for node in getattr(function, "body", ()) if not isinstance(node, nested)]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, nested):
                stack.append(child)


def _dotted(node: ast.AST) -> str:
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""
