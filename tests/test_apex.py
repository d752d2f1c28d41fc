"""The apex family (AMP1) beyond its golden fixtures: what every migrated file must satisfy, and
the helpers the migration is built from."""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
import pytest
from conftest import FIXTURES, check, codes, fix

from ampmigrate.analysis.statements import branches, following, preceding
from ampmigrate.diagnostics import Fix
from ampmigrate.engine.context import rebuild_args
from ampmigrate.engine.fixer import apply_fixes
from ampmigrate.engine.names import NameIndex
from ampmigrate.rules.apex._presence import Unsupported, simplify
from ampmigrate.rules.apex._scaler_access import add_parameter

APEX_EXPECTED = sorted(p for p in FIXTURES.glob("AMP1*/*.expected.py"))


def _apex_imports(code: str):
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name == "apex" or a.name.startswith("apex.")]
        elif isinstance(node, ast.ImportFrom) and node.module and (node.module == "apex" or node.module.startswith("apex.")):
            found.append(node.module)
    return found


@pytest.mark.parametrize("path", APEX_EXPECTED, ids=[f"{p.parent.name}/{p.name}" for p in APEX_EXPECTED])
def test_migrated_fixture_is_clean(path: Path):
    """A fixed fixture parses, has no AMP1 finding left, and imports no apex (fixtures with parts
    that cannot be fixed have no .expected.py: `fix` leaves them unchanged)."""
    code = path.read_text(encoding="utf-8")
    compile(code, str(path), "exec")
    assert [c for c in codes(check(code, str(path))) if c.startswith("AMP1")] == []
    assert _apex_imports(code) == []


def test_spec_migration_drops_apex():
    spec = (FIXTURES / "spec" / "apex_o1_train.py").read_text(encoding="utf-8")
    fixed = fix(spec)
    assert _apex_imports(fixed) == []
    assert fixed == (FIXTURES / "spec" / "apex_o1_train.fp16.expected.py").read_text(encoding="utf-8")


def test_partial_selection_of_the_group_does_not_apply_it():
    """The O0 fix also changes AMP101's sites: selecting AMP103 alone must not apply half of it."""
    code = (FIXTURES / "AMP103" / "o0_fp32.py").read_text(encoding="utf-8")
    assert fix(code, select=["AMP103"]) == code
    assert fix(code, select=["AMP1"]) != code


def test_noqa_on_one_site_blocks_the_whole_migration():
    code = (FIXTURES / "AMP101" / "o1_train_loop.py").read_text(encoding="utf-8")
    suppressed = code.replace('"amp": amp.state_dict(),', '"amp": amp.state_dict(),  # noqa: AMP101')
    assert suppressed != code
    assert fix(suppressed) == suppressed


def test_unsafe_migration_needs_unsafe_fixes():
    code = (FIXTURES / "AMP101" / "dynamic_opt_level_unsafe.py").read_text(encoding="utf-8")
    [finding, *_] = check(code)
    assert finding.fix is not None and finding.fix.applicability == "unsafe"
    assert 'opt_level=getattr(args, "opt_level", "O1")' in finding.fix.message
    assert fix(code) == code


def test_run_time_opt_level_is_safe_with_an_o3_guard():
    """O0/O1/O2 keep their meaning; O3 (pure fp16) raises where amp.initialize ran."""
    code = (FIXTURES / "AMP101" / "dynamic_opt_level.py").read_text(encoding="utf-8")
    [finding, *_] = check(code)
    assert finding.fix is not None and finding.fix.applicability == "safe"
    assert "O3 (pure fp16, which torch.amp cannot do) now raises" in finding.fix.message
    fixed = fix(code)
    guard = 'if args.opt_level == "O3":\n        raise ValueError('
    assert guard in fixed and fixed.index(guard) < fixed.index("scaler = torch.amp.GradScaler")
    compile(fixed, "fixed", "exec")
    assert fix(fixed) == fixed


