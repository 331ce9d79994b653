"""The phase-1 checkpoint conversion, against a checkpoint written by real TensorFlow
(tests/data/tf_bert, made by tests/data/make_tf_fixtures.py; TensorFlow is not needed to run this)."""

import json
import shutil
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, run_cli

from trainer.checkpoints.convert import convert
from trainer.checkpoints.tf_checkpoint import TFCheckpoint
from trainer.data.prepare.errors import BadInput

sys.path.insert(0, str(REPO / "tests" / "data"))
import make_tf_fixtures  # noqa: E402  (numpy only: what TensorFlow was given)

PREFIX = REPO / "tests" / "data" / "tf_bert" / "model.ckpt-5"
CONFIG = REPO / "tests" / "data" / "tf_bert" / "bert_config.json"
TF = make_tf_fixtures.checkpoint_arrays()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("conv") / "model.pt"
    result = run_cli("convert-checkpoint", "--tf-checkpoint", str(PREFIX), "--bert-config", str(CONFIG), "--output", str(out))
    assert result.code == 0, result.err
    assert result.out.strip() == str(out)
    return torch.load(out, weights_only=True)["model"]


def test_the_reader_returns_what_tensorflow_saved():
    ckpt = TFCheckpoint(PREFIX)
    assert set(ckpt.names()) == set(TF) | {"global_step"}
    assert int(ckpt.read("global_step")) == 5
    for name, value in TF.items():
        got = ckpt.read(name)
        assert got.dtype == np.float32 and np.array_equal(got, value), name


def test_tensors_are_renamed_transposed_and_the_vocab_padded(converted):
    assert converted["bert.embeddings.word_embeddings.weight"].shape == (30528, 8)
    assert torch.equal(converted["bert.embeddings.word_embeddings.weight"][:30522], torch.from_numpy(TF["bert/embeddings/word_embeddings"]))
    assert not converted["bert.embeddings.word_embeddings.weight"][30522:].any()
    assert torch.equal(converted["cls.predictions.bias"][:30522], torch.from_numpy(TF["cls/predictions/output_bias"]))
    assert not converted["cls.predictions.bias"][30522:].any()
    kernel = TF["bert/encoder/layer_1/intermediate/dense/kernel"]  # [hidden 8, intermediate 16] in TF
    assert torch.equal(converted["bert.encoder.layer.1.intermediate.dense.weight"], torch.from_numpy(kernel.T))
    assert torch.equal(converted["bert.encoder.layer.0.attention.self.query.weight"],
                       torch.from_numpy(TF["bert/encoder/layer_0/attention/self/query/kernel"].T))
    assert torch.equal(converted["cls.seq_relationship.weight"], torch.from_numpy(TF["cls/seq_relationship/output_weights"]))
    assert torch.equal(converted["bert.encoder.layer.0.output.LayerNorm.weight"],
                       torch.from_numpy(TF["bert/encoder/layer_0/output/LayerNorm/gamma"]))
    # every model weight exactly once; LAMB slots and the global step left out; the tied decoder included
    assert not any("LAMB" in k or "step" in k for k in converted)
    assert torch.equal(converted["cls.predictions.decoder.weight"], converted["bert.embeddings.word_embeddings.weight"])


