"""Evaluation on the fast step's path (fixed-shape packed batches, compiled with runtime.compile) against
the reference evaluation: the same masked tokens counted right, exactly, on the CPU."""

import pytest
import torch
import yaml
from synthetic import tiny_run_config

from trainer.config import RunConfig
from trainer.loop.evaluate import build_evaluator
from trainer.model.bert import BertForPreTraining


def config(tmp_path, **runtime) -> RunConfig:
    path = tiny_run_config(tmp_path, balance={"packing": True, "pack_sequences": 3, "pack_average": 2},
                           train={"global_batch_size": 16}, runtime={"unpad": True, **runtime})
    return RunConfig.model_validate(yaml.safe_load(path.read_text()))


def counts(evaluator, model) -> tuple[torch.Tensor, list[int]]:
    """[correct, loss sum, masked] summed over the evaluator's batches, and each batch's sequence count."""
    model.eval()
    with torch.no_grad():
        return sum(evaluator.sums(model, batch) for batch in evaluator.batches), [b.num_sequences for b in evaluator.batches]


def tiny_model(cfg: RunConfig) -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(cfg.model, attention="per_sequence")


@pytest.mark.parametrize("compiled", [False, True])
def test_the_fast_evaluation_counts_exactly_what_the_reference_counts(tmp_path, compiled):
    """The 200 synthetic eval samples (lengths 8-64, 10 masked at most) in packs of up to 3 and batches of
    2 x train.batch_size packs; compiled: inductor, the compiler the GPU runs, making the CPU's kernels."""
    fast_cfg = config(tmp_path, step="fast", compile=compiled)
    reference_cfg = config(tmp_path, step="reference")
    assert fast_cfg.fast_step and not reference_cfg.fast_step
    model = tiny_model(fast_cfg)
    fast, reference = build_evaluator(fast_cfg, 0, 1, torch.device("cpu")), build_evaluator(reference_cfg, 0, 1, torch.device("cpu"))
    torch.compiler.reset()
    fast.warm_up(model, lambda: torch.autocast("cpu", enabled=False))
    (got, fast_sequences), (want, reference_sequences) = counts(fast, model), counts(reference, model)
    torch.compiler.reset()
    assert sum(fast_sequences) == sum(reference_sequences) == 200
    assert got[2].item() == want[2].item() > 1000  # every masked token counted once, padding slots none
    assert got[0].item() == want[0].item() > 10  # the same ones right
    assert got[1].item() == pytest.approx(want[1].item(), rel=1e-5)
    if compiled:
        assert fast.sums.failed is None
    assert fast.accuracy(model, lambda: torch.autocast("cpu", enabled=False))[0] == pytest.approx(got[0].item() / got[2].item())


def test_every_fast_evaluation_batch_has_one_shape_the_one_its_fullest_batch_needs(tmp_path):
    cfg = config(tmp_path, step="fast")
    batches = build_evaluator(cfg, 0, 1, torch.device("cpu")).batches
    shapes = {tuple((name, tuple(t.shape)) for name, t in vars(b).items() if isinstance(t, torch.Tensor)) for b in batches}
    assert len(batches) > 2 and len(shapes) == 1
    assert all(b.static for b in batches)
    assert max(b.num_masked for b in batches) == batches[0].mlm_labels.numel()  # the fullest fills it, no more
    assert max(b.num_sequences for b in batches) == batches[0].nsp_labels.numel()
    assert batches[0].input_ids.numel() == 2 * cfg.train.batch_size * cfg.model.max_position_embeddings


def test_the_ranks_fast_evaluations_add_up_to_the_whole_set(tmp_path):
    cfg = config(tmp_path, step="fast")
    model = tiny_model(cfg)
    whole, _ = counts(build_evaluator(cfg, 0, 1, torch.device("cpu")), model)
    parts = [counts(build_evaluator(cfg, rank, 3, torch.device("cpu")), model)[0] for rank in range(3)]
    assert sum(p[2].item() for p in parts) == whole[2].item()
    assert sum(p[0].item() for p in parts) == whole[0].item()