# ---------------------------------------------------------------------------------- helpers
def _module_and_names(code: str):
    module = cst.parse_module(code)
    return module, NameIndex(module)


def test_add_parameter_appends_or_goes_keyword_only():
    def render(signature: str) -> str:
        module = cst.parse_module(f"def f{signature}:\n    pass\n")
        func = module.body[0]
        return module.code_for_node(func.with_changes(params=add_parameter(func.params, "scaler"))).splitlines()[0]

    assert render("(a, b)") == "def f(a, b, scaler):"
    assert render("()") == "def f(scaler):"
    assert render("(a, b=1)") == "def f(a, b=1, *, scaler):"
    assert render("(a, *args)") == "def f(a, *args, scaler):"
    assert render("(a, *, k=1)") == "def f(a, *, k=1, scaler):"
    assert render("(a, **kw)") == "def f(a, *, scaler, **kw):"
    compile(render("(a, **kw)") + "\n    pass\n", "x", "exec")


def test_rebuild_args_keeps_the_closing_paren_on_its_own_line():
    module = cst.parse_module("f(a,\n  b\n  )\n")
    call = module.body[0].body[0].value
    new = rebuild_args(call, [*call.args, cst.Arg(cst.Name("s"), keyword=cst.Name("s"),
                                                  equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                                        whitespace_after=cst.SimpleWhitespace("")))])
    assert module.code_for_node(new) == "f(a,\n  b,\n  s=s\n  )"


def test_statements_inserted_above_a_statement_after_a_blank_line_keep_the_changes_inside_it():
    """The inserted line takes the blank line above its target; the target (an `if` whose body
    another change of the same fix edits) must keep that edit, not come back as it was."""
    from ampmigrate.engine.context import FixBuilder

    module = cst.parse_module("x = 1\n\nif c:\n    a = old()\n")
    if_node = module.body[1]
    call = if_node.body.body[0].body[0].value
    builder = FixBuilder("m", "safe", frozenset())
    builder.replace(call, cst.parse_expression("new()"))
    builder.insert_before(if_node, cst.parse_statement("scaler = make()\n"))
    assert apply_fixes(module, [builder.build()]) == "x = 1\n\nscaler = make()\nif c:\n    a = new()\n"


def test_a_replacement_function_composes_with_changes_inside_it():
    module = cst.parse_module("if x:\n    a = old()\n")
    if_node = module.body[0]
    call = if_node.body.body[0].body[0].value
    unwrap = lambda updated: cst.FlattenSentinel(list(updated.body.body))  # noqa: E731
    changes = ((call, cst.parse_expression("new()")), (if_node, unwrap))
    assert apply_fixes(module, [Fix("m", "safe", changes=changes)]) == "a = new()\n"


def test_following_and_preceding_stay_in_the_iteration():
    module, names = _module_and_names(
        "def f():\n"
        "    for epoch in epochs:\n"
        "        for x in xs:\n"
        "            a = 1\n"
        "            if c:\n"
        "                b = 2\n"
        "            else:\n"
        "                d = 3\n"
        "            e = 4\n"
        "        g = 5\n"
        "    h = 6\n"
    )
    loop = module.body[0].body.body[0].body.body[0]
    b_line = loop.body.body[1].body.body[0]
    after = [module.code_for_node(s).strip() for s in following(names, b_line)]
    assert after == ["e = 4"]
    # Out of the inner (accumulation) loop, never past the outermost one.
    after_loops = [module.code_for_node(s).strip() for s in following(names, b_line, out_of_loops=True)]
    assert after_loops == ["e = 4", "g = 5"]
    before = [module.code_for_node(s).strip().splitlines()[0] for s in preceding(names, b_line)]
    assert before == ["a = 1"]
    [branch] = branches(names, b_line)
    assert branch.taken and module.code_for_node(branch.test) == "c"


