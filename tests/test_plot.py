"""`bertctl plot`: what the picture holds (curves, target, times, throughput) and that it is written as a PNG."""

import dataclasses
import json
from pathlib import Path

import mllog_factory as f
import pytest
from conftest import run_cli

from orchestrator.results import plot, resultset
from orchestrator.results.summary import summarize

INSPUR = Path(__file__).parent / "data" / "mlperf-results" / "v1.1" / "Inspur"


def read_png(path: Path):
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return matplotlib.image.imread(str(path))


def test_plot_of_an_experiment_is_written_next_to_it():
    exp = f.make_experiment(f.with_changes(f.example_specs(), 3, converged=False, minutes=24.0))
    result = run_cli("plot", exp.id)
    assert result.code == 0 and result.out.strip() == str(exp.path / "convergence.png")
    pixels = read_png(exp.path / "convergence.png")
    assert pixels.shape[:2] == (990, 1210) and pixels.std() > 0.05  # not a blank canvas


def test_the_figure_has_every_run_the_target_and_each_time_to_train():
    import matplotlib.pyplot as plt

    exp = f.make_experiment(f.with_changes(f.example_specs(), 3, converged=False, minutes=24.0))
    fig = plot.figure([resultset.from_experiment(exp)])
    acc, tput = fig.axes
    legend = [t.get_text() for t in acc.get_legend().get_texts()]
    assert legend[:3] == ["run 0: 20.40 min", "run 1: 19.10 min", "run 2: 21.70 min"]
    assert "run 3: not converged (aborted)" in legend and "MLPerf target 0.720" in legend
    target = [line for line in acc.get_lines() if line.get_label() == "MLPerf target 0.720"][0]
    assert list(target.get_ydata()) == [0.72, 0.72]
    curves = [line for line in acc.get_lines() if line.get_label().startswith("run ")]
    assert len(curves) == 10 and curves[0].get_xdata()[-1] == pytest.approx(2.4)  # millions of samples
    assert len(tput.get_lines()) == 10 and "block_start to block_stop" in tput.get_title()
    assert "olympic score 20.938 min" in fig._suptitle.get_text()
    plt.close(fig)


def test_plot_of_a_foreign_tree_estimates_samples_and_says_so(tmp_path):
    out = tmp_path / "inspur.png"
    result = run_cli("plot", "--results", str(INSPUR), "--out", str(out))
    assert result.code == 0 and result.out.strip() == str(out) and read_png(out).std() > 0.05
    fig = plot.figure([resultset.from_directory(INSPUR)])
    assert "estimated: epoch_num is not a sample count" in fig.axes[0].get_xlabel()
    assert "olympic score 19.389 min" in fig._suptitle.get_text()
    assert "evaluation time included" in fig.axes[1].get_title()


def test_v11_accuracy_curve_is_spread_evenly_up_to_train_samples():
    s = summarize(INSPUR / "results" / "nf5688m6_pytorch" / "bert" / "result_1.txt")
    curve, estimated = s.accuracy_curve()
    assert estimated and len(curve) == 16 and curve[-1] == (2_400_384, pytest.approx(0.7203778))
    assert curve[0][0] == round(2_400_384 / 16)


def test_throughput_from_blocks_from_stop_to_stop_and_from_tracked_stats(tmp_path):
    interval, slot_s = 150_000, 20.0 * 60 / 16 - 0.001
    timed = summarize(f.write_log(tmp_path / "a.txt", f.RunSpec(seed=5)))
    points, source = timed.throughput()
    assert source == "blocks" and len(points) == 16
    assert points[0][1] == pytest.approx(interval / (0.9 * slot_s * f._jitter(5, 1)), rel=1e-3)
    # a trainer that writes block_start just before block_stop: rates from one block_stop to the next
    back_to_back = summarize(f.write_log(tmp_path / "b.txt", f.RunSpec(seed=5, block_start_at_begin=False)))
    points, source = back_to_back.throughput()
    assert source == "block_stops" and len(points) == 16
    gap_s = slot_s * (1 + 0.9 * (f._jitter(5, 2) - f._jitter(5, 1)))  # block_stop 1 to block_stop 2, eval included
    assert points[1][1] == pytest.approx(interval / gap_s, rel=1e-3)
    tracked = summarize(f.write_log(tmp_path / "c.txt", f.RunSpec(seed=5, tracked_stats=True)))
    points, source = tracked.throughput()
    assert source == "tracked_stats" and points[0][1] == pytest.approx(interval / (0.9 * slot_s * f._jitter(5, 1)), rel=1e-3)


def test_tiny_runs_are_plotted_in_thousands_of_samples():
    exp = f.make_experiment(f.tiny_closed_specs(), cluster="local", overrides=f.TINY_CLOSED)
    fig = plot.figure([resultset.from_experiment(exp)])
    assert fig.axes[0].get_xlabel() == "samples trained (thousands)"


