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
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from ampmigrate.engine import collector
from ampmigrate.engine.apex_cast_registrations import cast_registrations
from ampmigrate.engine.apex_checkpoint import state_key, summarize_checkpoint
from ampmigrate.engine.apex_setup_helper import setup_key
from ampmigrate.engine.apex_attrs import apex_attr_loads, apex_attr_stores
from ampmigrate.engine.apex_attrs import wanted as attr_stores_wanted
from ampmigrate.engine.apex_star import apex_star_exports, provider_key, star_bound, star_key
from ampmigrate.engine.apex_base_class import base_class_key
from ampmigrate.engine.apex_owned_optimizer import owned_key
from ampmigrate.engine.apex_threading import summarize_threading, threading_key
from ampmigrate.engine.apex_values import (
    apex_amp_args,
    apex_amp_getters,
    apex_state_params,
    top_functions,
)
from ampmigrate.engine.caller_uses import source_tree
from ampmigrate.engine.grad_norm_helpers import grad_norm_helpers
from ampmigrate.engine.state_loaders import state_loaders
from ampmigrate.engine.project import module_names
from ampmigrate.source import SourceError, read_regular_file

_CLIP_CALLEES = frozenset({"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"})
_CLIP_MODULES = ("torch.nn.utils", "torch.nn.utils.clip_grad", "nn.utils", "utils")
_FORMAT = 30


@dataclass
class ModuleSummary:
    trains: bool = False  # calls `.backward()`, makes a GradScaler or defines `training_step`
    # Makes a GradScaler, or calls `<scaler>.scale(loss).backward()`: its training keeps one.
    scales_loss: bool = False
    # Top-level functions that run an FFT op (no bfloat16 kernel) on an input not cast to
    # float32 there: {name: the op as written}. A bfloat16 region whose values reach one breaks.
    fft_helpers: Dict[str, str] = field(default_factory=dict)
    imports: List[str] = field(default_factory=list)  # modules it imports (absolute, dotted)
    # Functions (top level, `Class.method`) that clip gradients ("clip") with torch's clip
    # functions and never unscale (nor scale): a clip wherever they are called.
    clip_helpers: Dict[str, str] = field(default_factory=dict)
    # Functions and the parameters they use as a GradScaler (analysis/scaler_typing.py's shape).
    scaler_params: Dict[str, List[str]] = field(default_factory=dict)
    # Calls passing a GradScaler this module makes: (callee as written, its line).
    scaler_passed_to: List[Tuple[str, int]] = field(default_factory=list)
    # Every `from module import name` of the file (any file, not only training code): who
    # imports what by name, for values a call in another file may pass.
    from_imports: List[Tuple[str, str]] = field(default_factory=list)
    # Issue 11: top-level classes whose `__call__` runs `.backward()` (timm-style NativeScaler
    # wrappers): a file that imports one by name trains (see backward_runner_imported).
    backward_runners: List[str] = field(default_factory=list)
    # Every file (engine/import_resolution.py): the modules of its plain `import a.b` lines, of
    # its `from m import *` lines (and from-lines the regex cannot split), and whether it may edit
    # `sys.path` (then its absolute imports may name any file of the run that ends so).
    module_imports: List[str] = field(default_factory=list)
    star_imports: List[str] = field(default_factory=list)
    edits_sys_path: bool = False
    # --- apex.amp across files (rules/apex/cross_module.py) ---
    # Functions and the parameters they call `.scale_loss(...)` on: apex's amp module received.
    apex_amp_params: Dict[str, List[str]] = field(default_factory=dict)
    # Calls passing apex's amp module (a name imported from apex) as an argument: (callee, line).
    apex_amp_passed_to: List[Tuple[str, int]] = field(default_factory=list)
    # Builders imported by name whose result a function of this (training) module trains:
    # `model = build_model(cfg)` then an optimizer over `model.parameters()` or `model.train()`,
    # as "module.name" (AMP409: a float16 conversion in the builder's file is trained here).
    trained_results: List[str] = field(default_factory=list)
    # Checkpoint helpers (top-level functions): their positional parameters and those whose
    # `.state_dict()` they save (`torch.save`, `save_on_master`, ...) while saving no scaler
    # state: a caller passing its optimizer there checkpoints without the GradScaler (AMP308).
    checkpoint_savers: Dict[str, Tuple[List[str], List[str]]] = field(default_factory=dict)
    # Top-level functions with a parameter named like a scaler (`scaler`, `loss_scaler`): their
    # positional parameters and, per such parameter, the methods called on it ("*" when it is
    # used otherwise: passed on, stored, returned). Whether a disabled GradScaler handed there
    # behaves as a removed one (AMP402).
    scaler_param_uses: Dict[str, Tuple[List[str], Dict[str, List[str]]]] = field(default_factory=dict)
    # --- apex.amp split across two files (engine/apex_threading.py) ---
    # The A side: the top-level function calling `amp.initialize` (the file's only one, and no
    # `scale_loss`), why the split migration cannot take it ("" when it can), and the calls there
    # passing the optimizer it returns: (callee, line, position or -1, keyword or "", how many
    # calls of that name the file makes).
    apex_init_function: str = ""
    apex_init_problem: str = ""
    apex_init_calls: List[Tuple[str, int, int, str, int]] = field(default_factory=list)
    # The B side: top-level functions running `with amp.scale_loss(loss, <param>)` on the
    # module's apex import: (positional parameters, the optimizer parameter, the name of the
    # scaler parameter to add, why the split migration cannot take it or "").
    apex_step_functions: Dict[str, Tuple[List[str], str, str, str]] = field(default_factory=dict)
    # {step function: the top-level function of the same file that calls it, relaying the
    # optimizer it is given (itself among `apex_step_functions`, called by the A sides)}.
    apex_step_relays: Dict[str, str] = field(default_factory=dict)
    # apex set up by a base class for subclasses in other files (engine/apex_base_class.py). A
    # side: {top-level class whose `__init__` holds the file's one `amp.initialize`: (the model
    # attribute, the optimizer attribute, why not or "")}. B side: {class deriving from a class
    # imported by name, scaling a loss with an optimizer it never stores: (the module as
    # imported, the base's name there, the optimizer attribute, why not or "")}.
    apex_setup_classes: Dict[str, Tuple[str, str, str]] = field(default_factory=dict)
    apex_subclass_steps: Dict[str, Tuple[str, str, str, str]] = field(default_factory=dict)
    # apex set up by a script on an object whose class owns its optimizer (engine/apex_owned_optimizer.py).
    # Script: [(the object's name, the optimizer attribute `amp.initialize` is given, why not or "")].
    # Class: {top-level class building `self.<attribute>` in `__init__` and scaling with it: (the
    # attribute, why not or "")}.
    apex_instance_setups: List[Tuple[str, str, str]] = field(default_factory=list)
    apex_owned_optimizers: Dict[str, Tuple[str, str]] = field(default_factory=dict)
    # The other top-level functions of a B side that may be handed the optimizer harmlessly: no
    # apex, no `.step()`/`.backward()`, no call of a step function (an `adjust_lr(optimizer, ...)`).
    apex_plain_functions: List[str] = field(default_factory=list)
    # apex.amp cast registrations torch.autocast would not honour (engine/apex_cast_registrations.py):
    # (the call as written, its line). Process-wide: a migration of any file of the run changes them.
    apex_cast_registrations: List[Tuple[str, int]] = field(default_factory=list)
    # Step functions that never step: an input gradient's helper, optimizer optional
    # (engine/apex_input_gradients.py); and, in a file that sets apex up and scales its own
    # losses, the calls after `amp.initialize` passing its optimizer: (callee, line, position or
    # -1, keyword or "").
    apex_gradient_functions: List[str] = field(default_factory=list)
    apex_gradient_calls: List[Tuple[str, int, int, str]] = field(default_factory=list)
    # --- apex.amp checkpoint helpers in another file (engine/apex_checkpoint.py) ---
    # A helper's file (apex's amp used only for `state_dict`/`load_state_dict`): its top-level
    # functions using it: (positional parameters, the scaler parameter to add, problem or "").
    apex_state_functions: Dict[str, Tuple[List[str], str, str]] = field(default_factory=dict)
    # A caller's file: how many `amp.initialize` uses, and per name imported by name: (calls, other uses).
    apex_initializes: int = 0
    apex_name_uses: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    # A caller's file whose every `amp.initialize` is given a model alone and that scales no loss
    # (an evaluation script): it has no GradScaler, and may call only helpers that load the state.
    apex_inference_only: bool = False
    # A helper's file: its top-level functions whose only apex use is `amp.load_state_dict`.
    apex_state_loaders_only: List[str] = field(default_factory=list)
    # Top-level functions whose value is the p-norm of their parameter's gradients
    # (engine/grad_norm_helpers.py): {name: (positional parameters, the norm-type parameter or "")}.
    # Called on a micro-step of apex accumulation, `f(params) / scaler.get_scale()` is apex's value.
    grad_norm_helpers: Dict[str, Tuple[List[str], str]] = field(default_factory=dict)
    # Top-level functions whose every return value is apex's amp module or None
    # (engine/apex_values.py): `amp = get_amp(fp16)` elsewhere binds apex's amp.
    apex_amp_getters: List[str] = field(default_factory=list)
    # The calls of this file handing apex's amp module to a parameter: (callee as written, line,
    # position or -1, keyword or ""). engine/apex_values.py.
    apex_amp_args: List[Tuple[str, int, int, str]] = field(default_factory=list)
    # Names bound at the module's top level by an apex amp import (`from apex import amp`): what
    # `from <this module> import *` may hand another file (engine/apex_star.py).
    apex_star_exports: List[str] = field(default_factory=list)
    # What each attribute named like amp is assigned here: {attr: ["apex" | "none" | "other"]},
    # "*" for a `setattr` of a computed name (engine/apex_attrs.py).
    apex_attr_stores: Dict[str, List[str]] = field(default_factory=dict)
    # A file without apex that may store to such an attribute (the byte test): its records are
    # read only when some file of the run stores apex's module there (ProjectIndex._attr_stores).
    apex_attr_candidate: bool = False
    # Attributes named like amp read here as `<x>.<attr>.<apex.amp function>` (a byte scan,
    # engine/apex_attrs.py `apex_attr_loads`): where a migration renaming the attribute must reach.
    apex_attr_loads: List[str] = field(default_factory=list)
    # Top-level functions restoring each `**kwargs` value's state from the checkpoint entry of its
    # keyword (SwAV's `restart_from_checkpoint`, engine/state_loaders.py).
    state_loaders: List[str] = field(default_factory=list)