@pytest.mark.parametrize(
    "expression,expected",
    [
        ("amp is not None", True),
        ("amp is None", False),
        ("not amp", False),
        ("args.fp16 and amp is not None", "args.fp16"),
        ("amp is None or args.fp32", "args.fp32"),
        ("amp is None and args.fp16", False),
        ("f() and amp is None", Unsupported),
        ("amp.x is None", Unsupported),
    ],
)
def test_presence_tests_fold(expression, expected):
    module = cst.parse_module(f"{expression}\n")
    node = module.body[0].body[0].value
    refs = {n for n in _walk(node) if isinstance(n, cst.Name) and n.value == "amp"}
    if expected is Unsupported:
        with pytest.raises(Unsupported):
            simplify(node, refs)
        return
    value = simplify(node, refs)
    assert value == expected if isinstance(expected, bool) else module.code_for_node(value) == expected


def _walk(node):
    yield node
    for child in node.children:
        yield from _walk(child)


# ---------------------------------------------------------------------------------- at run time
# The migrated program must run and train exactly like the original did. On this CPU-only torch,
# an apex stand-in keeps the original's fp32 semantics, and GradScaler is pointed at the CPU so
# the scaler protocol itself runs (a misplaced `unscale_` or `step` raises); scaling by a power
# of two is exact, so both programs produce the same losses.
_PROGRAMS = {
    "functions": '''
import torch
import torch.nn as nn

try:
    from apex import amp
except ImportError:
    amp = None


def train_one_epoch(model, data, optimizer, clip):
    for x, y in data:
        out = model(x)
        loss = nn.functional.mse_loss(out, y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), clip)
        optimizer.step()
    return loss.item()


def main(use_amp=True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if use_amp:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(12)]
    losses = [train_one_epoch(model, data, optimizer, 1.0) for epoch in range(3)]
    return losses, {"model": model.state_dict(), "amp": amp.state_dict()}


RESULT = main()
''',
    "class": '''
import torch
import torch.nn as nn
from apex import amp


class Accumulator:
    def __init__(self, model, steps):
        self.model = model
        self.optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")
        self.steps = steps

    def fit(self, data, epochs):
        losses = []
        for epoch in range(epochs):
            for i, (x, y) in enumerate(data):
                loss = nn.functional.mse_loss(self.model(x), y) / self.steps
                with amp.scale_loss(loss, self.optimizer, delay_unscale=(i + 1) % self.steps != 0) as scaled:
                    scaled.backward()
                if (i + 1) % self.steps == 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.5)
                    self.optimizer.step()
                    self.optimizer.zero_grad()
            losses.append(loss.item())
        return losses

    def checkpoint(self):
        return {"model": self.model.state_dict(), "amp": amp.state_dict()}


torch.manual_seed(0)
trainer = Accumulator(nn.Linear(8, 1), steps=3)
RESULT = trainer.fit([(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(12)], epochs=3), trainer.checkpoint()
''',
    # a second, plain backward before the step (a regularizer, FGM's adversarial loss): apex had
    # unscaled, so the fix scales it too; left plain, it would shrink by the loss scale
    "plain_backward": '''
import torch
from torch import nn
from apex import amp


def train(model, data, epochs):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    losses = []
    for _ in range(epochs):
        for x, y in data:
            loss = nn.functional.mse_loss(model(x), y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            reg_loss = 0.5 * model(x).pow(2).mean()
            reg_loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses, {"amp": amp.state_dict()}


torch.manual_seed(0)
net = nn.Linear(8, 1)
RESULT = train(net, [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(6)], epochs=3)
''',
    # transformers' Trainer of 2020: the scaled backward in `_training_step`, the clip and the
    # step in `train()` after the call (the clip binds: a wrong scale would change every step)
    "caller_step": '''
import torch
from torch import nn

try:
    from apex import amp
except ImportError:
    amp = None


class Trainer:
    def __init__(self, model, fp16, accumulation):
        self.model = model
        self.fp16 = fp16
        self.accumulation = accumulation

    def train(self, data, epochs):
        model = self.model
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        if self.fp16:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        losses = []
        for _ in range(epochs):
            for i, (x, y) in enumerate(data):
                losses.append(self._training_step(model, (x, y), optimizer))
                if (i + 1) % self.accumulation == 0:
                    if self.fp16:
                        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 0.05)
                    else:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
                    optimizer.step()
                    model.zero_grad()
        return losses

    def _training_step(self, model, batch, optimizer):
        x, y = batch
        loss = nn.functional.mse_loss(model(x), y) / self.accumulation
        if self.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        return loss.item()

    def checkpoint(self):
        return {"model": self.model.state_dict(), "amp": amp.state_dict()}


torch.manual_seed(0)
trainer = Trainer(nn.Linear(8, 1), fp16=True, accumulation=2)
RESULT = trainer.train([(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(8)], epochs=3), trainer.checkpoint()
''',
}


