"""bertctl judges published BERT logs of every round (v0.7 to v5.0) as the official checker does.

tests/data/mlperf-rounds/logs.tar.gz holds real logs, logs.json the official checker's verdict on
each (benchmarks/published_logs_sweep.py judged every published log the same way). A log the
official checker passes is never malformed for bertctl; what bertctl doubts in it is a warning.
"""

import json
import tarfile

import pytest
from conftest import REPO

from orchestrator.results import compliance, verdict
from orchestrator.results import summary as results

ROUNDS = REPO / "tests" / "data" / "mlperf-rounds"
MANIFEST = json.loads((ROUNDS / "logs.json").read_text())


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """{file in logs.json: its path, extracted}"""
    folder = tmp_path_factory.mktemp("rounds")
    with tarfile.open(ROUNDS / "logs.tar.gz") as tar:
        tar.extractall(folder, filter="data")
    return {m["file"]: folder / m["file"] for m in MANIFEST}


def test_the_sample_covers_every_round_and_both_verdicts():
    rounds = {m["ruleset"] for m in MANIFEST}
    assert rounds == {"0.7.0", "1.0.0", "1.1.0", "2.0.0", "2.1.0", "3.0.0", "3.1.0", "4.0.0", "4.1.0", "5.0.0"}
    assert sum(m["official_compliant"] for m in MANIFEST) == 19 and len(MANIFEST) == 23


@pytest.mark.parametrize("entry", [m for m in MANIFEST if m["official_compliant"]], ids=lambda m: m["file"])
def test_no_published_log_the_official_checker_passes_is_malformed(entry, published):
    s = results.summarize(published[entry["file"]])
    assert verdict.own_problem(s) is None and not s.damaged, (verdict.own_problem(s), s.damaged)
    assert s.minutes and s.minutes > 0


@pytest.mark.parametrize("file, warning", [
    ("v0.7/Google/gpu-v100-8-TF2.0/result_0.txt", "time_ms 0 is not a time this log could have been written at"),
    ("v1.0/Supermicro/SYS-420GP-TNAR+/result_1.txt", "an event with an empty key"),
    ("v1.1/Google/tpu-v4-4096-TF/result_0.txt", "evaluations after convergence"),
    ("v3.1/xFusion/G5500V7x8xL40S/result_10.txt", "earlier than the last eval_accuracy"),
])
def test_what_bertctl_doubts_in_an_accepted_log_is_a_warning_with_its_line(file, warning, published):
    s = results.summarize(published[file])
    assert any(warning in w and w.startswith("line ") for w in s.warnings), s.warnings


@pytest.mark.parametrize("file", [
    "v3.0/NVIDIA/dgxh100_ngc23.04_pytorch/result_0.txt",  # tracked_stats step [2, 3321]: the false alarm
    "v2.0/Google/cloud-tpu-v4-8192-TF/result_0.txt",  # run_final after run_stop
    "v4.1/tinycorp/tinybox_green/result_0.txt",  # seed after run_stop
])
def test_the_variety_the_official_checker_ignores_raises_no_doubt(file, published):
    s = results.summarize(published[file])
    assert (s.problem, s.warnings) == (None, [])


def test_bertctl_verdict_equals_the_official_checkers_on_every_sample_log(published):
    """The real checker, run now, on every log bertctl hands it; bertctl's own checks fail the rest."""
    summaries = {m["file"]: results.summarize(published[m["file"]]) for m in MANIFEST}
    handed = [m for m in MANIFEST if verdict.own_problem(summaries[m["file"]]) is None]
    checked = {}
    for ruleset in sorted({m["ruleset"] for m in handed}):
        group = [m for m in handed if m["ruleset"] == ruleset]
        for m, result in zip(group, compliance.check_logs([published[m["file"]] for m in group], ruleset)):
            checked[m["file"]] = result.compliant
    for m in MANIFEST:
        bertctl = checked.get(m["file"], False)
        assert bertctl == m["official_compliant"], (m["file"], verdict.own_problem(summaries[m["file"]]))
    assert len(handed) >= 21  # only the logs without run_stop (HPE v2.1) are failed before the checker


def test_the_time_to_train_reader_predicts_a_v3_h100_set_and_a_set_without_a_score_does_not_raise(published):
    """The issue: the benchmark's reader rejected every v3.0 H100 log (tracked_stats steps), and
    PublishedCheck.error raised TypeError on a set without a score. One run has no olympic score."""
    from orchestrator.checks import predict
    from orchestrator.results import resultset

    log = published["v3.0/NVIDIA/dgxh100_ngc23.04_pytorch/result_0.txt"]
    check = predict.from_published(resultset.from_directory(log.parent), "3.0.0")
    assert check.global_batch == 768 and check.prediction.rcp.ruleset == "3.0.0"
    assert check.prediction.minutes > 0 and check.score_minutes is None and check.error is None
