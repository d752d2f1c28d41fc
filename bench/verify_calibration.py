"""Calibrate `verify`'s decision (`ampmigrate.verify.stats.compare`) on cheap synthetic training runs.

    nice python bench/verify_calibration.py              # the study (a few minutes on one core)
    nice python bench/verify_calibration.py --quick      # fewer trials, a smoke run

Thousands of small training runs are simulated at once (parameters carry a leading "run"
dimension, so one batched matmul trains every run): two tasks (a linear regression trained with
SGD + momentum, an MLP classifier trained with AdamW; both clip the gradient norm at 1, as the
legacy scripts `verify` meets do), each run with its own seed (initial weights) and random
stream (its mini-batches). A trial is what `verify` does: K before runs and K after runs, run k
of both with the same seed, judged by `stats.compare`.

Afters that must be accepted (identical training): the same code under other seeds; the same
code with another random stream (same initial weights, other batches: one extra random draw);
the same seed with bf16 rounding of the activations (what a precision migration changes).
Afters that must be rejected: learning rate x1.5 and x0.5, a missing `zero_grad()` (gradients
accumulate), clipping the scaled gradients (loss scale 2**16, clipped before unscaling), the loss
divided by 2.

1. For each K (runs per side) and number of stretches, the band and the spread margin are set to
   the smallest values that accept 98% of the identical-training trials of every task and step
   count (leaving room for the 95% the issue asks), read off `Comparison.band_ratio` and the final
   interval.
2. The table is then `stats.compare` with the chosen constants on every trial: acceptance of
   the identical afters at 200, 1,000 and 10,000 steps and rejection of the broken ones at 200.
   (Step 1 uses curves averaged over blocks that divide every stretch, which gives the same
   stretch means; step 2 uses the raw curves.)
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import time
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ampmigrate.verify.stats import DEFAULT, Criterion, compare  # noqa: E402

ACCEPT = ("other seeds", "other random stream", "bf16 rounding")
REJECT = ("lr x1.5", "lr x0.5", "no zero_grad", "clip scaled grads", "loss / 2")
FEATURES, HIDDEN, BATCH, LOSS_SCALE, MAX_NORM = 16, 32, 64, 2.0**16, 1.0
# Adam divides a gradient by its own running magnitude, so clipping the scaled gradients (which only
# shrinks them by a factor) barely changes an Adam run's curve: no curve test can see it there.
# `verify` catches it at run time instead (the harness sees a clip of gradients a GradScaler scaled
# and has not unscaled); the choice of constants leaves this one cell out.
CURVE_BLIND = {("mlp-classifier-adamw", "clip scaled grads")}
TASKS = {
    # name: (outputs, optimizer, learning rate, label noise); one output: a linear model (convex)
    "linear-regression-sgd": (1, "sgd", 0.01, 0.3),
    "mlp-classifier-adamw": (4, "adamw", 3e-3, 0.3),
}


def simulate(task: str, variants, trials: int, runs: int, steps: int, seed: int = 0):
    """Loss curves [steps][R] of the before runs (trials*runs) and of each after variant."""
    outputs, optimizer, lr, label_noise = TASKS[task]
    group = trials * runs
    names = ["before", *variants]
    total = group * len(names)
    generator = torch.Generator().manual_seed(seed)
    teacher = (torch.randn(FEATURES, 8, generator=generator), torch.randn(8, outputs, generator=generator))
    # Seeds: run j of the before side has seed j; "other seeds" get seeds group..2*group-1 (weights
    # and batches), "other random stream" keeps the seed's weights and draws other batches.
    init_seed = torch.arange(total) % group
    stream = torch.arange(total) % group
    for index, name in enumerate(names):
        block = slice(index * group, (index + 1) * group)
        if name == "other seeds":
            init_seed[block] += group
            stream[block] += group
        elif name == "other random stream":
            stream[block] += 2 * group
    weights = torch.randn(3 * group, FEATURES, HIDDEN, generator=generator) / math.sqrt(FEATURES)
    heads = 0.1 * torch.randn(3 * group, HIDDEN, outputs, generator=generator) / math.sqrt(HIDDEN)  # small output init
    params = [weights[init_seed].clone().requires_grad_(), torch.zeros(total, 1, HIDDEN, requires_grad=True),
              heads[init_seed].clone().requires_grad_(), torch.zeros(total, 1, outputs, requires_grad=True)]

    def per_variant(values):
        out = torch.ones(total, 1, 1)
        for index, name in enumerate(names):
            if name in values:
                out[index * group:(index + 1) * group] = values[name]
        return out

    lr_of = per_variant({"lr x1.5": 1.5, "lr x0.5": 0.5}) * lr
    loss_factor = per_variant({"loss / 2": 0.5}).view(total)
    bf16 = per_variant({"bf16 rounding": 0.0}).view(total, 1, 1) == 0
    accumulate = per_variant({"no zero_grad": 0.0}).view(total) == 0
    clip_scaled = per_variant({"clip scaled grads": 0.0}).view(total) == 0
    state = [torch.zeros_like(p) for p in params]
    second = [torch.zeros_like(p) for p in params]
    accumulated = [torch.zeros_like(p) for p in params]
    curves = torch.empty(steps, total)
    for step in range(steps):
        x_all = torch.randn(3 * group, BATCH, FEATURES, generator=generator)
        noise_all = torch.randn(3 * group, BATCH, outputs, generator=generator)
        x, noise = x_all[stream], noise_all[stream]
        if outputs == 1:
            hidden = x  # linear regression: the first layer is unused
            prediction = torch.baddbmm(params[3], hidden, params[2][:, :FEATURES]) + 0 * params[0].sum() + 0 * params[1].sum()
        else:
            hidden = torch.tanh(torch.baddbmm(params[1], x, params[0]))
            hidden = torch.where(bf16, hidden.bfloat16().float(), hidden)
            prediction = torch.baddbmm(params[3], hidden, params[2])
        prediction = torch.where(bf16, prediction.bfloat16().float(), prediction)
        target = torch.tanh(x @ teacher[0]) @ teacher[1] + label_noise * noise
        if outputs == 1:
            loss = ((prediction - target) ** 2).mean(dim=(1, 2))
        else:
            loss = torch.nn.functional.cross_entropy(prediction.transpose(1, 2), target.argmax(-1), reduction="none").mean(1)
        loss = loss * loss_factor
        grads = torch.autograd.grad(loss.sum(), params)
        with torch.no_grad():
            curves[step] = loss
            grads = [torch.where(accumulate.view(-1, *[1] * (g.dim() - 1)), a + g, g) for a, g in zip(accumulated, grads)]
            accumulated = grads
            norm = torch.sqrt(sum((g.flatten(1) ** 2).sum(1) for g in grads))
            scaled_norm = torch.where(clip_scaled, norm * LOSS_SCALE, norm)
            coef = (MAX_NORM / (scaled_norm + 1e-6)).clamp(max=1.0)
            for i, (p, g) in enumerate(zip(params, grads)):
                g = g * coef.view(-1, *[1] * (g.dim() - 1))
                if optimizer == "sgd":
                    state[i].mul_(0.9).add_(g)
                    p.sub_(lr_of.view(-1, *[1] * (p.dim() - 1)) * state[i])
                else:
                    state[i].mul_(0.9).add_(g, alpha=0.1)
                    second[i].mul_(0.999).addcmul_(g, g, value=0.001)
                    m_hat = state[i] / (1 - 0.9 ** (step + 1))
                    v_hat = second[i] / (1 - 0.999 ** (step + 1))
                    rate = lr_of.view(-1, *[1] * (p.dim() - 1))
                    p.mul_(1 - rate * 0.01).sub_(rate * m_hat / (v_hat.sqrt() + 1e-8))
    curves = curves.nan_to_num(nan=math.inf)
    return {name: curves[:, i * group:(i + 1) * group] for i, name in enumerate(names)}


def trial_curves(curves, name, trial, runs, k):
    """The first k runs of a trial, as lists (one list per run)."""
    block = curves[name][:, trial * runs: trial * runs + k]
    return [block[:, j].tolist() for j in range(k)]


def block_average(curves, steps):
    """Curves averaged over blocks that divide every stretch (same stretch means, far fewer points)."""
    size = steps // 100 if steps % 100 == 0 and steps >= 1000 else 1
    if size == 1:
        return curves
    return {name: c.view(steps // size, size, -1).mean(1) for name, c in curves.items()}


def rates(curves, names, trials, runs, criterion):
    """Fraction of trials `compare` accepts, per after variant."""
    accepted = {}
    for name in names:
        count = 0
        for trial in range(trials):
            before = trial_curves(curves, "before", trial, runs, criterion.runs)
            after = trial_curves(curves, name, trial, runs, criterion.runs)
            count += compare(before, after, criterion).equivalent
        accepted[name] = count / trials
    return accepted


def needed(curves, trials, runs, criterion):
    """Per identical-training trial: the band and the spread margin it needs to be accepted."""
    bands, paired, margins = [], [], []
    for name in ACCEPT:
        for trial in range(trials):
            result = compare(trial_curves(curves, "before", trial, runs, criterion.runs),
                             trial_curves(curves, name, trial, runs, criterion.runs), criterion)
            bands.append(result.band_ratio)
            paired.append(result.rms_ratio)
            relative = criterion.margin * abs(result.final_before)
            extreme = max(abs(result.final_low), abs(result.final_high))
            margins.append(0.0 if extreme <= relative else extreme / result.spread[-1])
    return bands, paired, margins


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def measure(simulated, counts_of, runs, criterion):
    table = {}
    for (task, steps), curves in simulated.items():
        names = ACCEPT + (REJECT if steps == 200 else ())
        table[f"{task} {steps} ({counts_of[task, steps]})"] = rates(curves, names, counts_of[task, steps], runs, criterion)
    return table


def print_table(table) -> None:
    print(f"{'task, steps (trials)':38}" + "".join(f"{name:>20}" for name in ACCEPT + REJECT))
    for key, row in table.items():
        cells = "".join(f"{(row[n] if n in ACCEPT else 1 - row[n]):>20.1%}" if n in row else f"{'':>20}" for n in ACCEPT + REJECT)
        print(f"{key:38}{cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials (a smoke run, not the study)")
    parser.add_argument("--json", help="write the numbers here")
    parser.add_argument("--trials", metavar="N200,N1000,N10000", help="trials per cell at 200, 1,000 and 10,000 steps "
                        "(default 200,150,50)")
    parser.add_argument("--simulate-only", metavar="TASK:STEPS", help="only simulate one task and length into the cache "
                        "(to spread the study over several processes; a later run without it reads the cache)")
    parser.add_argument("--cache", help="where simulated curves are kept (default bench/.work/calibration)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    counts = [int(n) for n in args.trials.split(",")] if args.trials else ([200, 150, 50] if not args.quick else [40, 30, 10])
    trials = dict(zip((200, 1000, 10000), counts))
    lengths = (200, 1000, 10000) if not args.quick else (200, 1000)
    runs = 4
    started = time.perf_counter()
    simulated = {}
    counts_of = {}  # trials simulated per (task, steps)
    cache = args.cache or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".work", "calibration")
    os.makedirs(cache, exist_ok=True)
    for task in TASKS:
        for steps in lengths:
            if args.simulate_only and args.simulate_only != f"{task}:{steps}":
                continue
            path = os.path.join(cache, f"{task}-{steps}-{trials[steps]}x{runs}.pt")
            cached = sorted(glob.glob(os.path.join(cache, f"{task}-{steps}-*x{runs}.pt")))
            if not args.simulate_only and cached:  # what an earlier (sharded) study simulated
                path = max(cached, key=lambda p: int(p.rsplit("-", 1)[1].split("x")[0]))
                simulated[task, steps] = torch.load(path)
                counts_of[task, steps] = int(path.rsplit("-", 1)[1].split("x")[0])
                continue
            variants = ACCEPT + (REJECT if steps == 200 else ())
            t0 = time.perf_counter()
            simulated[task, steps] = simulate(task, variants, trials[steps], runs, steps, seed=steps)
            torch.save(simulated[task, steps], path)
            counts_of[task, steps] = trials[steps]
            print(f"simulated {task} {steps} steps x {trials[steps]} trials in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if args.simulate_only:
        return

    # 1. choose the band and the spread margin for each K and number of stretches
    choices = []
    for k in (2, 3, 4):
        for segments in (10, 20):
            base = replace(DEFAULT, runs=k, segments=segments)
            bands, paired, margins = [], [], []
            for (task, steps), curves in simulated.items():
                b, p, m = needed(block_average(curves, steps), counts_of[task, steps], runs, base)
                bands.append(quantile(b, 0.98))
                paired.append(quantile(p, 0.98))
                margins.append(quantile(m, 0.98))
            criterion = replace(base, band=round(max(bands) + 0.05, 1), rms_band=round(max(paired) + 0.05, 1),
                                spread_margin=round(max(margins) + 0.05, 1))
            reject = {}
            for task in TASKS:
                reject[task] = rates(simulated[task, 200], REJECT, counts_of[task, 200], runs, criterion)
            worst = {name: min(1 - reject[task][name] for task in TASKS if (task, name) not in CURVE_BLIND) for name in REJECT}
            choices.append((criterion, min(worst.values())))
            print(f"K={k} stretches={segments}: band {criterion.band:g}, rms band {criterion.rms_band:g}, spread margin "
                  f"{criterion.spread_margin:g}; rejected at least " + ", ".join(f"{n} {r:.0%}" for n, r in worst.items()), file=sys.stderr)
    good = [c for c in choices if c[1] >= 0.95]
    chosen = min(good, key=lambda c: (c[0].runs, -c[1]))[0] if good else max(choices, key=lambda c: c[1])[0]

    # 2. the tables: the decision function with the chosen and with the shipped constants, on the raw curves
    table = measure(simulated, counts_of, runs, chosen)
    print(f"\nchosen: K={chosen.runs} runs per side, {chosen.segments} stretches, band {chosen.band:g}, rms band {chosen.rms_band:g}, "
          f"margin max({chosen.margin:.0%} of the loss, {chosen.spread_margin:g} spreads)")
    print("acceptance rate (identical training; must be >= 95%) / rejection rate (broken; must be >= 95%)")
    print_table(table)
    shipped = measure(simulated, counts_of, runs, DEFAULT)
    print(f"\nshipped (stats.DEFAULT: K={DEFAULT.runs}, {DEFAULT.segments} stretches, band {DEFAULT.band:g}, "
          f"rms band {DEFAULT.rms_band:g}, margin max({DEFAULT.margin:.0%}, {DEFAULT.spread_margin:g} spreads)):")
    print_table(shipped)
    print(f"\n{time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"chosen": chosen.__dict__, "accepted": table, "shipped": DEFAULT.__dict__, "accepted_shipped": shipped},
                      handle, indent=1)


if __name__ == "__main__":
    main()
