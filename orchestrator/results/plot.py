"""`bertctl plot`: convergence, training loss and throughput of one or more sets of runs, as one PNG.

Top: eval accuracy against samples trained, one line per run, each run's time to train in the
legend and its convergence point marked. Middle (when the runs have `metrics/run_N.jsonl`, as
bertctl's own do): training loss against samples trained. Bottom: training throughput (samples/s)
against minutes since run_start.

One set: a colour per run. Several sets (`bertctl plot EXP1 EXP2`, e.g. a recipe before and after a
change): a colour and a line style per set, every run of a set drawn in it, one legend entry per set,
so a regression shows as one family of curves apart from the other.

The accuracy axis fits the data: MLPerf's 0.720 target is drawn when it is in reach of the curves,
and otherwise stated in the title, so a small model's curves are not squeezed into a flat line.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

MLPERF_TARGET = 0.720
SET_STYLES = ("-", "--", ":", "-.")
THROUGHPUT_SOURCES = {
    "tracked_stats": "the trainer's tracked_stats throughput",
    "blocks": "samples per block, block_start to block_stop",
    "block_stops": "samples from one block_stop to the next, evaluation time included",
    "evals": "samples between evaluations, evaluation time included",
}


def default_output(sets: list) -> Path:
    """One experiment: next to its results. Otherwise (a foreign tree may be read-only, an overlay
    belongs to no one experiment) in the current directory."""
    if len(sets) == 1 and sets[0].experiment is not None:
        return sets[0].experiment.path / "convergence.png"
    names = [rs.label if rs.experiment is not None else _slug(rs.label) for rs in sets]
    return Path.cwd() / f"convergence_{'_vs_'.join(names)}.png"


def plot(sets: list, out: Path) -> Path:
    """Draw the sets and write them as a PNG; returns its path."""
    import matplotlib.pyplot as plt

    fig = figure(sets)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        save_png(fig, out)
    finally:
        plt.close(fig)
    return out


def save_png(fig, out: Path) -> None:
    """Written under a hidden name in the same folder and renamed when whole: a full disk leaves no
    half-written PNG under the real name, nor a temporary file in the way of a retry."""
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, dpi=110, format="png")
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the plot from the user's group
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def figure(sets: list):
    """The matplotlib figure: accuracy axes first, loss axes (if any run has metrics), throughput last."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a login node
    import matplotlib.pyplot as plt

    losses = [[rs.loss_curve(i) for i in range(len(rs.summaries))] for rs in sets]
    with_loss = any(curve for set_losses in losses for curve in set_losses)
    ratios = [3, 2, 2] if with_loss else [3, 2]
    fig, axes = plt.subplots(len(ratios), 1, figsize=(11, 4.5 * len(ratios)), gridspec_kw={"height_ratios": ratios})
    acc_ax, tput_ax = axes[0], axes[-1]
    loss_ax = axes[1] if with_loss else None
    scale, unit = _sample_unit(sets)
    estimated, sources, peak, accuracies = False, set(), 0.0, []
    for k, rs in enumerate(sets):
        style = SET_STYLES[k % len(SET_STYLES)]
        for i, s in enumerate(rs.summaries):
            colour = _colour(k, i, len(sets))
            label = _legend(s) if len(sets) == 1 else (_set_legend(rs) if i == 0 else None)
            curve, guessed = s.accuracy_curve()
            estimated |= guessed
            if curve:
                xs = [samples / scale for samples, _ in curve]
                accuracies += [acc for _, acc in curve]
                acc_ax.plot(xs, [acc for _, acc in curve], style, marker="o", ms=3, lw=1.3, color=colour, label=label)
                if s.converged:
                    acc_ax.plot(xs[-1], curve[-1][1], "*", ms=12, color=colour, markeredgecolor="black", mew=0.5)
            if loss_ax is not None and losses[k][i]:
                loss_ax.plot([x / scale for x, _ in losses[k][i]], [v for _, v in losses[k][i]], style, lw=1.1,
                             color=colour, label=label)
            points, source = s.throughput()
            if points:
                sources.add(source)
                tput_ax.plot([t for t, _ in points], [v for _, v in points], style, lw=1.3, color=colour)
                peak = max(peak, max(v for _, v in points))
    off_scale = _decorate_accuracy(acc_ax, sets, accuracies, estimated, unit)
    if loss_ax is not None:
        _decorate_loss(loss_ax, unit, len(sets))
    _decorate_throughput(tput_ax, sources, peak)
    title = " vs ".join(f"{rs.label}: {len(rs.summaries)} run(s), {_score_text(rs)}" for rs in sets)
    fig.suptitle(title + (f"\n{off_scale}" if off_scale else ""), fontsize=11 if len(sets) == 1 else 9)
    fig.tight_layout()
    return fig


