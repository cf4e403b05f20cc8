"""The PPO step (actor and critic) and checkpoints: save_hf bit-exact, distributed round trip."""

import math

import pytest
import torch

import megadsl


def rollout(reference, model, side="right"):
    ids, mask = reference[f"{side}.input_ids"], reference[f"{side}.attention_mask"]
    with torch.no_grad():
        old = model.forward(ids, mask)
    g = torch.Generator().manual_seed(5)
    batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": old["valid"].float()}
    if model.critic:
        batch["old_values"] = old["values"]
        batch["returns"] = old["values"] + torch.randn(ids.shape, generator=g)
    else:
        batch["old_log_probs"] = old["log_probs"]
        batch["advantages"] = torch.randn(ids.shape, generator=g)
    return batch


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.parameters().items()}


@pytest.mark.parametrize("critic", [False, True])
def test_ppo_step_changes_the_parameters(gqa, reference, critic):
    model = megadsl.Model.from_hf(gqa / "critic" if critic else gqa, critic=critic)
    trainer = model.trainer(lr=1e-3, clip_grad=1.0, clip_ratio=0.2, entropy_coeff=0.01, value_clip=0.5)
    before = snapshot(model)
    batch = rollout(reference, model)
    m = trainer.step(batch, microbatches=2)
    verl_metrics = ({"critic/vf_loss", "critic/vf_clipfrac"} if critic else
                    {"actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/entropy_loss"})
    assert set(m) == {"loss", "grad_norm", "lr", "tokens", "seconds", "tokens_per_second", "moe_aux_loss",
                      "skipped"} | verl_metrics
    assert m["skipped"] is False and m["moe_aux_loss"] == 0
    assert all(math.isfinite(v) for v in m.values())
    assert m["grad_norm"] > 0 and m["lr"] == 1e-3 and m["tokens"] == int(batch["attention_mask"].sum())
    after = model.parameters()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert "layers.0.qkv.weight" in changed and len(changed) > len(before) // 2
    assert trainer.steps == 1 and trainer.samples == 4
    m2 = trainer.step(batch)  # one micro-batch; the second step moves on from the first
    assert math.isfinite(m2["loss"]) and trainer.steps == 2


def test_microbatches_do_not_change_the_step(gqa, reference):
    results = []
    for split in (dict(microbatches=1), dict(microbatches=4), dict(max_token_len=12)):
        model = megadsl.Model.from_hf(gqa)
        trainer = model.trainer(lr=1e-3)
        m = trainer.step(rollout(reference, model), **split)
        results.append((m["loss"], snapshot(model)))
    for loss, params in results[1:]:
        assert abs(loss - results[0][0]) < 1e-6
        for k, v in params.items():
            assert torch.allclose(v, results[0][1][k], atol=1e-6), k


def test_the_chunked_lm_head_trains_as_the_whole_one(gqa, reference):
    """head_chunk_tokens: the training step's head in chunks of 5 tokens (forward and backward)
    gives the whole head's loss, metrics and gradients; a bad chunk is refused. (The updated
    parameters are not compared: AdamW's first step divides each gradient by its own magnitude,
    so where a gradient is near 0 its last bits move the parameter by up to ~lr.)"""
    results = []
    for chunk in (-1, 5):
        model = megadsl.Model.from_hf(gqa, head_chunk_tokens=chunk)
        trainer = model.trainer(lr=1e-3, entropy_coeff=0.01)
        m = trainer.step(rollout(reference, model), microbatches=2)
        results.append((m, {k: v.grad.clone() for k, v in model.parameters().items()}))
    (whole, whole_grads), (chunked, chunked_grads) = results
    for key in ("loss", "grad_norm", "actor/entropy_loss", "actor/ppo_kl"):
        assert abs(chunked[key] - whole[key]) < 1e-6, key
    assert whole["grad_norm"] > 0
    for k, g in chunked_grads.items():
        assert torch.allclose(g, whole_grads[k], atol=1e-6, rtol=0), k
    with pytest.raises(ValueError, match="head_chunk_tokens"):
        megadsl.Model.from_hf(gqa, head_chunk_tokens=-2)


def test_bad_batches_are_named(gqa, reference):
    model = megadsl.Model.from_hf(gqa)
    trainer = model.trainer()
    batch = rollout(reference, model)
    with pytest.raises(KeyError, match="advantages"):
        trainer.step({k: v for k, v in batch.items() if k != "advantages"})
    with pytest.raises(KeyError, match="unknown batch field \"reward\""):
        trainer.step(dict(batch, reward=batch["advantages"]))
    with pytest.raises(ValueError, match="shape"):
        trainer.step(dict(batch, advantages=batch["advantages"][:, :3]))
    with pytest.raises(TypeError, match="torch.Tensor"):
        trainer.step(dict(batch, advantages=[1, 2]))
    with pytest.raises(ValueError, match="kl_coeff > 0 needs ref_log_probs"):
        model.trainer(kl_coeff=0.1).step(batch)


