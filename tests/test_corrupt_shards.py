"""A corrupt-shard matrix (issue 13): every way a shard breaks, in both layouts, against

  (b) `Shard` itself: ShardError "<file>: sample <i>: <problem>" (or "<file>: <problem>" for the file),
  (a) the trainer: its data path (TrainData, the eval reader) raises that error before any of the
      shard is trained on, and `trainer.loop.entry.main` turns it into one line and exit 2,
  (c) `data verify` on a prepared dataset, with checksums off and the broken file left out of the
      statistics (`--stats-files 1`): one FAIL naming the file, exit 1.

Plus, as a user runs them: `python -m trainer` on a broken shard read by a prefetch worker, and
`bertctl data verify` with `expect.checksums: none` (intact: exit 0) and with `--stats-files 1`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import pytest
import yaml
from data_helpers import SMALL, bertctl
from synthetic import make_sample, tiny_run_config, train_data

from trainer.data.layout import Sample, Shard, ShardError, write_shard

BAD = 17  # the broken sample: not the first, so the index in the message means something


@dataclass(frozen=True)
class Limits:
    vocab: int
    max_len: int
    max_pred: int


TINY = Limits(vocab=64, max_len=64, max_pred=10)  # tests/synthetic.py's tiny_run_config


def canvas(limits: Limits, length: int = 40) -> Sample:
    """A well-formed sample to break: ids inside any vocabulary of 60+, six masked positions."""
    rng = np.random.default_rng(5)
    ids = rng.integers(10, 60, length)
    ids[0] = 2
    seg = (np.arange(length) >= length // 2).astype(np.int64)
    positions = np.array([3, 8, 12, 20, 27, 33])
    labels = ids[positions].copy()
    ids[positions] = 4
    return Sample(ids, seg, positions, labels, 0)


# ---- the ways to break a shard

def broken_sample(mutate: Callable[[Sample, Limits], Sample]):
    """Write `samples` with sample BAD replaced by a broken one."""
    def write(path: Path, samples: list[Sample], layout: str, limits: Limits) -> None:
        samples = list(samples)
        samples[BAD] = mutate(canvas(limits), limits)
        width = max(limits.max_len, max(len(s) for s in samples))
        predictions = max(limits.max_pred, max(len(s.masked_lm_positions) for s in samples))
        write_shard(path, samples, layout, width, predictions)
    return write


def damaged_file(damage: Callable[[Path], None]):
    """Write `samples` whole, then damage the file."""
    def write(path: Path, samples: list[Sample], layout: str, limits: Limits) -> None:
        width = max(limits.max_len, max(len(s) for s in samples))
        write_shard(path, samples, layout or "varlen", width, limits.max_pred)
        damage(path)
    return write


def edit(fn: Callable[[Sample, Limits], None]) -> Callable[[Sample, Limits], Sample]:
    def mutate(s: Sample, limits: Limits) -> Sample:
        fn(s, limits)
        return s
    return mutate


def with_hdf5(fn: Callable[[h5py.File], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        with h5py.File(path, "r+") as f:
            fn(f)
    return damage


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def replace_dataset(name: str, make: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], None]:
    def fn(f: h5py.File) -> None:
        data = f[name][:]
        del f[name]
        f.create_dataset(name, data=make(data))
    return with_hdf5(fn)


def too_many_predictions(s: Sample, limits: Limits) -> Sample:
    s.masked_lm_positions = np.arange(1, limits.max_pred + 2)
    s.masked_lm_ids = s.input_ids[s.masked_lm_positions].copy()
    return s


@dataclass(frozen=True)
class Case:
    name: str
    write: Callable  # (path, good samples, layout, limits) -> None: the broken shard at path
    expect: str  # regex of the problem, formatted with the limits
    sample: bool = True  # the message names sample BAD (False: a fault of the whole file)
    layouts: tuple = ("fixed", "varlen")
    needs_limits: bool = False  # caught only against the run's vocabulary / lengths


FIELDS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")
UNREADABLE = r"unreadable HDF5 shard \(.+\)"
CASES = [
    Case("truncated", damaged_file(truncate), UNREADABLE, sample=False),
    Case("empty file", damaged_file(lambda p: p.write_bytes(b"")), UNREADABLE, sample=False, layouts=(None,)),
    Case("garbage bytes", damaged_file(lambda p: p.write_bytes(np.random.default_rng(0).bytes(4096))), UNREADABLE,
         sample=False, layouts=(None,)),
    *[Case(f"missing {field}", damaged_file(with_hdf5(lambda f, name=field: f.__delitem__(name))),
           rf"not a BERT shard \(missing {field}\)", sample=False) for field in FIELDS],
    Case("sample counts differ", damaged_file(replace_dataset("next_sentence_labels", lambda a: a[:-1])),
         r"datasets hold different numbers of samples: .*next_sentence_labels {n_minus_1}.*", sample=False),
    Case("token id = vocabulary size", broken_sample(edit(lambda s, L: s.input_ids.__setitem__(5, L.vocab))),
         r"token id {vocab} in input_ids is outside the vocabulary \(0-{vocab_minus_1}\)", needs_limits=True),
    Case("negative token id", broken_sample(edit(lambda s, L: s.input_ids.__setitem__(5, -3))),
         r"token id -3 in input_ids is outside the vocabulary \(.+\)"),
    Case("masked id = vocabulary size", broken_sample(edit(lambda s, L: s.masked_lm_ids.__setitem__(1, L.vocab))),
         r"token id {vocab} in masked_lm_ids is outside the vocabulary \(0-{vocab_minus_1}\)", needs_limits=True),
    Case("masked position past the end", broken_sample(edit(lambda s, L: s.masked_lm_positions.__setitem__(5, 40))),
         r"masked position 40 is past the end of the sequence \(length 40\)"),
    Case("masked position 0", broken_sample(edit(lambda s, L: s.masked_lm_positions.__setitem__(0, 0))),
         r"masked position 0 is the \[CLS\] token"),
    Case("more predictions than max", broken_sample(too_many_predictions),
         r"{max_pred_plus_1} masked positions, more than max_predictions {max_pred}", needs_limits=True),
    Case("longer than max_seq_length", broken_sample(lambda s, L: canvas(L, L.max_len + 1)),
         r"{max_len_plus_1} tokens, more than max_seq_length {max_len}", needs_limits=True),
    Case("next sentence label 2", broken_sample(edit(lambda s, L: setattr(s, "next_sentence_label", 2))),
         r"next_sentence_label 2 \(must be 0 or 1\)"),
    Case("segment id 2", broken_sample(edit(lambda s, L: s.segment_ids.__setitem__(7, 2))),
         r"segment id 2 \(segment_ids must be 0 or 1\)"),
    Case("segment_ids shorter than input_ids", broken_sample(edit(lambda s, L: setattr(s, "segment_ids", s.segment_ids[:-1]))),
         r"input_ids has 40 entries, segment_ids 39", layouts=("varlen",)),
    Case("fewer masked ids than positions", broken_sample(edit(lambda s, L: setattr(s, "masked_lm_ids", s.masked_lm_ids[:-1]))),
         r"masked_lm_positions has 6 entries, masked_lm_ids 5", layouts=("varlen",)),
    Case("input_mask with a hole", damaged_file(with_hdf5(lambda f: f["input_mask"].__setitem__((BAD, 5), 0))),
         r"input_mask is not 1s followed by 0s", layouts=("fixed",)),
    Case("masked_lm_ids narrower than positions", damaged_file(replace_dataset("masked_lm_ids", lambda a: a[:, :-1])),
         r"masked_lm_positions is {max_pred} wide, masked_lm_ids {max_pred_minus_1}", sample=False, layouts=("fixed",)),
    Case("fixed shard without input_mask", damaged_file(with_hdf5(lambda f: f.__delitem__("input_mask"))),
         r"input_ids is a 2-D int16 array, not variable-length rows \(a fixed-layout shard also has input_mask\)", sample=False, layouts=("fixed",)),
]
MATRIX = [pytest.param(case, layout, id=f"{case.name}-{layout or 'any'}") for case in CASES for layout in case.layouts]


def expected(case: Case, path: Path, limits: Limits, count: int) -> str:
    problem = case.expect.format(vocab=limits.vocab, vocab_minus_1=limits.vocab - 1, max_pred=limits.max_pred, max_pred_plus_1=limits.max_pred + 1,
                                 max_pred_minus_1=limits.max_pred - 1, max_len=limits.max_len,
                                 max_len_plus_1=limits.max_len + 1, n_minus_1=count - 1)
    return re.escape(str(path)) + ": " + (f"sample {BAD}: " if case.sample else "") + problem


def synthetic_samples(n: int = 40) -> list[Sample]:
    rng = np.random.default_rng(3)
    return [make_sample(rng, TINY.vocab, TINY.max_len, TINY.max_pred) for _ in range(n)]


def limits_of(limits: Limits) -> dict:
    return {"vocab_size": limits.vocab, "max_seq_length": limits.max_len, "max_predictions": limits.max_pred}


# ---- (b) Shard itself

@pytest.mark.parametrize("case,layout", MATRIX)
def test_shard_names_the_file_sample_and_problem(case, layout, tmp_path):
    samples = synthetic_samples()
    path = tmp_path / "part_00000.hdf5"
    case.write(path, samples, layout, TINY)
    with pytest.raises(ShardError) as e:
        Shard(path, **limits_of(TINY))
    assert re.fullmatch(expected(case, path, TINY, len(samples)), str(e.value)), str(e.value)
    if not case.needs_limits:  # structural faults are caught without any limits too
        with pytest.raises(ShardError, match=re.escape(str(path))):
            Shard(path)


@pytest.mark.parametrize("layout", ["fixed", "varlen"])
def test_a_good_shard_passes_and_reads_back_unchanged(layout, tmp_path):
    samples = synthetic_samples()
    path = write_shard(tmp_path / "good.hdf5", samples, layout, TINY.max_len, TINY.max_pred)
    shard = Shard(path, vocab_size=TINY.vocab, max_seq_length=TINY.max_len, max_predictions=TINY.max_pred)
    assert len(shard) == 40
    for i, s in enumerate(samples):
        got = shard.sample(i)
        assert np.array_equal(got.input_ids, s.input_ids) and np.array_equal(got.masked_lm_positions, s.masked_lm_positions)
    # the limits are exact: the largest id, the longest sequence and the most predictions are allowed
    top = max(int(s.input_ids.max()) for s in samples)
    Shard(path, vocab_size=top + 1, max_seq_length=int(shard.lengths.max()), max_predictions=int(shard.num_predictions.max()))
    with pytest.raises(ShardError, match=f"outside the vocabulary \\(0-{top - 1}\\)"):
        Shard(path, vocab_size=top)


def test_fixed_layout_padding_is_not_data(tmp_path):
    """Beyond a sample's length (and its predictions) the fixed layout's padding is ignored, whatever it holds."""
    path = write_shard(tmp_path / "fixed.hdf5", synthetic_samples(), "fixed", TINY.max_len, TINY.max_pred)
    with h5py.File(path, "r+") as f:
        short = int(np.argmin(f["input_mask"][:].sum(axis=1)))
        f["input_ids"][short, -1] = TINY.vocab + 5
        f["segment_ids"][short, -1] = 7
    Shard(path, **limits_of(TINY))
    with h5py.File(path, "r+") as f:
        f["input_mask"][short, -1] = 1  # now the padding is inside: a hole, and then out-of-range data
    with pytest.raises(ShardError, match=f"sample {short}: input_mask is not 1s followed by 0s"):
        Shard(path, **limits_of(TINY))


def test_a_shard_cannot_be_written_with_ids_that_do_not_fit_int16(tmp_path):
    samples = synthetic_samples()
    samples[3].input_ids[2] = 40000  # would be stored as -25536
    with pytest.raises(ValueError, match="sample 3: input_ids holds 40000, which does not fit a shard"):
        write_shard(tmp_path / "x.hdf5", samples)
    assert not list(tmp_path.iterdir())


# ---- (a) the trainer

@pytest.fixture(scope="module")
def run_config(tmp_path_factory) -> dict:
    """tiny_run_config's run, cut to 3 updates: a broken shard that slipped through would still end quickly."""
    folder = tmp_path_factory.mktemp("run")
    path = tiny_run_config(folder, optim={"max_steps": 3}, train={"max_samples_termination": 24, "eval_every_samples": 24})
    return yaml.safe_load(path.read_text())


