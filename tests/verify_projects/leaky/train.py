"""A training script that writes into its working directory by every route the leak suite knows.

    python train.py [--skip CASE ...]

Run from a folder holding config.json, notes.txt, data/ and ckpt/ (a link to a folder elsewhere
that holds last.pt). Each case checks that the run sees its own write, so a redirection that
loses a write fails the script.
"""

import argparse
import functools
import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Points(Dataset):
    def __init__(self):
        gen = torch.Generator().manual_seed(3)
        self.x = torch.randn(64, 4, generator=gen)
        self.y = self.x.sum(dim=1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


def worker_writes(kind, worker_id):
    """DataLoader workers write files too (a per-worker log)."""
    with open(f"worker-{kind}-{worker_id}.txt", "w") as handle:
        handle.write("worker was here\n")
    with open("notes.txt", "a") as handle:
        handle.write(f"worker {kind}\n")


def leak(skip):
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "beside_the_script.txt"), "w") as handle:
        handle.write("written next to the script\n")

    os.truncate("config.json", 5)
    assert os.path.getsize("config.json") == 5

    os.makedirs("runs", exist_ok=True)
    np.savetxt("runs/arr.txt", np.arange(3.0))
    np.save("runs/arr.npy", np.arange(3.0))
    assert np.loadtxt("runs/arr.txt").tolist() == [0.0, 1.0, 2.0]
    try:
        import pandas
    except ImportError:
        pass
    else:
        pandas.DataFrame({"a": [1, 2]}).to_csv("data/table.csv")
        pandas.DataFrame({"a": [1, 2]}).to_csv("config.json")

    torch.save({"w": torch.ones(2)}, "ckpt/last.pt")  # ckpt links out of the project
    assert torch.load("ckpt/last.pt")["w"].tolist() == [1.0, 1.0]

    fd = os.open("notes.txt", os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"overwritten by os.write\n")
    os.close(fd)
    fd = os.open("created_by_os_open.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"\x00\x01")
    os.close(fd)

    if "child" not in skip:
        subprocess.run(["sh", "-c", "echo child >> config.json; echo new > created_by_child.txt; echo x >> ckpt/last.pt"], check=True)

    shutil.copy2(sys.argv[0], "copied_script.py")
    shutil.copy2("data/train.csv", "data/train_copy.csv")
    shutil.copytree("data", "data_copy")
    assert os.path.exists("data_copy/train.csv")

    os.symlink("config.json", "link_to_config")
    assert os.path.islink("link_to_config")

    handler = logging.FileHandler("train.log")
    logger = logging.getLogger("leaky")
    logger.addHandler(handler)
    logger.warning("a log line")
    handler.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip", nargs="*", default=[])
    args = parser.parse_args()
    leak(args.skip)

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loaders = []
    for kind in ("fork", "spawn"):
        if kind in args.skip:
            continue
        init = functools.partial(worker_writes, kind)
        loaders.append(
            DataLoader(Points(), batch_size=16, num_workers=1, multiprocessing_context=kind, worker_init_fn=init, persistent_workers=True)
        )
    loaders = loaders or [DataLoader(Points(), batch_size=16)]
    for epoch in range(100):
        for loader in loaders:
            for x, y in loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()


if __name__ == "__main__":
    main()
