"""`fix --unsafe-fixes` runs again over a run whose first pass wrote files (cli.py `_UNSAFE_PASSES`):
an unsafe fix may depend on what another file's fix just did, and the run's project index was built
from the files as they were. Here (qianrenjian/HotpotQA_GNN's shape) the apex migration hands the
scaler to a checkpoint helper of another file; only then can AMP401/AMP402 move the training to
bfloat16 without a scaler. A second `fix` must change nothing."""

from __future__ import annotations

from pathlib import Path

from test_apex_threading import _fix, _snapshot

UTILS = '''\
import torch
from apex import amp


def save_state(args, model, optimizer, path):
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    if args.fp16:
        checkpoint["amp"] = amp.state_dict()
    torch.save(checkpoint, path)
'''
TRAIN = '''\
import torch
from apex import amp

from utils import save_state


def main(args, model, loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            if args.fp16:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
        save_state(args, model, optimizer, "ckpt.pt")
'''


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "p"
    project.mkdir()
    (project / "utils.py").write_text(UTILS)
    (project / "train.py").write_text(TRAIN)
    return project


def test_an_unsafe_fix_that_waits_for_another_files_fix_is_made_in_the_same_run(tmp_path):
    project = _project(tmp_path)
    output = _fix(project, "--unsafe-fixes")
    train = (project / "train.py").read_text()
    assert "dtype=torch.bfloat16" in train and "from apex" not in train, output
    after = _snapshot(project)
    _fix(project, "--unsafe-fixes")
    assert _snapshot(project) == after


def test_safe_fixes_run_once(tmp_path):
    project = _project(tmp_path)
    _fix(project)
    train = (project / "train.py").read_text()
    assert "dtype=torch.float16" in train and "GradScaler" in train