def run_trainer_in_process(config: dict, folder: Path, capsys) -> tuple[int, list[str]]:
    """`python -m trainer --config ... --out ...` as trainer.loop.entry.main runs it (an exception escaping
    main would be the traceback a user sees)."""
    from trainer.loop.entry import main

    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    capsys.readouterr()
    code = main(["--config", str(path), "--out", str(folder / "out")])
    return code, capsys.readouterr().err.strip().splitlines()


def trained_updates(folder: Path) -> int:
    metrics = folder / "out" / "metrics" / "run_0.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


@pytest.mark.parametrize("case,layout", MATRIX)
def test_the_trainer_data_path_refuses_the_shard_before_training(case, layout, tmp_path):
    """TrainData and the eval reader, given the run's limits (what train.py passes)."""
    from trainer.loop.evaluate import read_eval_samples

    samples = synthetic_samples()
    path = tmp_path / "train" / "part_00000.hdf5"
    path.parent.mkdir()
    case.write(path, samples, layout, TINY)
    pattern = expected(case, path, TINY, len(samples))
    data = train_data(path.parent, 0, 1, 8, seed=1, vocab_size=TINY.vocab, max_seq_length=TINY.max_len,
                      max_predictions=TINY.max_pred)
    try:
        with pytest.raises(ShardError) as e:
            data.next_samples()
        assert re.fullmatch(pattern, str(e.value)), str(e.value)
    finally:
        data.close()
    with pytest.raises(ShardError) as e:
        read_eval_samples(str(path.parent), 10, **limits_of(TINY))
    assert re.fullmatch(pattern, str(e.value)), str(e.value)


