"""`--plot PATH.png`: the loss curves as an image (matplotlib, the optional `plot` extra)."""

from __future__ import annotations

from ampmigrate.verify.session import Outcome


class PlotUnavailable(Exception):
    """matplotlib is not installed."""


def write_png(outcome: Outcome, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'ampmigrate[plot]'") from None
    from ampmigrate.verify.report import baseline_name

    comparison = outcome.comparison
    baseline, after = outcome.baseline, outcome.after
    name = baseline_name(outcome)
    steps = list(range(1, comparison.steps + 1))
    figure, (curves, deviation) = plt.subplots(
        2, 1, figsize=(9, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]}, constrained_layout=True
    )
    raw = [(baseline, "tab:blue"), (after, "tab:purple")]
    for run, colour in raw:
        values = [v if v is not None else float("nan") for v in run.losses[: comparison.steps]]
        curves.plot(steps, values, color=colour, alpha=0.18, linewidth=0.8)
    for index, curve in enumerate(comparison.noise):
        curves.plot(steps, curve, color="0.6", linewidth=1.0, label=f"{name}, seed {outcome.options.seed + index + 1}" if index == 0 or len(comparison.noise) < 4 else None)
    curves.plot(steps, comparison.baseline, color="tab:blue", linewidth=2.0, label=f"{name} ({baseline.precision_label()})")
    curves.plot(steps, comparison.after, color="tab:purple", linewidth=2.0, linestyle="--", label=f"after ({after.precision_label()})")
    curves.set_ylabel("loss (EMA-smoothed; raw faint)")
    verdict = "equivalent" if comparison.equivalent else "NOT equivalent"
    curves.set_title(f"ampmigrate verify: {outcome.options.script} — {verdict}")
    curves.legend(loc="upper right", fontsize="small")
    curves.grid(alpha=0.3)

    gaps = [abs(a - b) for a, b in zip(comparison.after, comparison.baseline)]
    deviation.plot(steps, gaps, color="tab:purple", linewidth=1.5, label="|after − baseline|")
    deviation.axhline(comparison.noise_floor, color="0.4", linestyle=":", label="noise floor")
    deviation.axhline(comparison.multiple * comparison.noise_floor, color="tab:red", linestyle="--", label=f"limit ({comparison.multiple:g}x floor)")
    deviation.set_xlabel("optimizer step")
    deviation.set_ylabel("deviation")
    deviation.legend(loc="upper right", fontsize="small")
    deviation.grid(alpha=0.3)
    figure.savefig(path, dpi=120)
    plt.close(figure)
