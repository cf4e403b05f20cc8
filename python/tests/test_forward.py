"""One process: the llama-gqa fixture's log-probs, entropy, logits and values against the
references transformers computed (tests/fixtures/generate_fixtures.py, DEFINITIONS)."""

import pytest
import torch

import megadsl
from helpers import lp_valid, max_diff

TOL = 1e-4


@pytest.fixture(scope="module")
def actor(gqa):
    return megadsl.Model.from_hf(gqa)


@pytest.mark.parametrize("side", ["left", "right"])
def test_actor_matches_transformers(actor, reference, side):
    ids, mask = reference[f"{side}.input_ids"], reference[f"{side}.attention_mask"]
    with torch.no_grad():
        out = actor.forward(ids, mask)
    assert set(out) == {"log_probs", "entropy", "valid"}
    lp_where = lp_valid(mask)
    assert torch.equal(out["valid"], lp_where)
    assert max_diff(out["log_probs"], reference[f"{side}.log_probs"], lp_where) < TOL
    assert max_diff(out["entropy"], reference[f"{side}.entropy"], mask.bool()) < TOL
    assert out["log_probs"].dtype == torch.float32 and out["log_probs"].shape == ids.shape


def test_logits_and_temperature(actor, reference):
    ids, mask = reference["left.input_ids"], reference["left.attention_mask"]
    with torch.no_grad():
        out = actor.forward(ids, mask, logits=True, entropy=False)
        hot = actor.forward(ids, mask, temperature=0.5, entropy=False)
    assert "entropy" not in out
    assert out["logits"].shape == (4, 12, 300)
    assert max_diff(out["logits"], reference["left.logits"], mask.bool()) < TOL
    # log p at temperature T is log_softmax(logits / T) of the next token.
    expected = torch.log_softmax(out["logits"].double() / 0.5, -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    where = lp_valid(mask)[:, :-1]
    assert max_diff(hot["log_probs"][:, :-1], expected, where) < TOL


def test_inputs_are_checked_and_converted(actor, reference):
    ids, mask = reference["right.input_ids"], reference["right.attention_mask"]
    with torch.no_grad():
        a = actor.forward(ids, mask)
        b = actor.forward(ids.int(), mask.bool())  # int32 ids and a bool mask are converted
        c = actor.forward(ids[:1, :7])             # no mask: every token is real
    assert torch.equal(a["log_probs"], b["log_probs"])
    assert max_diff(c["log_probs"], a["log_probs"][:1, :7], lp_valid(mask[:1, :7])) < 1e-5
    with pytest.raises(ValueError, match="outside the vocabulary"):
        actor.forward(torch.full((1, 3), 300))
    with pytest.raises(ValueError, match="2-D"):
        actor.forward(ids[0])
    with pytest.raises(ValueError, match="attention_mask has shape"):
        actor.forward(ids, mask[:, :5])


def test_forward_carries_the_graph_when_grad_is_on(actor, reference):
    out = actor.forward(reference["right.input_ids"], reference["right.attention_mask"])
    assert out["log_probs"].requires_grad
    out["log_probs"].sum().backward()
    params = actor.parameters()
    assert params["layers.0.qkv.weight"].grad is not None
    for p in params.values():
        p.grad = None


def test_remove_padding_layout_agrees(gqa, reference):
    model = megadsl.Model.from_hf(gqa, rmpad=True)
    ids, mask = reference["left.input_ids"], reference["left.attention_mask"]
    with torch.no_grad():
        out = model.forward(ids, mask)
    assert max_diff(out["log_probs"], reference["left.log_probs"], lp_valid(mask)) < TOL
    assert model.layout == megadsl.Layout(rmpad=True)


def test_critic_values(gqa, reference):
    critic = megadsl.Model.from_hf(gqa / "critic", critic=True)
    assert critic.critic
    assert not any("initialised" in n for n in critic.load_notes)  # score.* was loaded
    ids, mask = reference["left.input_ids"], reference["left.attention_mask"]
    with torch.no_grad():
        out = critic.forward(ids, mask)
    assert set(out) == {"values", "valid"}
    assert max_diff(out["values"], reference["left.values"], mask.bool()) < TOL


def test_bf16_compute_is_close(gqa, reference):
    model = megadsl.Model.from_hf(gqa, dtype="bf16")
    assert all(p.dtype == torch.float32 for p in model.parameters().values())  # fp32 parameters
    ids, mask = reference["left.input_ids"], reference["left.attention_mask"]
    with torch.no_grad():
        out = model.forward(ids, mask)
    assert out["log_probs"].dtype == torch.float32
    assert max_diff(out["log_probs"], reference["left.log_probs"], lp_valid(mask)) < 0.2


def test_a_layout_the_world_cannot_hold(gqa):
    with pytest.raises(ValueError, match="world"):
        megadsl.Model.from_hf(gqa, tp=2)  # one process, no init()
    with pytest.raises(ValueError, match="heads_divisible_by_tp"):
        megadsl.Model.from_hf(gqa, tp=3)


def test_model_properties(actor):
    assert (actor.rank, actor.world_size, actor.tp_rank, actor.pp_rank, actor.dp_rank) == (0, 1, 0, 0, 0)
    assert actor.vocab == 300 and actor.model_type == "llama" and not actor.critic
    assert actor.device == "cpu"
    params = actor.parameters()
    assert params["layers.0.qkv.weight"].shape == (128, 64)  # 4 q + 2 k + 2 v heads of 16 rows
    assert "megadsl.Model(" in repr(actor)


def test_init_needs_a_launcher(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(RuntimeError, match="torchrun"):
        megadsl.init()
    assert not megadsl.is_initialized() and megadsl.rank() == 0 and megadsl.world_size() == 1


def test_parameters_are_the_live_tensors(gqa, reference):
    model = megadsl.Model.from_hf(gqa)
    ids, mask = reference["right.input_ids"], reference["right.attention_mask"]
    with torch.no_grad():
        before = model.forward(ids, mask)["log_probs"]
        model.parameters()["final_norm.weight"].mul_(2.0)  # no copy: the model sees the change
        after = model.forward(ids, mask)["log_probs"]
    assert not torch.equal(before, after)


def test_a_closed_model_says_so(gqa, reference):
    model = megadsl.Model.from_hf(gqa)
    trainer = model.trainer()
    model.close()
    assert model.closed and "closed" in repr(model)
    assert model.vocab == 300  # what it was stays readable
    with pytest.raises(RuntimeError, match="closed"):
        model.forward(reference["right.input_ids"])
    with pytest.raises(RuntimeError, match="closed"):
        trainer.step({"input_ids": reference["right.input_ids"]})
    model.close()  # idempotent


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_transformers(gqa, reference):
    model = megadsl.Model.from_hf(gqa, device="cuda")
    ids, mask = reference["left.input_ids"], reference["left.attention_mask"]
    with torch.no_grad():
        out = model.forward(ids, mask)  # CPU inputs are moved to the model's device
    assert out["log_probs"].is_cuda
    lp = out["log_probs"].cpu()
    assert max_diff(lp, reference["left.log_probs"], lp_valid(mask)) < TOL


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_a_gpu_is_refused(gqa):
    with pytest.raises(RuntimeError, match="CUDA device was asked for"):
        megadsl.Model.from_hf(gqa, device="cuda")
