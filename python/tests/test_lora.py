"""LoRA adapters (issue 48), forward: a PEFT adapter saved by PEFT 0.21 on transformers loads into
megadsl in any layout and gives PEFT's log-probs; what megadsl cannot honour is refused in one line.

The adapters are made here: PEFT's get_peft_model on the fixture with init_lora_weights=False (A
and B random, so the update is not zero; B scaled to a tenth), saved with save_pretrained."""

import json

import pytest
import torch

import helpers
import megadsl

# (fixture, target_modules, use_rslora): a dense family on all its linears, MLA's projections, a
# mixture's attention, Qwen3-Next's linear and full attention.
CASES = [
    ("qwen3-tf5", "all-linear", False),
    ("llama-gqa", ["q_proj", "v_proj", "down_proj"], True),
    ("deepseek-v3-tf5", ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"], False),
    ("qwen3-moe-tf5", ["q_proj", "k_proj", "v_proj", "o_proj"], False),
    # the gated DeltaNet's projections, and the output-gated attention's replicated k / v
    ("qwen3-next-tf5", ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkvz", "in_proj_ba", "out_proj"], False),
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
    with torch.no_grad():  # B at a tenth of nn.Linear's init: an update the size a trained one has
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.mul_(0.1)
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
        (dict(r=8), r"lora_A.weight has shape \[4, \d+\]; this model's is \[8, \d+\]"),
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


def saved_tensors(directory, pattern="model*.safetensors"):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(directory.glob(pattern)):
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("name, layout, world", [("qwen3-tf5", dict(tp=2, pp=2, sp=True), 4),
                                                 ("deepseek-v3-tf5", dict(tp=2), 2)])
def test_save_hf_merges_the_adapter_as_peft_does(adapters, tmp_path, name, layout, world):
    """save_hf(merge_lora=True) from a layout writes PEFT's merge_and_unload weights (fp32, 1e-6),
    and the merged checkpoint alone gives the adapted model's log-probs."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    path, adapter, want, ids, mask = adapters[name]
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    theirs = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload().state_dict()
    out = tmp_path / "merged"
    megadsl.launch_local(world, helpers.save_merged, str(path), str(adapter), str(out), layout, timeout=600)
    ours = saved_tensors(out)
    modules = {k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for k in saved_tensors(adapter, "adapter_*.safetensors")}
    adapted = [n for n in ours if n.removesuffix(".weight") in modules]
    assert adapted  # the merged modules are among the tensors written
    assert all(n in theirs for n in adapted)
    compared = [n for n in ours if n in theirs]
    assert all(n in compared for n in ours if ".experts." not in n)  # (transformers 5 holds them fused)
    for n in compared:
        assert (ours[n] - theirs[n]).abs().max().item() < 1e-6, n
    base = saved_tensors(path)
    for n in adapted:
        assert (ours[n] - base[n]).abs().max().item() > 1e-4, n  # merged, not the base
    # The rollout sync sends the same merged tensors, in buckets, to every rank.
    for rank, sent in enumerate(megadsl.launch_local(world, helpers.export_merged, str(path), str(adapter), layout,
                                                     timeout=600)):
        assert set(sent) == set(ours), rank
        for n, t in sent.items():
            assert torch.equal(t, ours[n]), (rank, n)
    merged = megadsl.Model.from_hf(out)
    with torch.no_grad():
        got = merged.forward(ids, mask)["log_probs"][:, :-1]
    assert helpers.max_diff(got, want, helpers.lp_valid(mask)[:, :-1]) < 1e-5


def test_save_hf_asks_whether_to_merge(adapters, tmp_path):
    path, adapter, *_ = adapters["qwen3-tf5"]
    model = megadsl.Model.from_hf(path, lora_adapter=adapter)
    with pytest.raises(ValueError, match="carries a LoRA adapter; pass merge_lora=True"):
        model.save_hf(tmp_path / "a")
    model.save_hf(tmp_path / "base", merge_lora=False)
    base = saved_tensors(tmp_path / "base")
    for n, t in saved_tensors(path).items():
        if n in base:
            assert torch.equal(base[n], t), n
    with pytest.raises(ValueError, match="carries no LoRA adapter"):
        megadsl.Model.from_hf(path).save_hf(tmp_path / "b", merge_lora=True)
    with pytest.raises(ValueError, match="carries a LoRA adapter; pass merge_lora=True to send"):
        next(model.export_weights())
    with pytest.raises(ValueError, match="carries no LoRA adapter"):
        next(megadsl.Model.from_hf(path).export_weights(merge_lora=True))


def test_megadsl_convert_merges_an_adapter(adapters, tmp_path):
    """`megadsl convert --merge-lora DIR` (the CLI, at tp 2 on 2 ranks) writes what save_hf(merge_lora=True) does."""
    import subprocess
    from pathlib import Path

    tool = Path(megadsl.__file__).resolve().parents[2] / "tools" / "megadsl"
    assert tool.exists(), f"{tool}: build the CLI first (scripts/build.sh)"
    path, adapter, *_ = adapters["qwen3-tf5"]
    out = tmp_path / "cli"
    run = subprocess.run([str(tool), "convert", "--from", str(path), "--to", str(out), "--to-format", "hf",
                          "--merge-lora", str(adapter), "--tp", "2", "--ranks", "2"], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    model = megadsl.Model.from_hf(path, lora_adapter=adapter)
    model.save_hf(tmp_path / "py", merge_lora=True)
    ours, want = saved_tensors(out), saved_tensors(tmp_path / "py")
    assert set(ours) == set(want)
    for n, t in ours.items():
        assert torch.equal(t, want[n]), n
    refused = subprocess.run([str(tool), "convert", "--from", str(path), "--to", str(tmp_path / "d"), "--to-format",
                              "dist", "--merge-lora", str(adapter)], capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "--merge-lora writes an HF checkpoint" in refused.stderr
