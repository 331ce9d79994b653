"""Where everything of a prepared dataset lives, and the stages and tasks that build it.

    <root>/text/train/part-0000i-of-0000n.txt, text/eval.txt   the python_stdlib corpus (corpus stage)
    <root>/vocab.txt                                            a trained vocabulary (corpus stage)
    <root>/.work/params.json                                    the parameters the work below was made with
    <root>/.work/examples/<output>/part-0000i.hdf5 (+ .json)    one input part's samples (examples stage)
    <root>/.work/combine/<output>/<bin>-<first shard>.json      what a combine task wrote (combine stage)
    <root>/<output>/[<bin>/]part_<i>_of_<n>.hdf5                the shards (combine stage)
    <root>/<output>/<file>                                      a picked eval set (combine stage)
    <root>/<checkpoint.output>                                  the converted phase-1 checkpoint
    <root>/prepared.json                                        counts, statistics, digests (finish stage)

Every task's result is a file written atomically; a task whose result exists is skipped, so an
interrupted build restarts where it stopped. The task lists depend only on the manifest and the
input files, so the orchestrator can size Slurm job arrays before anything runs.
"""

from __future__ import annotations

import glob
import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from trainer.config import DatasetManifest, DatasetOutput, expand_path
from trainer.data.prepare import files
from trainer.data.prepare.bins import bin_names
from trainer.data.prepare.errors import BadInput

STAGES = ("corpus", "examples", "combine", "checkpoint", "finish")
SPLITS = ("train", "eval")


@dataclass(frozen=True)
class ExamplesTask:
    split: str
    part: int  # index into the split's input files


@dataclass(frozen=True)
class CombineTask:
    output: str
    bin: int  # index into the output's bins (0 for a flat or picked output)
    first: int  # shards [first, stop)
    stop: int