def _apex_stand_in():
    """apex.amp for fp32 runs: the API, none of the casting."""
    import contextlib
    import types

    amp = types.ModuleType("apex.amp")
    amp.initialize = lambda models, optimizers=None, **kwargs: (models, optimizers)
    amp.scale_loss = contextlib.contextmanager(lambda loss, optimizers, **kwargs: (yield loss))
    amp.master_params = lambda optimizer: (p for group in optimizer.param_groups for p in group["params"])
    amp.state_dict = lambda: {"loss_scaler0": {"loss_scale": 1.0, "unskipped": 0}}
    apex = types.ModuleType("apex")
    apex.amp = amp
    return {"apex": apex, "apex.amp": amp}


@pytest.mark.parametrize("name", sorted(_PROGRAMS))
def test_migrated_program_trains_like_the_original(monkeypatch, name):
    torch = pytest.importorskip("torch")
    import sys
    import warnings

    program = _PROGRAMS[name]
    with monkeypatch.context() as patch:
        for module_name, module in _apex_stand_in().items():
            patch.setitem(sys.modules, module_name, module)
        namespace = {"__name__": "original"}
        exec(compile(program, "original.py", "exec"), namespace)
        original_losses, _ = namespace["RESULT"]

    migrated = fix(program)
    assert _apex_imports(migrated) == [] and "torch.amp.GradScaler(" in migrated

    class CpuGradScaler(torch.amp.GradScaler):
        def __init__(self, device="cuda", *args, **kwargs):
            super().__init__("cpu", *args, **kwargs)

    monkeypatch.setattr(torch.amp, "GradScaler", CpuGradScaler)
    namespace = {"__name__": "migrated"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # autocast("cuda") without CUDA: disabled, as expected here
        exec(compile(migrated, "migrated.py", "exec"), namespace)
    migrated_losses, checkpoint = namespace["RESULT"]
    assert migrated_losses == pytest.approx(original_losses, rel=1e-6)
    assert {"scale", "_growth_tracker"} <= set(checkpoint["amp"])  # the scaler's state is saved


def test_a_module_passed_as_a_value_is_not_a_presence_test():
    from ampmigrate.rules.apex._presence import presence_action

    module, names = _module_and_names("from apex import amp\nsetup(model, amp=amp)\nif amp:\n    pass\n")
    refs = [n for n in names.loads if n.value == "amp"]
    passed = next(r for r in refs if isinstance(names.parent(r), cst.Arg))
    tested = next(r for r in refs if isinstance(names.parent(r), cst.If))
    with pytest.raises(Unsupported):
        presence_action(names, passed, set(refs))
    assert presence_action(names, tested, set(refs)).kind == "unwrap"


# ---------------------------------------------------------------------- the step in the caller
def _amp101_reasons(name: str):
    code = (FIXTURES / "AMP101" / name).read_text(encoding="utf-8")
    return {f.no_fix_reason for f in check(code, select=["AMP1"]) if f.code == "AMP101"}


def test_a_plain_backward_between_the_scaled_backward_and_the_step_is_scaled_too():
    fixed = (FIXTURES / "AMP101" / "plain_backward_in_window.expected.py").read_text(encoding="utf-8")
    assert "scaler.scale(reg_loss).backward()" in fixed and "reg_loss.backward()" not in fixed.replace("scale(reg_loss)", "")


def test_a_plain_backward_that_is_not_a_loss_statement_is_refused():
    (reason,) = _amp101_reasons("plain_backward_expression.py")
    assert "at line 13 adds gradients after the scaled backward at line 10" in reason
    assert "not a `loss.backward()` statement of its own" in reason


def test_a_backward_function_with_a_second_caller_is_not_stepped_from_the_first():
    (reason,) = _amp101_reasons("caller_step_called_twice.py")
    assert "`training_step()` uses apex.amp but is not only called (directly) from the function" in reason


def test_an_optimizer_passed_under_another_name_is_not_followed():
    (reason,) = _amp101_reasons("caller_step_renamed_optimizer.py")
    assert "no `opt.step()` follows" in reason


def test_the_caller_step_migration_passes_the_scaler_and_steps_after_the_call():
    fixed = (FIXTURES / "AMP101" / "caller_step_function.expected.py").read_text(encoding="utf-8")
    assert "def training_step(model, batch, optimizer, accum, scaler):" in fixed
    assert "training_step(model, batch, optimizer, accum, scaler=scaler)" in fixed
    # unscale_ once per step, in the caller's stepping branch, before the clip
    branch = fixed.split("if (step + 1) % accum == 0:")[1]
    assert branch.index("scaler.unscale_(optimizer)") < branch.index("clip_grad_norm_") < branch.index("scaler.step(optimizer)")


def test_this_files_code_reading_gradients_in_the_window_gets_them_unscaled_as_apex_gave_them():
    assert _amp101_reasons("window_reader_same_file.py") == {None}
    fixed = fix((FIXTURES / "AMP101" / "window_reader_same_file.py").read_text(encoding="utf-8"))
    window = fixed.split("scaler.scale(loss).backward()\n")[1]
    assert window.index("scaler.unscale_(optimizer)") < window.index("perturb.attack()") < window.index("scaler.step(optimizer)")


def test_a_plain_backward_after_a_reader_stays_unscaled():
    """apex unscaled at the block's exit, before the read; the adversarial backward then added its
    own gradients at scale 1. `unscale_` goes before the read, and the backward stays as it is."""
    assert _amp101_reasons("window_reader_then_backward.py") == {None}
    migrated = fix((FIXTURES / "AMP101" / "window_reader_then_backward.py").read_text(encoding="utf-8"))
    window = migrated[migrated.index("scaler.scale(loss).backward()"):]
    assert window.index("scaler.unscale_(optimizer)") < window.index("adversary.attack()")
    assert "        loss_adv.backward()\n        adversary.restore()\n        scaler.step(optimizer)" in window


def test_a_reader_on_every_micro_step_is_refused():
    (reason,) = _amp101_reasons("window_reader_micro_steps.py")
    assert "read at line 17 on every backward pass, but the optimizer steps only" in reason
    assert "`log_gradients(...)` is not torch's" in reason


def test_a_reader_under_a_condition_gets_one_unscale_before_it_that_the_clip_after_shares():
    source = """import torch
from apex import amp


def grad_max(model):
    return max(p.grad.abs().max().item() for p in model.parameters() if p.grad is not None)


def train(model, loader, log_every):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for index, batch in enumerate(loader):
        loss = model(batch)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        if index % log_every == 0:
            print(grad_max(model))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
"""
    fixed = fix(source)
    assert fixed.count("scaler.unscale_(optimizer)") == 1
    window = fixed.split("scaler.scale(loss).backward()\n")[1]
    assert window.index("scaler.unscale_(optimizer)") < window.index("if index % log_every == 0:") < window.index("clip_grad_norm_")
    assert fix(fixed) == fixed


def test_a_grad_is_none_test_in_the_window_is_no_read():
    assert _amp101_reasons("window_reader_grad_is_none.py") == {None}


def test_a_plain_backward_after_the_unscale_stays_unscaled():
    migrated = fix((FIXTURES / "AMP101" / "plain_backward_after_clip.py").read_text(encoding="utf-8"))
    assert "scaler.unscale_(optimizer)\n        torch.nn.utils.clip_grad_norm_(" in migrated
    assert "        reg_loss.backward()\n        scaler.step(optimizer)" in migrated


def test_a_plain_backward_after_an_unscale_on_some_paths_only_is_refused():
    (reason,) = _amp101_reasons("plain_backward_after_conditional_clip.py")
    assert "`reg_loss.backward()` at line 15 adds gradients after they are unscaled at line 13 on some paths only" in reason


def test_a_normalized_attack_in_the_window_keeps_the_migration():
    assert _amp101_reasons("window_reader_normalized.py") == {None}


def test_o1_with_keep_batchnorm_fp32_is_refused_because_apex_raised_there():
    (reason,) = _amp101_reasons("o1_keep_batchnorm_raises.py")
    assert "apex raises RuntimeError for `keep_batchnorm_fp32=True` with opt_level O1" in reason


# ---------------------------------------------------------------------- inference without optimizers
def test_o3_inference_is_refused_with_its_own_reason():
    code = (FIXTURES / "AMP101" / "inference_initialize_o3.py").read_text(encoding="utf-8")
    (reason,) = {f.no_fix_reason for f in check(code, select=["AMP1"]) if f.code == "AMP102"}
    assert "O3 without optimizers (inference)" in reason and "outputs to fp32" in reason


def test_an_empty_optimizer_list_binds_only_when_read():
    """`net, rest = amp.initialize(net, ())`: `rest` keeps the empty tuple apex returned when
    something reads it; a discarded `_` is not rebound."""
    read = (FIXTURES / "AMP101" / "inference_initialize_empty_tuple_read.py").read_text(encoding="utf-8")
    assert "    rest = ()\n    with torch.no_grad():" in fix(read)
    discarded = read.replace("rest = amp", "_ = amp").replace("len(rest)", "0")
    fixed = fix(discarded)
    assert "_ = ()" not in fixed and "from apex" not in fixed
    assert "_ = ()" in fix(discarded.replace("return out, 0", "return out, _"))


# ---------------------------------------------------------------------- `torch` bound by a star import
def test_torch_from_a_star_import_is_used_only_where_the_file_shows_it():
    code = (FIXTURES / "AMP101" / "star_import_torch_evidence.py").read_text(encoding="utf-8")
    fixed = fix(code)
    assert "scaler = torch.amp.GradScaler(" in fixed and "import torch\n" not in fixed
    # a star import after the code, or inside a `try`, or a local `torch`: not followed
    moved = code.replace("from common import *\n", "") + "\nfrom common import *\n"
    guarded = code.replace("from common import *\n", "try:\n    from common import *\nexcept ImportError:\n    pass\n")
    local = code.replace('    device = torch.device(', '    torch = load_backend()\n    device = torch.device(')
    for variant in (moved, guarded, local):
        assert "amp.initialize" in fix(variant), variant
    # no read of `torch.<attribute of torch's>` in the file: unknown
    unknown = code.replace("torch.cuda.is_available()", "True").replace("torch.nn.functional.cross_entropy", "criterion")
    assert "amp.initialize" in fix(unknown.replace('torch.device("cuda" if True else "cpu")', '"cuda"'))


def test_a_facade_forwarding_its_own_star_arguments_to_apex_says_so():
    text = (FIXTURES / "AMP101" / "apex_facade_forwarding.py").read_text()
    reasons = {f.no_fix_reason for f in check(text, select=["AMP1"]) if f.code == "AMP101"}
    assert reasons == {
        "`amp.scale_loss` at line 14 is given the `args`, `kwargs` of `scale_loss()`, which wraps apex's amp for its "
        "callers (they choose the options and use the result): migrate the callers to torch.amp, then this wrapper goes"
    }
    assert fix(text) == text


@pytest.mark.parametrize(
    "signature, call",
    [
        ("def setup(model, opt, opts)", "amp.initialize(model, opt, **opts)"),  # a dict parameter, not `**kwargs`
        ("def setup(model, opt, *args)", "amp.initialize(model, opt, opt_level='O1')"),  # not handed on
    ],
)
def test_a_function_not_forwarding_its_star_parameters_is_no_facade(signature, call):
    text = f"from apex import amp\n\n\n{signature}:\n    return {call}\n"
    reasons = {f.no_fix_reason for f in check(text, select=["AMP1"]) if f.code == "AMP101"}
    assert reasons and not any("wraps apex's amp" in (r or "") for r in reasons)


def test_custom_fwd_on_a_module_forward_casts_its_inputs_as_apex_float_function_did():
    """What the AMP105 rewrite of module_forward.py relies on: torch's custom_fwd on an nn.Module's
    forward (first argument the module) casts floating inputs to float32 under autocast and is a
    no-op without it (here on the CPU device type, which the test machine has)."""
    torch = pytest.importorskip("torch")
    seen = []

    class Layer(torch.nn.Module):
        @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
        def forward(self, x, rois):
            seen.append((x.dtype, rois.dtype, torch.is_autocast_enabled("cpu")))
            return x.sum() + rois.sum()

    layer = Layer()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.bfloat16))
    layer(torch.ones(2, dtype=torch.bfloat16), torch.ones(2))
    assert seen == [(torch.float32, torch.float32, False), (torch.bfloat16, torch.float32, False)]


