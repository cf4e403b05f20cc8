"""Weights streamed to a rollout engine (Model.export_weights): transformers loads them and reproduces
megadsl's log-probs after an update; they are save_hf's bytes; every rank of a pipeline gets them."""

import pytest
import torch

import helpers
import megadsl
from helpers import lp_valid, max_diff
from test_train import rollout


def hf_log_probs(hf, ids, mask):
    """A transformers model's log-probs of each next token (0 in the last column), as megadsl's."""
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=mask).logits.float()
    out = torch.zeros(ids.shape, dtype=torch.float32)
    out[:, :-1] = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    return out


def test_exported_weights_reproduce_the_updated_model_in_transformers(gqa, reference, tmp_path):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    model = megadsl.Model.from_hf(gqa)
    trainer = model.trainer(lr=1e-2)
    trainer.step(rollout(reference, model))  # the weights move away from the checkpoint's
    ids, mask = reference["left.input_ids"], reference["left.attention_mask"]
    with torch.no_grad():
        ours = model.forward(ids, mask)

    weights = dict(model.export_weights(dtype="fp32", bucket_mb=0.05))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(gqa), dtype=torch.float32)
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    theirs = hf_log_probs(hf, ids, mask)
    assert max_diff(theirs, ours["log_probs"], lp_valid(mask)) < 1e-4
    assert max_diff(theirs, reference["left.log_probs"], lp_valid(mask)) > 1e-3  # the update did move them

    # The bytes save_hf writes, in every dtype.
    for dtype, torch_dtype in [("bf16", torch.bfloat16), ("fp32", torch.float32)]:
        model.save_hf(tmp_path / dtype, dtype=dtype)
        saved = load_file(str(tmp_path / dtype / "model.safetensors"))
        exported = dict(model.export_weights(dtype=dtype))
        assert exported.keys() == saved.keys()
        for k, v in saved.items():
            assert exported[k].dtype == torch_dtype and torch.equal(exported[k], v), k


def test_every_rank_of_a_pipeline_gets_the_same_weights(gqa):
    single = {name: t.clone() for name, t in megadsl.Model.from_hf(gqa).export_weights(dtype="fp32")}
    results = megadsl.launch_local(2, helpers.export_on_ranks, str(gqa), {"pp": 2}, "fp32", timeout=120)
    for got in results:
        assert got.keys() == single.keys()
        for k in single:
            assert torch.equal(got[k], single[k]), k


def test_rollout_tp_slices(gqa):
    model = megadsl.Model.from_hf(gqa)
    full = dict(model.export_weights(dtype="fp32"))
    halves = [dict(model.export_weights(dtype="fp32", shard_tp=2, shard_rank=r)) for r in range(2)]
    q = "model.layers.0.self_attn.q_proj.weight"
    o = "model.layers.0.self_attn.o_proj.weight"
    norm = "model.layers.0.input_layernorm.weight"
    assert torch.equal(torch.cat([h[q] for h in halves], 0), full[q])
    assert torch.equal(torch.cat([h[o] for h in halves], 1), full[o])
    assert all(torch.equal(h[norm], full[norm]) for h in halves)


def test_rollout_tp_slices_of_fused_hf_tensors_are_refused(fixtures):
    """Phi-3 stores q/k/v in one qkv_proj: an even slice would mix projections, so it is refused."""
    model = megadsl.Model.from_hf(fixtures / "phi3-tf5")
    with pytest.raises(ValueError, match="qkv_proj.weight holds several projections in one HF tensor"):
        list(model.export_weights(dtype="fp32", shard_tp=2))
    assert len(dict(model.export_weights(dtype="fp32"))) > 0  # full tensors are fine


def test_a_multimodal_checkpoint_trains_and_saves_as_published(fixtures, tmp_path):
    """Gemma 3 as published (Gemma3ForConditionalGeneration, the older names): megadsl trains its text
    model; save_hf writes the multimodal checkpoint back, which transformers loads and runs with
    megadsl's log-probs; the export sends the checkpoint's own names."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    src = fixtures / "gemma3-vl-tf5"
    reference = load_file(str(src / "reference.safetensors"))
    model = megadsl.Model.from_hf(src)
    model.trainer(lr=1e-2).step(rollout(reference, model))
    ids, mask = reference["right.input_ids"], reference["right.attention_mask"]
    with torch.no_grad():
        ours = model.forward(ids, mask)
    model.save_hf(tmp_path / "saved")
    saved = load_file(str(tmp_path / "saved" / "model.safetensors"))
    source = load_file(str(src / "model.safetensors"))
    assert saved.keys() == source.keys()
    for k in source:
        if not k.startswith("language_model."):
            assert torch.equal(saved[k], source[k]), k  # the vision tower, carried
    exported = dict(model.export_weights(dtype="fp32"))
    assert exported.keys() == {k for k in saved if k.startswith("language_model.")}
    for k, v in exported.items():
        assert torch.equal(v, saved[k]), k

    hf = transformers.Gemma3ForConditionalGeneration.from_pretrained(str(tmp_path / "saved"), dtype=torch.float32,
                                                                     attn_implementation="eager").eval()
    theirs = hf_log_probs(hf, ids, mask)
    assert max_diff(theirs, ours["log_probs"], lp_valid(mask)) < 1e-4
    assert max_diff(theirs, reference["right.log_probs"], lp_valid(mask)) > 1e-3  # the update did move them

    # Through a distributed checkpoint (as a verl run saves them), into a fresh model, back to HF:
    # the same multimodal checkpoint, the vision tower carried by the checkpoint's hf/.
    model.save_distributed(tmp_path / "dist")
    assert (tmp_path / "dist" / "hf" / "multimodal.safetensors").exists()
    again = megadsl.Model.from_hf(src)
    again.load_distributed(tmp_path / "dist")
    again.save_hf(tmp_path / "again")
    resaved = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert resaved.keys() == saved.keys()
    for k in saved:
        assert torch.equal(resaved[k], saved[k]), k