@pytest.mark.parametrize("case,layout", [pytest.param(case, layout, id=f"{case.name}-{layout or 'any'}")
                                         for case in CASES for layout in case.layouts])
def test_the_trainer_exits_2_with_one_line_naming_file_and_sample(case, layout, run_config, tmp_path, capsys):
    samples = synthetic_samples()
    path = tmp_path / "train" / "part_00000.hdf5"
    path.parent.mkdir()
    case.write(path, samples, layout, TINY)
    config = {**run_config, "data": {**run_config["data"], "train_dir": str(path.parent)}}
    code, lines = run_trainer_in_process(config, tmp_path, capsys)
    assert code == 2 and len(lines) == 1, lines
    assert re.fullmatch("error: " + expected(case, path, TINY, len(samples)), lines[0]), lines[0]
    assert trained_updates(tmp_path) == 0


def test_a_broken_eval_shard_stops_the_trainer_at_start(run_config, tmp_path, capsys):
    samples = synthetic_samples()
    path = tmp_path / "eval" / "part_eval.hdf5"
    path.parent.mkdir()
    broken_sample(edit(lambda s, L: s.masked_lm_positions.__setitem__(5, 40)))(path, samples, "varlen", TINY)
    config = {**run_config, "data": {**run_config["data"], "eval_dir": str(path.parent), "eval_samples": 40}}
    code, lines = run_trainer_in_process(config, tmp_path, capsys)
    assert code == 2 and lines == [f"error: {path}: sample {BAD}: masked position 40 is past the end of the sequence (length 40)"]
    assert trained_updates(tmp_path) == 0