def test_the_unsafe_module_forward_rewrite_names_the_op_apex_still_cast():
    text = (FIXTURES / "AMP105" / "module_forward_unsafe.py").read_text()
    (finding,) = [f for f in check(text, select=["AMP105"]) if f.code == "AMP105"]
    assert finding.fix is not None and finding.fix.applicability == "unsafe"
    assert "apex still cast `torch.softmax` inside the forward" in finding.fix.message
    assert fix(text) == text  # the safe fix leaves it alone


def test_a_module_naming_custom_fwds_attributes_is_left_alone():
    text = (FIXTURES / "AMP105" / "module_forward.py").read_text().replace(
        "        self.output_size = output_size\n", "        self.output_size = output_size\n        self._dtype = None\n"
    )
    (finding,) = [f for f in check(text, select=["AMP105"]) if f.code == "AMP105"]
    assert finding.fix is None and "`_dtype` or `_fwd_used_autocast`" in finding.no_fix_reason


def test_a_loss_a_loop_rebinds_is_not_taken_from_before_the_loop():
    """tests/fixtures/AMP101/loss_read_in_optimizer_loop.py takes a loss computed before a loop
    that only reads it; here the loop assigns `loss_dict` again, so a later iteration scales the
    value of an earlier one and the region stays unknown."""
    reasons = _amp101_reasons("loss_rebound_in_optimizer_loop.py")
    assert reasons and all("the loss `loss_dict[\"G\"]` is not computed in this function's training step" in r for r in reasons)
    migrated = fix((FIXTURES / "AMP101" / "loss_read_in_optimizer_loop.py").read_text(encoding="utf-8"))
    assert migrated.count('with torch.autocast("cuda", dtype=torch.float16):') == 1
    assert '            scaler.scale(loss_dict["D_" + name]).backward()' in migrated


def test_a_plain_backward_after_one_optimizer_of_two_is_unscaled_is_refused():
    (reason,) = _amp101_reasons("plain_backward_after_one_optimizers_unscale.py")
    assert "`reg_loss.backward()` at line 17 adds gradients after they are unscaled at line 15" in reason
    assert "for some of the step's optimizers only" in reason
