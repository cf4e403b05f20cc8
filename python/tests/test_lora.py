"""LoRA adapters (issue 48), forward: a PEFT adapter saved by PEFT 0.21 on transformers loads into
megadsl in any layout and gives PEFT's log-probs; what megadsl cannot honour is refused in one line.

The adapters are made here: PEFT's get_peft_model on the fixture with init_lora_weights=False (A
and B random, so the update is not zero; B scaled to a tenth), saved with save_pretrained."""

import json

import pytest
import torch

import helpers
import megadsl

# (fixture, target_modules, use_rslora, target_parameters): a dense family on all its linears, MLA's
# projections, a mixture's attention and experts (PEFT's ParamWrapper on transformers' fused
# experts), Qwen3-Next's linear and full attention.
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
CASES = [
    ("qwen3-tf5", "all-linear", False, None),
    ("llama-gqa", ["q_proj", "v_proj", "down_proj"], True, None),
    ("deepseek-v3-tf5", ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"], False, None),
    ("qwen3-moe-tf5", ["q_proj", "k_proj", "v_proj", "o_proj"], False, EXPERTS),
    # the gated DeltaNet's projections, and the output-gated attention's replicated k / v
    ("qwen3-next-tf5", ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkvz", "in_proj_ba", "out_proj"], False, None),
]
LAYOUTS = [
    (dict(tp=2, sp=True, rmpad=True), 2),
    (dict(tp=2, pp=2, sp=True), 4),
]
# A mixture's experts' adapters live with their experts under ep.
MOE_LAYOUTS = [(dict(ep=2, tp=2, sp=True), 4)]


def batch(vocab):
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(1, vocab, (3, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # a left-padded row
    mask[2, 11:] = 0  # a right-padded one
    return ids, mask


def peft_adapter(fixture, targets, rslora, parameters, out):
    """PEFT's adapter on the fixture, saved to `out`, and PEFT's log-probs of batch()."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(fixture, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, use_rslora=rslora,
                        init_lora_weights=False, target_parameters=parameters)
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
    for name, targets, rslora, parameters in CASES:
        out = tmp_path_factory.mktemp(f"lora-{name}")
        made[name] = (fixtures / name, out, *peft_adapter(fixtures / name, targets, rslora, parameters, out))
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
    for rows in ((dict(), 1),) + tuple(LAYOUTS) + tuple(MOE_LAYOUTS if "moe" in name else ()):
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
    # A mixture's experts take adapters through target_parameters (as on transformers 5, where
    # they are no nn.Linear), named by the lora rules; a parameter no experts have is refused too.
    moe = fixtures / "qwen3-moe-tf5"
    for i, (changes, match) in enumerate([
        (dict(target_modules=["gate_proj"]), r"lora_target_supported.*a mixture's experts take adapters through target_parameters"),
        (dict(target_parameters=["mlp.experts.gate_proj"]), r"lora_targets_match: LoRA target parameter \"mlp.experts.gate_proj\" names no experts parameter"),
    ]):
        d = tmp_path / f"experts-{i}"
        d.mkdir()
        (d / "adapter_config.json").write_text(json.dumps({**config, **changes}))
        with pytest.raises(megadsl.CheckpointError, match=match):
            megadsl.Model.from_hf(moe, lora_adapter=d)
    # An experts adapter whose nesting is not PEFT's (the down_proj adapter under base_layer) is
    # named as such, not read into the wrong parameter.
    moe_path, moe_adapter, *_ = adapters["qwen3-moe-tf5"]
    moved = {k.replace("experts.lora_", "experts.base_layer.base_layer.lora_"): v
             for k, v in load_file(str(moe_adapter / "adapter_model.safetensors")).items()}
    d = tmp_path / "experts-nesting"
    d.mkdir()
    (d / "adapter_config.json").write_text((moe_adapter / "adapter_config.json").read_text())
    save_file(moved, str(d / "adapter_model.safetensors"))
    with pytest.raises(megadsl.CheckpointError, match=r"experts' parameter that target_parameters .* does not name"):
        megadsl.Model.from_hf(moe_path, lora_adapter=d)
    with pytest.raises(ValueError, match="invariant arithmetic"):
        megadsl.Model.from_hf(path, lora_adapter=adapter, invariant=True)
    # Fresh adapters' keys are checked; a mixture's experts take no dropout (nor in PEFT).
    with pytest.raises(ValueError, match=r"lora_dropout_experts"):
        megadsl.Model.from_hf(moe, lora_rank=4, lora_target_parameters=EXPERTS, lora_dropout=0.1)
    with pytest.raises(ValueError, match="lora_adapter= .* or lora_rank= .*, not both"):
        megadsl.Model.from_hf(path, lora_adapter=adapter, lora_rank=8)
    with pytest.raises(ValueError, match="lora_target_modules is \"all-linear\" or a list"):
        megadsl.Model.from_hf(path, lora_rank=8, lora_target_modules=".*proj")
    with pytest.raises(ValueError, match="save_lora: this model carries no LoRA adapter"):
        megadsl.Model.from_hf(path).save_lora(tmp_path / "none")


def saved_tensors(directory, pattern="model*.safetensors"):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(directory.glob(pattern)):
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("name, layout, world", [("qwen3-tf5", dict(tp=2, pp=2, sp=True), 4),
                                                 ("deepseek-v3-tf5", dict(tp=2), 2),
                                                 ("qwen3-moe-tf5", dict(tp=2, ep=2), 4)])
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
    # A mixture's experts: each expert's merged gate, up and down against transformers' fused ones.
    fused_experts = [n for n in theirs if n.endswith("mlp.experts.gate_up_proj") or n.endswith("mlp.experts.down_proj")]
    adapts_experts = any(m.endswith(".experts") or ".experts.base_layer" in m for m in modules)
    assert fused_experts or not adapts_experts
    for n in fused_experts if adapts_experts else []:
        stem, fused = n.rsplit(".", 1)
        for e in range(theirs[n].shape[0]):
            if fused == "down_proj":
                parts = [f"{stem}.{e}.down_proj.weight"]
            else:
                parts = [f"{stem}.{e}.gate_proj.weight", f"{stem}.{e}.up_proj.weight"]
            mine = torch.cat([ours[p] for p in parts], 0)
            assert (mine - theirs[n][e]).abs().max().item() < 1e-6, (n, e)
            adapted += parts
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


# Training (the base frozen): PEFT on transformers against megadsl, 3 AdamW steps with clipping and
# weight decay, in layouts: (fixture, [(layout, ranks)]); the adapters of CASES. A dense family on
# all its linears (dp 2 with the distributed optimizer too, vpp, cp), MLA's projections, a mixture's
# attention (its experts under ep); tp 4 over llama-gqa's 2 kv heads sums a replicated head's rows
# of B over the ranks holding it.
# AdamW divides each gradient by its own magnitude: where one is near eps, fp32 noise in it moves
# that element's update by a fraction of lr (4.5e-5 seen at lr 1e-3 on DeepSeek-V3 at tp 2). At
# 1e-4 the updates stay within 1e-5 of PEFT's and the adapters still move by 3e-4.
TRAIN_LR = 1e-4
TRAIN_STEPS = 3
TRAIN_CASES = {
    "qwen3-tf5": [(dict(), 1), (dict(tp=2, sp=True, rmpad=True), 2), (dict(tp=2, pp=2), 4), (dict(tp=1), 2),
                  (dict(pp=2, vpp=2), 2), (dict(cp=2, rmpad=True), 2)],
    "deepseek-v3-tf5": [(dict(tp=2, sp=True, rmpad=True), 2), (dict(tp=2, pp=2), 4)],
    "qwen3-moe-tf5": [(dict(tp=2, pp=2), 4), (dict(ep=2), 2), (dict(ep=2, tp=2, sp=True), 4)],
    "llama-gqa": [(dict(tp=4), 4)],
}


def training_batch(path):
    """4 rows (2 micro-batches, dp 2): left- and right-padded ones among them."""
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(1, json.loads((path / "config.json").read_text())["vocab_size"], (4, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[2, 11:] = 0
    mask[3, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": helpers.lp_valid(mask).float(),
            "advantages": torch.randn(ids.shape, generator=g)}


def peft_train(path, adapter, batch, steps):
    """PEFT's side: the same loss (helpers.advantage_loss) through PEFT on transformers, torch's AdamW
    over the adapters with the global norm clipped at 1. Each step's loss and norm, the trained
    adapters, and the trained model's log-probs."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter, is_trainable=True)
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    opt = torch.optim.AdamW(trained, lr=TRAIN_LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    ids, mask = batch["input_ids"], batch["attention_mask"]

    def log_probs():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
        return torch.nn.functional.pad(lp, (0, 1))

    steps_out = []
    for _ in range(steps):
        loss = -(batch["advantages"] * log_probs() * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        opt.zero_grad()
        steps_out.append((loss.item(), norm.item()))
    with torch.no_grad():
        lp = log_probs()
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return steps_out, weights, lp


def adapter_weights(directory):
    from safetensors.torch import load_file

    return load_file(str(directory / "adapter_model.safetensors"))


@pytest.mark.parametrize("name", list(TRAIN_CASES))
def test_training_the_adapters_equals_peft(adapters, tmp_path, name):
    """The adapters' losses, gradient norms and weights after 3 steps equal PEFT's within 1e-5 in
    every layout; what megadsl saves loads in PEFT with the same log-probs."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    path, adapter, *_ = adapters[name]
    batch = training_batch(path)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    want_steps, want, want_lp = peft_train(path, adapter, batch, TRAIN_STEPS)
    assert want_steps[0][1] > 0
    start = adapter_weights(adapter)
    moved = max((want[k.replace(".weight", ".default.weight")] - v).abs().max().item() for k, v in start.items())
    assert moved > 1e-4  # the steps change the adapters
    for layout, world in TRAIN_CASES[name]:
        out = tmp_path / f"saved-{len(list(tmp_path.iterdir()))}"
        if world == 1:
            got_steps = [helpers.train_lora(str(path), str(adapter), batch, TRAIN_STEPS, layout, TRAIN_LR, str(out))]
        else:
            got_steps = megadsl.launch_local(world, helpers.train_lora, str(path), str(adapter), batch, TRAIN_STEPS,
                                             layout, TRAIN_LR, str(out), timeout=600)
        for rank, steps in enumerate(got_steps):
            for (loss, norm), (want_loss, want_norm) in zip(steps, want_steps):
                assert abs(loss - want_loss) < 1e-5, (layout, rank, loss, want_loss)
                assert abs(norm - want_norm) < 1e-5 * max(1.0, want_norm), (layout, rank, norm, want_norm)
        saved = adapter_weights(out)
        assert set(saved) == set(start), layout
        for k, v in saved.items():
            diff = (v - want[k.replace(".weight", ".default.weight")]).abs().max().item()
            assert diff < 1e-5, (layout, k, diff)
    # The last save loads in PEFT and gives the PEFT-trained model's log-probs.
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    reloaded = PeftModel.from_pretrained(base, out).eval()
    with torch.no_grad():
        logits = reloaded(input_ids=ids, attention_mask=mask).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    valid = helpers.lp_valid(mask)[:, :-1]
    assert helpers.max_diff(lp, want_lp[:, :-1], valid) < 1e-5



@pytest.mark.parametrize("name, layout, world", [("qwen3-tf5", dict(), 1), ("qwen3-tf5", dict(tp=2, sp=True), 2),
                                                  ("deepseek-v3-tf5", dict(tp=2, sp=True), 2)])
def test_the_adapters_gradients_equal_pefts(adapters, name, layout, world):
    """Each rank's adapter gradients after one backward (finalize_grads: the tp sums of a split base's
    whole matrix, dp) equal PEFT's within 1e-5: a matrix whole here against PEFT's whole, a piece
    against its rows of B (or columns of A) at its global offset."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    path, adapter, *_ = adapters[name]
    batch = training_batch(path)
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), adapter,
                                     is_trainable=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    logits = peft(input_ids=ids, attention_mask=mask).logits.float()
    lp = torch.nn.functional.pad(torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0], (0, 1))
    (-(batch["advantages"] * lp * batch["loss_mask"]).sum() / batch["loss_mask"].sum()).backward()
    want = {n.replace("base_model.model.", "").replace(".default", ""): p.grad for n, p in peft.named_parameters()
            if p.requires_grad}
    runs = ([helpers.lora_gradients(str(path), str(adapter), batch, layout)] if world == 1 else
            megadsl.launch_local(world, helpers.lora_gradients, str(path), str(adapter), batch, layout, timeout=600))
    for rank, grads in enumerate(runs):
        covered = set()
        for key, g in grads.items():
            tensor, _, offset = key.partition("@")
            full = want[tensor]
            if offset:
                dim = 0 if ".lora_B." in tensor else 1
                full = full.narrow(dim, int(offset), g.shape[dim])
            assert full.shape == g.shape, (key, full.shape, g.shape)
            assert (g - full).abs().max().item() < 1e-5, (layout, rank, key)
            covered.add(tensor)
        assert covered == set(want), set(want) - covered
        assert max(g.abs().max().item() for g in grads.values()) > 1e-4


def test_the_base_stays_as_loaded_and_the_adapters_can_be_switched_off(adapters):
    """Training with adapters leaves every base tensor as loaded, a router's expert bias included
    (DeepSeek-V3's, which full training balances after each step); lora_enabled=False gives the
    base's log-probs (verl's disable_adapter), True the adapted ones again. A critic is refused."""
    path, adapter, want, ids, mask = adapters["deepseek-v3-tf5"]
    model = megadsl.Model.from_hf(path, lora_adapter=adapter)
    base = {k: v.detach().clone() for k, v in model.parameters().items()}
    assert any("expert_bias" in k or "correction_bias" in k for k in base), sorted(base)[:20]
    trainer = model.trainer(lr=1e-3)
    for _ in range(2):
        trainer.step(training_batch(path), microbatches=2, loss_fn=helpers.advantage_loss)
    assert all(torch.equal(v, base[k]) for k, v in model.parameters().items())
    plain = megadsl.Model.from_hf(path)
    with torch.no_grad():
        model.lora_enabled = False
        off = model.forward(ids, mask)["log_probs"]
        model.lora_enabled = True
        on = model.forward(ids, mask)["log_probs"]
        assert torch.equal(off, plain.forward(ids, mask)["log_probs"])
    valid = helpers.lp_valid(mask)
    assert helpers.max_diff(on, off, valid) > 1e-3 and model.lora_enabled
    with pytest.raises(ValueError, match="LoRA on a critic .value model. is not supported yet"):
        megadsl.Model.from_hf(path, critic=True, lora_rank=4)


def test_fresh_adapters_start_at_the_base_and_train_alike_in_every_layout(fixtures, tmp_path):
    """lora_rank= (verl's keys): PEFT's initialisation (A within Kaiming's bound, B zero), so the first
    forward is the base's; drawn per module, so two steps give the same adapters at tp 2 x pp 2 as
    in one process. What save_lora writes loads in PEFT."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    path = fixtures / "qwen3-tf5"
    batch = training_batch(path)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    fresh = megadsl.Model.from_hf(path, lora_rank=8, lora_alpha=16)
    with torch.no_grad():
        assert torch.equal(fresh.forward(ids, mask)["log_probs"], megadsl.Model.from_hf(path).forward(ids, mask)["log_probs"])
    fresh.save_lora(tmp_path / "start")
    config = json.loads((tmp_path / "start" / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16 and config["target_modules"] == "all-linear"
    start = adapter_weights(tmp_path / "start")
    for k, v in start.items():
        if "lora_B" in k:
            assert torch.equal(v, torch.zeros_like(v)), k
        else:
            assert 0 < v.abs().max() <= 1 / v.shape[1] ** 0.5, k
    one = helpers.train_fresh_lora(str(path), batch, 2, {}, str(tmp_path / "one"))
    many = megadsl.launch_local(4, helpers.train_fresh_lora, str(path), batch, 2, dict(tp=2, pp=2), str(tmp_path / "many"),
                                timeout=600)
    for (loss, norm), (want_loss, want_norm) in zip(many[0], one):
        assert abs(loss - want_loss) < 1e-5 and abs(norm - want_norm) < 1e-5 * max(1, want_norm)
    a, b = adapter_weights(tmp_path / "one"), adapter_weights(tmp_path / "many")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert max(a[k].abs().max().item() for k in a if "lora_B" in k) > 1e-4  # B moved off zero
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, tmp_path / "one").eval()
    with torch.no_grad():
        logits = peft(input_ids=ids, attention_mask=mask).logits.float()
        ours = megadsl.Model.from_hf(path, lora_adapter=tmp_path / "one").forward(ids, mask)["log_probs"]
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    valid = helpers.lp_valid(mask)[:, :-1]
    assert helpers.max_diff(ours[:, :-1], lp, valid) < 1e-5


def test_fresh_adapters_on_a_mixtures_experts_train_alike_under_ep(fixtures, tmp_path):
    """lora_target_parameters: fresh adapters on every expert (PEFT's init of the stacked A and B)
    start at the base's log-probs bit for bit; 2 steps at ep 2 x tp 2 equal one process within 1e-5."""
    path = fixtures / "qwen3-moe-tf5"
    batch = training_batch(path)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    fresh = megadsl.Model.from_hf(path, lora_rank=8, lora_target_modules=None, lora_target_parameters=EXPERTS)
    with torch.no_grad():
        assert torch.equal(fresh.forward(ids, mask)["log_probs"], megadsl.Model.from_hf(path).forward(ids, mask)["log_probs"])
    assert fresh.lora_config["target_parameters"] == EXPERTS
    one = helpers.train_fresh_lora(str(path), batch, 2, {}, str(tmp_path / "one"), EXPERTS)
    many = megadsl.launch_local(4, helpers.train_fresh_lora, str(path), batch, 2, dict(ep=2, tp=2), str(tmp_path / "many"),
                                EXPERTS, timeout=600)
    for (loss, norm), (want_loss, want_norm) in zip(many[0], one):
        assert abs(loss - want_loss) < 1e-5 and abs(norm - want_norm) < 1e-5 * max(1, want_norm)
    a, b = adapter_weights(tmp_path / "one"), adapter_weights(tmp_path / "many")
    assert set(a) == set(b) and any(".experts.base_layer.lora_B" in k for k in a)
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    for which in ("experts.base_layer.lora_B", "experts.lora_B"):  # gate_up_proj's and down_proj's B moved off zero
        assert max(a[k].abs().max().item() for k in a if k.endswith(which + ".weight")) > 1e-4, which


def test_lora_dropout_trains_alike_in_every_layout(adapters, tmp_path):
    """lora_dropout (PEFT's, on each adapter's input in training steps): its masks come from the
    tokens, so 3 steps at tp 2 + sp + rmpad, tp 2 x pp 2 and cp 2 equal one process within 1e-5;
    the steps differ from dropout 0's, and a forward outside training is PEFT's eval forward."""
    path, adapter, want_lp, ids, mask = adapters["qwen3-tf5"]
    d = tmp_path / "dropout"
    d.mkdir()
    config = json.loads((adapter / "adapter_config.json").read_text())
    (d / "adapter_config.json").write_text(json.dumps({**config, "lora_dropout": 0.1}))
    (d / "adapter_model.safetensors").write_bytes((adapter / "adapter_model.safetensors").read_bytes())
    with torch.no_grad():  # no dropout outside a training step
        got = megadsl.Model.from_hf(path, lora_adapter=d).forward(ids, mask)["log_probs"][:, :-1]
    assert helpers.max_diff(got, want_lp, helpers.lp_valid(mask)[:, :-1]) < 1e-5
    batch = training_batch(path)
    one = helpers.train_lora(str(path), str(d), batch, TRAIN_STEPS, {}, TRAIN_LR, str(tmp_path / "one"))
    plain = helpers.train_lora(str(path), str(adapter), batch, TRAIN_STEPS, {}, TRAIN_LR, str(tmp_path / "plain"))
    assert abs(one[0][0] - plain[0][0]) > 1e-6  # the masks change the first step's loss
    want = adapter_weights(tmp_path / "one")
    for layout, world in [(dict(tp=2, sp=True, rmpad=True), 2), (dict(tp=2, pp=2), 4), (dict(cp=2, rmpad=True), 2)]:
        out = tmp_path / f"many-{world}-{len(layout)}"
        got = megadsl.launch_local(world, helpers.train_lora, str(path), str(d), batch, TRAIN_STEPS, layout, TRAIN_LR,
                                   str(out), timeout=600)
        for (loss, norm), (want_loss, want_norm) in zip(got[0], one):
            assert abs(loss - want_loss) < 1e-5 and abs(norm - want_norm) < 1e-5 * max(1, want_norm), layout
        saved = adapter_weights(out)
        assert max((saved[k] - want[k]).abs().max().item() for k in want) < 1e-5, layout
    # A mixture's shared expert runs on the real tokens alone (not the padded stream): DeepSeek-V3
    # with fresh adapters on every linear, dropout 0.1, at tp 2 + sp + rmpad against one process.
    ds = adapters["deepseek-v3-tf5"][0]
    batch = training_batch(ds)
    one = helpers.train_fresh_lora(str(ds), batch, 2, {}, str(tmp_path / "ds-one"), None, 0.1)
    plain = helpers.train_fresh_lora(str(ds), batch, 2, {}, str(tmp_path / "ds-plain"), None, 0.0)
    assert abs(one[0][1] - plain[0][1]) > 1e-6  # the masks change the first step's gradients
    many = megadsl.launch_local(2, helpers.train_fresh_lora, str(ds), batch, 2, dict(tp=2, sp=True, rmpad=True),
                                str(tmp_path / "ds-many"), None, 0.1, timeout=600)
    for (loss, norm), (want_loss, want_norm) in zip(many[0], one):
        assert abs(loss - want_loss) < 1e-5 and abs(norm - want_norm) < 1e-5 * max(1, want_norm)
    a, b = adapter_weights(tmp_path / "ds-one"), adapter_weights(tmp_path / "ds-many")
    assert any("shared_experts" in k for k in a) and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


@pytest.mark.parametrize("name, layout", [("qwen3-tf5", dict(tp=2, pp=2)), ("qwen3-moe-tf5", dict(ep=2, tp=2))])
def test_a_distributed_checkpoint_carries_the_adapters_and_their_adamw_state(adapters, tmp_path, name, layout):
    """save_distributed with the trainer keeps the adapters and their AdamW moments (lora/, whole):
    2 steps, saved at tp 2 x pp 2 (a mixture's, its experts' adapters at ep 2 x tp 2), resumed for a
    3rd step in the same layout, equal the 3 steps straight bit for bit; resumed at tp 1, within 1e-6
    of them. A model without adapters (and one with other settings) is refused the checkpoint."""
    path, adapter, *_ = adapters[name]
    batch = training_batch(path)
    ckpt = str(tmp_path / "ckpt")
    run = lambda world, layout, phase, out="": megadsl.launch_local(  # noqa: E731
        world, helpers.lora_steps_with_checkpoint, str(path), str(adapter), batch, layout, ckpt, phase, out, timeout=600)
    straight = run(4, layout, "straight", str(tmp_path / "straight"))[0]
    run(4, layout, "save")
    resumed = run(4, layout, "resume", str(tmp_path / "resumed"))[0]
    assert resumed[1] == 3 and resumed[0][0] == straight[0][2]
    a, b = adapter_weights(tmp_path / "straight"), adapter_weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    one = helpers.lora_steps_with_checkpoint(str(path), str(adapter), batch, {}, ckpt, "resume", str(tmp_path / "one"))
    assert abs(one[0][0] - straight[0][2]) < 1e-6
    c = adapter_weights(tmp_path / "one")
    assert max((a[k] - c[k]).abs().max().item() for k in a) < 1e-6
    with pytest.raises(megadsl.CheckpointError, match="holds LoRA adapters .lora/., and this model has none"):
        megadsl.Model.from_hf(path).load_distributed(ckpt)
    with pytest.raises(megadsl.CheckpointError, match="on other target_modules, target_parameters or rank than this model.s"):
        megadsl.Model.from_hf(path, lora_rank=8).load_distributed(ckpt)


def test_megadsl_run_applies_an_adapter(adapters, tmp_path):
    """`megadsl run --lora-adapter DIR` (the CLI, at tp 2 on 2 ranks) gives PEFT's log-probs."""
    import subprocess
    from pathlib import Path

    tool = Path(megadsl.__file__).resolve().parents[2] / "tools" / "megadsl"
    path, adapter, want, ids, mask = adapters["qwen3-tf5"]
    (tmp_path / "in.json").write_text(json.dumps({"input_ids": ids.tolist(), "attention_mask": mask.tolist()}))
    run = subprocess.run([str(tool), "run", str(path), "--input", str(tmp_path / "in.json"), "--output",
                          str(tmp_path / "out.json"), "--lora-adapter", str(adapter), "--tp", "2", "--ranks", "2"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    got = torch.tensor(json.loads((tmp_path / "out.json").read_text())["log_probs"])
    valid = helpers.lp_valid(mask)[:, :-1]
    assert helpers.max_diff(got[:, :-1], want, valid) < 1e-5
