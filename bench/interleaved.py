"""Cold `check` of two or more checkouts and ruff, interleaved, in CPU time and wall time.

On a machine shared with other work, two runs minutes apart are not comparable; runs one after
the other, round after round, are. Each round runs, from each checkout given, `python -m
ampmigrate check TREE` with a new, empty cache directory, then `ruff check --select ALL
--no-cache --isolated` on the same tree; CPU time is user + system of every process of the run
(the command, its index child and its workers: `getrusage(RUSAGE_CHILDREN)`).

    python bench/interleaved.py --tree /work/corpus/lightning --rounds 10 /path/to/main .

Write each checkout's bytecode first (`python -m compileall -q ampmigrate`): under
PYTHONDONTWRITEBYTECODE a checkout would compile every module at each start. A checkout may carry
environment settings after a `|`: `.|AMPMIGRATE_X=1,Y=2`. The runs' findings must be the same.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple


def _run(command: List[str], cwd: str, env: Dict[str, str]) -> Tuple[float, float, bytes]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkouts", nargs="+", help="checkout roots (optionally `root|NAME=value,...`)")
    parser.add_argument("--tree", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ruff", default=shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff"))
    parser.add_argument("--jobs", help="`-j` for ampmigrate (default: its default)")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="interleaved-")
    config = os.path.join(work, "pyproject.toml")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write("[tool.ampmigrate]\nrespect-gitignore = false\n")
    labels = list(args.checkouts) + (["ruff"] if os.path.exists(args.ruff) else [])
    walls: Dict[str, List[float]] = {label: [] for label in labels}
    cpus: Dict[str, List[float]] = {label: [] for label in labels}
    outputs: Dict[str, bytes] = {}
    try:
        for _ in range(args.rounds):
            for label in args.checkouts:
                root, _, settings = label.partition("|")
                env = {**os.environ, "PYTHONPATH": ""}
                env.update(item.split("=", 1) for item in settings.split(",") if item)
                cache = tempfile.mkdtemp(dir=work)
                command = [sys.executable, "-m", "ampmigrate", "check", args.tree, "--config", config,
                           "--output-format", "concise", "--exit-zero", "--cache-dir", cache]
                if args.jobs:
                    command += ["-j", args.jobs]
                wall, cpu, out = _run(command, os.path.abspath(root), env)
                shutil.rmtree(cache, ignore_errors=True)
                walls[label].append(wall)
                cpus[label].append(cpu)
                outputs.setdefault(label, out)
            if "ruff" in walls:
                wall, cpu, _ = _run([args.ruff, "check", "--select", "ALL", "--no-cache", "--isolated", "--exit-zero", "-q", args.tree], work, dict(os.environ))
                walls["ruff"].append(wall)
                cpus["ruff"].append(cpu)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at the end {os.getloadavg()}; {args.rounds} rounds; medians (min)")
    for label in labels:
        print(f"{label:40s} wall {statistics.median(walls[label]):.3f} s ({min(walls[label]):.3f})"
              f"  CPU {statistics.median(cpus[label]):.3f} s ({min(cpus[label]):.3f})")
    if "ruff" in cpus:
        ruff_cpu, ruff_wall = statistics.median(cpus["ruff"]), statistics.median(walls["ruff"])
        for label in args.checkouts:
            print(f"{label:40s} / ruff: CPU {statistics.median(cpus[label]) / ruff_cpu:.2f}, wall {statistics.median(walls[label]) / ruff_wall:.2f}")
    if len(set(outputs.values())) > 1:
        raise SystemExit("the checkouts' findings differ")


if __name__ == "__main__":
    main()