def test_a_truncated_shard_in_a_4_bin_folder_is_named_when_counting_for_stratified_batches(run_config, tmp_path, capsys):
    samples = synthetic_samples()
    for edge in (128, 256, 384, 512):
        write_shard(tmp_path / "train" / str(edge) / "part_0.hdf5", samples, "varlen", TINY.max_len, TINY.max_pred)
    broken = tmp_path / "train" / "384" / "part_0.hdf5"
    truncate(broken)
    config = {**run_config, "data": {**run_config["data"], "train_dir": str(tmp_path / "train")},
              "balance": {"stratified": True}}
    code, lines = run_trainer_in_process(config, tmp_path, capsys)
    assert code == 2 and len(lines) == 1 and re.fullmatch(f"error: {re.escape(str(broken))}: {UNREADABLE}", lines[0]), lines


def test_python_m_trainer_stops_at_a_broken_shard_read_by_a_prefetch_worker(run_config, tmp_path):
    """As a user runs it: the second shard, read ahead in a worker process, has a negative id; the
    error crosses the process boundary and ends the run with one line and exit 2."""
    good, broken = tmp_path / "train" / "part_00000.hdf5", tmp_path / "train" / "part_00001.hdf5"
    write_shard(good, synthetic_samples(), "varlen", TINY.max_len, TINY.max_pred)
    broken_sample(edit(lambda s, L: s.input_ids.__setitem__(5, -3)))(broken, synthetic_samples(), "fixed", TINY)
    config = {**run_config, "data": {**run_config["data"], "train_dir": str(tmp_path / "train"), "num_workers": 1},
              "optim": {**run_config["optim"], "max_steps": 20}, "train": {**run_config["train"], "max_samples_termination": 160}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "trainer", "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines == [
        f"error: {broken}: sample {BAD}: token id -3 in input_ids is outside the vocabulary (0-63)"], proc.stderr[-2000:]


# ---- (c) data verify