def _as_data(summary: ModuleSummary) -> dict:
    """`dataclasses.asdict(summary)` (what the cache stores), without its generic deep copy."""
    return {
        "trains": summary.trains,
        "scales_loss": summary.scales_loss,
        "fft_helpers": dict(summary.fft_helpers),
        "imports": list(summary.imports),
        "clip_helpers": dict(summary.clip_helpers),
        "scaler_params": {name: list(params) for name, params in summary.scaler_params.items()},
        "scaler_passed_to": [tuple(item) for item in summary.scaler_passed_to],
        "from_imports": [tuple(item) for item in summary.from_imports],
        "backward_runners": list(summary.backward_runners),
        "module_imports": list(summary.module_imports),
        "star_imports": list(summary.star_imports),
        "edits_sys_path": summary.edits_sys_path,
        "apex_amp_params": {name: list(params) for name, params in summary.apex_amp_params.items()},
        "apex_amp_passed_to": [tuple(item) for item in summary.apex_amp_passed_to],
        "trained_results": list(summary.trained_results),
        "checkpoint_savers": {name: (list(a), list(b)) for name, (a, b) in summary.checkpoint_savers.items()},
        "scaler_param_uses": {
            name: (list(positional), {param: list(methods) for param, methods in uses.items()})
            for name, (positional, uses) in summary.scaler_param_uses.items()
        },
        "apex_init_function": summary.apex_init_function,
        "apex_init_problem": summary.apex_init_problem,
        "apex_init_calls": [tuple(item) for item in summary.apex_init_calls],
        "apex_step_functions": {
            name: (list(positional), optimizer, scaler, problem)
            for name, (positional, optimizer, scaler, problem) in summary.apex_step_functions.items()
        },
        "apex_step_relays": dict(summary.apex_step_relays),
        "apex_setup_classes": {name: tuple(record) for name, record in summary.apex_setup_classes.items()},
        "apex_subclass_steps": {name: tuple(record) for name, record in summary.apex_subclass_steps.items()},
        "apex_instance_setups": [tuple(record) for record in summary.apex_instance_setups],
        "apex_owned_optimizers": {name: tuple(record) for name, record in summary.apex_owned_optimizers.items()},
        "apex_plain_functions": list(summary.apex_plain_functions),
        "apex_cast_registrations": [tuple(item) for item in summary.apex_cast_registrations],
        "apex_gradient_functions": list(summary.apex_gradient_functions),
        "apex_gradient_calls": [tuple(item) for item in summary.apex_gradient_calls],
        "apex_state_functions": {
            name: (list(positional), scaler, problem)
            for name, (positional, scaler, problem) in summary.apex_state_functions.items()
        },
        "apex_initializes": summary.apex_initializes,
        "apex_name_uses": {name: tuple(uses) for name, uses in summary.apex_name_uses.items()},
        "apex_inference_only": summary.apex_inference_only,
        "apex_state_loaders_only": list(summary.apex_state_loaders_only),
        "grad_norm_helpers": {name: (list(positional), norm) for name, (positional, norm) in summary.grad_norm_helpers.items()},
        "apex_amp_getters": list(summary.apex_amp_getters),
        "apex_amp_args": [tuple(item) for item in summary.apex_amp_args],
        "apex_star_exports": list(summary.apex_star_exports),
        "apex_attr_stores": {attr: list(kinds) for attr, kinds in summary.apex_attr_stores.items()},
        "apex_attr_candidate": summary.apex_attr_candidate,
        "apex_attr_loads": list(summary.apex_attr_loads),
        "state_loaders": list(summary.state_loaders),
    }