def test_plot_bad_input_is_one_line(tmp_path):
    result = run_cli("plot", "--results", str(tmp_path))
    assert result.code == 2 and result.out == "" and "no result_*.txt logs" in result.err and result.err.count("\n") == 1


@pytest.mark.parametrize("name, message", [("plot.txt", "the name must end in .png"), ("a-file/x.png", "cannot write")])
def test_a_bad_output_path_is_one_line(tmp_path, name, message):
    (tmp_path / "a-file").write_text("not a folder")
    result = run_cli("plot", "--results", str(INSPUR), "--out", str(tmp_path / name))
    assert result.code == 2 and result.out == "" and message in result.err and result.err.count("\n") == 1, result.err


def write_metrics(exp, run: int, records: list[tuple[int, int, float]], extra_lines: tuple[str, ...] = ()) -> None:
    """metrics/run_N.jsonl as the trainer writes it: (update, samples, loss) per report."""
    lines = [json.dumps({"update": u, "samples": s, "loss": loss, "mlm_loss": loss - 0.7, "nsp_loss": 0.7})
             for u, s, loss in records]
    path = exp.path / "metrics" / f"run_{run}.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_text("\n".join([*lines, *extra_lines]) + "\n")


def test_the_loss_panel_reads_the_metrics_and_a_resumed_run_counts_its_later_reports():
    import matplotlib.pyplot as plt

    exp = f.make_experiment(f.tiny_closed_specs(2), cluster="local", overrides=f.TINY_CLOSED)
    # run 0 was interrupted after update 30 and resumed from its checkpoint at update 20
    write_metrics(exp, 0, [(10, 160, 7.0), (20, 320, 6.5), (30, 480, 6.4), (30, 480, 6.3), (40, 640, 6.0)],
                  extra_lines=('{"update": 50, "samp',))  # killed mid-write
    rs = resultset.from_experiment(exp)
    assert rs.loss_curve(0) == [(160, 7.0), (320, 6.5), (480, 6.3), (640, 6.0)]
    assert rs.loss_curve(1) == []  # no metrics file: no curve, no error
    fig = plot.figure([rs])
    acc, loss, tput = fig.axes
    assert loss.get_ylabel() == "training loss (MLM + NSP)" and len(loss.get_lines()) == 1
    assert list(loss.get_lines()[0].get_xdata()) == [0.16, 0.32, 0.48, 0.64]  # thousands, as the accuracy axis
    plt.close(fig)


def test_two_experiments_are_overlaid_one_style_and_legend_entry_each(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    before = f.make_experiment(f.tiny_closed_specs(3), cluster="local", overrides=f.TINY_CLOSED)
    after = f.make_experiment([dataclasses.replace(s, minutes=3.0) for s in f.tiny_closed_specs(3)], cluster="local",
                             overrides=f.TINY_CLOSED)
    for exp, loss in ((before, 6.0), (after, 6.5)):
        for run in range(3):
            write_metrics(exp, run, [(10, 160, loss + 1), (20, 320, loss)])
    fig = plot.figure([resultset.from_experiment(before), resultset.from_experiment(after)])
    acc, loss, _ = fig.axes
    legend = [t.get_text() for t in acc.get_legend().get_texts()]
    assert legend[0].startswith(f"{before.id}: 3/3 converged, median 2.10 min, final accuracy 0.7")
    assert legend[1].startswith(f"{after.id}: 3/3 converged, median 3.00 min")
    styles = {line.get_linestyle() for line in acc.get_lines() if line.get_marker() == "o"}
    colours = {line.get_color() for line in loss.get_lines()}
    assert styles == {"-", "--"} and len(colours) == 2 and len(loss.get_lines()) == 6
    assert f"{before.id}: 3 run(s)" in fig._suptitle.get_text() and f" vs {after.id}: 3 run(s)" in fig._suptitle.get_text()
    plt.close(fig)
    monkeypatch.chdir(tmp_path)
    result = run_cli("plot", before.id, after.id)
    out = tmp_path / f"convergence_{before.id}_vs_{after.id}.png"
    assert result.code == 0 and result.out.strip() == str(out) and read_png(out).std() > 0.05


def test_the_accuracy_axis_fits_small_models_and_names_the_mlperf_target_instead():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    rs = resultset.ResultSet(label="demo", directory=Path("."), files=[], summaries=[], run_config={"train": {"target_accuracy": 0.3}})
    note = plot._decorate_accuracy(ax, [rs], [0.12, 0.2, 0.31], False, "thousands")
    low, high = ax.get_ylim()
    assert 0.1 < low < 0.12 and 0.31 < high < 0.33
    assert "0.720" in note and "above this scale" in note
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["run target 0.300"]
    ax.clear()
    assert plot._decorate_accuracy(ax, [rs], [0.5, 0.68], False, "thousands") == ""  # in reach: drawn
    assert ax.get_ylim()[1] > 0.72
    plt.close(fig)
