"""`bertctl data verify`: is a prepared dataset what its manifest says, and intact?

Per output: the files are all there; the sample counts match what the build recorded and the
manifest's expectations; every file is read whole and every sample well formed (the trainer's own
validation, trainer.data.layout.Shard: token ids inside the vocabulary, masked positions inside the
sequence, labels 0/1, lengths and predictions within the output's limits) and every length in its
bin; the masked share of tokens, the [MASK]/random/kept split and the share of random next sentences
are within the manifest's tolerances (on `--stats-files N` of the files, when given); each file's
content digest matches the one recorded when it was written. Plus the phase-1 checkpoint's input
files and converted output, where the manifest has one. Each check passes, fails, or is skipped with
the reason; a skipped check is not a failure.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from trainer.config import DatasetOutput, expand_path
from trainer.config.regular import open_regular
from trainer.data.layout import Shard, ShardError, sample_count
from trainer.data.prepare import files
from trainer.data.prepare.bins import bin_counts, bin_names
from trainer.data.prepare.plan import Plan
from trainer.data.prepare.stats import ShardStats, stats_of
from trainer.data.prepare.vocab import read_vocab


@dataclass
class Check:
    name: str
    ok: bool | None  # None: skipped
    detail: str

    @property
    def status(self) -> str:
        return {True: "PASS", False: "FAIL", None: "SKIP"}[self.ok]

    def as_json(self) -> dict:
        return {**asdict(self), "status": self.status}


def verify(plan: Plan, stats_files: int | None = None) -> list[Check]:
    checks = [built_check(plan)]
    record = files.read_json(plan.prepared) if plan.prepared.exists() else None
    vocab = vocabulary(plan)
    mask_id = vocab.index("[MASK]") if vocab and "[MASK]" in vocab else None
    for name, out in plan.manifest.outputs.items():
        checks += output_checks(plan, name, out, (record or {}).get("outputs", {}).get(name), mask_id,
                                len(vocab) if vocab else None, stats_files)
    if plan.manifest.checkpoint is not None:
        checks += checkpoint_checks(plan)
    return checks


def vocabulary(plan: Plan) -> list[str] | None:
    """The dataset's tokens by id (the manifest's vocab file, or the one learned at build time), if there is one."""
    path = plan.vocab_file
    return read_vocab(path) if path is not None and path.exists() else None


def built_check(plan: Plan) -> Check:
    if not plan.prepared.exists():
        return Check("prepared", False, f"{plan.prepared} missing: run `bertctl data prepare --dataset {plan.manifest.name}`")
    record = files.read_json(plan.prepared)
    if record.get("params") != plan.manifest.params_digest():
        return Check("prepared", False, "built with other parameters than the manifest's (prepare it again with --force)")
    return Check("prepared", True, f"built {record.get('created', '?')} with Python {record.get('python', '?')}")


def output_checks(plan: Plan, name: str, out: DatasetOutput, record: dict | None, mask_id: int | None,
                  vocab_size: int | None, stats_files: int | None) -> list[Check]:
    """Every present file is opened and validated; statistics and digests come from `stats_files` of them."""
    paths = plan.output_files(name)
    missing = [p for p in paths if not p.exists()]
    checks = [Check(f"{name}: files", not missing,
                    f"{len(paths) - len(missing)} of {len(paths)} present" + (f"; missing {missing[0]}" if missing else ""))]
    present = [p for p in paths if p.exists()]  # a FIFO or folder there is present, and fails as a shard
    chosen = set(spread(present, stats_files))
    total, per_file, broken = ShardStats(), {}, []
    counted = 0
    for path in present:
        try:
            shard = Shard(path, vocab_size, out.max_seq_length, out.max_predictions)
        except ShardError as e:
            broken.append(str(e))
            counted += header_count(path)  # one fault, one failed check: the count stays right where it can
            continue
        counted += len(shard)
        if path in chosen:
            per_file[path] = stats_of(shard, mask_id, length_range(plan, name, out, path))
            total.add(per_file[path])
    checks.append(count_check(plan, name, counted, record))
    checks.append(shape_check(name, out, total, broken, vocab_size, len(present)))
    if total.samples:
        checks += statistics_checks(plan, name, total, mask_id, subset=len(per_file) < len(present))
    checks.append(digest_check(plan, name, paths, per_file, record))
    return checks


def header_count(path: Path) -> int:
    try:
        return sample_count(path)
    except ShardError:
        return 0


def spread(paths: list[Path], n: int | None) -> list[Path]:
    """`n` files spread evenly over each length bin (a bin is a folder), at least one from every bin.

    The statistics differ by bin (short sequences hold more random next sentences), and every bin
    has the same number of files, so taking the same count from each keeps the subset's mix of
    lengths the whole output's; `n` files from the first bin alone failed an intact dataset."""
    if n is None or n >= len(paths):
        return paths
    by_bin: dict[Path, list[Path]] = {}
    for path in paths:
        by_bin.setdefault(path.parent, []).append(path)
    per_bin = max(1, n // len(by_bin))
    return [group[i] for group in by_bin.values()
            for i in sorted(set((np.arange(min(per_bin, len(group))) * len(group)) // min(per_bin, len(group))))]


def _by_chance(margin: float) -> str:
    return f", ± {margin:.1%} more by chance" if margin else ""


def sampling_margin(share: float, count: int, subset: bool) -> float:
    """What a subset's share may differ from the whole's by chance: 4 standard errors of a binomial
    share over `count` draws (a false alarm about once in 16,000 checks); 0 for the whole output."""
    return 4 * math.sqrt(share * (1 - share) / count) if subset and count else 0.0


def length_range(plan: Plan, name: str, out: DatasetOutput, path: Path) -> tuple[int, int]:
    if not out.bins:
        return (1, out.max_seq_length)
    b = bin_names(out.bins).index(path.parent.name)
    return (1 if b == 0 else out.bins[b - 1] + 1, out.bins[b])


def count_check(plan: Plan, name: str, counted: int, record: dict | None) -> Check:
    problems = []
    if record is not None and record.get("samples") != counted:
        problems.append(f"the build recorded {record.get('samples')}")
    expect = plan.manifest.expect.outputs.get(name)
    if expect is not None:
        if expect.samples is not None and counted != expect.samples:
            problems.append(f"the manifest expects {expect.samples}")
        if expect.min_samples is not None and counted < expect.min_samples:
            problems.append(f"the manifest expects at least {expect.min_samples}")
        if expect.max_samples is not None and counted > expect.max_samples:
            problems.append(f"the manifest expects at most {expect.max_samples}")
    return Check(f"{name}: samples", not problems, f"{counted} samples" + (": " + "; ".join(problems) if problems else ""))


def shape_check(name: str, out: DatasetOutput, total: ShardStats, broken: list[str], vocab_size: int | None,
                files_read: int) -> Check:
    """Every file's samples as the trainer will validate them, plus the bins and ordering of the files
    read for statistics."""
    problems = broken[:1] + (["and {} more file(s)".format(len(broken) - 1)] if len(broken) > 1 else []) + total.problems
    if problems:
        return Check(f"{name}: well formed", False, "; ".join(problems))
    where = "every length in its bin" if out.bins else f"lengths 1-{out.max_seq_length}"
    ids = f"token ids < {vocab_size}" if vocab_size else "token ids not checked against a vocabulary (none found)"
    return Check(f"{name}: well formed", True, f"{files_read} file(s) read whole: {where}, at most "
                 f"{out.max_predictions} predictions, {ids}, labels 0/1")


def statistics_checks(plan: Plan, name: str, total: ShardStats, mask_id: int | None, subset: bool) -> list[Check]:
    e, p = plan.manifest.expect, plan.manifest.prepare
    note = " (from a subset of the files)" if subset else ""
    masked_share = total.masked / total.tokens
    margin = sampling_margin(p.masked_lm_prob, total.tokens, subset)
    checks = [Check(f"{name}: masking", abs(masked_share - p.masked_lm_prob) <= e.masking_tolerance + margin,
                    f"{masked_share:.2%} of tokens masked, expected {p.masked_lm_prob:.1%} ± {e.masking_tolerance:.1%}"
                    f"{note}{_by_chance(margin)}")]
    if mask_id is None:
        checks.append(Check(f"{name}: 80/10/10", None, "no vocabulary to tell the [MASK] id (set vocab.file)"))
    else:
        shares = [total.shown_mask / total.masked, (total.masked - total.shown_mask - total.shown_original) / total.masked,
                  total.shown_original / total.masked]
        margin = sampling_margin(0.8, total.masked, subset)
        ok = all(abs(a - b) <= e.replacement_tolerance + margin for a, b in zip(shares, (0.8, 0.1, 0.1)))
        checks.append(Check(f"{name}: 80/10/10", ok, "[MASK] {:.1%}, random {:.1%}, kept {:.1%}; expected 80/10/10 ± {:.1%}{}{}".format(
            *shares, e.replacement_tolerance, note, _by_chance(margin))))
    nsp = total.random_next / total.samples
    margin = sampling_margin(0.5, total.samples, subset)
    checks.append(Check(f"{name}: next sentence", abs(nsp - 0.5) <= e.nsp_tolerance + margin,
                        f"{nsp:.2%} random next sentences, expected 50% ± {e.nsp_tolerance:.0%}{note}{_by_chance(margin)}"))
    return checks


def digest_check(plan: Plan, name: str, paths: list[Path], per_file: dict[Path, ShardStats],
                 record: dict | None) -> Check:
    """Each file read for statistics against its recorded digest; a missing file is a mismatch too."""
    if plan.manifest.expect.checksums == "none":
        return Check(f"{name}: checksums", None, "the manifest records no checksums")
    if record is None:
        return Check(f"{name}: checksums", False, "no digests recorded (prepared.json missing)")
    recorded = record.get("files", {})
    checked = [p for p in paths if p in per_file or not p.is_file()]
    wrong = [p for p in checked if p not in per_file
             or recorded.get(str(p.relative_to(plan.root)), {}).get("digest") != per_file[p].digest]
    detail = f"{len(checked) - len(wrong)} of {len(checked)} files match the digests recorded at build time"
    return Check(f"{name}: checksums", not wrong, detail + (f"; first mismatch: {wrong[0]}" if wrong else ""))


def checkpoint_checks(plan: Plan) -> list[Check]:
    ck = plan.manifest.checkpoint
    checks = []
    if ck.tf_checkpoint:
        problems = [f"{path}: {what}" for path, what in input_file_problems(plan)]
        checks.append(Check("checkpoint: TF files", not problems, "; ".join(problems) if problems else
                            f"{len(ck.files) + bool(ck.bert_config_file)} files as expected"))
    else:
        checks.append(Check("checkpoint: TF files", None, "checkpoint.tf_checkpoint is not set"))
    output = plan.root / expand_path(ck.output)
    checks.append(Check("checkpoint: converted", output.is_file(), str(output) if output.is_file() else
                        f"{output} missing: set -o checkpoint.tf_checkpoint=PREFIX -o checkpoint.bert_config=JSON and prepare again"))
    return checks


def input_file_problems(plan: Plan) -> list[tuple[Path, str]]:
    """Size and md5 of the checkpoint's files against the manifest (a published md5 prefix suffices)."""
    ck = plan.manifest.checkpoint
    wanted = [(Path(expand_path(ck.tf_checkpoint) + suffix), check) for suffix, check in ck.files.items()]
    if ck.bert_config and ck.bert_config_file:
        wanted.append((Path(expand_path(ck.bert_config)), ck.bert_config_file))
    problems = []
    for path, check in wanted:
        if not path.is_file():
            problems.append((path, "missing"))
            continue
        size = path.stat().st_size
        if check.bytes is not None and size != check.bytes:
            problems.append((path, f"{size} bytes, expected {check.bytes}"))
        elif check.md5 and not md5_of(path).startswith(check.md5):
            problems.append((path, f"md5 is not {check.md5}…"))
    return problems


def md5_of(path: Path) -> str:
    h = hashlib.md5()
    with open_regular(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def print_report(plan: Plan, checks: list[Check], out: TextIO) -> None:
    print(f"dataset {plan.manifest.name} at {plan.root}", file=out)
    for c in checks:
        print(f"  {c.status}  {c.name}: {c.detail}", file=out)
    record = files.read_json(plan.prepared) if plan.prepared.exists() else {}
    for name, out_cfg in plan.manifest.outputs.items():
        hist = record.get("outputs", {}).get(name, {}).get("stats", {}).get("length_histogram")
        if hist:
            print(f"  {name}: lengths {histogram_line(hist, out_cfg)}", file=out)
    passed, skipped, failed = (sum(c.ok is value for c in checks) for value in (True, None, False))
    print(f"{passed} of {len(checks)} checks passed" + (f", {skipped} skipped" if skipped else "")
          + (f", {failed} failed" if failed else ""), file=out)


def exit_code(checks: list[Check]) -> int:
    """0 exactly when no check failed (a skipped check is not a failure), else 1."""
    return 1 if any(c.ok is False for c in checks) else 0


def histogram_line(hist: list[int], out: DatasetOutput) -> str:
    edges = out.bins or [e for e in (64, 128, 256, 384, 512) if e < out.max_seq_length] + [out.max_seq_length]
    counts = bin_counts(hist, edges)
    total = max(sum(counts), 1)
    bounds = [0, *edges]
    return ", ".join(f"{lo + 1}-{hi}: {n} ({n / total:.0%})" for lo, hi, n in zip(bounds, bounds[1:], counts))