class ProjectIndex:
    def __init__(self, root: str) -> None:
        self.root = Path(os.path.abspath(root))
        self.modules: Dict[str, ModuleSummary] = {}  # absolute path -> summary
        self._by_name: Dict[str, List[str]] = {}  # dotted module name (and its suffixes) -> paths
        self._importers: Dict[str, List[str]] = {}  # path -> the files of the run importing it
        self._trained_names: Dict[str, Dict[str, str]] = {}  # path -> name -> a training file importing it
        self._trained_results: Dict[str, Dict[str, str]] = {}  # path -> builder -> a file training its result
        self._grad_norm_files = True  # whether some module has a gradient-norm helper (`_link`)
        # `from X import a, b` of every file (a byte regex): module -> the names imported from it.
        self._exports: Dict[str, Set[str]] = {}
        self._module_names: Dict[str, List[str]] = {}  # path -> module_names(path), computed once
        # The bytes (and their digest) of the files with apex setups split across files, as read
        # before any fix: each side plans the others' migration too (rules/apex/_cross_threading.py).
        self.apex_sources: Dict[str, Tuple[str, bytes]] = {}
        # The digest of every file's bytes as the index read them (engine/apex_importers.py reads
        # a caller's file again only when its bytes still have this digest).
        self.digests: Dict[str, str] = {}

    # ------------------------------------------------------------------ building
    @classmethod
    @collector.pausing  # every parsed tree is dropped before the next file (engine/collector.py)
    def build(cls, root: str, files: Iterable[str], cache_path: Optional[str] = None, max_size: int = 0) -> "ProjectIndex":
        index = cls(root)
        cached = _load(cache_path)
        fresh: Dict[str, Tuple[str, dict]] = {}
        for path in files:
            absolute = os.path.abspath(path)
            raw = _read(absolute, max_size)
            if raw is None:
                continue
            digest = hashlib.blake2b(raw, digest_size=16).hexdigest()  # = cache.content_hash(raw)
            entry = cached.get(absolute)
            if entry is not None and entry[0] == digest:
                data = entry[1]
            else:
                package = index.package_of(absolute)
                if is_test_file(absolute):
                    data = _as_data(summarize(raw, package, test_file=True))
                else:
                    data = _as_data(summarize(raw, package))
            fresh[absolute] = (digest, data)
            index.digests[absolute] = digest
            index._add(absolute, ModuleSummary(**data))
            if (
                data.get("apex_step_functions")
                or data.get("apex_init_function")
                or data.get("apex_setup_classes")
                or data.get("apex_subclass_steps")
                or data.get("apex_instance_setups")
                or data.get("apex_owned_optimizers")
                or data.get("apex_state_functions")
                or data.get("apex_initializes")
            ):
                index.apex_sources[absolute] = (digest, raw)
        if cache_path is not None and fresh != cached:
            _store(cache_path, fresh)
        index._link()
        return index

    def _link(self) -> None:
        """Who imports whom, once (queries are per file; a scan per query would be quadratic)."""
        self._importers: Dict[str, List[str]] = {}
        self._trained_names: Dict[str, Dict[str, str]] = {}
        self._grad_norm_files = any(summary.grad_norm_helpers for summary in self.modules.values())
        for path, summary in sorted(self.modules.items()):
            targets = {self._imported(path, spec) for spec in summary.imports}
            for target in targets:
                if target is not None and target != path:
                    self._importers.setdefault(target, []).append(path)
            for spec in summary.trained_results:
                module, _, name = spec.rpartition(".")
                target = self._imported(path, module) if module else None
                if target is not None and target != path:
                    self._trained_results.setdefault(target, {}).setdefault(name, path)
            if not summary.trains:
                continue
            for spec in summary.imports:  # `from model import Net`: recorded as "model" and "model.Net"
                module, _, name = spec.rpartition(".")
                target = self._imported(path, module) if module else None
                if target is not None and target != path:
                    self._trained_names.setdefault(target, {}).setdefault(name, path)

    def _imported(self, importer: str, dotted: str) -> Optional[str]:
        """The file `import dotted` in `importer` loads: the one file the name fits, else (two
        sub-projects' `utils.py`) the one Python finds from the importer (`module_for`)."""
        if _ambiguous(self._by_name, dotted):
            return self.module_for(dotted, importer)
        return self.module_for(dotted)

    def _add(self, path: str, summary: ModuleSummary) -> None:
        summary.scaler_passed_to = [tuple(item) for item in summary.scaler_passed_to]
        summary.apex_amp_passed_to = [tuple(item) for item in summary.apex_amp_passed_to]
        summary.apex_amp_args = [tuple(item) for item in summary.apex_amp_args]
        summary.checkpoint_savers = {k: (list(v[0]), list(v[1])) for k, v in summary.checkpoint_savers.items()}
        summary.scaler_param_uses = {k: (list(v[0]), dict(v[1])) for k, v in summary.scaler_param_uses.items()}
        summary.apex_init_calls = [tuple(item) for item in summary.apex_init_calls]
        summary.apex_gradient_calls = [tuple(item) for item in summary.apex_gradient_calls]
        summary.apex_step_functions = {k: (list(v[0]), *v[1:]) for k, v in summary.apex_step_functions.items()}
        summary.apex_state_functions = {k: (list(v[0]), *v[1:]) for k, v in summary.apex_state_functions.items()}
        summary.apex_name_uses = {k: tuple(v) for k, v in summary.apex_name_uses.items()}
        summary.apex_cast_registrations = [tuple(item) for item in summary.apex_cast_registrations]
        for module, name in summary.from_imports:
            self._exports.setdefault(module, set()).add(name)
        self.modules[path] = summary
        for name in self.module_names(path):
            self._by_name.setdefault(name, []).append(path)

    def module_names(self, path: str) -> List[str]:
        """Dotted names a file can be imported under: a/b/c.py -> a.b.c, b.c, c."""
        names = self._module_names.get(path)
        if names is None:
            names = self._module_names[path] = module_names(self.root, path)
        return list(names)

    def package_of(self, path: str) -> str:
        """The package relative imports of the file at `path` start from."""
        names = self.module_names(path)
        if not names:
            return ""
        return names[0] if os.path.basename(path) == "__init__.py" else names[0].rpartition(".")[0]

    # ------------------------------------------------------------------ queries
    def module_for(self, dotted: str, importer: str = "") -> Optional[str]:
        """The one file of the run that `dotted` (a module name as imported) denotes, else None.
        Asked for the file `importer`, it is the one Python finds from there
        (engine/import_resolution.py: the importer's own folder and those above it, never a
        sibling sub-project's `src/utils.py`), which does not depend on where the run's root is.
        Without one: the only file it can name, else the one whose full name (from the root) it is."""
        dotted = dotted.lstrip(".")
        if importer:
            from ampmigrate.engine.import_resolution import candidates

            found = candidates(self, os.path.abspath(importer), dotted)
            return found[0] if len(found) == 1 else None
        paths = self._by_name.get(dotted, [])
        if len(paths) > 1:
            paths = [p for p in paths if self.module_names(p)[:1] == [dotted]]
        return paths[0] if len(paths) == 1 else None

    def function(self, qname: str, importer: str = "") -> Optional[Tuple[str, str]]:
        """For `pkg.utils.clip_gradients` (a qualified name from engine/names.py, as the file
        `importer` imports it): the file of the run defining it and the function's name there."""
        module, _, name = qname.rpartition(".")
        path = self.module_for(module, importer) if module else None
        return (path, name) if path is not None else None

    def clip_helper(self, qname: str, importer: str = "") -> Optional[Tuple[str, str]]:
        """("clip" | "read", the defining file) when `qname` is a helper of another file of the
        run that clips (or reads the norm of) gradients and never unscales."""
        found = self.function(qname, importer)
        if found is None:
            return None
        path, name = found
        kind = self.modules[path].clip_helpers.get(name)
        return (kind, path) if kind else None

    def apex_amp_getter(self, qname: str, importer: str = "") -> Optional[str]:
        """The file of the run defining `qname` (`utils.get_amp`) when that function returns
        apex's amp module or None (engine/apex_values.py)."""
        found = self.function(qname, importer)
        if found is None:
            return None
        path, name = found
        return path if name in self.modules[path].apex_amp_getters else None

    def state_loader(self, qname: str, importer: str = "") -> Optional[str]:
        """The file of the run defining `qname` when that function restores each keyword
        argument's state from the checkpoint entry of its name (engine/state_loaders.py)."""
        found = self.function(qname, importer)
        if found is None:
            return None
        path, name = found
        return path if name in self.modules[path].state_loaders else None

    def trained_with(self, path: str, name: str) -> Optional[str]:
        """Another file of the run that trains (calls `.backward()`, makes a GradScaler, ...) and
        imports `name` (a function or class) from the module at `path` by name, if any."""
        return self._trained_names.get(os.path.abspath(path), {}).get(name)

    def checkpoint_saver(self, qname: str, importer: str = "") -> Optional[Tuple[str, List[str], List[str]]]:
        """For `utils.save_checkpoint` (a qualified name): (its file, its positional parameters,
        the parameters whose `.state_dict()` it saves without saving a scaler's), if it is one."""
        found = self.function(qname, importer)
        if found is None:
            return None
        path, name = found
        record = self.modules[path].checkpoint_savers.get(name)
        return (path, *record) if record else None

    def result_trained_in(self, path: str, function: str) -> Optional[str]:
        """Another file of the run that imports `function` from the module at `path` by name,
        calls it and trains what it returns (an optimizer over its parameters, `.train()`)."""
        return self._trained_results.get(os.path.abspath(path), {}).get(function)

    def scaler_parameter_uses(self, qname: str, importer: str = "") -> Optional[Tuple[List[str], Dict[str, List[str]]]]:
        """For `utils.load_checkpoint`: (positional parameters, {scaler-like parameter: methods
        called on it, "*" for other uses}), if it has such a parameter."""
        found = self.function(qname, importer)
        if found is None:
            return None
        path, name = found
        return self.modules[path].scaler_param_uses.get(name)

    def fft_helper(self, qname: str, importer: str = "") -> Optional[Tuple[str, str]]:
        """For `losses.mel_loss` (a qualified name): (its file, the FFT op it runs), if it is one."""
        found = self.function(qname, importer)
        if found is None:
            return None
        path, name = found
        op = self.modules[path].fft_helpers.get(name)
        return (path, op) if op else None

    def grad_norm_helper(self, qname: str, importer: str = "") -> Optional[Tuple[str, Tuple[List[str], str]]]:
        """For `utils.get_grad_norm` imported by the file `importer`: (its file, (positional
        parameters, norm-type parameter or "")), if it is a gradient-norm helper
        (engine/grad_norm_helpers.py). The module is each file the import may load from
        `importer` (engine/import_resolution.py: Swin's forks each have their own `utils.py`);
        where several may, all must record the same helper."""
        module, _, name = qname.rpartition(".")
        if not module:
            return None
        if importer:
            from ampmigrate.engine.import_resolution import candidates

            paths = set(candidates(self, os.path.abspath(importer), module))
        else:
            paths = {p for p in (self.module_for(module),) if p}
        records = dict(self._reexported_helper(p, name) for p in paths)
        if not records or any(not r for r in records.values()):
            return None
        shapes = {(tuple(r[0]), r[1]) for r in records.values()}
        if len(shapes) != 1:
            return None
        path = sorted(records)[0]
        positional, norm = next(iter(shapes))
        return path, (list(positional), norm)

    def _reexported_helper(self, path: str, name: str, depth: int = 0) -> Tuple[str, Optional[Tuple[List[str], str]]]:
        """The gradient-norm helper `name` of the file `path`, or of the one module it imports
        `name` from (`utils/__init__.py`: `from .misc import get_grad_norm`), a link or two on:
        (the defining file, its record or None)."""
        summary = self.modules[path]
        record = summary.grad_norm_helpers.get(name)
        if record or depth >= 2:
            return path, record
        sources = {module for module, imported in summary.from_imports if imported == name}
        target = self.module_for(sources.pop()) if len(sources) == 1 else None
        if target is None or target == path:
            return path, None
        return self._reexported_helper(target, name, depth + 1)

    def sibling_module(self, importer: str, dotted: str) -> Optional[str]:
        """The file of the run that `import dotted` finds in the directory of the script
        `importer` (an absolute import only), if there is one."""
        if not dotted or dotted.startswith("."):
            return None
        base = os.path.join(os.path.dirname(os.path.abspath(importer)), *dotted.split("."))
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if candidate in self.modules:
                return candidate
        return None

    def scales_loss(self, path: str) -> bool:
        return bool(self.modules.get(os.path.abspath(path), ModuleSummary()).scales_loss)

    def scaler_made_in(self, path: str, function: str) -> Optional[str]:
        """A file of the run that passes a GradScaler it makes to `function` of the module at
        `path`, which uses one of its parameters as a GradScaler."""
        absolute = os.path.abspath(path)
        summary = self.modules.get(absolute)
        if summary is None or function not in summary.scaler_params:
            return None
        for other in self._importers.get(absolute, ()):
            if any(callee.rpartition(".")[2] == function for callee, _ in self.modules[other].scaler_passed_to):
                return other
        return None

    def apex_amp_passed_from(self, path: str, function: str) -> Optional[str]:
        """A file of the run (`path` itself included) that passes apex's amp module to `function`
        of the module at `path`, which calls `.scale_loss` on one of its parameters."""
        absolute = os.path.abspath(path)
        summary = self.modules.get(absolute)
        if summary is None or function not in summary.apex_amp_params:
            return None
        # The file itself first (`main()` passes the `amp` it imported to `train(..., amp)`).
        for other in (absolute, *self._importers.get(absolute, ())):
            name = function.rpartition(".")[2]  # `Trainer.train` is called as `trainer.train(...)`
            if any(callee.rpartition(".")[2] == name for callee, _ in self.modules[other].apex_amp_passed_to):
                return other
        return None

    def apex_attr(self, attr: str) -> Optional[str]:
        """A file of the run storing apex's amp module in attributes named `attr` when every
        store to such an attribute anywhere in the run is that module or None (and no file sets
        attributes by computed name): engine/apex_attrs.py."""
        memo = self.__dict__.setdefault("_apex_attrs", {})
        if attr not in memo:
            origin = None
            stores = self._attr_stores()
            for path in sorted(stores):
                kinds = set(stores[path].get(attr, ())) | set(stores[path].get("*", ()))
                if "other" in kinds:
                    origin = None
                    break
                if "apex" in kinds and origin is None:
                    origin = path
            memo[attr] = origin
        return memo[attr]

    def apex_attr_files(self, attr: str) -> Dict[str, Tuple[bool, bool]]:
        """{file: (stores apex's amp module in `.attr`, reads `.attr.<apex function>`)} for the
        files of the run doing either (engine/apex_attrs.py)."""
        found: Dict[str, Tuple[bool, bool]] = {}
        stores = self._attr_stores()
        for path, summary in self.modules.items():
            stored = "apex" in stores.get(path, {}).get(attr, ())
            loaded = attr in summary.apex_attr_loads
            if stored or loaded:
                found[path] = (stored, loaded)
        return found

    def imports_file(self, importer: str, path: str) -> bool:
        """Whether the file `importer` imports the module of the file `path` (directly)."""
        return os.path.abspath(importer) in self._importers.get(os.path.abspath(path), ())

    def apex_attrs_key(self) -> str:
        """The part of every file's cache key that `apex_attr` answers depend on ("" when no file
        stores apex's module in an attribute)."""
        memo = self.__dict__.setdefault("_apex_attrs", {})
        if "key" not in memo:
            stores = self._attr_stores()
            text = repr(sorted((p, r) for p, r in stores.items() if r)) if stores else ""
            if text:  # and what `apex_attr_files` / `imports_file` answer for them (_amp_carrier.py)
                readers = sorted((p, s.apex_attr_loads) for p, s in self.modules.items() if s.apex_attr_loads)
                involved = set(stores) | {p for p, _ in readers}
                links = sorted((p, sorted(set(self._importers.get(p, ())) & involved)) for p in involved)
                text += repr(readers) + repr(links)
            memo["key"] = hashlib.blake2b(text.encode(), digest_size=8).hexdigest() if text else ""
        return memo["key"]

    def _attr_stores(self) -> Dict[str, Dict[str, List[str]]]:
        """{file: its attribute-store records}, or {} when no file of the run stores apex's module
        in an attribute. The files without apex are parsed for their records only then (most
        runs have no such store, and the byte test passes many files: `.timestamp)`, `setattr(`)."""
        memo = self.__dict__.setdefault("_apex_attrs", {})
        if "stores" not in memo:
            stores: Dict[str, Dict[str, List[str]]] = {}
            recorded = {p: s.apex_attr_stores for p, s in self.modules.items() if s.apex_attr_stores}
            if any("apex" in kinds for record in recorded.values() for kinds in record.values()):
                stores.update(recorded)
                for path, summary in self.modules.items():
                    if summary.apex_attr_candidate:
                        record = _attr_stores(source_tree(self, path))
                        if record:
                            stores[path] = record
            memo["stores"] = stores
        return memo["stores"]

    def star_bound(self, path: str) -> Dict[str, str]:
        """{name: "apex.amp"}: the names the star imports of the file at `path` bind to apex's amp
        module (engine/apex_star.py); what engine/names.py resolves a name bound nowhere to."""
        return star_bound(self, path)

    def content_hash(self, path: str) -> Optional[str]:
        """`cache.content_hash` of the bytes of the file at `path` as `build` read them, if it did
        (within the size limit, readable): the runner's cache lookup need not read it again."""
        return self.digests.get(os.path.abspath(path))

    def apex_amp_callees(self, path: str) -> FrozenSet[str]:
        """Last parts of the callees that the file at `path` and the files importing it hand
        apex's amp module to (`scheduler.save_checkpoint` -> `save_checkpoint`)."""
        absolute = os.path.abspath(path)
        if absolute not in self.modules:
            return frozenset()
        return frozenset(
            callee.rpartition(".")[2]
            for other in (absolute, *self._importers.get(absolute, ()))
            for callee, *_ in self.modules[other].apex_amp_args
        )

    def apex_amp_state_passed_from(
        self, path: str, function: str, params: List[Tuple[str, int]]
    ) -> Optional[Tuple[str, List[str]]]:
        """(a file of the run, `path` itself included, the parameters) when that file hands apex's
        amp module, by keyword or position, to one of `params` ((name, position or -1): what
        `function` of the module at `path` uses only to save or restore amp's state,
        engine/apex_values.py `apex_state_params`)."""
        absolute = os.path.abspath(path)
        if absolute not in self.modules or not params:
            return None
        name = function.rpartition(".")[2]
        shift = 1 if "." in function else 0  # `obj.method(a, b)`: `a` is the parameter after `self`
        for other in (absolute, *self._importers.get(absolute, ())):
            matched = sorted(
                {
                    param
                    for callee, _, position, keyword in self.modules[other].apex_amp_args
                    if callee.rpartition(".")[2] == name and (not shift or "." in callee)
                    for param, index in params
                    if keyword == param or (not keyword and position >= 0 and index == position + shift)
                }
            )
            if matched:
                return other, matched
        return None

    def apex_state_param_target(
        self, path: str, callee: str, position: int, keyword: str
    ) -> Optional[Tuple[str, str, str]]:
        """(file, function or "Class.method", parameter): the one function of another file of the
        run that `path` imports whose parameter, used only for amp's state (engine/apex_values.py
        `apex_state_params`), takes the argument at `position` (or `keyword`) of a call of
        `callee` as written (`load_checkpoint`, `state.track_amp_state`, `Model.serialize`); None
        when no function fits, or several (the name alone cannot tell them apart). A method
        called on a name (`state.track_amp_state(amp)`) takes positions after `self`; a static
        method or a class method is matched by keyword only."""
        absolute = os.path.abspath(path)
        name = callee.rpartition(".")[2]
        on_object = "." in callee
        found: List[Tuple[str, str, str]] = []
        for other, importers in sorted(self._importers.items()):
            if other == absolute or absolute not in importers:
                continue
            tree = source_tree(self, other)
            if tree is None:
                continue
            state_params = None
            for owner, function in top_functions(tree):
                if function.name != name or bool(owner) != on_object:
                    continue
                decorated = any(isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod") for d in function.decorator_list)
                shift = 1 if owner else 0  # `self` takes the first position of a method
                if state_params is None:  # the file's, relays to its other functions included
                    memo = self.__dict__.setdefault("_apex_state_params", {})
                    if other not in memo:
                        memo[other] = apex_state_params(tree)
                    state_params = memo[other]
                for param, index in state_params.get(f"{owner}.{function.name}" if owner else function.name, []):
                    by_position = not keyword and position >= 0 and index == position + shift and not decorated
                    if keyword == param or by_position:
                        found.append((other, f"{owner}.{name}" if owner else name, param))
        return found[0] if len(found) == 1 else None

    def apex_train_param_target(self, path: str, callee: str, position: int, keyword: str) -> Optional[Tuple[str, str, str]]:
        """(file, function, parameter): the one top-level function of another file of the run
        that `path` imports and that calls `.scale_loss(...)` on the parameter taking the argument
        at `position` (or `keyword`) of a call of `callee` as written (`train_one_epoch(...,
        amp)`, `utils.train(..., amp=amp)`); None when no function fits, or several."""
        absolute = os.path.abspath(path)
        name = callee.rpartition(".")[2]
        found: List[Tuple[str, str, str]] = []
        for other, importers in sorted(self._importers.items()):
            if other == absolute or absolute not in importers:
                continue
            params = self.modules[other].apex_amp_params.get(name)
            if not params:
                continue
            tree = source_tree(self, other)
            function = next(
                (f for owner, f in top_functions(tree) if not owner and f.name == name), None
            ) if tree is not None else None
            if function is None:
                continue
            positional = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
            for param in params:
                if keyword == param or (not keyword and 0 <= position < len(positional) and positional[position] == param):
                    found.append((other, name, param))
        return found[0] if len(found) == 1 else None

    def cast_registrations_elsewhere(self, path: str) -> List[Tuple[str, str, int]]:
        """apex.amp cast registrations autocast would not honour, in the other files of the run:
        (the file, relative; the call; its line), in path order."""
        absolute = os.path.abspath(path)
        return [
            (self.relative(other), code, line)
            for other, summary in sorted(self.modules.items())
            if other != absolute
            for code, line in summary.apex_cast_registrations
        ]

    def importers_of(self, path: str) -> Tuple[str, ...]:
        """The files of the run that may import the module at `path` (by any of its names, not
        only the imports the apex records keep)."""
        from ampmigrate.engine.import_resolution import importers

        return tuple(other for other, _ in importers(self, os.path.abspath(path)))

    def imported_from(self, path: str) -> FrozenSet[str]:
        """Names files of the run import from the module at `path` (`from .x import name` counts)."""
        names: Set[str] = set()
        for module in self.module_names(path):
            names |= self._exports.get(module, set())
        return frozenset(names)

    def dependency_key(self, path: str) -> str:
        """What of the index a file's result may depend on, as a short hash ("" if nothing)."""
        absolute = os.path.abspath(path)
        summary = self.modules.get(absolute)
        parts: List[str] = []
        if summary is not None:
            for spec in summary.imports:
                other = self.module_for(spec)
                for target in sorted(self._spec_targets(absolute, spec, other)):
                    for label, field in _QUERIED_RECORDS:
                        value = getattr(self.modules[target], field)
                        if value:
                            parts.append(f"{spec}{label}={sorted(value.items()) if isinstance(value, dict) else value}")
                if not self._grad_norm_files:  # the usual case: no sibling to look for
                    continue
                for near in sorted((self._spec_targets(absolute, spec, other) | {self.sibling_module(absolute, spec)}) - {None}):
                    if near != absolute and self.modules[near].grad_norm_helpers:
                        parts.append(f"{spec}:gradnorm={sorted(self.modules[near].grad_norm_helpers.items())}")
                    if near != absolute:  # helpers a package re-exports (`_reexported_helper`)
                        for module, name in self.modules[near].from_imports:
                            target = self.module_for(module) if name else None
                            record = self.modules[target].grad_norm_helpers.get(name) if target else None
                            if record:
                                parts.append(f"{spec}:gradnorm:{module}.{name}={record}")
            # timm's scaler followed into the files it imports (rules/apex/_timm_remote.py), and the
            # bodies of other files' code called between the scaled backward and the step
            # (rules/apex/_remote_grad_reads.py)
            if summary.apex_initializes or summary.apex_step_functions or summary.apex_amp_params:
                for spec in sorted(set(summary.imports) | set(summary.star_imports)):
                    other = self.module_for(spec)
                    if other is not None and other != absolute:
                        parts.append(f"{spec}:apex_callee={self.digests.get(other, '')}")
                        if self.modules[other].apex_amp_params:  # its other callers decide too (_passed_training.py)
                            for caller in self.importers_of(other):
                                parts.append(f"{spec}:apex_callee_caller={self.digests.get(caller, '')}")
            if summary.apex_initializes:  # its functions gaining a scaler: who calls them (_threaded_importers.py)
                for caller in self.importers_of(absolute):
                    parts.append(f"apex_init_importer={self.digests.get(caller, '')}")
                registrations = self.cast_registrations_elsewhere(absolute)
                if registrations:  # they make its migration unsafe (_amp_migration.py)
                    parts.append(f"apex_cast_registrations={registrations}")
            if summary.apex_amp_params:  # the files handing it apex's amp module plan with it
                for caller in self.importers_of(absolute):
                    parts.append(f"apex_amp_caller={self.digests.get(caller, '')}")
        exported = self.imported_from(absolute)
        if exported:
            parts.append("exports=" + ",".join(sorted(exported)))
        for name, trainer in sorted(self._trained_names.get(absolute, {}).items()):
            parts.append(f"trained:{name}={trainer}:{self.modules[trainer].scales_loss}")
        for name, trainer in sorted(self._trained_results.get(absolute, {}).items()):
            parts.append(f"trained_result:{name}={trainer}")
        attrs = self.apex_attrs_key()
        if attrs:
            parts.append(f"apex_attrs={attrs}")
        stars = star_key(self, absolute) if summary is not None and summary.star_imports else ""
        if stars:
            parts.append(f"apex_star={stars}")
        users = provider_key(self, absolute) if summary is not None and summary.apex_star_exports else ""
        if users:
            parts.append(f"apex_star_users={users}")
        inherited = base_class_key(self, absolute)
        if inherited:
            parts.append(f"apex_base_class={inherited}")
        owned = owned_key(self, absolute)
        if owned:
            parts.append(f"apex_owned_optimizer={owned}")
        threading = threading_key(self, absolute)
        if threading:
            parts.append(f"apex_threading={threading}")
        setup = setup_key(self, absolute)
        if setup:
            parts.append(f"apex_setup_helper={setup}")
        helpers = state_key(self, absolute)
        if helpers:
            parts.append("apex_checkpoint=" + hashlib.blake2b(helpers.encode(), digest_size=8).hexdigest())
        runner = self.backward_runner_imported(absolute)
        if runner:
            parts.append(f"backward_runner={runner}")
        for other in self._importers.get(absolute, ()):
            if self.modules[other].scaler_passed_to:
                parts.append(f"scaler_from={other}:{self.modules[other].scaler_passed_to}")
            if self.modules[other].apex_amp_passed_to:
                parts.append(f"apex_amp_from={other}:{self.modules[other].apex_amp_passed_to}")
            if self.modules[other].apex_amp_args:
                parts.append(f"apex_amp_args={other}:{self.modules[other].apex_amp_args}")
        if not parts:
            return ""
        return hashlib.blake2b("\n".join(parts).encode(), digest_size=8).hexdigest()

    def _spec_targets(self, importer: str, spec: str, loose: Optional[str]) -> Set[str]:
        """Every other file the queries may take `spec` (imported by `importer`) to name: the
        loose match and, where the name fits several files, the ones Python may find."""
        targets = {loose} if loose is not None else set()
        if _ambiguous(self._by_name, spec):
            from ampmigrate.engine.import_resolution import candidates

            targets.update(candidates(self, importer, spec))
        return targets - {importer}

    def backward_runner_imported(self, path: str) -> Optional[str]:
        """The file of the run defining a class whose `__call__` runs `.backward()` that the module at
        `path` imports by name (`from util.misc import NativeScalerWithGradNormCount`), if any."""
        summary = self.modules.get(os.path.abspath(path))
        for module, name in summary.from_imports if summary is not None else ():
            target = self.module_for(module)
            if target is not None and name in self.modules[target].backward_runners:
                return target
        return None

    def relative(self, path: str) -> str:
        try:
            return Path(path).relative_to(self.root).as_posix()
        except ValueError:
            return os.path.basename(path)


# ---------------------------------------------------------------------------------- reading
def _ambiguous(by_name: Dict[str, List[str]], dotted: str) -> bool:
    """Whether the name fits several files of the run, and is not the standard library's
    (`import io` beside a package's own `io/`: the loose match's answer, none, stays)."""
    dotted = dotted.lstrip(".")
    return len(by_name.get(dotted, ())) > 1 and dotted.partition(".")[0] not in _STDLIB


_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))