def hf_model():
    from transformers import BertConfig, BertForPreTraining

    config = json.loads(CONFIG.read_text())
    config.update(vocab_size=30528, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(BertConfig(**config))
    return model.eval()


def assign_directly(model) -> None:
    """The TF arrays put into Hugging Face's modules by hand, attribute by attribute (no converter)."""
    t = lambda name: torch.from_numpy(TF[name].copy())  # noqa: E731
    with torch.no_grad():
        emb = model.bert.embeddings
        emb.word_embeddings.weight.zero_()
        emb.word_embeddings.weight[:30522] = t("bert/embeddings/word_embeddings")
        emb.position_embeddings.weight[:] = t("bert/embeddings/position_embeddings")
        emb.token_type_embeddings.weight[:] = t("bert/embeddings/token_type_embeddings")
        emb.LayerNorm.weight[:], emb.LayerNorm.bias[:] = t("bert/embeddings/LayerNorm/gamma"), t("bert/embeddings/LayerNorm/beta")
        for n, layer in enumerate(model.bert.encoder.layer):
            p = f"bert/encoder/layer_{n}/"
            for proj in ("query", "key", "value"):
                linear = getattr(layer.attention.self, proj)
                linear.weight[:], linear.bias[:] = t(p + f"attention/self/{proj}/kernel").T, t(p + f"attention/self/{proj}/bias")
            out = layer.attention.output
            out.dense.weight[:], out.dense.bias[:] = t(p + "attention/output/dense/kernel").T, t(p + "attention/output/dense/bias")
            out.LayerNorm.weight[:], out.LayerNorm.bias[:] = t(p + "attention/output/LayerNorm/gamma"), t(p + "attention/output/LayerNorm/beta")
            layer.intermediate.dense.weight[:] = t(p + "intermediate/dense/kernel").T
            layer.intermediate.dense.bias[:] = t(p + "intermediate/dense/bias")
            layer.output.dense.weight[:], layer.output.dense.bias[:] = t(p + "output/dense/kernel").T, t(p + "output/dense/bias")
            layer.output.LayerNorm.weight[:], layer.output.LayerNorm.bias[:] = t(p + "output/LayerNorm/gamma"), t(p + "output/LayerNorm/beta")
        model.bert.pooler.dense.weight[:], model.bert.pooler.dense.bias[:] = t("bert/pooler/dense/kernel").T, t("bert/pooler/dense/bias")
        head = model.cls.predictions
        head.transform.dense.weight[:] = t("cls/predictions/transform/dense/kernel").T
        head.transform.dense.bias[:] = t("cls/predictions/transform/dense/bias")
        head.transform.LayerNorm.weight[:] = t("cls/predictions/transform/LayerNorm/gamma")
        head.transform.LayerNorm.bias[:] = t("cls/predictions/transform/LayerNorm/beta")
        head.bias.zero_()
        head.bias[:30522] = t("cls/predictions/output_bias")
        model.cls.seq_relationship.weight[:] = t("cls/seq_relationship/output_weights")
        model.cls.seq_relationship.bias[:] = t("cls/seq_relationship/output_bias")


def test_the_converted_model_gives_the_logits_of_the_weights_loaded_directly(converted):
    loaded, direct = hf_model(), hf_model()
    assert not loaded.load_state_dict(converted, strict=True).missing_keys
    assign_directly(direct)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 30522, (3, 32), generator=g)
    segments = (torch.arange(32) > 15).long().expand(3, 32)
    mask = torch.ones(3, 32, dtype=torch.long)
    mask[1, 20:] = 0
    with torch.no_grad():
        a = loaded(input_ids=ids, token_type_ids=segments, attention_mask=mask)
        b = direct(input_ids=ids, token_type_ids=segments, attention_mask=mask)
    assert a.prediction_logits.shape == (3, 32, 30528)
    assert torch.equal(a.prediction_logits, b.prediction_logits) and torch.equal(a.seq_relationship_logits, b.seq_relationship_logits)
    assert a.prediction_logits.std() > 0.1  # real weights, not zeros


def test_the_trainer_loads_the_converted_checkpoint(converted, tmp_path):
    from trainer.config import ModelConfig
    from trainer.model.bert import BertForPreTraining
    from trainer.model.weights import load_pretrained

    c = json.loads(CONFIG.read_text())
    model = BertForPreTraining(ModelConfig(num_layers=c["num_hidden_layers"], hidden_size=c["hidden_size"],
                                           num_heads=c["num_attention_heads"], intermediate_size=c["intermediate_size"],
                                           vocab_size=c["vocab_size"], max_position_embeddings=c["max_position_embeddings"]))
    load_pretrained(model, dict(converted))
    own = model.state_dict()
    shared = set(own) & set(converted)
    assert len(shared) >= len(converted) - 1  # all but HF's second copy of the tied decoder bias
    for name in shared:
        assert torch.equal(own[name], converted[name]), name


def copy_checkpoint(tmp_path):
    for f in PREFIX.parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / PREFIX.name


