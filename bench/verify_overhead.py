"""How much does the `verify` harness add to the step time of the bundled example?

    python bench/verify_overhead.py [--steps 500] [--block 10] [--repeats 5]

Two measurements, both on examples/legacy_transformer/train.py run as `__main__`, in processes
this script starts (one process tree):

1. interleaved, in one process: the script trains once while the harness's instruments (loss
   capture on backward(), GradScaler.scale/.step/.unscale_ and autocast observation, the step
   hook) are switched on and off every BLOCK steps. Alternating blocks share the same load,
   caches and data, so the ratio of the median step times (process CPU time and wall-clock) is
   precise even on a busy machine;
2. separate runs, as `verify` runs them: plain runs (the harness with its instruments off: seeds,
   the step count and stop, nothing else) alternate with full harness runs, REPEATS of each; the
   ratio of the medians of their median step times. Noisy where other work shares the cores.

Both sides keep what it takes to run the script at all on a CPU machine (the CUDA -> CPU mapping)
and the write redirection (no file access in the training step); the per-call cost of the
mapping's hot-path wrappers is printed at the end. Use OMP_NUM_THREADS=1 on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "legacy_transformer"
SCRIPT = EXAMPLE / "train.py"
WARMUP = 20
sys.path.insert(0, str(ROOT))


def interleaved_child(steps: int, block: int, out: str) -> None:
    """Runs in its own process: the example with the instruments toggled every `block` steps."""
    import runpy

    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from ampmigrate.verify import devicemap, harness
    from ampmigrate.verify.sandbox import Sandbox

    devicemap.map_cuda_to_cpu()
    harness.seed_everything(torch, 0)
    sandbox = Sandbox([str(EXAMPLE)], os.path.join(os.path.dirname(out), "scratch"))
    sandbox.install()
    sandbox.install_torch(torch)
    recorder = harness.Recorder(torch, steps=10**9, synchronize=False)
    samples = {"plain": {"cpu": [], "wall": []}, "harness": {"cpu": [], "wall": []}}
    state = {"uninstall": None, "count": 0, "stamp": None}

    # A pre-step hook: toggling the instruments registers/removes a post-step hook, which must
    # not happen while torch iterates over the post-step hooks.
    def hook(optimizer, args, kwargs):
        cpu, wall = time.process_time(), time.perf_counter()
        mode = "harness" if state["uninstall"] else "plain"
        if state["stamp"] is not None and state["count"] > WARMUP:
            samples[mode]["cpu"].append(cpu - state["stamp"][0])
            samples[mode]["wall"].append(wall - state["stamp"][1])
        state["count"] += 1
        if state["count"] > steps:
            raise harness.StopTraining
        if state["count"] % block == 0:
            if state["uninstall"]:
                state["uninstall"]()
                state["uninstall"] = None
            else:
                state["uninstall"] = harness.install_instruments(torch, recorder)
        state["stamp"] = (time.process_time(), time.perf_counter())

    register_optimizer_step_pre_hook(hook)
    os.chdir(EXAMPLE)
    sys.argv = [str(SCRIPT), "--epochs", str(steps // 128 + 2)]
    sys.path[0] = str(EXAMPLE)
    sys.dont_write_bytecode = True
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    except harness.StopTraining:
        pass
    sandbox.uninstall()
    with open(out, "w") as handle:
        json.dump(samples, handle)


def interleaved(steps: int, block: int) -> None:
    with tempfile.TemporaryDirectory(prefix="ampmigrate-bench-") as workdir:
        out = os.path.join(workdir, "samples.json")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONDONTWRITEBYTECODE="1")
        subprocess.run(
            [sys.executable, __file__, "--interleaved-child", out, "--steps", str(steps), "--block", str(block)],
            check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        with open(out) as handle:
            samples = json.load(handle)
    print(f"1. interleaved in one process: {steps} steps, instruments toggled every {block} steps")
    for clock in ("cpu", "wall"):
        plain = statistics.median(samples["plain"][clock])
        harness = statistics.median(samples["harness"][clock])
        label = "process CPU" if clock == "cpu" else "wall-clock"
        print(
            f"   {label:11s} median step: plain {plain * 1e3:.3f} ms ({len(samples['plain'][clock])} steps), "
            f"harness {harness * 1e3:.3f} ms ({len(samples['harness'][clock])} steps), "
            f"harness / plain = {harness / plain:.4f} ({(harness / plain - 1) * 100:+.2f}%)"
        )


def separate_runs(steps: int, repeats: int) -> None:
    from ampmigrate.verify.runner import RunSpec, execute

    medians = {"plain": {"cpu": [], "wall": []}, "harness": {"cpu": [], "wall": []}}
    with tempfile.TemporaryDirectory(prefix="ampmigrate-bench-") as workdir:
        for repeat in range(repeats):
            for mode in ("plain", "harness"):
                spec = RunSpec(
                    label=mode, script=str(SCRIPT), args=[], cwd=str(EXAMPLE), steps=steps, seed=0,
                    device="cpu", protect=[str(EXAMPLE)], instrument=mode == "harness",
                )
                result = execute(spec, workdir, f"{mode}-{repeat}")
                if result.failed or result.median_step_time is None:
                    sys.exit(f"{mode} run failed: {result.error or result.log_tail()}")
                medians[mode]["wall"].append(result.median_step_time)
                medians[mode]["cpu"].append(result.median_step_cpu_time)
    print(f"2. separate runs as verify runs them: {repeats} plain and {repeats} harness runs of {steps} steps, alternating")
    for clock in ("cpu", "wall"):
        plain = statistics.median(medians["plain"][clock])
        harness = statistics.median(medians["harness"][clock])
        spread = max(medians["plain"][clock] + medians["harness"][clock]) / min(medians["plain"][clock] + medians["harness"][clock])
        label = "process CPU" if clock == "cpu" else "wall-clock"
        print(
            f"   {label:11s} median step: plain {plain * 1e3:.3f} ms, harness {harness * 1e3:.3f} ms, "
            f"harness / plain = {harness / plain:.4f} ({(harness / plain - 1) * 100:+.2f}%); "
            f"runs spread {spread:.2f}x"
        )


def wrapper_costs() -> None:
    """Per call: the hot-path CUDA -> CPU wrappers against the call they stand for."""
    import torch

    from ampmigrate.verify import devicemap

    x = torch.zeros(4)
    calls = {
        "Tensor.to('cuda') vs. Tensor.to('cpu')": (lambda: x.to("cuda"), lambda: x.to("cpu")),
        "autocast('cuda') vs. autocast('cpu', float16)": (
            lambda: torch.autocast("cuda"),
            lambda: torch.autocast("cpu", dtype=torch.float16),
        ),
    }
    originals = {name: min(timeit.repeat(plain, number=20000, repeat=5)) / 20000 for name, (_, plain) in calls.items()}
    devicemap.map_cuda_to_cpu()
    try:
        mapped = {name: min(timeit.repeat(call, number=20000, repeat=5)) / 20000 for name, (call, _) in calls.items()}
    finally:
        devicemap.restore()
    print("3. CUDA -> CPU wrappers (CPU runs only, both sides), per call:")
    for name in calls:
        print(f"   {name}: {mapped[name] * 1e6:.2f} us vs. {originals[name] * 1e6:.2f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--interleaved-child", metavar="OUT", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.interleaved_child:
        interleaved_child(options.steps, options.block, options.interleaved_child)
        return
    print(f"bundled example on the CPU, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'default')}")
    interleaved(options.steps, options.block)
    if options.repeats:
        separate_runs(min(options.steps, 200), options.repeats)
    wrapper_costs()


if __name__ == "__main__":
    main()