def test_save_hf_round_trip_is_bit_exact(gqa, tmp_path):
    from safetensors.torch import load_file

    model = megadsl.Model.from_hf(gqa)
    model.save_hf(tmp_path / "out")
    original = load_file(str(gqa / "model.safetensors"))
    saved = {}
    for f in sorted((tmp_path / "out").glob("*.safetensors")):
        saved.update(load_file(str(f)))
    assert saved.keys() == original.keys()
    for k in original:
        assert saved[k].dtype == original[k].dtype and torch.equal(saved[k], original[k]), k
    assert (tmp_path / "out" / "config.json").exists()
    again = megadsl.Model.from_hf(tmp_path / "out")
    for k, v in model.parameters().items():
        assert torch.equal(v, again.parameters()[k]), k


def test_save_hf_bf16(gqa, tmp_path):
    from safetensors.torch import load_file

    megadsl.Model.from_hf(gqa).save_hf(tmp_path / "bf16", dtype="bf16")
    tensors = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())


def test_distributed_checkpoint_keeps_the_training_state(gqa, reference, tmp_path):
    model = megadsl.Model.from_hf(gqa)
    trainer = model.trainer(lr=1e-3)
    batch = rollout(reference, model)
    trainer.step(batch)
    model.save_distributed(tmp_path / "ckpt", trainer=trainer)
    assert (tmp_path / "ckpt" / "metadata.json").exists()
    m_next = trainer.step(batch)
    expected = snapshot(model)

    other = megadsl.Model.from_hf(gqa, rmpad=True)  # another layout loads it
    other_trainer = other.trainer(lr=1e-3)
    other.load_distributed(tmp_path / "ckpt", trainer=other_trainer)
    assert other_trainer.steps == 1
    m_other = other_trainer.step(batch)
    assert abs(m_other["loss"] - m_next["loss"]) < 1e-5
    for k, v in other.parameters().items():
        assert torch.allclose(v, expected[k], atol=1e-5), k

    plain = megadsl.Model.from_hf(gqa)
    plain.load_distributed(tmp_path / "ckpt")  # without a trainer: the parameters only
    with pytest.raises(ValueError, match="another model"):
        plain.save_distributed(tmp_path / "x", trainer=trainer)


def test_moe_auxiliary_losses_reach_python(fixtures):
    """Megatron's auxiliary losses of a mixture, set from Python: reported per step and trained on."""
    path = fixtures / "qwen3-moe-tf5"
    from safetensors.torch import load_file
    ref = load_file(str(path / "reference.safetensors"))
    ids, mask = ref["right.input_ids"], ref["right.attention_mask"]
    steps = {}
    for coeff in (0.0, 0.1):
        model = megadsl.Model.from_hf(path, moe_aux_loss_coeff=coeff, moe_z_loss_coeff=coeff / 10)
        trainer = model.trainer(lr=1e-3)
        before = snapshot(model)
        with torch.no_grad():
            old = model.forward(ids, mask)
        batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": old["valid"].float(),
                 "old_log_probs": old["log_probs"], "advantages": torch.ones(ids.shape)}
        m = trainer.step(batch)
        routers = [k for k in before if k.endswith("router.weight")]
        steps[coeff] = (m, {k: model.parameters()[k] - before[k] for k in routers})
    assert steps[0.0][0]["moe_aux_loss"] == 0
    assert steps[0.1][0]["moe_aux_loss"] > 0.1  # several layers near balance (about 1 each when balanced), times 0.1
    assert any(not torch.allclose(steps[0.0][1][k], steps[0.1][1][k]) for k in steps[0.0][1])
    with pytest.raises(ValueError, match="moe_aux_loss_coeff"):
        megadsl.Model.from_hf(path, moe_aux_loss_coeff=-1.0)


def test_offload_between_phases(gqa, reference):
    """Model.offload / Trainer.offload free the device storage of parameters, gradients and AdamW's
    moments; reloaded, training goes on exactly as without the round trip."""
    batch = rollout(reference, megadsl.Model.from_hf(gqa))
    models = [megadsl.Model.from_hf(gqa) for _ in range(2)]
    trainers = [m.trainer(lr=1e-3) for m in models]
    for t in trainers:
        t.step(batch)
    model, trainer = models[0], trainers[0]
    held = model.device_bytes()
    assert held["parameters"] > 0 and held["gradients"] > 0 and trainer.optimizer_bytes > 0
    model.offload(gradients=False)
    assert model.device_bytes() == {"parameters": 0, "gradients": held["gradients"]}
    model.offload()
    trainer.offload()
    assert model.device_bytes() == {"parameters": 0, "gradients": 0} and trainer.optimizer_bytes == 0
    with pytest.raises(RuntimeError, match="offloaded to host memory; call reload"):
        model.forward(batch["input_ids"], batch["attention_mask"])
    model.reload()
    with pytest.raises(RuntimeError, match="reload_optimizer"):
        trainer.step(batch)
    trainer.reload()
    assert model.device_bytes() == held
    m = [t.step(batch) for t in trainers]
    assert m[0]["loss"] == m[1]["loss"]
    a, b = models[0].parameters(), models[1].parameters()
    assert all(torch.equal(a[k], b[k]) for k in a)