# The records of an imported file that the queries above read for the importer: its cache key holds them.
_QUERIED_RECORDS = (
    ("", "clip_helpers"), (":savers", "checkpoint_savers"), (":scalers", "scaler_param_uses"),
    (":apex_getters", "apex_amp_getters"), (":state_loaders", "state_loaders"), (":fft", "fft_helpers"),
)
# The top-level functions those records name (and the gradient-norm helpers): what a star import
# of the file must resolve for the queries to find them (engine/apex_star.helper_names).
HELPER_RECORDS = tuple(field for _, field in _QUERIED_RECORDS) + ("grad_norm_helpers",)


def is_test_file(path: str) -> bool:
    """`test_*.py`, `*_test.py`, `conftest.py`: code that exercises float16 on purpose."""
    name = os.path.basename(path)
    return name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"


def _read(path: str, max_size: int) -> Optional[bytes]:
    """The one place the index reads a file: unreadable or oversized files are left out (the
    per-file pass reports them)."""
    try:
        return read_regular_file(path, max_size or None)  # never blocks on a FIFO or reads a device
    except SourceError:  # FileTooLarge included
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
        # `dumps` runs the C encoder in one go; `dump` streams through the Python one (5x slower).
        text = json.dumps({"format": _FORMAT, "modules": {p: list(e) for p, e in modules.items()}})
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, cache_path)
    except OSError:
        pass  # a read-only cache directory: go without