@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A small build of the sample dataset (varlen shards), once for this module."""
    home = tmp_path_factory.mktemp("verify-home")
    result = bertctl("data", "prepare", "--dataset", "sample", *SMALL, home=home)
    assert result.returncode == 0, result.stderr
    return home / "datasets" / "sample"


def sample_limits(root: Path) -> Limits:
    vocab = len((root / "vocab.txt").read_text(encoding="utf-8").splitlines())
    return Limits(vocab=vocab, max_len=128, max_pred=20)  # the sample manifest's train_128 output


def verify_copy(root: Path, stats_files: int | None = 1):
    """`data verify` (the worker's function) on `root`, checksums off: only validation can catch a fault."""
    from orchestrator import data
    from trainer.data.prepare.plan import Plan
    from trainer.data.prepare.verify import exit_code, verify

    overrides = [*SMALL[1::2], f"root={root}", "expect.checksums=none"]
    checks = verify(Plan(data.load_manifest("sample", overrides).config), stats_files=stats_files)
    return exit_code(checks), checks


@pytest.mark.parametrize("case,layout", MATRIX)
def test_verify_fails_the_broken_file_with_checksums_off_and_the_file_unsampled(case, layout, prepared, tmp_path):
    root = tmp_path / "sample"
    shutil.copytree(prepared, root)
    limits = sample_limits(root)
    path = root / "train_128" / "part_1_of_2.hdf5"  # --stats-files 1 reads part_0 for statistics
    original = Shard(path)
    case.write(path, original.samples(range(len(original))), layout, limits)
    code, checks = verify_copy(root)
    failed = {c.name: c.detail for c in checks if c.ok is False}
    assert code == 1 and "train_128: well formed" in failed, failed
    assert set(failed) <= {"train_128: well formed", "train_128: samples"}, failed
    assert re.fullmatch(expected(case, path, limits, len(original)), failed["train_128: well formed"]), failed
    assert "train_128: samples" not in failed or not case.sample  # a bad sample does not lose the file's count


def test_verify_of_an_intact_dataset_with_checksums_off_passes_with_a_skip(prepared):
    result = bertctl("data", "verify", "--dataset", "sample", *SMALL, "-o", "expect.checksums=none", home=prepared.parent.parent)
    assert result.returncode == 0, result.stderr
    assert "SKIP  train_128: checksums: the manifest records no checksums" in result.stderr
    assert "FAIL" not in result.stderr and result.stderr.strip().endswith("checks passed, 3 skipped")


def test_bertctl_verify_names_an_unsampled_broken_shard(prepared, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(prepared.parent.parent, home)
    path = home / "datasets" / "sample" / "train_128" / "part_1_of_2.hdf5"
    truncate(path)
    result = bertctl("data", "verify", "--dataset", "sample", *SMALL, "--stats-files", "1", home=home)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    fails = [line.strip() for line in result.stderr.splitlines() if line.strip().startswith("FAIL")]
    assert f"FAIL  train_128: well formed: {path}: unreadable HDF5 shard" in "\n".join(fails), fails


@pytest.mark.parametrize("layout", ["fixed", "varlen"])
def test_a_shard_without_samples_stops_the_trainer_instead_of_spinning(layout, tmp_path):
    """A reader whose only shard is empty would advance through epochs forever looking for a sample."""
    path = write_shard(tmp_path / "train" / "part_00000.hdf5", [], layout, TINY.max_len, TINY.max_pred)
    assert len(Shard(path)) == 0  # a valid file (the prepare pipeline may read such parts)
    data = train_data(path.parent, 0, 1, 8, seed=1)
    try:
        with pytest.raises(ShardError, match=f"^{re.escape(str(path))}: no samples$"):
            data.next_samples()
    finally:
        data.close()


@pytest.mark.parametrize("kind", [h5py.string_dtype(), h5py.string_dtype("ascii")])
def test_a_shard_of_strings_is_refused_naming_the_field(kind, tmp_path):
    """Variable-length strings where token ids belong: h5py reports their type as `str`/`bytes`, no dtype."""
    path = tmp_path / "strings.hdf5"
    rng = np.random.default_rng(0)
    write_shard(path, [make_sample(rng, 64, 64, 10) for _ in range(4)], layout="varlen")
    with h5py.File(path, "r+") as f:
        del f["input_ids"]
        f.create_dataset("input_ids", data=np.array(["1 2 3"] * 4, dtype=object), dtype=kind)
    with pytest.raises(ShardError, match=r"strings\.hdf5: input_ids holds (str|bytes) values, expected integers"):
        Shard(path)
