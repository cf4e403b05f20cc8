"""Python at par with C++: Megatron's LR schedules, router replay, micro-batched inference, and one
line for a keyword a function does not take."""

import math
import pickle

import pytest
import torch

import megadsl
import helpers
from helpers import lp_valid, max_diff
from test_train import rollout


def test_lr_schedule_is_megatrons(gqa, reference):
    model = megadsl.Model.from_hf(gqa)
    batch = rollout(reference, model)  # 4 rows: the schedule counts samples, as Megatron's does
    trainer = model.trainer(lr=1e-3, min_lr=1e-4, lr_decay_style="cosine", lr_warmup_samples=4, lr_decay_samples=16)
    lrs = [trainer.step(batch)["lr"] for _ in range(6)]

    def megatron(n, warmup=4, decay=16, max_lr=1e-3, min_lr=1e-4):
        if n <= warmup:
            return max_lr * n / warmup
        if n > decay:
            return min_lr
        ratio = (n - warmup) / (decay - warmup)
        return min_lr + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (max_lr - min_lr)

    assert lrs == pytest.approx([megatron(4 * i) for i in range(6)], abs=1e-12)
    with pytest.raises(ValueError, match="lr_decay_style \"cosin\" is not one of Megatron's"):
        model.trainer(lr_decay_style="cosin")


def test_router_replay_from_python(fixtures):
    from safetensors.torch import load_file

    path = fixtures / "qwen2-moe-tf5"
    ref = load_file(str(path / "reference.safetensors"))
    ids, mask = ref["left.input_ids"], ref["left.attention_mask"]
    model = megadsl.Model.from_hf(path)
    with torch.no_grad():
        recorded = model.forward(ids, mask, record_routing=True)
        routing = recorded["routed_experts"]
        assert routing.shape[:2] == ids.shape and routing.dtype == torch.long
        replayed = model.forward(ids, mask, routed_experts=routing)
    assert torch.equal(replayed["log_probs"], recorded["log_probs"])
    batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": recorded["valid"].float(),
             "old_log_probs": recorded["log_probs"], "advantages": torch.randn(ids.shape),
             "routed_experts": routing}
    m = model.trainer(lr=1e-4).step(batch, microbatches=2)
    assert math.isfinite(m["loss"]) and not m["skipped"]
    with pytest.raises(ValueError, match=r"routed_experts has shape \[4, 12\]"):
        model.forward(ids, mask, routed_experts=routing[:, :, 0, 0])


def test_micro_batched_inference_gives_the_same_outputs(gqa, reference):
    model = megadsl.Model.from_hf(gqa)
    ids, mask = reference["left.input_ids"], reference["left.attention_mask"]
    with torch.no_grad():
        whole = model.forward(ids, mask)
        parts = model.forward(ids, mask, micro_batch_size=1)
    assert torch.equal(whole["valid"], parts["valid"])
    assert max_diff(whole["log_probs"], parts["log_probs"], lp_valid(mask)) < 1e-6
    assert max_diff(whole["entropy"], parts["entropy"], mask.bool()) < 1e-6


def test_micro_batched_inference_is_pipelined_at_pp_2(gqa, reference):
    ids, mask = reference["left.input_ids"], reference["left.attention_mask"]
    for whole, parts in megadsl.launch_local(2, helpers.forward_whole_and_micro, str(gqa), ids, mask, {"pp": 2}):
        assert torch.equal(whole["valid"], parts["valid"])
        assert max_diff(whole["log_probs"], parts["log_probs"], lp_valid(mask)) < 1e-6
        assert max_diff(whole["entropy"], parts["entropy"], mask.bool()) < 1e-6


