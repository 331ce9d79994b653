"""`bertctl plot`: convergence curves and training throughput of every run of a set, as one PNG.

Top: eval accuracy against samples trained, one line per run, the MLPerf target, each run's time
to train in the legend and its convergence point marked. Bottom: training throughput (samples/s)
against minutes since run_start.
"""

from __future__ import annotations

from pathlib import Path

MLPERF_TARGET = 0.720
THROUGHPUT_SOURCES = {
    "tracked_stats": "the trainer's tracked_stats throughput",
    "blocks": "samples per block, block_start to block_stop",
    "block_stops": "samples from one block_stop to the next, evaluation time included",
    "evals": "samples between evaluations, evaluation time included",
}


def default_output(rs) -> Path:
    """Next to the experiment's results; for a foreign tree, in the current directory (it may be read-only)."""
    if rs.experiment is not None:
        return rs.experiment.path / "convergence.png"
    return Path.cwd() / f"convergence_{_slug(rs.label)}.png"


def plot(rs, out: Path) -> Path:
    """Draw the set and write it as a PNG; returns its path."""
    import matplotlib.pyplot as plt

    fig = figure(rs)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def figure(rs):
    """The matplotlib figure: accuracy axes first, throughput axes second."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a login node
    import matplotlib.pyplot as plt

    fig, (acc_ax, tput_ax) = plt.subplots(2, 1, figsize=(11, 9), gridspec_kw={"height_ratios": [3, 2]})
    colours = plt.get_cmap("tab10")
    estimated, sources, peak = False, set(), 0.0
    scale, unit = _sample_unit(rs)
    for i, s in enumerate(rs.summaries):
        colour = colours(i % 10)
        curve, guessed = s.accuracy_curve()
        estimated |= guessed
        if curve:
            xs = [samples / scale for samples, _ in curve]
            acc_ax.plot(xs, [acc for _, acc in curve], "-o", ms=3, lw=1.3, color=colour, label=_legend(s))
            if s.converged:
                acc_ax.plot(xs[-1], curve[-1][1], "*", ms=12, color=colour, markeredgecolor="black", mew=0.5)
        points, source = s.throughput()
        if points:
            sources.add(source)
            tput_ax.plot([t for t, _ in points], [v for _, v in points], "-", lw=1.3, color=colour)
            peak = max(peak, max(v for _, v in points))
    _decorate_accuracy(acc_ax, rs, estimated, unit)
    _decorate_throughput(tput_ax, sources, peak)
    fig.suptitle(f"{rs.label}: {len(rs.summaries)} run(s), {_score_text(rs)}", fontsize=12)
    fig.tight_layout()
    return fig


def _legend(s) -> str:
    name = Path(s.file).stem.replace("result_", "run ")
    if s.converged and s.minutes is not None:
        return f"{name}: {s.minutes:.2f} min"
    return f"{name}: not converged ({s.status or 'no run_stop'})"


def _sample_unit(rs) -> tuple[float, str]:
    """Millions for BERT-large (about 2.5 M samples to converge), thousands for small test models."""
    furthest = max((s.accuracy_curve()[0][-1][0] for s in rs.summaries if s.evals), default=0)
    return (1e6, "millions") if furthest >= 100_000 else (1e3, "thousands")


def _decorate_accuracy(ax, rs, estimated: bool, unit: str) -> None:
    ax.axhline(MLPERF_TARGET, color="black", ls="--", lw=1, label=f"MLPerf target {MLPERF_TARGET:.3f}")
    own = ((rs.run_config or {}).get("train") or {}).get("target_accuracy")
    if own is not None and abs(own - MLPERF_TARGET) > 1e-9:
        ax.axhline(own, color="grey", ls=":", lw=1, label=f"run target {own:.3f}")
    xlabel = f"samples trained ({unit})"
    if estimated:
        xlabel += "; estimated: epoch_num is not a sample count, evals spread evenly up to train_samples"
    ax.set_xlabel(xlabel)
    ax.set_ylabel("eval accuracy (masked LM)")
    ax.set_title("Convergence (star: run_stop success; legend: time to train, run_stop - run_start)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="lower right")


def _score_text(rs) -> str:
    from orchestrator import scoring

    score = scoring.olympic_score([(Path(s.file).name, s.minutes, s.converged) for s in rs.summaries])
    if len(rs.summaries) != scoring.required_runs():
        return f"not scored ({scoring.required_runs()} runs needed)"
    if score.minutes is None:
        return "no score (more than one run did not converge)"
    return f"olympic score {score.minutes:.3f} min (before any RCP factor)"


def _decorate_throughput(ax, sources: set[str], peak: float) -> None:
    ax.set_xlabel("minutes since run_start")
    ax.set_ylabel("training samples / s")
    how = "; ".join(THROUGHPUT_SOURCES[s] for s in sorted(sources)) or "no throughput in the logs"
    ax.set_title(f"Training throughput ({how})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.set_ylim(0, peak * 1.15 if peak > 0 else 1)


def _slug(text: str) -> str:
    parts = [p for p in Path(text).resolve().parts if p not in ("/", "results", "bert")]
    return "_".join(parts[-2:]) or "results"