class Plan:
    def __init__(self, manifest: DatasetManifest):
        self.manifest = manifest
        self.root = Path(expand_path(manifest.root))
        self.work = self.root / ".work"

    # ---- inputs

    @cached_property
    def inputs(self) -> dict[str, list[Path]]:
        """The input files of each split that some output is made from."""
        used = {out.split for out in self.manifest.outputs.values()}
        return {split: self._split_inputs(split) for split in SPLITS if split in used}

    def _split_inputs(self, split: str) -> list[Path]:
        src = self.manifest.source
        if src.kind == "python_stdlib":
            if split == "eval":
                return [self.eval_text]
            return [self.text_part(i) for i in range(src.parts)]
        spec = src.train if split == "train" else src.eval
        if not spec:
            what = "the training parts (a folder or glob)" if split == "train" else "the eval file"
            raise BadInput(f"source.{split}", f"not set: point it at {what} with -o source.{split}=PATH")
        return list_input_files(spec, f"source.{split}")

    def text_part(self, i: int) -> Path:
        return self.root / "text" / "train" / f"part-{i:05d}-of-{self.manifest.source.parts:05d}.txt"

    @property
    def eval_text(self) -> Path:
        return self.root / "text" / "eval.txt"

    @property
    def vocab_file(self) -> Path | None:
        v = self.manifest.vocab
        if v.file:
            return Path(expand_path(v.file))
        return self.root / "vocab.txt" if self.learns_vocab else None

    @property
    def learns_vocab(self) -> bool:
        v = self.manifest.vocab
        return not v.file and v.learn and self.manifest.source.kind != "tfrecord"

    @property
    def needs_corpus_stage(self) -> bool:
        return self.manifest.source.kind == "python_stdlib" or self.learns_vocab

    @property
    def checkpoint_output(self) -> Path | None:
        """The converted phase-1 checkpoint, when the manifest has one to convert."""
        ck = self.manifest.checkpoint
        if ck is None or not ck.tf_checkpoint:
            return None
        return self.root / expand_path(ck.output)

    # ---- tasks

    @cached_property
    def examples_tasks(self) -> list[ExamplesTask]:
        return [ExamplesTask(split, i) for split, parts in self.inputs.items() for i in range(len(parts))]

    @cached_property
    def combine_tasks(self) -> list[CombineTask]:
        group = self.manifest.prepare.combine_group
        tasks = []
        for name, out in self.manifest.outputs.items():
            if out.pick is not None:
                tasks.append(CombineTask(name, 0, 0, 1))
                continue
            for b in range(len(bin_names(out.bins))):
                tasks += [CombineTask(name, b, s, min(s + group, out.shards)) for s in range(0, out.shards, group)]
        return tasks

    def task_count(self, stage: str) -> int:
        return {"corpus": int(self.needs_corpus_stage), "examples": len(self.examples_tasks),
                "combine": len(self.combine_tasks), "checkpoint": int(self.checkpoint_output is not None),
                "finish": 1}[stage]

    def stages(self, state: str) -> list[dict]:
        """The stages still to run: all of them, or for complete data a missing checkpoint conversion."""
        if state == "complete":
            out = self.checkpoint_output
            return [{"name": "checkpoint", "tasks": 1}] if out is not None and not out.exists() else []
        return [{"name": s, "tasks": self.task_count(s)} for s in STAGES if self.task_count(s)]

    # ---- files

    def outputs_of(self, split: str) -> dict[str, DatasetOutput]:
        return {n: o for n, o in self.manifest.outputs.items() if o.split == split}

    def examples_file(self, output: str, part: int) -> Path:
        return self.work / "examples" / output / f"part-{part:05d}.hdf5"

    def examples_stats(self, output: str, part: int) -> Path:
        return self.examples_file(output, part).with_suffix(".json")

    def combine_stamp(self, task: CombineTask) -> Path:
        label = bin_names(self.manifest.outputs[task.output].bins)[task.bin] or "flat"
        return self.work / "combine" / task.output / f"{label}-{task.first:05d}.json"

    def output_dir(self, output: str, bin_index: int = 0) -> Path:
        out = self.manifest.outputs[output]
        return self.root / output / bin_names(out.bins)[bin_index]

    def output_files(self, output: str) -> list[Path]:
        """Every file an output consists of, in order."""
        out = self.manifest.outputs[output]
        if out.pick is not None:
            return [self.root / output / out.pick_file]
        from trainer.data.prepare.bins import shard_name

        return [self.output_dir(output, b) / shard_name(i, out.shards)
                for b in range(len(bin_names(out.bins))) for i in range(out.shards)]

    @property
    def prepared(self) -> Path:
        return self.root / "prepared.json"

    @property
    def params_stamp(self) -> Path:
        return self.work / "params.json"

    @property
    def corpus_stamp(self) -> Path:
        return self.work / "corpus.json"

    # ---- the start of a build

    def state(self) -> str:
        """complete | partial (an interrupted build of the same parameters) | fresh | stale."""
        digest = self.manifest.params_digest()
        if self.prepared.exists():
            return "complete" if files.read_json(self.prepared).get("params") == digest else "stale"
        if self.params_stamp.exists():
            return "partial" if files.read_json(self.params_stamp).get("params") == digest else "stale"
        if any((self.root / name).exists() for name in self.manifest.outputs):
            return "stale"
        return "fresh"

    def start(self, force: bool = False) -> str:
        """Prepare the root for the stages; returns the state found. A stale root needs `force`."""
        self.check_inputs()
        try:
            state = self.state()
            if state == "stale" and not force:
                raise BadInput(self.root, "holds a dataset built with other parameters (or by something else): "
                                          "remove it, or run again with --force to rebuild it")
            if force and state != "fresh":
                self.clear()
                state = "fresh"
            if state in ("fresh",):
                files.write_json(self.params_stamp, {"params": self.manifest.params_digest(), "dataset": self.manifest.name})
            files.remove_temporaries(self.root)
        except OSError as e:  # a file where a folder belongs, no permission, a read-only file system: bad input
            where = f" ({e.filename})" if e.filename and str(e.filename) != str(self.root) else ""
            raise BadInput(self.root, f"cannot be used as the dataset root: {e.strerror or e}{where}") from None
        return state

    def check_inputs(self) -> None:
        """Every input the stages will read is there, before anything is written."""
        self.inputs  # noqa: B018  (lists the input files; a missing folder or file is BadInput)
        v = self.manifest.vocab
        if v.file and self.manifest.source.kind != "tfrecord" and not Path(expand_path(v.file)).is_file():
            raise BadInput(expand_path(v.file), "vocab file not found")
        ck = self.manifest.checkpoint
        if ck is not None and ck.tf_checkpoint:
            index = Path(expand_path(ck.tf_checkpoint) + ".index")
            if not index.is_file():
                raise BadInput(index, "checkpoint index not found (checkpoint.tf_checkpoint is the prefix, e.g. .../model.ckpt-28252)")
            if not ck.bert_config or not Path(expand_path(ck.bert_config)).is_file():
                raise BadInput(expand_path(ck.bert_config or "checkpoint.bert_config"), "bert config not found")
            for suffix, check in ck.files.items():  # sizes now; md5 sums (minutes for 4 GB) in the checkpoint stage
                path = Path(expand_path(ck.tf_checkpoint) + suffix)
                if not path.is_file():
                    raise BadInput(path, "missing (is this the MLPerf phase-1 checkpoint?)")
                if check.bytes is not None and path.stat().st_size != check.bytes:
                    raise BadInput(path, f"{path.stat().st_size} bytes, expected {check.bytes} (is this the MLPerf phase-1 checkpoint?)")

    def clear(self) -> None:
        """Remove what this manifest builds (outputs, work, stamps, the corpus text); keep a given vocab."""
        for name in self.manifest.outputs:
            shutil.rmtree(self.root / name, ignore_errors=True)
        shutil.rmtree(self.work, ignore_errors=True)
        if self.manifest.source.kind == "python_stdlib":
            shutil.rmtree(self.root / "text", ignore_errors=True)
        if not self.manifest.vocab.file:
            (self.root / "vocab.txt").unlink(missing_ok=True)
        self.prepared.unlink(missing_ok=True)


def list_input_files(spec: str, key: str) -> list[Path]:
    """A folder's files (sorted, hidden ones excluded), a glob's matches (sorted), or one file."""
    expanded = expand_path(spec)
    path = Path(expanded)
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    elif glob.has_magic(expanded):
        found = sorted(Path(p) for p in glob.glob(expanded) if Path(p).is_file())
    elif path.is_file():
        found = [path]
    else:
        raise BadInput(expanded, f"{key}: no such file or folder")
    if not found:
        raise BadInput(expanded, f"{key}: no input files there")
    return found


def group_range(group: int, group_size: int, total: int) -> range:
    """The task indices of array task `group` when tasks are grouped `group_size` at a time."""
    return range(group * group_size, min((group + 1) * group_size, total))
