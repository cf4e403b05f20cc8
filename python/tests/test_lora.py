"""LoRA adapters (issue 48), forward: a PEFT adapter saved by PEFT 0.21 on transformers loads into
megadsl in any layout and gives PEFT's log-probs; what megadsl cannot honour is refused in one line.

The adapters are made here: PEFT's get_peft_model on the fixture with init_lora_weights=False (A
and B random, so the update is not zero), saved with save_pretrained."""

import json

import pytest
import torch

import helpers
import megadsl

# (fixture, target_modules, use_rslora): a dense family on all its linears, MLA's projections, a
# mixture's attention.
CASES = [
    ("qwen3-tf5", "all-linear", False),
    ("llama-gqa", ["q_proj", "v_proj", "down_proj"], True),
    ("deepseek-v3-tf5", ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"], False),
    ("qwen3-moe-tf5", ["q_proj", "k_proj", "v_proj", "o_proj"], False),
]
LAYOUTS = [
    (dict(tp=2, sp=True, rmpad=True), 2),
    (dict(tp=2, pp=2, sp=True), 4),
]


def batch(vocab):
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(1, vocab, (3, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # a left-padded row
    mask[2, 11:] = 0  # a right-padded one
    return ids, mask


def peft_adapter(fixture, targets, rslora, out):
    """PEFT's adapter on the fixture, saved to `out`, and PEFT's log-probs of batch()."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(fixture, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, use_rslora=rslora,
                        init_lora_weights=False)
    model = get_peft_model(base, config).eval()
    model.save_pretrained(out)
    ids, mask = batch(base.config.vocab_size)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    return lp, ids, mask


@pytest.fixture(scope="module")
def adapters(fixtures, tmp_path_factory):
    made = {}
    for name, targets, rslora in CASES:
        out = tmp_path_factory.mktemp(f"lora-{name}")
        made[name] = (fixtures / name, out, *peft_adapter(fixtures / name, targets, rslora, out))
    return made


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_a_peft_adapter_gives_pefts_log_probs(adapters, name):
    path, adapter, want, ids, mask = adapters[name]
    valid = helpers.lp_valid(mask)[:, :-1]
    plain = megadsl.Model.from_hf(path)
    model = megadsl.Model.from_hf(path, lora_adapter=adapter)
    with torch.no_grad():
        base = plain.forward(ids, mask)["log_probs"][:, :-1]
        got = model.forward(ids, mask)["log_probs"][:, :-1]
    assert helpers.max_diff(base, want, valid) > 1e-3  # the adapter changes the numbers
    assert helpers.max_diff(got, want, valid) < 1e-5
    for rows in ((dict(), 1),) + tuple(LAYOUTS):
        layout, world = rows
        if world == 1:
            continue
        got = megadsl.launch_local(world, helpers.forward_with_lora, str(path), str(adapter), ids, mask, layout,
                                   timeout=600)
        for rank, lp in enumerate(got):
            assert helpers.max_diff(lp[:, :-1], want, valid) < 1e-5, f"{layout}, rank {rank}"


def test_what_megadsl_cannot_honour_is_refused(adapters, tmp_path, fixtures):
    path, adapter, *_ = adapters["qwen3-tf5"]
    config = json.loads((adapter / "adapter_config.json").read_text())

    made = []

    def with_config(**changes):
        made.append(changes)
        d = tmp_path / f"config-{len(made)}"
        d.mkdir()
        (d / "adapter_config.json").write_text(json.dumps({**config, **changes}))
        (d / "adapter_model.safetensors").write_bytes((adapter / "adapter_model.safetensors").read_bytes())
        return d

    for changes, match in [
        (dict(use_dora=True), r"adapter_config.json: use_dora = true: DoRA are not supported"),
        (dict(rank_pattern={"q_proj": 8}), r"rank_pattern = .*per-module ranks"),
        (dict(target_modules=".*proj"), r"target_modules is the regular expression"),
        (dict(r=8), r"lora_A.weight has shape \[4, 64\]; this model's is \[8, 64\]"),
        (dict(target_modules=["q_proj"]), r"holds an adapter on model.layers.0.\S+, which target_modules in adapter_config.json does not name"),
    ]:
        with pytest.raises(megadsl.CheckpointError, match=match) as info:
            megadsl.Model.from_hf(path, lora_adapter=with_config(**changes))
        assert "\n" not in str(info.value)
    # An adapter on a module megadsl does not adapt (the LM head), beside the others.
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    tensors["base_model.model.lm_head.lora_A.weight"] = torch.zeros(4, 64)
    d = with_config()
    save_file(tensors, str(d / "adapter_model.safetensors"))
    with pytest.raises(megadsl.CheckpointError, match=r"holds an adapter on lm_head, which megadsl does not adapt"):
        megadsl.Model.from_hf(path, lora_adapter=d)
    # A mixture's experts take no adapters yet: named by the lora rules.
    moe = fixtures / "qwen3-moe-tf5"
    d = tmp_path / "experts"
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["gate_proj"]}))
    with pytest.raises(megadsl.CheckpointError, match=r"lora_target_supported.*a mixture's experts take no adapters yet"):
        megadsl.Model.from_hf(moe, lora_adapter=d)
    with pytest.raises(ValueError, match="invariant arithmetic"):
        megadsl.Model.from_hf(path, lora_adapter=adapter, invariant=True)
    model = megadsl.Model.from_hf(path, lora_adapter=adapter)
    with pytest.raises(ValueError, match="training adapters is not built yet"):
        model.trainer()