def _colour(set_index: int, run_index: int, n_sets: int):
    import matplotlib.pyplot as plt

    return plt.get_cmap("tab10")((run_index if n_sets == 1 else set_index) % 10)


def _legend(s) -> str:
    name = Path(s.file).stem.replace("result_", "run ")
    if s.problem:  # drawn up to the line that broke a rule; no time to train
        return f"{name}: malformed log ({s.problem[:60]})"
    if s.converged and s.minutes is not None:
        return f"{name}: {s.minutes:.2f} min"
    return f"{name}: not converged ({s.status or 'no run_stop'})"


def _set_legend(rs) -> str:
    """One line per set in an overlay: how many converged, the median time, the final accuracies."""
    converged = [s for s in rs.summaries if s.converged and s.minutes is not None]
    finals = [s.last_accuracy for s in rs.summaries if s.last_accuracy is not None]
    parts = [f"{rs.label}: {len(converged)}/{len(rs.summaries)} converged"]
    if converged:
        parts.append(f"median {statistics.median(s.minutes for s in converged):.2f} min")
    if finals:
        parts.append(f"final accuracy {min(finals):.3f}-{max(finals):.3f}")
    return ", ".join(parts)


def _sample_unit(sets: list) -> tuple[float, str]:
    """Millions for BERT-large (about 2.5 M samples to converge), thousands for small test models."""
    furthest = max((s.accuracy_curve()[0][-1][0] for rs in sets for s in rs.summaries if s.evals), default=0)
    return (1e6, "millions") if furthest >= 100_000 else (1e3, "thousands")


def _decorate_accuracy(ax, sets: list, accuracies: list[float], estimated: bool, unit: str) -> str:
    """Axes, targets and legend; returns the note for the title when MLPerf's target is off the scale."""
    targets = sorted({t for rs in sets if (t := _run_target(rs)) is not None and abs(t - MLPERF_TARGET) > 1e-9})
    for t in targets:
        ax.axhline(t, color="grey", ls=":", lw=1, label=f"run target {t:.3f}")
    low, high = (min(accuracies), max(accuracies)) if accuracies else (0.0, MLPERF_TARGET)
    high = max([high, *targets])
    off_scale = ""
    if MLPERF_TARGET <= high + 0.25 * (high - low) + 0.02:  # in reach of the curves: draw it
        ax.axhline(MLPERF_TARGET, color="black", ls="--", lw=1, label=f"MLPerf target {MLPERF_TARGET:.3f}")
        high = max(high, MLPERF_TARGET)
    else:
        off_scale = f"MLPerf's target ({MLPERF_TARGET:.3f} masked-LM accuracy) is above this scale: not drawn"
    margin = max(0.05 * (high - low), 0.005)
    ax.set_ylim(max(0.0, low - margin), high + margin)
    xlabel = f"samples trained ({unit})"
    if estimated:
        xlabel += "; estimated: epoch_num is not a sample count, evals spread evenly up to train_samples"
    ax.set_xlabel(xlabel)
    ax.set_ylabel("eval accuracy (masked LM)")
    ax.set_title("Convergence (star: run_stop success; legend: time to train, run_stop - run_start)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=1 if len(sets) > 1 else 2, loc="lower right")
    return off_scale


def _run_target(rs) -> float | None:
    return ((rs.run_config or {}).get("train") or {}).get("target_accuracy")


def _decorate_loss(ax, unit: str, n_sets: int) -> None:
    ax.set_xlabel(f"samples trained ({unit})")
    ax.set_ylabel("training loss (MLM + NSP)")
    ax.set_title("Training loss (metrics/run_N.jsonl: the mean over each report's steps)", fontsize=10)
    ax.grid(alpha=0.3)
    if n_sets > 1:
        ax.legend(fontsize=8, loc="upper right")


def _score_text(rs) -> str:
    from orchestrator.results import scoring

    score = scoring.olympic_score([(Path(s.file).name, s.minutes, s.converged) for s in rs.summaries])
    if len(rs.summaries) != scoring.required_runs():
        return f"not scored ({scoring.required_runs()} runs needed)"
    malformed = [Path(s.file).name for s in rs.summaries if s.problem]
    if malformed:
        return f"not scored (malformed log: {', '.join(malformed[:3])})"
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
