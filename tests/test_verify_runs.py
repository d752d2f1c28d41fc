"""`ampmigrate verify` end to end on the CPU: real training runs in subprocesses, real fp16/bf16
CPU autocast, CUDA code mapped to the CPU by the harness.

The projects live in tests/verify_projects/ and examples/ (hand-written afters are edits of a
project's train.py: `AFTERS`); each test copies what it runs into a temporary folder, runs it from
there (the working directory a user would have), and checks that the user's files are left byte
for byte as they were. The assertions are about behaviour (exit status, verdict, what was
recorded), not the migrated text, so they hold whatever rule families the migration has.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT
from test_verify_parts import snapshot

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECTS = ROOT / "tests" / "verify_projects"
EXAMPLE = ROOT / "examples" / "legacy_transformer"


@pytest.fixture(autouse=True)
def quiet_runs(monkeypatch, tmp_path):
    # Runs stay fast and steady on a few shared cores; every run of a comparison uses the same.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # verify keeps its temporary folder when a run is not equivalent: keep it in the test's folder.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))


def copy_of(source: Path, destination: Path, *extra: Path) -> Path:
    shutil.copytree(source, destination)
    for path in extra:
        shutil.copy(path, destination / path.name)
    return destination


# Hand-written "afters", each as the project it belongs to and the edits that make it from that
# project's train.py (so it follows the original when that changes). Every edit must apply
# exactly as many times as it says (once unless a third element says otherwise).
_MODERN_SPELLING = [
    ("torch.cuda.amp.GradScaler(enabled=args.amp)", 'torch.amp.GradScaler("cuda", enabled=args.amp)'),
    ("torch.cuda.amp.autocast(enabled=args.amp)", 'torch.amp.autocast("cuda", enabled=args.amp)'),
]
_STEP_WITHOUT_SCALER = ("scaler.step(optimizer)\n            scaler.update()", "optimizer.step()")
AFTERS = {
    # Issue 16: the GradScaler dropped from a step it alone guarded (bf16, no guard): NaN updates.
    "unguarded_bf16.py": (
        PROJECTS / "nonfinite_guard",
        [
            ("dtype=torch.float16", "dtype=torch.bfloat16"),
            ("scaler.scale(loss).backward()", "loss.backward()"),
            ("                scaler.unscale_(optimizer)\n", ""),
            ("scaler.step(optimizer)\n                scaler.update()", "optimizer.step()"),
        ],
    ),
    # The migration `fix --unsafe-fixes` aims at: bf16 autocast, no GradScaler. Equivalent.
    "bf16_no_scaler.py": (
        EXAMPLE,
        [
            ("    scaler = torch.cuda.amp.GradScaler(enabled=args.amp)\n", ""),
            ("torch.cuda.amp.autocast(enabled=args.amp)", 'torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp)'),
            ("scaler.scale(loss).backward()\n            scaler.unscale_(optimizer)", "loss.backward()"),
            _STEP_WITHOUT_SCALER,
            (" scale {scaler.get_scale():.0f}", ""),
            ('                "scaler": scaler.state_dict(),\n', ""),
        ],
    ),
    # Broken: the loss is scaled but the step bypasses the scaler, so AdamW steps on gradients
    # multiplied by the loss scale. Adam normalises a constant scale away, so the curve barely
    # moves; verify must still say not equivalent.
    "scaled_not_unscaled.py": (
        EXAMPLE,
        [*_MODERN_SPELLING, ("            scaler.unscale_(optimizer)\n", ""), _STEP_WITHOUT_SCALER],
    ),
    # Broken: the learning rate was lost (AdamW's default 1e-3 instead of 3e-3).
    "wrong_lr.py": (EXAMPLE, [*_MODERN_SPELLING, ("lr=args.lr, weight_decay", "weight_decay")]),
    # Broken, in the two-file project: scaled, never unscaled (SGD steps 65536x too far: the loss
    # stops being finite).
    "broken_scaled_not_unscaled.py": (
        PROJECTS / "two_file",
        [
            ("from torch.cuda.amp import GradScaler, autocast", "from torch.amp import GradScaler, autocast"),
            ("with autocast():", 'with autocast("cuda"):', 2),
            ("scaler = GradScaler()", 'scaler = GradScaler("cuda")'),
            _STEP_WITHOUT_SCALER,
        ],
    ),
    # The legacy LM migrated by hand as `fix --unsafe-fixes` does, but with a 30x learning rate.
    "lm_lr30.py": (
        PROJECTS / "legacy_lm",
        [
            ("    scaler = torch.cuda.amp.GradScaler()\n", ""),
            ("torch.cuda.amp.autocast()", 'torch.amp.autocast("cuda", dtype=torch.bfloat16)'),
            ("scaler.scale(loss).backward()", "loss.backward()"),
            ("scaler.step(optimizer)\n        scaler.update()", "optimizer.step()"),
            ("lr=args.lr,", "lr=30 * args.lr,"),
        ],
    ),
    # The legacy LM respelled to torch.amp but still clipping the scaled gradients (AMP301 not applied).
    "lm_clips_scaled.py": (
        PROJECTS / "legacy_lm",
        [
            ("torch.cuda.amp.GradScaler()", 'torch.amp.GradScaler("cuda")'),
            ("torch.cuda.amp.autocast()", 'torch.amp.autocast("cuda")'),
        ],
    ),
    # The apex project migrated by hand to torch.amp, with the learning rate doubled ...
    "apex_lr2.py": (PROJECTS / "apex_project", [("lr=0.01,", "lr=0.02,")], "train_torch_amp.py"),
    # ... and without zero_grad() (gradients accumulate over the steps).
    "apex_no_zero_grad.py": (PROJECTS / "apex_project", [("            optimizer.zero_grad()\n", "")], "train_torch_amp.py"),
    # fp16 whose GradScaler starts at a scale of 1e38: every step overflows and is skipped (halving takes too long).
    "every_step_skipped.py": (
        PROJECTS / "two_file",
        [
            ("from torch.cuda.amp import GradScaler, autocast", "from torch.amp import GradScaler, autocast"),
            ("with autocast():", 'with autocast("cuda"):', 2),
            ("scaler = GradScaler()", 'scaler = GradScaler("cuda", init_scale=1e38)'),
        ],
    ),
}


def project_with_after(destination: Path, name: str) -> Path:
    """A copy of the project the hand-written after `name` belongs to, with it beside train.py."""
    source, edits, *base = AFTERS[name]
    project = copy_of(source, destination)
    text = (project / (base[0] if base else "train.py")).read_text(encoding="utf-8")
    for old, new, *count in edits:
        assert text.count(old) == (count[0] if count else 1), (name, old)
        text = text.replace(old, new)
    (project / name).write_text(text, encoding="utf-8")
    return project


def run_verify(cli, monkeypatch, cwd: Path, *args: str):
    monkeypatch.chdir(cwd)
    report = cwd.parent / f"{cwd.name}-verify.json"
    result = cli("verify", "--device", "cpu", "--json", str(report), *args)
    data = json.loads(report.read_text()) if report.exists() else None
    return result, data


# ------------------------------------------------------------------------------ acceptance
def test_two_file_legacy_project_verifies_and_stays_untouched(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECTS / "two_file", tmp_path / "two_file")
    before = snapshot(project)

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--steps", "60", "--runs", "2", "--", "--out", "runs/other")

    assert result.exit_code == 0, result.output
    assert snapshot(project) == before  # no file changed, none added (checkpoints went to scratch)
    # Both project files carry legacy AMP. (The deliberately broken `--after` script beside them is
    # migrated too: the GradScaler family fixes its missing scaler.step.)
    assert {"train.py", "net.py"} <= set(data["migration"]["changed_files"])
    before, after = data["runs"]["before"][0], data["runs"]["after"][0]
    assert len(data["runs"]["before"]) == len(data["runs"]["after"]) == 2
    assert before["status"] == after["status"] == "completed"
    assert before["steps"] == after["steps"] == 60
    assert before["cuda_mapped_to_cpu"] is True
    assert before["precision"].startswith("fp16")  # legacy autocast ran as CPU fp16
    # the script got its arguments, read config.json from the working directory, and its
    # checkpoint went to the run's scratch folder
    assert before["written_files"] == after["written_files"] == ["runs/other/last.pt"]
    assert data["verdict"] == "equivalent"
    assert "EQUIVALENT" in result.output and "seed-to-seed spread" in result.output


def test_bundled_transformer_example_verifies(cli, monkeypatch, tmp_path):
    project = copy_of(EXAMPLE, tmp_path / "legacy_transformer")
    before = snapshot(project)
    plot = tmp_path / "curves.png"
    plotting = importlib.util.find_spec("matplotlib") is not None

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--steps", "30", "--runs", "2",
                              *(["--plot", str(plot)] if plotting else []))

    assert result.exit_code == 0, result.output
    assert snapshot(project) == before
    assert set(data["migration"]["changed_files"]) == {"train.py", "model.py"}
    comparison = data["comparison"]
    assert comparison["steps"] == 30 and comparison["runs_per_side"] == 2
    assert comparison["band_ratio_max"] < comparison["criterion"]["band"]
    # The script seeds itself (torch.manual_seed(args.seed), torch.Generator().manual_seed(1234)):
    # the runs of seed S+1 still differ from those of seed S.
    first, second = data["runs"]["before"]
    assert first["losses"] != second["losses"]
    assert first["precision"] == "fp16 + GradScaler"
    assert first["median_step_time_s"] > 0 and first["peak_memory_bytes"] > 0
    for row in ("final loss (last ", "difference, 90% CI", "curve (std. errors)", "median step time", "peak memory (RSS)",
                "CPU: says nothing about a GPU"):
        assert row in result.output
    # README's sample output of this command has the rows and the verdict line the command prints
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sample = readme.split("Output of `ampmigrate verify examples/legacy_transformer/train.py --device cpu`")[1]
    sample = sample.split("```text\n")[1].split("```")[0]
    table = sample.split("\n\n")[0].splitlines()[2:]  # the table, without its header and rule
    rows = [re.split(r"\s{2,}", line.strip())[0] for line in table if line.strip()]
    assert rows and all(row in result.output for row in rows), rows
    verdict_line = next(line for line in sample.splitlines() if line.startswith("EQUIVALENT"))
    numbers = re.compile(r"\d+")
    assert numbers.sub("N", verdict_line.split(" within ")[0]) in numbers.sub("N", " ".join(result.output.split()))
    assert any(0x2800 < ord(ch) <= 0x28FF for ch in result.output)  # the terminal plot
    if plotting:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hand_migrated_bf16_without_scaler_is_equivalent(cli, monkeypatch, tmp_path):
    project = project_with_after(tmp_path / "legacy_transformer", "bf16_no_scaler.py")

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--after", "bf16_no_scaler.py", "--steps", "30", "--runs", "2")

    assert result.exit_code == 0, result.output
    assert data["runs"]["after"][0]["precision"] == "bf16"
    assert data["runs"]["before"][0]["precision"] == "fp16 + GradScaler"


def test_wrong_learning_rate_is_not_equivalent(cli, monkeypatch, tmp_path):
    project = project_with_after(tmp_path / "legacy_transformer", "wrong_lr.py")

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--after", "wrong_lr.py", "--steps", "30", "--runs", "2")

    assert result.exit_code == 1, result.output
    assert data["verdict"] == "not equivalent"
    assert data["comparison"]["reasons"]
    assert "NOT EQUIVALENT" in result.output


def test_loss_scaled_but_never_unscaled_is_not_equivalent(cli, monkeypatch, tmp_path):
    project = project_with_after(tmp_path / "two_file", "broken_scaled_not_unscaled.py")

    result, data = run_verify(
        cli, monkeypatch, project, "train.py", "--after", "broken_scaled_not_unscaled.py", "--steps", "40", "--runs", "2"
    )

    assert result.exit_code == 1, result.output
    assert any("not finite" in reason for reason in data["reasons"])


def test_steps_on_scaled_gradients_are_not_equivalent_even_where_adam_hides_them(cli, monkeypatch, tmp_path):
    project = project_with_after(tmp_path / "legacy_transformer", "scaled_not_unscaled.py")

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--after", "scaled_not_unscaled.py", "--steps", "20", "--runs", "2")

    assert result.exit_code == 1, result.output
    assert any("never unscales the gradients" in reason for reason in data["reasons"])


def test_a_script_that_raises_exits_2_with_its_traceback(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECTS / "failing", tmp_path / "failing")

    result, data = run_verify(cli, monkeypatch, project, "raises.py", "--steps", "50")

    assert result.exit_code == 2, result.output
    assert data["verdict"] == "could not run"
    assert "Traceback (most recent call last)" in result.output
    assert "in regression_loss" in result.output
    assert "ValueError: prediction (32, 1) and target (32,) differ" in result.output
    assert "harness.py" not in result.output  # the harness's own frames are left out
    assert "not equivalent" not in result.output.lower()


def test_a_script_that_never_calls_backward_gets_a_clear_error(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECTS / "failing", tmp_path / "failing")

    result, _ = run_verify(cli, monkeypatch, project, "no_backward.py", "--steps", "50")

    assert result.exit_code == 2
    assert "never called backward()" in result.output


def test_apex_before_runs_unmodified_on_the_emulation(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECTS / "apex_project", tmp_path / "apex_project")
    before = snapshot(project)

    result, data = run_verify(
        cli, monkeypatch, project, "train.py", "--after", "train_torch_amp.py", "--steps", "60", "--runs", "2"
    )

    assert result.exit_code == 0, result.output
    assert snapshot(project) == before
    assert data["baseline"] == "before" and data["apex_emulation"] is True
    first = data["runs"]["before"][0]
    assert first["status"] == "completed" and "apex.amp" in first["apex_emulation"]
    assert first["precision"] == "fp16 + apex loss scale"
    after = data["runs"]["after"][0]
    assert after["precision"] == "fp16 + GradScaler"
    # apex O1 and torch.amp share their numerics: fp16 casts, the same dynamic scale (2**16,
    # halved on overflow), the same skipped steps; the curves agree to the last bit
    assert first["skipped_steps"] == after["skipped_steps"] and first["skipped_steps"]
    assert first["losses"] == after["losses"]
    assert "apex emulation" in result.output


@pytest.mark.parametrize("name", ["apex_lr2.py", "apex_no_zero_grad.py"])
def test_broken_afters_of_an_apex_project_are_rejected(cli, monkeypatch, tmp_path, name):
    project = project_with_after(tmp_path / "apex_project", name)

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--after", name, "--steps", "60", "--runs", "2")

    assert result.exit_code == 1, result.output
    assert data["apex_emulation"] is True and data["reasons"]


def test_legacy_lm_migration_is_equivalent_and_its_bug_fix_is_reported_apart(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECTS / "legacy_lm", tmp_path / "legacy_lm")

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--steps", "40", "--runs", "2")

    assert result.exit_code == 0, result.output
    assert data["baseline"] == "before with protocol fixes"
    fixes = data["bug_fix"]["fixes"]
    assert [fix["code"] for fix in fixes] == ["AMP301"] and "unscale_" in fixes[0]["change"]
    assert data["runs"]["before"][0]["clips_on_scaled_gradients"] > 0
    assert data["runs"]["fixed_before"][0]["clips_on_scaled_gradients"] == 0
    assert data["runs"]["after"][0]["precision"] == "bf16"
    effect = data["bug_fix"]["effect"]
    assert effect["final_loss_reference"] > 0 and effect["final_loss_after"] > 0
    assert "AMP301 train.py:55" in result.output and "with the fix" in result.output


def test_legacy_lm_after_with_a_30x_learning_rate_is_rejected(cli, monkeypatch, tmp_path):
    project = project_with_after(tmp_path / "legacy_lm", "lm_lr30.py")

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--after", "lm_lr30.py", "--steps", "40", "--runs", "2")

    assert result.exit_code == 1, result.output
    assert data["bug_fix"]["fixes"][0]["code"] == "AMP301"  # judged against the before with the fix
    assert data["comparison"]["reasons"]


def test_an_after_that_clips_scaled_gradients_is_rejected(cli, monkeypatch, tmp_path):
    # AdamW hides a constant gradient scale from the curve; the clip's view of the gradients does not.
    project = project_with_after(tmp_path / "legacy_lm", "lm_clips_scaled.py")

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--after", "lm_clips_scaled.py", "--steps", "40", "--runs", "2")

    assert result.exit_code == 1, result.output
    assert data["runs"]["after"][0]["clips_on_scaled_gradients"] > 0
    assert any("clips gradients that a GradScaler scaled" in reason for reason in data["reasons"])


def test_an_after_whose_every_step_is_skipped_is_not_equivalent(cli, monkeypatch, tmp_path):
    project = project_with_after(tmp_path / "two_file", "every_step_skipped.py")

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--after", "every_step_skipped.py", "--steps", "30", "--runs", "2")

    assert result.exit_code == 1, result.output
    assert "every optimizer step of the after run" in data["reasons"][0]
    assert "inf/NaN" in result.output


def test_migrating_an_apex_project_either_verifies_or_says_apex_remains(cli, monkeypatch, tmp_path):
    project = copy_of(PROJECTS / "apex_project", tmp_path / "apex_project")
    (project / "train_torch_amp.py").unlink()

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--steps", "30", "--runs", "2")

    if result.exit_code == 2:  # the migration left apex in place
        assert "still imports apex" in result.output
    else:
        assert data["apex_emulation"] is True
        assert result.exit_code == 0, result.output


def test_device_cuda_without_a_gpu_is_exit_2(cli, monkeypatch, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is available")
    project = copy_of(PROJECTS / "failing", tmp_path / "failing")
    monkeypatch.chdir(project)
    result = cli("verify", "raises.py", "--device", "cuda", "--steps", "20")
    assert result.exit_code == 2
    assert "CUDA is not available" in " ".join(result.output.split())  # rich wraps long lines


# ------------------------------------------------------------------------------ the harness alone
CUDA_IDIOMS = '''
    import json, sys
    import torch
    from torch import nn

    assert torch.cuda.is_available() and torch.cuda.device_count() == 1
    assert torch.cuda.get_device_properties(0).total_memory > 0
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(8, 16, device="cuda"), nn.ReLU(), nn.Linear(16, 1)).cuda()
    model.to(device).to("cuda:0").to(0)
    bias = torch.zeros(1, device="cuda") + torch.ones(1, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cuda")
    assert scaler.is_enabled() and scaler.get_scale() == 65536.0

    class Square(torch.autograd.Function):
        @staticmethod
        @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, x):
            assert x.dtype == torch.float32
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @torch.cuda.amp.custom_bwd
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 2 * x * grad

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    seen = []
    for step in range(1000):
        x = torch.randn(32, 8).to("cuda", non_blocking=True)
        y = x.sum(dim=1, keepdim=True).cuda()
        optimizer.zero_grad()
        with torch.autocast("cuda"):
            hidden = model[0](x)
            assert hidden.dtype == torch.float16, hidden.dtype
            assert torch.is_autocast_enabled() and torch.get_autocast_dtype("cuda") == torch.float16
            loss = Square.apply(model[2](model[1](hidden)) - y + bias).mean()
        with torch.cuda.amp.autocast(dtype=torch.bfloat16):
            assert model[0](x).dtype == torch.bfloat16
        seen.append(loss.item())
        with open(sys.argv[1], "w") as handle:
            json.dump(seen, handle)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        torch.cuda.synchronize()
    end.record()
    print(start.elapsed_time(end), torch.cuda.max_memory_allocated(), torch.cuda.get_device_name())
'''


def test_harness_maps_cuda_idioms_to_the_cpu_and_records_the_true_loss(tmp_path):
    from ampmigrate.verify.runner import RunSpec, execute

    project = tmp_path / "proj"
    project.mkdir()
    (project / "idioms.py").write_text(textwrap.dedent(CUDA_IDIOMS))
    losses_file = tmp_path / "script_losses.json"  # outside the protected folder: written as is
    spec = RunSpec(
        label="before", script=str(project / "idioms.py"), args=[str(losses_file)], cwd=str(project),
        steps=25, seed=0, device="cpu", protect=[str(project)],
    )

    result = execute(spec, str(tmp_path / "work"), "before")

    assert result.status == "completed", (result.error.get("traceback") or result.log_tail())
    assert result.data["autocast"] == ["cpu:float16", "cpu:bfloat16"]
    assert result.data["grad_scaler"] is True
    # The recorded curve is the loss itself, not the loss times the GradScaler's 65536.
    script_losses = json.loads(losses_file.read_text())
    applied = [loss for index, loss in enumerate(script_losses) if index not in _skipped_iterations(result)]
    assert result.losses == pytest.approx(applied[: result.steps], rel=1e-6)


def _skipped_iterations(result):
    """Iteration numbers of the skipped steps (the harness stores the applied-step count at each skip)."""
    iterations, applied = [], 0
    skipped = list(result.data["skipped_steps"])
    iteration = 0
    while skipped:
        if skipped[0] == applied:
            iterations.append(iteration)
            skipped.pop(0)
        else:
            applied += 1
        iteration += 1
    return set(iterations)


def test_instruments_observe_the_loss_and_come_off_again():
    from ampmigrate.verify import harness

    originals = (torch.autograd.backward, torch.amp.GradScaler.scale, torch.amp.GradScaler.step)
    recorder = harness.Recorder(torch, steps=10**9, synchronize=False)
    uninstall = harness.install_instruments(torch, recorder)
    try:
        weight = torch.nn.Parameter(torch.ones(3))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        loss = (weight * 2.0).sum()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    finally:
        uninstall()
    assert (torch.autograd.backward, torch.amp.GradScaler.scale, torch.amp.GradScaler.step) == originals
    assert recorder.losses() == [6.0]  # the loss, not the loss times 1024
    assert recorder.scaler_calls == {"scale": 1, "unscale_": 1, "step": 1}  # step() unscales
    optimizer.step()  # the step hook is gone too
    assert len(recorder.losses()) == 1


SELF_SEEDED = '''
    import json, random, sys
    import numpy as np
    import torch

    draws = {
        "torch.Generator": torch.rand(3, generator=torch.Generator().manual_seed(0)).tolist(),
        "default_rng": np.random.default_rng(0).random(3).tolist(),
        "RandomState": np.random.RandomState(0).rand(3).tolist(),
        "random.Random": [random.Random(0).random() for _ in range(3)],
    }
    with open(sys.argv[1], "w") as handle:
        json.dump(draws, handle)
    weight = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    for _ in range(30):
        optimizer.zero_grad()
        (weight ** 2).sum().backward()
        optimizer.step()
'''


def test_runs_of_other_seeds_shift_the_generators_a_script_seeds_itself(tmp_path):
    from ampmigrate.verify.runner import RunSpec, execute

    project = tmp_path / "proj"
    project.mkdir()
    (project / "seeded.py").write_text(textwrap.dedent(SELF_SEEDED))
    draws = []
    for offset in (0, 0, 1):
        out = tmp_path / f"draws-{len(draws)}.json"
        spec = RunSpec(label="before", script=str(project / "seeded.py"), args=[str(out)], cwd=str(project),
                       steps=20, seed=offset, seed_offset=offset, device="cpu")
        result = execute(spec, str(tmp_path / "work"), f"run-{len(draws)}")
        assert result.status == "completed", result.error.get("traceback") or result.log_tail()
        draws.append(json.loads(out.read_text()))
    assert draws[0] == draws[1]  # the same seed: the same draws
    for name, values in draws[0].items():
        assert draws[2][name] != values, name  # seed S+1: every self-seeded generator moved


APEX_SEMANTICS = '''
    import sys
    sys.path.insert(0, sys.argv[1])
    import torch
    from torch import nn
    from apex import amp
    from apex.amp import _amp_state
    from apex.optimizers import FusedAdam, FusedSGD
    from apex.normalization import FusedLayerNorm
    from apex.parallel import DistributedDataParallel, convert_syncbn_model

    torch.manual_seed(0)
    # O2: fp16 model except batch norm, fp32 master weights in the optimizer, fp32 outputs
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    optimizer = FusedSGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", loss_scale="dynamic", num_losses=2)
    assert model[0].weight.dtype == torch.float16 and model[1].weight.dtype == torch.float32
    masters = list(amp.master_params(optimizer))
    assert all(p.dtype == torch.float32 for p in masters) and len(masters) == 6
    out = model(torch.randn(16, 4))
    assert out.dtype == torch.float32
    assert _amp_state.loss_scalers[0].loss_scale() == 2.0**16 and len(_amp_state.loss_scalers) == 2
    loss = out.pow(2).mean()
    with amp.scale_loss(loss, optimizer, loss_id=1) as scaled:
        assert scaled.item() == loss.item() * 2.0**16
        scaled.backward()
    grads = [p.grad for p in amp.master_params(optimizer)]
    assert all(g is not None and g.dtype == torch.float32 for g in grads)
    before = masters[0].detach().clone()
    optimizer.step()
    assert not torch.equal(masters[0], before)
    assert torch.equal(model[0].weight, masters[0].detach().half())  # the fp16 model follows its masters

    # an overflow halves the dynamic scale and skips the next step; static scales never skip
    optimizer.zero_grad()
    with amp.scale_loss(model(torch.full((16, 4), 1e4)).pow(2).mean() * 1e30, optimizer) as scaled:
        scaled.backward()
    assert _amp_state.loss_scalers[0].loss_scale() == 2.0**15
    weights = model[0].weight.detach().clone()
    assert optimizer.step() is None and torch.equal(model[0].weight, weights)
    state = amp.state_dict()
    assert state == {"loss_scaler0": {"loss_scale": 2.0**15, "unskipped": 0}, "loss_scaler1": {"loss_scale": 2.0**16, "unskipped": 1}}
    amp.load_state_dict({"loss_scaler0": {"loss_scale": 8.0, "unskipped": 3}, "loss_scaler1": state["loss_scaler1"]})
    assert _amp_state.loss_scalers[0].loss_scale() == 8.0

    # delay_unscale: gradients stay scaled until the last micro-batch
    plain = nn.Linear(2, 1)
    sgd = torch.optim.SGD(plain.parameters(), lr=0.1)
    plain, sgd = amp.initialize(plain, sgd, opt_level="O0", loss_scale=128.0, verbosity=0)
    assert _amp_state.loss_scalers[0].dynamic is False
    with amp.scale_loss(plain(torch.ones(1, 2)).sum(), sgd, delay_unscale=True) as scaled:
        scaled.backward()
    assert plain.bias.grad.item() == 128.0
    with amp.scale_loss(plain(torch.ones(1, 2)).sum(), sgd) as scaled:
        scaled.backward()
    assert plain.bias.grad.item() == 2.0

    try:
        amp.initialize(nn.Linear(1, 1), opt_level="01")
    except RuntimeError as exc:
        assert "the prefix O is the letter O" in str(exc)
    else:
        raise AssertionError("opt_level 01 accepted")

    adam = FusedAdam([nn.Parameter(torch.ones(2))])
    assert isinstance(adam, torch.optim.Adam) and adam.defaults["weight_decay"] == 0.0 and adam.defaults["decoupled_weight_decay"]
    assert isinstance(FusedLayerNorm(8), nn.LayerNorm) and FusedLayerNorm(8).eps == 1e-5
    net = convert_syncbn_model(nn.Sequential(nn.BatchNorm1d(3)))
    assert isinstance(net[0], nn.SyncBatchNorm)
    wrapped = DistributedDataParallel(nn.Linear(3, 1))
    assert wrapped(torch.ones(2, 3)).shape == (2, 1) and isinstance(wrapped.module, nn.Linear)
    print("ok")
'''


def test_apex_emulation_keeps_apex_semantics(tmp_path):
    import subprocess
    import sys

    from ampmigrate.verify.harness import APEX_EMULATION

    script = tmp_path / "apex_semantics.py"
    script.write_text(textwrap.dedent(APEX_SEMANTICS))
    done = subprocess.run([sys.executable, str(script), APEX_EMULATION], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr


def test_the_emulation_imports_like_a_current_apex_in_after_runs(tmp_path):
    import os
    import subprocess
    import sys

    from ampmigrate.verify.harness import APEX_EMULATION

    code = ("import sys; sys.path.insert(0, sys.argv[1]); import apex.optimizers, apex.normalization\n"
            "try:\n    import apex.amp\nexcept ImportError as exc:\n    print(exc.name)")
    env = {**os.environ, "AMPMIGRATE_APEX_EMULATION": "current"}
    done = subprocess.run([sys.executable, "-c", code, APEX_EMULATION], capture_output=True, text=True, env=env, timeout=300)
    assert done.stdout.strip() == "apex.amp", done.stderr


# ------------------------------------------------------------------------------ issue 16
def test_a_step_only_the_scaler_guarded_keeps_it_and_verifies(cli, monkeypatch, tmp_path):
    """The migration leaves the scaler where it is the mixed-precision step's only inf/NaN guard
    (AMP401 withheld), so the program trains through the corrupt sample as before."""
    project = copy_of(PROJECTS / "nonfinite_guard", tmp_path / "nonfinite_guard")

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--steps", "60", "--runs", "2")

    assert result.exit_code == 0, result.output
    assert "train.py" not in data["migration"]["changed_files"]


def test_dropping_the_scaler_that_guarded_a_step_is_not_equivalent(cli, monkeypatch, tmp_path):
    project = project_with_after(tmp_path / "nonfinite_guard", "unguarded_bf16.py")

    result, data = run_verify(cli, monkeypatch, project, "train.py", "--after", "unguarded_bf16.py", "--steps", "60", "--runs", "2")

    assert result.exit_code == 1, result.output
    assert any("not finite" in reason for reason in data["reasons"]), data["reasons"]



def test_the_migrated_vocoder_trains_where_a_dtype_swap_breaks_the_fft(cli, monkeypatch, tmp_path):
    """The fp16 vocoder's own before cannot run on the CPU (MKL has no half FFT either: the hazard
    itself), so `verify` compares the migrated program (bf16, FFT inputs cast to float32) with the
    dtype swapped alone: the migration trains, the swap raises in the FFT."""
    from ampmigrate.engine.pipeline import Engine

    from conftest import make_settings

    project = copy_of(PROJECTS / "vocoder_fft", tmp_path / "vocoder_fft")
    text = (project / "train.py").read_text(encoding="utf-8")
    migrated = Engine(make_settings({"unsafe-fixes": True})).fix_text(text, str(project / "train.py")).new_text
    assert migrated is not None and ".float())" in migrated and "torch.bfloat16" in migrated
    (project / "migrated.py").write_text(migrated, encoding="utf-8")
    (project / "swapped.py").write_text(text.replace("torch.float16", "torch.bfloat16"), encoding="utf-8")

    result, data = run_verify(cli, monkeypatch, project, "migrated.py", "--after", "swapped.py", "--steps", "30", "--runs", "2")

    assert result.exit_code == 2, result.output
    assert all(run["status"] == "completed" for run in data["runs"]["before"]), data["runs"]["before"]
    assert data["verdict"] == "could not run"
    assert "BFloat16" in result.output