# ---------------------------------------------------------------------------------- one module
# Byte tests first: most files of a framework tree say none of these, and only the files that
# may define a clip helper or pass a GradScaler are parsed (with `ast`, once). What a summary
# holds is defined by these regexes; the substring tests and `_line_matches` below only find
# the same answers faster (tests/test_project_index_shortcuts.py compares them over real trees).
_TRAINS = re.compile(rb"\.backward\(|GradScaler\(|def[ \t]+training_step\b")
_NEEDS_AST = re.compile(rb"clip_grad_(?:norm|value)|\.scale\(|GradScaler\(")
_IMPORT = re.compile(rb"^[ \t]*import[ \t]+([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*)", re.MULTILINE)
_FROM = re.compile(rb"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)", re.MULTILINE)
_TRAINING_STEP = re.compile(rb"def[ \t]+training_step\b")
# A whole `import a.b as c, d` line (with backslash continuations), for `module_imports`.
_IMPORT_LINE = re.compile(rb"^[ \t]*import[ \t]+([^\n#;]*(?:\\\n[^\n#;]*)*)", re.MULTILINE)
# Where a `def __call__` may be (any whitespace or line continuation between the two tokens).
_DEF_CALL = re.compile(rb"def[\s\\]+__call__")
# `from apex import amp` (`from .apex`, continuations) or `import apex.amp as x`: an over-approximation.
_APEX_AMP_IMPORT = re.compile(rb"from[\s\\.]+apex[\s\\]+import|apex[\s\\]*\.[\s\\]*amp")


