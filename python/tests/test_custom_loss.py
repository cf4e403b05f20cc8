"""A loss of the caller's own through the schedule (Trainer.step(loss_fn=...)): on the last stage of
any layout, with the global batch's counts, its own batch fields and metrics; equal to the built-in
loss when it computes the same thing, and equal across layouts."""

import pytest
import torch

import helpers
import megadsl
from test_train import rollout


def weighted_batch(reference, model):
    batch = rollout(reference, model)
    g = torch.Generator().manual_seed(3)
    batch["token_weights"] = torch.rand(batch["input_ids"].shape, generator=g) + 0.5
    return batch


def test_custom_loss_equals_the_builtin_one(gqa, reference):
    model = megadsl.Model.from_hf(gqa)
    batch = weighted_batch(reference, model)
    builtin = {k: v for k, v in batch.items() if k != "token_weights"}
    builtin["rollout_is_weights"] = batch["token_weights"]
    a = megadsl.Model.from_hf(gqa).trainer(lr=1e-3).step(builtin, microbatches=2)
    metrics, weights = helpers.train_with_custom_loss(str(gqa), {}, batch, 1)
    other = megadsl.Model.from_hf(gqa)
    other.trainer(lr=1e-3).step(builtin, microbatches=2)
    expected = dict(other.export_weights(dtype="fp32"))
    assert abs(metrics[0]["loss"] - a["loss"]) < 1e-7
    assert abs(metrics[0]["grad_norm"] - a["grad_norm"]) < 1e-6
    assert metrics[0]["my/pg_clipfrac"] == pytest.approx(a["actor/pg_clipfrac"], abs=1e-7)
    for k, v in expected.items():
        assert torch.allclose(weights[k], v, atol=1e-7), k


def test_custom_loss_through_a_pipeline_equals_one_process(gqa, reference):
    model = megadsl.Model.from_hf(gqa)
    batch = weighted_batch(reference, model)
    one_metrics, one_weights = helpers.train_with_custom_loss(str(gqa), {}, batch, 2)
    for layout in ({"pp": 2}, {"tp": 2, "sp": True, "rmpad": True}):
        results = megadsl.launch_local(2, helpers.train_with_custom_loss, str(gqa), layout, batch, 2, timeout=180)
        for metrics, weights in results:
            for m, ref in zip(metrics, one_metrics):
                assert abs(m["loss"] - ref["loss"]) < 1e-6, layout
                assert abs(m["my/pg_clipfrac"] - ref["my/pg_clipfrac"]) < 1e-6, layout
            for k, v in one_weights.items():
                assert torch.allclose(weights[k], v, atol=1e-5), (layout, k)


def test_a_bad_loss_fn_is_named(gqa, reference):
    model = megadsl.Model.from_hf(gqa)
    trainer = model.trainer()
    batch = weighted_batch(reference, model)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        trainer.step(batch, loss_fn=3)
    with pytest.raises(TypeError, match="loss_fn must return a scalar torch.Tensor"):
        trainer.step(batch, loss_fn=lambda o, b, c: 1.0)
    with pytest.raises(ValueError, match="returned a tensor of shape"):
        trainer.step(batch, loss_fn=lambda o, b, c: o["log_probs"])
    with pytest.raises(KeyError, match="unknown batch field \"token_weights\""):
        trainer.step(batch)  # the built-in loss does not read it
    assert trainer.steps == 0


def test_custom_loss_without_a_loss_mask_divides_by_the_real_tokens(gqa, reference):
    """A custom loss needs no loss_mask: the counts are then the real tokens and rows."""
    model = megadsl.Model.from_hf(gqa)
    ids, mask = reference["left.input_ids"], reference["left.attention_mask"]
    seen = []

    def loss_fn(outputs, micro, counts):
        seen.append(dict(counts))
        return (outputs["log_probs"] * micro["attention_mask"]).sum() / counts["batch_num_tokens"]

    m = model.trainer(lr=1e-4).step({"input_ids": ids, "attention_mask": mask}, microbatches=2, loss_fn=loss_fn)
    assert not m["skipped"]
    assert seen and all(c["batch_num_tokens"] == mask.sum().item() for c in seen)
    assert all(c["global_batch_size"] == (mask.sum(1) > 0).sum().item() for c in seen)
