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
    from ampmigrate.verify.report import baseline_name, mean_curve, smoothed

    comparison = outcome.comparison
    reference, after = outcome.reference_runs, outcome.after_runs
    name = baseline_name(outcome)
    steps = list(range(1, comparison.steps + 1))
    figure, (curves, deviation) = plt.subplots(
        2, 1, figsize=(9, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]}, constrained_layout=True
    )
    for runs, colour, label in ((reference, "tab:blue", name), (after, "tab:purple", "after")):
        smooth = [smoothed(run, comparison.steps) for run in runs]
        for curve in smooth:
            curves.plot(steps, curve, color=colour, alpha=0.25, linewidth=0.8)
        curves.plot(steps, mean_curve(smooth), color=colour, linewidth=2.0,
                    label=f"{label} ({runs[0].precision_label()}), mean of {len(runs)} seeds")
    curves.set_ylabel("loss (EMA-smoothed; each seed faint)")
    verdict = "equivalent" if not outcome.reasons else "NOT equivalent"
    curves.set_title(f"ampmigrate verify: {outcome.options.script} — {verdict}")
    curves.legend(loc="upper right", fontsize="small")
    curves.grid(alpha=0.3)

    middles = [(start + end) / 2 for start, end in comparison.bounds]
    deviation.plot(middles, comparison.band_ratios, color="tab:purple", marker="o", linewidth=1.5,
                   label="|after − reference| in standard errors")
    deviation.axhline(comparison.criterion.band, color="tab:red", linestyle="--", label=f"limit ({comparison.criterion.band:g})")
    deviation.axhline(comparison.criterion.rms_band, color="0.4", linestyle=":", label=f"rms limit ({comparison.criterion.rms_band:g})")
    deviation.set_xlabel("optimizer step")
    deviation.set_ylabel("deviation")
    deviation.legend(loc="upper right", fontsize="small")
    deviation.grid(alpha=0.3)
    figure.savefig(path, dpi=120)
    plt.close(figure)