def summarize(raw: bytes, package: str, shortcuts: bool = True, *, test_file: bool = False) -> ModuleSummary:
    """What the file with bytes `raw` does for training. `shortcuts=False` takes the long way
    (every regex run over the whole file, every parse made): the answer is the same. A test file
    (`test_file`) gets no records for the precision rules, which never report on test code:
    builders it trains, checkpoint helpers, scaler parameters, FFT helpers."""
    summary = ModuleSummary()
    stars: List[str] = []
    from_imports = _from_imports(raw, package, shortcuts, stars) if b"import" in raw else []
    summary.from_imports = [(module, name) for module, name in from_imports if name]
    if b"import" in raw:
        _note_imports(raw, stars, summary, shortcuts)
    if shortcuts:
        needs_ast = (
            b"clip_grad_norm" in raw or b"clip_grad_value" in raw or b".scale(" in raw or b"GradScaler(" in raw
        )
        summary.trains = (
            b".backward(" in raw
            or b"GradScaler(" in raw
            or (b"training_step" in raw and _TRAINING_STEP.search(raw) is not None)
        )
    else:
        needs_ast = _NEEDS_AST.search(raw) is not None
        summary.trains = _TRAINS.search(raw) is not None
    # A substring test first: the regex alone (no literal prefix) doubles the index's time.
    needs_apex = (b"apex" in raw or b".scale_loss(" in raw) and _APEX_AMP.search(raw) is not None
    tree: Optional[ast.Module] = None
    parsed = False

    def parse() -> Optional[ast.Module]:  # one parse for every use below
        nonlocal tree, parsed
        if not parsed:
            parsed = True
            try:
                tree = ast.parse(raw)
            except (SyntaxError, ValueError, MemoryError, RecursionError):
                tree = None
        return tree

    if b"amp" in raw:
        summary.apex_attr_loads = apex_attr_loads(raw)
    if attr_stores_wanted(raw):
        if b"apex" in raw:  # only a file importing apex can store apex's module
            tree_for_attrs = parse()
            summary.apex_attr_stores = _attr_stores(tree_for_attrs) if tree_for_attrs is not None else {}
        else:
            summary.apex_attr_candidate = True
    if summary.trains and b"__call__" in raw and b".backward(" in raw:
        if not shortcuts or not raw.isascii() or _may_define_backward_runner(raw):
            summary.backward_runners = _backward_runners(parse())
    if b"fft" in raw and not test_file:
        summary.fft_helpers = _fft_helpers(parse())
    if b".grad" in raw and b"norm" in raw:
        if not shortcuts or not raw.isascii() or _may_define_grad_norm_helper(raw):
            summary.grad_norm_helpers = grad_norm_helpers(parse())
    needs_savers = not test_file and b"state_dict()" in raw and _SAVES.search(raw) is not None
    needs_scaler_params = not test_file and b"caler" in raw and _SCALER_PARAM.search(raw) is not None
    needs_loaders = not test_file and b".load_state_dict(" in raw and b"**" in raw and b".items()" in raw
    if not (summary.trains or needs_ast or needs_apex or needs_savers or needs_scaler_params or needs_loaders):
        return summary
    summary.imports = _imports(raw, from_imports, shortcuts)
    # A training file that builds something it imported and trains it (AMP409 across files).
    needs_results = (
        not test_file and summary.trains and bool(summary.from_imports) and _TRAINS_A_RESULT.search(raw) is not None
    )
    if needs_results and shortcuts and raw.isascii():
        needs_results = _may_train_a_result(raw, summary.from_imports)
    others = needs_results or needs_savers or needs_scaler_params or needs_loaders  # records the shortcuts below do not cover
    if not (needs_ast or needs_apex or others):
        return summary
    if shortcuts and raw.isascii():
        # Only a file that spells what a record needs can have one: in an ASCII file every
        # identifier `ast` reports is spelled as is (elsewhere NFKC may join other spellings).
        needs_ast = needs_ast and _may_record_scaler_or_clip(raw)
        if needs_savers and not _may_define_checkpoint_saver(raw):
            needs_savers = False
            others = needs_results or needs_scaler_params or needs_loaders
        needs_apex = needs_apex and (b"scale_loss" in raw or _APEX_AMP_IMPORT.search(raw) is not None)
        if not (needs_ast or needs_apex or others):
            return summary
    if parse() is None:
        return summary
    try:
        if needs_ast:
            _Summarizer(summary).run(tree)
        if needs_apex:
            _summarize_apex_amp(tree, summary)
            summarize_threading(tree, summary)
            summarize_checkpoint(tree, summary)
            summary.apex_amp_getters = apex_amp_getters(tree)
            summary.apex_amp_args = apex_amp_args(tree, _dotted)
            summary.apex_star_exports = apex_star_exports(tree)
            summary.apex_cast_registrations = cast_registrations(tree)
        if needs_results:
            summary.trained_results = _trained_results(tree, summary.from_imports, raw)
        if needs_savers:
            summary.checkpoint_savers = _checkpoint_savers(tree, raw)
        if needs_scaler_params:
            summary.scaler_param_uses = _scaler_param_uses(tree)
        if needs_loaders:
            summary.state_loaders = state_loaders(tree)
    except RecursionError:
        return ModuleSummary(
            trains=summary.trains, imports=summary.imports, from_imports=summary.from_imports,
            module_imports=summary.module_imports, star_imports=summary.star_imports, edits_sys_path=summary.edits_sys_path,
        )
    return summary


_TRAINS_A_RESULT = re.compile(rb"\.(?:named_)?parameters\(|\.train\(")
# Optimizer constructors by their last dotted part (`torch.optim.AdamW`, `optim.SGD`, `bnb.optim.Adam8bit`).
_OPTIMIZER_NAME = re.compile(r"(?:Adam|SGD|RMSprop|Adagrad|Adadelta|Adamax|Lamb|LAMB|Lion|Adafactor|LARS|NovoGrad|Lars)")


_BUILT = re.compile(rb"(?:^|;)[ \t]*(\w+)[ \t]*=(?:[ \t]|\\\n)*(\w+)[ \t]*\(", re.MULTILINE)
# `.parameters(` / `.train(`: the literal dot first (a leading `(\w+)` would be tried at every
# position); the receiver's name is read backwards from it (`_receiver`).
_TRAINED = re.compile(rb"\.(?:\s|\\)*(?:named_parameters|parameters|train)(?:\s|\\)*\(")
_NAME_END = re.compile(rb"\w+$")


def _receiver(raw: bytes, dot: int) -> bytes:
    """The identifier before the `.` at `dot` (skipping whitespace and continuations)."""
    end = dot
    while end > 0 and raw[end - 1 : end] in (b" ", b"\t", b"\n", b"\r", b"\\", b"\x0c"):
        end -= 1
    match = _NAME_END.search(raw, max(0, end - 256), end)
    return match.group(0) if match is not None else b""


def _may_train_a_result(raw: bytes, from_imports: List[Tuple[str, str]]) -> bool:
    """False when no name is both assigned the call of a name imported by name (`model =
    build_model(...)`) and given to training (`model.parameters(`, `model.train(`): then
    `_trained_results` records nothing (an ASCII file: every identifier is spelled as is)."""
    imported = {name.encode() for _, name in from_imports}
    built = {m.group(1) for m in _BUILT.finditer(raw) if m.group(2) in imported}
    return bool(built) and any(_receiver(raw, m.start()) in built for m in _TRAINED.finditer(raw))


def _trained_results(tree: ast.Module, from_imports: List[Tuple[str, str]], raw: bytes) -> List[str]:
    """"module.name" for each builder imported by name (`from models import build_model`) whose
    result is trained later in the same function (or the module body): `model = build_model(...)`,
    then `model.train()` or an optimizer over `model.parameters()`. Only the statements on lines
    where the byte regexes see such an assignment or use are looked into."""
    imported = {name: module for module, name in from_imports if name}
    assigned = {m.group(1) for m in _BUILT.finditer(raw) if m.group(2).decode("utf-8", "replace") in imported}
    lines = _line_numbers(raw)
    use_lines = {lines(m.start()) for m in _TRAINED.finditer(raw) if _receiver(raw, m.start()) in assigned}
    built: Dict[int, Dict[str, Tuple[str, int]]] = {}  # body -> local name -> (builder, line)
    uses: Dict[int, List[Tuple[str, int]]] = {}  # body -> (local name, line) of a training use

    def visit(statements: List[ast.stmt], owner: Optional[int]) -> None:
        for statement in statements:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(statement.body, id(statement))
                continue
            if isinstance(statement, ast.ClassDef):
                visit(statement.body, None)  # class bodies belong to no function
                continue
            if owner is not None:
                if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
                    value = statement.value
                    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in imported:
                        built.setdefault(owner, {})[statement.targets[0].id] = (
                            f"{imported[value.func.id]}.{value.func.id}",
                            statement.lineno,
                        )
                end = getattr(statement, "end_lineno", statement.lineno) or statement.lineno
                if any(statement.lineno <= line <= end for line in use_lines):
                    for node in _header_nodes(statement):
                        _note_training_use(node, owner, uses)
            for field_name, value in ast.iter_fields(statement):
                if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                    visit(value, owner)
                elif isinstance(value, list) and value and isinstance(value[0], (ast.ExceptHandler, ast.match_case)):
                    for part in value:
                        visit(part.body, owner)

    visit(tree.body, 0)
    found: Set[str] = set()
    for owner, trained in uses.items():
        local = built.get(owner, {})
        for name, line in trained:
            if name in local and local[name][1] < line:
                found.add(local[name][0])
    return sorted(found)


def _header_nodes(statement: ast.stmt):
    """The expression nodes of a statement, not those of the statements inside it (nor lambdas)."""
    stack: List[ast.AST] = []
    for value in (v for _, v in ast.iter_fields(statement)):
        items = value if isinstance(value, list) else [value]
        stack.extend(i for i in items if isinstance(i, ast.AST) and not isinstance(i, (ast.stmt, ast.ExceptHandler, ast.match_case)))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Lambda):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _note_training_use(node: ast.AST, owner: int, uses: Dict[int, List[Tuple[str, int]]]) -> None:
    if not isinstance(node, ast.Call):
        return
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "train" and isinstance(func.value, ast.Name):
        if all(isinstance(a, ast.Constant) and a.value is True for a in node.args):
            uses.setdefault(owner, []).append((func.value.id, node.lineno))
    elif node.args and _is_optimizer_class(_dotted(func).rpartition(".")[2]):
        first = node.args[0]
        if (
            isinstance(first, ast.Call)
            and isinstance(first.func, ast.Attribute)
            and first.func.attr in ("parameters", "named_parameters")
            and isinstance(first.func.value, ast.Name)
        ):
            uses.setdefault(owner, []).append((first.func.value.id, node.lineno))


def _line_numbers(raw: bytes):
    """offset -> 1-based line number of `raw`."""
    import bisect

    starts = [0] + [m.end() for m in re.finditer(rb"\n", raw)]
    return lambda offset: bisect.bisect_right(starts, offset)