def damage(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_bad_checkpoints_are_one_clear_error_naming_the_file_and_variable(tmp_path):
    unexpected = REPO / "tests" / "data" / "tf_unexpected" / "model.ckpt-1"
    with pytest.raises(BadInput, match=r"model.ckpt-1.index: variable bert/encoder/layer_0/attention/self/rotary/kernel: unexpected name"
                                       r" \(not a BERT pretraining weight or optimizer slot\), shape \[8, 8\]$"):
        convert(unexpected, CONFIG)  # the shape itself (issue 16: the message once lacked its f-string)
    prefix = copy_checkpoint(tmp_path)
    ckpt = TFCheckpoint(prefix)
    entry = ckpt.entries["bert/pooler/dense/kernel"]
    damage(ckpt.data_file(0), entry.offset + 3)
    with pytest.raises(BadInput, match=r"data-00000-of-00001: variable bert/pooler/dense/kernel: corrupt \(CRC mismatch\)"):
        convert(prefix, CONFIG)
    shutil.copy(PREFIX.parent / (PREFIX.name + ".data-00000-of-00001"), ckpt.data_file(0))
    with open(ckpt.data_file(0), "r+b") as f:
        f.truncate(entry.offset + 5)
    with pytest.raises(BadInput, match=r"variable bert/pooler/dense/kernel: truncated") as e:
        convert(prefix, CONFIG)
    assert str(e.value).startswith(str(ckpt.data_file(0)))
    index = prefix.with_name(prefix.name + ".index")
    index.write_bytes(index.read_bytes()[:-10])
    with pytest.raises(BadInput, match=r"\.index: not a TensorFlow checkpoint index: bad magic number"):
        convert(prefix, CONFIG)
    with pytest.raises(BadInput, match=r"checkpoint index not found"):
        convert(tmp_path / "nothing", CONFIG)


def test_a_config_that_does_not_describe_the_checkpoint_names_the_variable(tmp_path):
    config = json.loads(CONFIG.read_text())
    (tmp_path / "wide.json").write_text(json.dumps({**config, "hidden_size": 16}))
    with pytest.raises(BadInput, match=r"variable bert/embeddings/LayerNorm/beta: shape \[8\] does not fit bert.embeddings.LayerNorm.bias \[16\]"):
        convert(PREFIX, tmp_path / "wide.json")
    (tmp_path / "deep.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(BadInput, match=r"no variable for bert.encoder.layer.2.attention.self.query.weight \(16 model weights missing"):
        convert(PREFIX, tmp_path / "deep.json")


def test_the_command_line_exits_2_with_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out.pt"
    result = run_cli("convert-checkpoint", "--tf-checkpoint", str(REPO / "tests" / "data" / "tf_unexpected" / "model.ckpt-1"),
                     "--bert-config", str(CONFIG), "--output", str(out))
    assert result.code == 2 and result.out == "" and result.err.count("\n") == 1
    assert result.err.startswith("bertctl: error: ") and "rotary/kernel" in result.err
    missing = run_cli("convert-checkpoint", "--tf-checkpoint", str(PREFIX), "--bert-config", str(tmp_path / "none.json"),
                      "--output", str(out))
    assert missing.code == 2 and f"{tmp_path / 'none.json'}: bert config not found" in missing.err
    assert list(tmp_path.iterdir()) == []


def write_index(path, entries: dict[bytes, bytes]) -> None:
    """A checkpoint index as TensorFlow writes it (a LevelDB table, uncompressed): one data block with
    every entry, an empty metaindex block, an index block pointing at the data block, the footer."""
    import struct

    from tfrecord_hand_parser import encode_varint as v

    from trainer.checkpoints.tf_checkpoint import TABLE_MAGIC
    from trainer.data.prepare.tfrecord import masked_crc

    def block(items):  # every key whole (shared prefix 0), one restart point at offset 0
        body = b"".join(v(0) + v(len(k)) + v(len(value)) + k + value for k, value in items)
        return body + struct.pack("<II", 0, 1)

    out, handles = bytearray(), []
    data = block(sorted(entries.items()))
    for contents in (data, block([]), block([(max(entries), v(0) + v(len(data)))])):
        handles.append(v(len(out)) + v(len(contents)))
        out += contents + b"\0" + struct.pack("<I", masked_crc(contents + b"\0"))  # type 0: uncompressed
    path.write_bytes(bytes(out) + (handles[1] + handles[2]).ljust(40, b"\0") + struct.pack("<Q", TABLE_MAGIC))


def test_adam_weight_decay_optimizer_slots_are_skipped(tmp_path, converted):
    """Google's BERT optimizer under TF2 names its slots var/AdamWeightDecayOptimizer(_1) (issue 16):
    the fixture's checkpoint with its LAMB slots so renamed converts to the same model."""
    from trainer.checkpoints.tf_checkpoint import read_table

    prefix = copy_checkpoint(tmp_path)
    index = prefix.with_name(prefix.name + ".index")
    renamed = {key.replace(b"/LAMB", b"/AdamWeightDecayOptimizer"): value for key, value in read_table(index.read_bytes())}
    write_index(index, renamed)
    names = TFCheckpoint(prefix).names()
    assert sum(n.endswith("/AdamWeightDecayOptimizer") for n in names) == sum(n.endswith("/AdamWeightDecayOptimizer_1") for n in names) > 0
    assert not any("LAMB" in n for n in names) and len(names) == len(TFCheckpoint(PREFIX).names())
    state = convert(prefix, CONFIG)
    assert set(state) == set(converted)
    for name, array in state.items():
        assert torch.equal(torch.from_numpy(array), converted[name]), name
