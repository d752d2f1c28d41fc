"""The apex emulation (ampmigrate/verify/apex_emulation) accumulates gradients over several
`amp.scale_loss` blocks as apex did: on entering a block apex sets aside the gradients already
there (unscaled by earlier blocks), unscales only the new backward's, and adds the two
(`_prepare_amp_backward` / `post_backward_models_are_masters`, and into the fp32 masters under O2).
The emulation used to divide every gradient by the scale on leaving each block, so the earlier
micro-batches of a step were divided again (by 65536): a transformers-2020 Trainer with
gradient accumulation trained on its last micro-batch only, and verify compared against that.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

pytest.importorskip("torch")

EMULATION = ROOT / "ampmigrate" / "verify" / "apex_emulation"

PROGRAM = textwrap.dedent(
    """
    import torch
    from apex import amp

    def run(opt_level, delays, loss_factor=0.25):
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, verbosity=0)
        x = torch.ones(1, 2)
        for delay in delays:
            with amp.scale_loss(model(x).float().sum() * loss_factor, optimizer, delay_unscale=delay) as scaled:
                scaled.backward()
        return [p.grad.tolist() for p in amp.master_params(optimizer)]

    print(run("O1", [False, False]))          # two micro-batches, each unscaled on leaving its block
    print(run("O1", [True, False]))           # delay_unscale: scaled until the last block
    print(run("O2", [False, False]))    # into the fp32 master gradients
    """
)


def test_scale_loss_blocks_accumulate_like_apex(tmp_path):
    script = tmp_path / "accumulate.py"
    script.write_text(PROGRAM, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(script)], env={"PYTHONPATH": str(EMULATION), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    assert out == ["[[[0.5, 0.5]], [0.5]]"] * 3, out