_SAVES = re.compile(rb"\bsave\w*\(")
# A `def` whose parameters may include a scaler-like name.
_SCALER_PARAM = re.compile(rb"def[ \t]+\w+[ \t]*\([^)]*scaler", re.IGNORECASE)


def _scaler_param_uses(tree: ast.Module) -> Dict[str, Tuple[List[str], Dict[str, List[str]]]]:
    found: Dict[str, Tuple[List[str], Dict[str, List[str]]]] = {}
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = node.args
        positional = [a.arg for a in [*args.posonlyargs, *args.args]]
        wanted = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if "scaler" in a.arg.lower()}
        if not wanted:
            continue
        uses: Dict[str, Set[str]] = {name: set() for name in wanted}
        receivers: Set[int] = set()
        tests: Set[int] = set()
        for inner in ast.walk(node):
            if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) and inner.value.id in wanted:
                receivers.add(id(inner.value))
                uses[inner.value.id].add(inner.attr)
            elif isinstance(inner, (ast.If, ast.IfExp, ast.While, ast.Assert)) and isinstance(inner.test, ast.Name):
                tests.add(id(inner.test))
            elif isinstance(inner, ast.Compare) and isinstance(inner.left, ast.Name) and all(
                isinstance(c, ast.Constant) and c.value is None for c in inner.comparators
            ):
                tests.add(id(inner.left))  # `scaler is not None`
            elif isinstance(inner, ast.BoolOp):
                tests.update(id(v) for v in inner.values if isinstance(v, ast.Name))
        for inner in ast.walk(node):
            if isinstance(inner, ast.Name) and inner.id in wanted and isinstance(inner.ctx, ast.Load):
                if id(inner) not in receivers and id(inner) not in tests:
                    uses[inner.id].add("*")
            elif isinstance(inner, ast.Name) and inner.id in wanted and isinstance(inner.ctx, ast.Store):
                uses[inner.id].add("*")
        found[node.name] = (positional, {name: sorted(methods) for name, methods in uses.items()})
    return found


def _checkpoint_savers(tree: ast.Module, raw: bytes) -> Dict[str, Tuple[List[str], List[str]]]:
    """Top-level functions that call a `*save*` function and `.state_dict()` on some of their
    parameters, and on nothing that looks like a scaler (a name or attribute containing
    "scaler"): {name: (positional parameters, the parameters whose state they save)}."""
    found: Dict[str, Tuple[List[str], List[str]]] = {}
    lines = _line_numbers(raw)
    state_lines = [lines(m.start()) for m in re.finditer(rb"state_dict", raw)]
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        end = getattr(node, "end_lineno", None) or node.lineno
        if not any(node.lineno <= line <= end for line in state_lines):
            continue  # no `state_dict` in its text: nothing it could save
        positional = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
        saved: Set[str] = set()
        saves = scaler = False
        for inner in ast.walk(node):
            if not isinstance(inner, ast.Call):
                continue
            func = inner.func
            last = _dotted(func).rpartition(".")[2] if isinstance(func, (ast.Name, ast.Attribute)) else ""
            if "save" in last.lower():
                saves = True
            if isinstance(func, ast.Attribute) and func.attr == "state_dict":
                owner = _dotted(func.value)
                if "scaler" in owner.lower():
                    scaler = True
                elif owner in positional:
                    saved.add(owner)
        if saves and saved and not scaler:
            found[node.name] = (positional, sorted(saved))
    return found


def _is_optimizer_class(name: str) -> bool:
    return name[:1].isupper() and _OPTIMIZER_NAME.search(name) is not None


def _fft_helpers(tree: Optional[ast.Module]) -> Dict[str, str]:
    """Top-level functions calling `*.stft`/`*.istft`/`*fft.*` on an input that is not `.float()`."""
    if tree is None:  # not Python
        return {}
    found: Dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in ast.walk(node):
            if not (isinstance(inner, ast.Call) and inner.args):
                continue
            name = _dotted(inner.func)
            last = name.rpartition(".")[2]
            if not (last in ("stft", "istft") or ".fft." in f".{name}" and name.split(".")[-2:-1] == ["fft"]):
                continue
            first = inner.args[0]
            if isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute) and first.func.attr == "float":
                continue
            found.setdefault(node.name, name)
    return found


def _may_record_scaler_or_clip(raw: bytes) -> bool:
    """False when `_Summarizer` cannot record anything in this (ASCII) file. A clip helper needs
    a clip function called as an attribute of `...utils` or `...clip_grad`
    (`torch.nn.utils.clip_grad_norm_(...)`) or imported from `torch.nn.utils`; a GradScaler
    parameter and `scales_loss` need `<x>.scale(loss).backward()`, or a `GradScaler(...)` call
    (which a GradScaler passed on needs too). Between tokens: any whitespace, continuation,
    comment (inside brackets) or closing parenthesis (`(torch.nn.utils).clip_grad_norm_`)."""
    if b"GradScaler" in raw:
        return True
    if (b"clip_grad_norm" in raw or b"clip_grad_value" in raw) and b"utils" in raw:
        if _CLIP_ATTRIBUTE.search(raw) is not None or _CLIP_IMPORT.search(raw) is not None:
            return True
    return b"scale" in raw and b"backward" in raw and _SCALE_CALL.search(raw) is not None


# Between two tokens of one expression: whitespace, continuations, comments (inside brackets),
# and for `_GAP_CLOSE` closing parentheses (`(torch.nn.utils).clip_grad_norm_`). A comment runs to
# its line's end (the lookahead: a `#` inside one cannot start another) and leaves the line break
# to `\s`: each character of a gap then has one reading, so a failed match backtracks linearly.
# (Ending the comment with `\r\n?` let a CRLF break be read as one or as two characters, and a
# run of commented-out CRLF lines took exponential time.)
_COMMENT = rb"#[^\r\n]*(?=[\r\n]|$)"
_GAP = rb"(?:[\s\\]|" + _COMMENT + rb")*"
_GAP_CLOSE = rb"(?:[\s\\)]|" + _COMMENT + rb")*"
_CLIP_ATTRIBUTE = re.compile(rb"(?:utils|clip_grad)" + _GAP_CLOSE + rb"\." + _GAP + rb"clip_grad_(?:norm|value)")
_CLIP_IMPORT = re.compile(rb"from[\s\\.]+torch[\s\\]*\.[\s\\]*nn[\s\\]*\.[\s\\]*utils")
_SCALE_CALL = re.compile(rb"\." + _GAP + rb"scale" + _GAP_CLOSE + rb"\(")


# engine/grad_norm_helpers.py's helpers: a top-level `def` (at a line's start: a top-level
# statement is never indented; form feeds aside), an attribute `grad` (`q.grad`), a call of
# `norm` (`q.grad.norm(t)`, `torch.norm(...)`, also as `(q.grad.norm)(t)`).
_TOP_DEF = re.compile(rb"(?:^|[\r\n])\x0c*def[\s\\]")
_GRAD_ATTRIBUTE = re.compile(rb"\." + _GAP + rb"grad\b")
_NORM_CALL = re.compile(rb"\bnorm" + _GAP_CLOSE + rb"\(")
# Each helper holds `q.grad[.data|.detach()].norm(t)` (the loop's form: `grad`, then `.norm`, only
# `.data`, `.detach()`, closing parentheses and gaps between) or calls `torch.stack` (torch's form).
_GRAD_DOT_NORM = re.compile(
    rb"grad" + _GAP_CLOSE
    + rb"(?:\." + _GAP + rb"data" + _GAP_CLOSE + rb"|\." + _GAP + rb"detach" + _GAP_CLOSE + rb"\(" + _GAP + rb"\)" + _GAP_CLOSE + rb")?"
    + rb"\." + _GAP + rb"norm\b"
)


def _may_define_grad_norm_helper(raw: bytes) -> bool:
    """False when this (ASCII) file cannot define a gradient-norm helper (each identifier of
    an ASCII file is spelled as `ast` reports it)."""
    return (
        _NORM_CALL.search(raw) is not None
        and _GRAD_ATTRIBUTE.search(raw) is not None
        and _TOP_DEF.search(raw) is not None
        and (b"stack" in raw or _GRAD_DOT_NORM.search(raw) is not None)
    )


# `_checkpoint_savers`: a top-level function (`def` or `async def` at a line's start) calling
# `<name>.state_dict()` on a name (one of its parameters), not on an attribute (`self.m`).
_TOP_FUNCTION = re.compile(rb"(?:^|[\r\n])\x0c*(?:async[\s\\]+)?def[\s\\]")
_NAME_STATE_DICT = re.compile(rb"(?<![\w.])\w+" + _GAP_CLOSE + rb"\." + _GAP + rb"state_dict\b")


def _may_define_checkpoint_saver(raw: bytes) -> bool:
    """False when this (ASCII) file cannot define a checkpoint saver."""
    return _TOP_FUNCTION.search(raw) is not None and _NAME_STATE_DICT.search(raw) is not None


def _may_define_backward_runner(raw: bytes) -> bool:
    """False when no `def __call__` of this (ASCII) file is followed by the word `backward`."""
    found = _DEF_CALL.search(raw)
    return found is not None and raw.find(b"backward", found.end()) != -1


