"""Dataset manifests: one YAML per dataset under datasets/.

What the data is, where its inputs live, how it is prepared and what the result must look like.
`bertctl data prepare|verify` validate a manifest here (torch-free, like the run configuration) and
hand the resolved manifest to the trainer-side workers (`python -m trainer.data.prepare`). Paths may
use `~` and `$VARS`, expanded on the node (trainer.config.paths).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Literal, Optional

import yaml
from pydantic import Field, model_validator

from trainer.config.base import ConfigProblem, Section

DATASET_NAME_RE = r"[A-Za-z0-9][A-Za-z0-9_.-]*"


class SourceSpec(Section):
    """Where the raw material comes from.

    python_stdlib: the docstrings of the Python standard library and the text of its language
                   reference (pydoc_data), split into documents and sentences on this machine.
    text:          text files, one sentence per line and a blank line between documents (the MLPerf
                   Wikipedia parts `part-00xxx-of-00500` and `eval.txt`), or free text with
                   `split_sentences`.
    tfrecord:      TFRecords in the MLPerf feature layout (already tokenized and masked).
    """

    kind: Literal["python_stdlib", "text", "tfrecord"]
    train: Optional[str] = Field(None, description="text/tfrecord: a folder (every file, sorted) or a glob of the training parts")
    eval: Optional[str] = Field(None, description="text/tfrecord: the file the eval set is made from")
    split_sentences: bool = Field(False, description="text: segment each line into sentences (free text)")
    parts: int = Field(8, ge=1, description="python_stdlib: number of text parts the training documents are written into")
    eval_percent: int = Field(10, ge=1, le=50, description="python_stdlib: share of the documents held out for the eval set")
    max_documents: Optional[int] = Field(None, ge=2, description="python_stdlib: only the first N documents (quick builds)")

    @model_validator(mode="after")
    def _fields_fit_the_kind(self) -> "SourceSpec":
        if self.kind == "python_stdlib" and (self.train or self.eval):
            raise ConfigProblem("train", "python_stdlib builds its own corpus: train and eval must be unset")
        if self.kind != "python_stdlib" and self.max_documents is not None:
            raise ConfigProblem("max_documents", "only for kind python_stdlib")
        if self.kind == "tfrecord" and self.split_sentences:
            raise ConfigProblem("split_sentences", "TFRecords are already tokenized")
        return self


class VocabSpec(Section):
    """The WordPiece vocabulary: a given file (MLPerf's uncased 30,522 tokens) or one trained on the corpus."""

    file: Optional[str] = Field(None, description="vocab.txt, one token per line; null: learn one into <root>/vocab.txt")
    learn: bool = Field(True, description="without a file: learn a vocabulary from the training text (false: a file is required)")
    size: int = Field(30522, ge=16, le=32768, description="size of a learned vocabulary, special tokens included")
    min_frequency: int = Field(2, ge=1)
    lower_case: bool = True


class GenerationParams(Section):
    """The create_pretraining_data parameters and how the work is split."""

    masked_lm_prob: float = Field(0.15, gt=0.0, lt=1.0)
    dupe_factor: int = Field(10, ge=1, description="passes over the documents, each with fresh pairs and masks")
    random_seed: int = Field(12345, ge=0)
    short_seq_prob: float = Field(0.1, ge=0.0, le=1.0, description="share of sequences with a random shorter target length")
    combine_group: int = Field(8, ge=1, description="output shards written by one task of the combine stage")
    array_tasks: int = Field(64, ge=1, description="Slurm: at most this many array tasks per stage (tasks are grouped)")
    keep_work: bool = Field(False, description="keep the per-part intermediate files under <root>/.work")


class DatasetOutput(Section):
    """One prepared folder under the dataset root, e.g. `train/` (4 bins) or `eval/` (one picked file)."""

    split: Literal["train", "eval"] = Field(description="which documents (or input files) it is made from")
    max_seq_length: int = Field(512, ge=8)
    max_predictions: int = Field(76, ge=1)
    layout: Literal["fixed", "varlen"] = "varlen"
    bins: Optional[list[int]] = Field(None, description="inclusive upper length edges, e.g. [128, 256, 384, 512]: one subfolder per bin")
    shards: int = Field(1, ge=1, description="shards per bin (or in the folder), balanced to within one sample")
    pick: Optional[int] = Field(None, ge=1, description="take this many samples evenly, idx = int(i*N/pick), into one file")
    file: Optional[str] = Field(None, description="with pick: the file name (default part_eval_<pick>.hdf5)")

    @model_validator(mode="after")
    def _consistent(self) -> "DatasetOutput":
        if self.bins is not None:
            if not self.bins or self.bins != sorted(set(self.bins)) or self.bins[0] < 1:
                raise ConfigProblem("bins", f"must be ascending positive lengths, got {self.bins}")
            if self.bins[-1] != self.max_seq_length:
                raise ConfigProblem("bins", f"the last edge must be max_seq_length ({self.max_seq_length}), got {self.bins[-1]}")
        if self.pick is not None and (self.bins is not None or self.shards != 1):
            raise ConfigProblem("pick", "a picked set is one file: bins must be unset and shards 1")
        if self.file is not None and (self.pick is None or "/" in self.file or not self.file.endswith((".hdf5", ".h5"))):
            raise ConfigProblem("file", f"needs pick, and a plain *.hdf5 name, got {self.file!r}")
        if self.max_predictions > self.max_seq_length:
            raise ConfigProblem("max_predictions", f"{self.max_predictions} exceeds max_seq_length ({self.max_seq_length})")
        return self

    @property
    def pick_file(self) -> str:
        return self.file or f"part_eval_{self.pick}.hdf5"


class FileCheck(Section):
    """What a known input file must be: size in bytes and md5 (a published prefix of the hex digest is enough)."""

    bytes: Optional[int] = Field(None, ge=0)
    md5: Optional[str] = Field(None, pattern=r"^[0-9a-f]{4,32}$")


class TFCheckpointSpec(Section):
    """The phase-1 TensorFlow checkpoint that phase 2 starts from, converted to PyTorch."""

    tf_checkpoint: Optional[str] = Field(None, description="the checkpoint prefix, e.g. /data/phase1/model.ckpt-28252")
    bert_config: Optional[str] = Field(None, description="bert_config.json")
    output: str = Field("phase1/model.ckpt-28252.pt", description="the converted file, relative to the dataset root")
    files: dict[str, FileCheck] = Field({}, description="checks of <tf_checkpoint><suffix>, e.g. '.index'")
    bert_config_file: Optional[FileCheck] = None

    @model_validator(mode="after")
    def _config_with_checkpoint(self) -> "TFCheckpointSpec":
        if self.tf_checkpoint and not self.bert_config:
            raise ConfigProblem("bert_config", "not set: converting the checkpoint needs its bert_config.json: "
                                               "-o checkpoint.bert_config=PATH")
        return self


class OutputCheck(Section):
    samples: Optional[int] = Field(None, ge=0, description="exact number of samples")
    min_samples: Optional[int] = Field(None, ge=0)
    max_samples: Optional[int] = Field(None, ge=0)


class Expectations(Section):
    """What `bertctl data verify` holds the prepared data to (besides the checksums recorded at build time)."""

    outputs: dict[str, OutputCheck] = {}
    masking_tolerance: float = Field(0.005, ge=0.0, description="|masked share of tokens - masked_lm_prob|")
    replacement_tolerance: float = Field(0.01, ge=0.0, description="each of the 80/10/10 [MASK]/random/kept shares")
    nsp_tolerance: float = Field(0.02, ge=0.0, description="|share of random next sentences - 0.5|")
    checksums: Literal["recorded", "none"] = Field(
        "recorded", description="recorded: compare each file's content digest with the one written when it was built")


class DatasetManifest(Section):
    name: str = Field(pattern=f"^{DATASET_NAME_RE}$")  # pydantic's regex: $ is the end of the text
    description: str = ""
    root: str = Field(description="where the prepared dataset goes")
    source: SourceSpec
    vocab: VocabSpec = VocabSpec()
    prepare: GenerationParams = GenerationParams()
    outputs: dict[str, DatasetOutput]
    checkpoint: Optional[TFCheckpointSpec] = None
    expect: Expectations = Expectations()

    @model_validator(mode="after")
    def _consistent(self) -> "DatasetManifest":
        if not self.outputs:
            raise ConfigProblem("outputs", "at least one output is needed")
        for name in self.outputs:
            if not re.fullmatch(DATASET_NAME_RE, name) or name.startswith("."):
                raise ConfigProblem("outputs", f"names are folder names (letters, digits, '_', '.', '-'), got {name!r}")
        if self.source.kind == "text" and not self.vocab.file and not self.vocab.learn:
            raise ConfigProblem("vocab.file", "not set: text sources need the vocabulary they are tokenized with: "
                                              "-o vocab.file=PATH (or vocab.learn true)")
        unknown = sorted(set(self.expect.outputs) - set(self.outputs))
        if unknown:
            raise ConfigProblem("expect.outputs", f"{', '.join(unknown)} is not an output (outputs: {', '.join(self.outputs)})")
        return self

    def params_digest(self) -> str:
        """A digest of everything that shapes the prepared files (not the expectations or task sizes)."""
        prepare = self.prepare.model_dump(mode="json", exclude={"combine_group", "array_tasks", "keep_work"})
        keys = {"source": self.source.model_dump(mode="json"), "vocab": self.vocab.model_dump(mode="json"),
                "prepare": prepare, "outputs": {k: v.model_dump(mode="json") for k, v in self.outputs.items()}}
        return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, width=100)


def load_dataset_manifest(path: str) -> DatasetManifest:
    with open(path, encoding="utf-8") as f:
        return DatasetManifest.model_validate(yaml.safe_load(f))