def test_a_wrong_keyword_is_one_line(gqa, reference):
    with pytest.raises(TypeError, match=r"^megadsl.Model.from_hf\(\) got an unexpected keyword argument 'tpp'; it takes path, "):
        megadsl.Model.from_hf(gqa, tpp=2)
    model = megadsl.Model.from_hf(gqa)
    for call, pattern in [(lambda: model.forward(reference["left.input_ids"], temp=2), r"Model.forward\(\) got an unexpected keyword argument 'temp'"),
                          (lambda: model.forward([1, 2]), r"Model.forward\(list\): the arguments do not fit"),
                          (lambda: model.trainer().step({}, micro=2), r"Trainer.step\(\) got an unexpected keyword argument 'micro'"),
                          (lambda: model.trainer(lrr=1e-3), r"Model.trainer\(\) got an unexpected keyword argument 'lrr'")]:
        with pytest.raises(TypeError, match=pattern) as e:
            call()
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("dynamic", [False, True])
def test_dp_local_batches_equal_the_global_batch(gqa, reference, dynamic):
    """Each dp rank given only its rows (verl's dispatch) trains as one process on the whole batch."""
    import helpers

    model = megadsl.Model.from_hf(gqa)
    batch = rollout(reference, model)
    split = dict(max_token_len=16) if dynamic else dict(microbatches=2)
    trainer = model.trainer(lr=1e-3)
    expected = [trainer.step(batch, **split) for _ in range(2)]
    weights = dict(model.export_weights(dtype="fp32"))
    for metrics, got in megadsl.launch_local(2, helpers.train_dp_local, str(gqa), batch, 2, dynamic, timeout=180):
        for m, e in zip(metrics, expected):
            assert abs(m["loss"] - e["loss"]) < 1e-6 and m["tokens"] == e["tokens"]
            assert abs(m["grad_norm"] - e["grad_norm"]) < 1e-5
        for k, v in weights.items():
            assert torch.allclose(got[k], v, atol=1e-6), k


def test_per_row_temperatures(gqa, reference):
    """Each row's logits divided by its own temperature: equal to a forward of that row alone at that
    temperature, in every layout, and in a training step."""
    import helpers

    ids, mask = reference["left.input_ids"], reference["left.attention_mask"]
    temps = torch.tensor([0.5, 1.0, 2.0, 0.7])
    model = megadsl.Model.from_hf(gqa)
    with torch.no_grad():
        mixed = model.forward(ids, mask, temperature=temps)
        for r, t in enumerate(temps.tolist()):
            alone = model.forward(ids[r:r + 1], mask[r:r + 1], temperature=t)
            if lp_valid(mask[r:r + 1]).any():  # (a row of one token has no log-prob)
                assert max_diff(mixed["log_probs"][r:r + 1], alone["log_probs"], lp_valid(mask[r:r + 1])) < 1e-6
            assert max_diff(mixed["entropy"][r:r + 1], alone["entropy"], mask[r:r + 1].bool()) < 1e-6
    for layout in ({"tp": 2, "sp": True, "rmpad": True}, {"pp": 2}):
        for out in megadsl.launch_local(2, helpers.forward_with_row_temperatures, str(gqa), ids, mask, temps, layout,
                                        timeout=120):
            assert max_diff(out["log_probs"], mixed["log_probs"], lp_valid(mask)) < 1e-5, layout
    batch = rollout(reference, model)
    batch["temperature"] = temps
    m = model.trainer(lr=1e-3).step(batch)
    assert math.isfinite(m["loss"]) and not m["skipped"]
    with pytest.raises(ValueError, match="give one or the other"):
        model.trainer(temperature=2.0).step(batch)
    with pytest.raises(ValueError, match=r"temperature has shape \[3\]"):
        model.forward(ids, mask, temperature=temps[:3])


def test_ring_context_parallelism_from_python(fixtures):
    """from_hf(cp=, cp_comm="ring" or Megatron's "p2p") and Layout(cp_comm=): the ring over the
    load-balanced split gives one process's log-probs, padded and packed, with a row shorter than
    2 cp chunks; an unknown kind is one line."""
    path = fixtures / "qwen3-tf5"
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 300, (3, 23), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :9] = 0
    mask[2, 4:] = 0  # 4 tokens: shorter than 2 cp chunks at cp 4
    want = megadsl.Model.from_hf(path).forward(ids, mask)["log_probs"].detach()
    valid = lp_valid(mask)
    for layout, world in [(dict(cp=2, cp_comm="ring", rmpad=True), 2), (dict(cp=4, cp_comm="p2p"), 4),
                          (dict(layout=megadsl.Layout(tp=2, sp=True, cp=2, cp_comm="ring")), 4),
                          (dict(cp=4, cp_comm="a2a+p2p", cp_a2a=2, rmpad=True), 4)]:
        for out, _ in megadsl.launch_local(world, helpers.forward_on_ranks, str(path), ids, mask, layout, timeout=300):
            assert max_diff(out["log_probs"], want, valid) < 1e-5, layout
    with pytest.raises(ValueError, match='cp_comm is "a2a"'):
        megadsl.Model.from_hf(path, cp=2, cp_comm="ulysses")
    hierarchical = megadsl.Layout(cp=4, cp_comm="a2a+ring", cp_a2a=2)
    assert (hierarchical.cp_comm, hierarchical.cp_a2a) == ("a2a+ring", 2)
    assert "cp_a2a=2" in repr(hierarchical) and pickle.loads(pickle.dumps(hierarchical)) == hierarchical