def _line_matches(pattern: "re.Pattern[bytes]", keyword: bytes, raw: bytes):
    """`pattern.finditer(raw)` for a MULTILINE pattern that starts `^[ \t]*<keyword>`, found by
    a substring search for `keyword` (the regex alone has no literal to skip ahead with): a match
    starts at the start of a line whose first word is `keyword`, and after the previous match."""
    end = 0
    at = raw.find(keyword)
    while at != -1:
        start = raw.rfind(b"\n", 0, at) + 1
        if start >= end and not raw[start:at].strip(b" \t"):
            match = pattern.match(raw, start)
            if match is not None:
                yield match
                end = match.end()
        at = raw.find(keyword, at + 1)


def _imports(raw: bytes, from_imports: List[Tuple[str, str]], shortcuts: bool = True) -> List[str]:
    """Modules a file imports (and `module.name` for each name imported from one), by regex."""
    found: Set[str] = set()
    for match in _line_matches(_IMPORT, b"import", raw) if shortcuts else _IMPORT.finditer(raw):
        for part in match.group(1).decode("utf-8", "replace").split(","):
            found.add(part.strip())
    for module, name in from_imports:
        found.add(module)
        if name:
            found.add(f"{module}.{name}")
    return sorted(found)


def _note_imports(raw: bytes, stars: List[str], summary: ModuleSummary, shortcuts: bool) -> None:
    """`module_imports`, `star_imports` and `edits_sys_path` (engine/import_resolution.py)."""
    modules: Set[str] = set()
    for match in _line_matches(_IMPORT_LINE, b"import", raw) if shortcuts else _IMPORT_LINE.finditer(raw):
        for part in match.group(1).decode("utf-8", "replace").replace("\\\n", " ").split(","):
            name = part.split(" as ")[0].strip(" \t\r\\")
            if name and all(piece.isidentifier() for piece in name.split(".")):
                modules.add(name)
    summary.module_imports = sorted(modules)
    summary.star_imports = sorted(set(stars))
    summary.edits_sys_path = b"sys.path" in raw or b"addsitedir" in raw or b"PYTHONPATH" in raw


def _attr_stores(tree: Optional[ast.Module]) -> Dict[str, List[str]]:
    """engine/apex_attrs.py's records of a parsed file ("*": any attribute, where it cannot be
    read: a file changed since the index read it, or nesting too deeply, may set anything)."""
    if tree is None:
        return {"*": ["other"]}
    try:
        return apex_attr_stores(tree)
    except RecursionError:
        return {"*": ["other"]}


def _from_imports(raw: bytes, package: str, shortcuts: bool = True, stars: Optional[List[str]] = None) -> List[Tuple[str, str]]:
    """(absolute module, name) of each `from module import name` (relative ones resolved against
    `package`); ("module", "") for a star import or a line the regex cannot split."""
    found: List[Tuple[str, str]] = []
    for match in _line_matches(_FROM, b"from", raw) if shortcuts else _FROM.finditer(raw):
        spec = match.group(1).decode("utf-8", "replace")
        level = len(spec) - len(spec.lstrip("."))
        module = spec[level:]
        if level:
            parts = package.split(".") if package else []
            parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
            module = ".".join([*parts, *([module] if module else [])])
        if not module:
            continue
        names = [
            part.split(" as ")[0].strip(" ()\t\r")
            for part in re.split(r"[,\n\\]", match.group(2).decode("utf-8", "replace").strip("()"))
        ]
        found.extend((module, name) for name in names if name.isidentifier())
        found.append((module, ""))
        if stars is not None and not any(name.isidentifier() for name in names):
            stars.append(module)  # `from m import *`, or a line the regex cannot split
    return found


@dataclass
class _Scope:
    """What one function (or the module's top level) does, gathered in the one walk."""

    name: str
    params: Set[str]
    clips: bool = False
    unscales: bool = False  # calls `.unscale_` or `.scale`: it knows the protocol
    scaled: Set[str] = field(default_factory=set)  # parameters with `p.scale(x).backward()`
    followed: Set[str] = field(default_factory=set)  # names with `.step`/`.unscale_`/`.update` calls
    made: Set[str] = field(default_factory=set)  # names assigned a GradScaler(...)
    calls: List[ast.Call] = field(default_factory=list)  # calls with a bare name among their arguments


class _Summarizer:
    def __init__(self, summary: ModuleSummary) -> None:
        self.summary = summary
        self.clip_imports: Set[str] = set()  # names imported from torch.nn.utils (any alias)

    def run(self, tree: ast.Module) -> None:
        scopes: List[_Scope] = []
        module = _Scope("", set())
        scopes.append(module)
        # (node, its scope, the enclosing class name for a direct method)
        stack: List[Tuple[ast.AST, _Scope, str]] = [(child, module, "") for child in reversed(tree.body)]
        while stack:
            node, scope, class_name = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
                named = f"{class_name}.{node.name}" if class_name else node.name
                inner = _Scope(named if scope is module else "", params)
                scopes.append(inner)
                stack.extend((child, inner, "") for child in reversed(node.body))
                continue
            if isinstance(node, ast.ClassDef):
                direct = node.name if scope is module else ""
                stack.extend((child, scope, direct) for child in reversed(node.body))
                continue
            if isinstance(node, ast.Lambda):
                continue
            self._node(node, scope)
            stack.extend((child, scope, "") for child in ast.iter_child_nodes(node))
        for scope in scopes:
            if scope.name and scope.clips and not scope.unscales:
                self.summary.clip_helpers[scope.name] = "clip"
            typed = sorted(scope.scaled & scope.followed & scope.params)
            if scope.name and typed:
                self.summary.scaler_params[scope.name] = typed
            for call in scope.calls if scope.made else ():
                values = [*call.args, *(k.value for k in call.keywords)]
                if any(isinstance(v, ast.Name) and v.id in scope.made for v in values):
                    callee = _dotted(call.func)
                    if callee and callee.rpartition(".")[2] not in _GRAD_SCALERS:
                        self.summary.scaler_passed_to.append((callee, call.lineno))
        self.summary.scaler_passed_to.sort(key=lambda item: item[1])

    def _node(self, node: ast.AST, scope: _Scope) -> None:
        if isinstance(node, ast.ImportFrom):
            if (node.module or "").startswith("torch.nn.utils"):
                self.clip_imports.update(a.asname or a.name for a in node.names if a.name in _CLIP_CALLEES)
            return
        if isinstance(node, ast.Assign):
            value = node.value
            if isinstance(value, ast.Call) and _dotted(value.func).rpartition(".")[2] in _GRAD_SCALERS:
                scope.made.update(t.id for t in node.targets if isinstance(t, ast.Name))
                self.summary.scales_loss = True
            return
        if not isinstance(node, ast.Call):
            return
        func = node.func
        if isinstance(func, ast.Attribute):
            last = func.attr
            if last in ("unscale_", "scale"):
                scope.unscales = True
            if last in _CLIP_CALLEES and _dotted(func.value) in _CLIP_MODULES:
                scope.clips = True
            elif last == "backward":
                inner = func.value
                if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "scale":
                    self.summary.scales_loss = True
                    if isinstance(inner.func.value, ast.Name):
                        scope.scaled.add(inner.func.value.id)
            elif last in ("step", "unscale_", "update") and isinstance(func.value, ast.Name):
                scope.followed.add(func.value.id)
        elif isinstance(func, ast.Name) and func.id in self.clip_imports:
            scope.clips = True
        if any(isinstance(a, ast.Name) for a in node.args) or any(isinstance(k.value, ast.Name) for k in node.keywords):
            scope.calls.append(node)


_GRAD_SCALERS = frozenset({"GradScaler", "ShardedGradScaler"})


def _dotted(node: ast.AST) -> str:
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


# ------------------------------------------------------------- issue 11: backward-running callables
def _backward_runners(tree: Optional[ast.Module]) -> List[str]:
    """Top-level classes whose `__call__` calls `.backward(...)` on anything (`loss.backward()`,
    `self._scaler.scale(loss).backward()`): calling an instance runs the backward pass."""
    if tree is None:  # not Python
        return []
    found: List[str] = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for method in node.body:
            if isinstance(method, ast.FunctionDef) and method.name == "__call__" and _calls_backward(method):
                found.append(node.name)
                break
    return found


def _calls_backward(function: ast.FunctionDef) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"
        for n in ast.walk(function)
    )
# ---------------------------------------------------------------- apex.amp across files
# Real apex code calls `amp.initialize` in main.py and hands `amp` to a trainer function in
# another file that runs `with amp.scale_loss(loss, opt)`: the trainer's file never names apex.
_APEX_AMP = re.compile(rb"\bapex\b|\.scale_loss\(")


def _summarize_apex_amp(tree: ast.Module, summary: ModuleSummary) -> None:
    """Fill `apex_amp_params` and `apex_amp_passed_to` (top-level functions and direct methods)."""
    amp_names: Set[str] = set()  # names bound to apex's amp module by an import
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "apex":
            amp_names.update(a.asname or a.name for a in node.names if a.name == "amp")
        elif isinstance(node, ast.Import):
            amp_names.update(a.asname for a in node.names if a.name == "apex.amp" and a.asname)
    for owner, function in top_functions(tree):
        params = {a.arg for a in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]}
        if not params:
            continue
        scaling = sorted(
            {
                node.func.value.id
                for node in ast.walk(function)
                if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "scale_loss"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in params
            }
        )
        if scaling:
            summary.apex_amp_params[f"{owner}.{function.name}" if owner else function.name] = scaling
    if not amp_names:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            values = [*node.args, *(k.value for k in node.keywords)]
            if any(isinstance(v, ast.Name) and v.id in amp_names for v in values):
                callee = _dotted(node.func)
                if callee:
                    summary.apex_amp_passed_to.append((callee, node.lineno))
    summary.apex_amp_passed_to.sort(key=lambda item: item[1])

