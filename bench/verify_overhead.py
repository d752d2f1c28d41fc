"""How much does the `verify` harness add to the step time of the bundled example?

    python bench/verify_overhead.py [--steps 200] [--repeats 5] [--device cpu]

Both sides run the example the same way, as subprocesses of this script (one process tree):

- plain: the harness with its instruments off: only what it takes to run the script at all
  (the CUDA -> CPU mapping on a CPU machine, the seeds) and one global optimizer hook that
  stamps the time and stops the run after N steps;
- harness: everything `verify` installs: loss capture on backward(), GradScaler.scale and .step
  observation, autocast observation, the step hook, the write sandbox.

Runs alternate (plain, harness, plain, ...) so that drift in the machine's load hits both alike;
the ratio is the median of the harness runs' median step times over that of the plain runs'.
It is given for wall-clock time and for process CPU time: on a shared, loaded machine only the
second is steady (run with OMP_NUM_THREADS=1 there, so CPU time is one thread's work).
A second part times the CUDA -> CPU wrappers per call, which both sides pay on the CPU only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "legacy_transformer"
sys.path.insert(0, str(ROOT))

from ampmigrate.verify.runner import RunSpec, execute  # noqa: E402


def step_times(steps: int, repeats: int, device: str, workdir: str):
    medians = {"plain": [], "harness": []}
    cpu_medians = {"plain": [], "harness": []}
    for repeat in range(repeats):
        for mode in ("plain", "harness"):
            spec = RunSpec(
                label=mode, script=str(EXAMPLE / "train.py"), args=[], cwd=str(EXAMPLE), steps=steps, seed=0,
                device=device, protect=[str(EXAMPLE)], instrument=mode == "harness",
            )
            result = execute(spec, workdir, f"{mode}-{repeat}")
            if result.failed or result.median_step_time is None:
                sys.exit(f"{mode} run failed: {result.error or result.log_tail()}")
            medians[mode].append(result.median_step_time)
            cpu_medians[mode].append(result.median_step_cpu_time)
            print(
                f"  {mode:8s} run {repeat + 1}: median step {result.median_step_time * 1e3:7.3f} ms wall, "
                f"{result.median_step_cpu_time * 1e3:7.3f} ms CPU ({result.steps} steps)",
                flush=True,
            )
    return medians, cpu_medians


def wrapper_costs():
    """Seconds per call of the hot-path CUDA -> CPU wrappers, patched minus original."""
    import torch

    from ampmigrate.verify import devicemap

    x = torch.zeros(4)
    calls = {
        "Tensor.to('cuda' -> 'cpu')": (lambda: x.to("cuda"), lambda: x.to("cpu")),
        "autocast('cuda') -> autocast('cpu', fp16)": (
            lambda: torch.autocast("cuda"),
            lambda: torch.autocast("cpu", dtype=torch.float16),
        ),
    }
    originals = {name: min(timeit.repeat(plain, number=20000, repeat=5)) / 20000 for name, (_, plain) in calls.items()}
    devicemap.map_cuda_to_cpu()
    try:
        patched = {name: min(timeit.repeat(mapped, number=20000, repeat=5)) / 20000 for name, (mapped, _) in calls.items()}
    finally:
        devicemap.restore()
    return {name: (originals[name], patched[name]) for name in calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    options = parser.parse_args()
    threads = os.environ.get("OMP_NUM_THREADS", "default")
    print(f"bundled example, {options.steps} steps per run, {options.repeats} runs per side, device {options.device}, OMP_NUM_THREADS={threads}")
    with tempfile.TemporaryDirectory(prefix="ampmigrate-bench-") as workdir:
        medians, cpu_medians = step_times(options.steps, options.repeats, options.device, workdir)
    for label, values in (("wall-clock", medians), ("process CPU", cpu_medians)):
        plain, harness = statistics.median(values["plain"]), statistics.median(values["harness"])
        print(
            f"{label} step time: plain {plain * 1e3:.3f} ms, harness {harness * 1e3:.3f} ms, "
            f"harness / plain = {harness / plain:.4f} ({(harness / plain - 1) * 100:+.2f}%)"
        )
    print("CUDA -> CPU wrappers (both sides, CPU only), per call:")
    for name, (original, patched) in wrapper_costs().items():
        print(f"  {name}: {original * 1e6:.2f} us -> {patched * 1e6:.2f} us")


if __name__ == "__main__":
    main()
