"""The engine as verl's code meets it, in one process: what it answers before initialize() (verl's
TrainingWorker asks for the dp rank first), one line naming the call, the key or the field for a
wrong order, a config key of another engine, an unsupported option or a batch without what the loss
reads; McoreOptimizerConfig trained as verl's Megatron engine would (Megatron's decay rule and
verl's get_megatron_optimizer_param_scheduler); checkpoint.save_contents / load_contents."""

from contextlib import nullcontext
from functools import partial

import pytest
import torch

import megadsl
import megadsl.verl
import verl_engine_ranks as ranks
from verl.utils import tensordict_utils as tu
from verl.trainer.config import CheckpointConfig
from verl.workers.config import FSDPOptimizerConfig, HFModelConfig, McoreOptimizerConfig
from verl.workers.engine.base import EngineRegistry
from verl.workers.utils.losses import ppo_loss


def engine(path, critic=False, optim=None, checkpoint=None, **config):
    return EngineRegistry.new(model_type="value_model" if critic else "language_model", backend="megadsl",
                              model_config=HFModelConfig(path=str(path), use_remove_padding=True, load_tokenizer=False),
                              engine_config=megadsl.verl.MegadslEngineConfig(**config),
                              optimizer_config=optim or FSDPOptimizerConfig(lr=1e-4),
                              checkpoint_config=checkpoint)


@pytest.fixture(scope="module")
def qwen3(fixtures):
    return fixtures / "qwen3-tf5"


def test_verl_asks_for_the_layout_before_initialize(qwen3):
    e = engine(qwen3)
    assert e.model is None  # nothing loaded yet
    assert (e.get_data_parallel_rank(), e.get_data_parallel_size(), e.get_data_parallel_group()) == (0, 1, None)
    assert e.is_mp_src_rank_with_outputs()


@pytest.mark.parametrize("call", ["train_batch", "infer_batch", "lr_scheduler_step", "to", "save_checkpoint"])
def test_a_call_before_initialize_names_it(qwen3, call):
    e = engine(qwen3)
    args = {"train_batch": (ranks.make_batch(0, 300), partial(ppo_loss, config=ranks.actor_config())),
            "infer_batch": (ranks.make_batch(0, 300),), "lr_scheduler_step": (), "to": ("cpu",),
            "save_checkpoint": ("/nonexistent",)}[call]
    with pytest.raises(RuntimeError, match=r"^megadsl.verl: call engine.initialize\(\) first") as info:
        getattr(e, call)(*args)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("config, match", [
    (dict(optim=FSDPOptimizerConfig(lr=1e-4, optimizer_impl="torchao.optim", optimizer="_AdamW")),
     "optimizer '_AdamW' is not supported"),
    (dict(full_determinism=True, tensor_model_parallel_size=3), "heads_divisible_by_tp"),
    (dict(dtype="float16"), "dtype 'float16' is not one of"),
    (dict(router_replay={"mode": "R2"}), "router_replay.mode R2 needs a mixture of experts"),
    (dict(checkpoint=CheckpointConfig(save_contents=["optimizer"])), "names optimizer without model"),
    (dict(tensor_model_parallel_size=3), "heads_divisible_by_tp"),
    (dict(head_chunk_tokens=-2), "head_chunk_tokens -2 is a chunk of tokens > 0"),
    (dict(context_parallel_size=4, cp_comm_type="a2a+p2p", hierarchical_context_parallel_sizes=[2, 3]),
     r"needs hierarchical_context_parallel_sizes \[a2a, p2p\] whose product is context_parallel_size 4; got \[2, 3\]"),
    (dict(context_parallel_size=4, cp_comm_type="p2p", hierarchical_context_parallel_sizes=[2, 2]),
     r"is for cp_comm_type a2a\+p2p, and cp_comm_type is p2p"),
    (dict(cp_comm_type="ulysses"), r"cp_comm_type 'ulysses' is"),
])
def test_an_unsupported_option_is_one_line(qwen3, config, match):
    from verl.workers.config import EngineRouterReplayConfig

    if "router_replay" in config:
        config["router_replay"] = EngineRouterReplayConfig(**config["router_replay"])
    with pytest.raises((ValueError, TypeError), match=match) as info:
        e = engine(qwen3, **config)
        e.initialize()
    assert "\n" not in str(info.value), str(info.value)


def test_megatrons_hierarchical_cp_keys_give_the_a2a_ring_layout(qwen3):
    """Megatron's cp_comm_type a2a+p2p with hierarchical_context_parallel_sizes [a2a, p2p]: all-to-all
    groups of the first size, rings of the second (Layout cp_comm "a2a+ring", cp_a2a)."""
    # One process cannot hold cp 4: the refusal names the layout the keys gave.
    with pytest.raises(ValueError, match=r'cp=4, cp_comm="a2a\+ring", cp_a2a=2\) on 1 ranks: world_fits_layout'):
        engine(qwen3, context_parallel_size=4, cp_comm_type="a2a+p2p", hierarchical_context_parallel_sizes=[2, 2])


def lora_engine(path, checkpoint=None, **model):
    return EngineRegistry.new(model_type="language_model", backend="megadsl",
                              model_config=HFModelConfig(path=str(path), load_tokenizer=False, **model),
                              engine_config=megadsl.verl.MegadslEngineConfig(use_dynamic_bsz=False,
                                                                             micro_batch_size_per_gpu=ranks.MICRO),
                              optimizer_config=FSDPOptimizerConfig(lr=1e-3),
                              checkpoint_config=checkpoint or CheckpointConfig(save_contents=["model", "extra"],
                                                                                 load_contents=["model", "extra"]))


def test_verls_lora_keys_train_the_adapters_and_sync_them(qwen3, tmp_path):
    """model.lora_rank / lora_alpha / target_modules (verl's FSDP keys): fresh adapters train, the base
    stays as loaded; get_per_tensor_param ships, as verl's FSDP engine does, the base under vLLM's
    base_layer names, then the adapters alone under PEFT's names with their LoraConfig, or (lora.merge)
    the merged weights; save_checkpoint keeps the adapters and AdamW's state of them (load_checkpoint
    continues from it), the adapter in PEFT's format (a new engine starts from it: lora_adapter_path)."""
    full = CheckpointConfig(save_contents=["model", "optimizer", "extra"], load_contents=["model", "optimizer", "extra"])
    e = lora_engine(qwen3, checkpoint=full, lora_rank=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"])
    e.initialize()
    base = {k: v.detach().clone() for k, v in e.model.parameters().items()}
    with e.train_mode():
        trained = e.train_batch(ranks.make_batch(0, e.model.vocab), loss_function=partial(ppo_loss, config=ranks.actor_config()))
    assert sum(trained["loss"]) != 0 and trained["metrics"]["grad_norm"] > 0
    assert all(torch.equal(v, base[k]) for k, v in e.model.parameters().items())  # frozen
    # verl's order (engine_workers.update_weights): the adapters asked for and held, the base asked
    # for and sent first (the first sync), then the adapters sent.
    adapters, config = e.get_per_tensor_param(base_sync_done=True)
    first, base_config = e.get_per_tensor_param(base_sync_done=False)
    first = dict(first)
    adapters = dict(adapters)
    assert config["r"] == 8 and config["lora_alpha"] == 16 and sorted(config["target_modules"]) == ["down_proj", "q_proj", "v_proj"]
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in adapters
    assert len(adapters) == 2 * 3 * 4  # A and B of 3 modules in 4 layers
    assert max(t.abs().max().item() for n, t in adapters.items() if "lora_B" in n) > 0  # B left zero
    assert "model.layers.0.self_attn.q_proj.base_layer.weight" in first and "model.layers.0.self_attn.q_proj.weight" not in first
    assert "model.embed_tokens.weight" in first and base_config["r"] == 8
    e.save_checkpoint(str(tmp_path / "step1"), global_step=1)
    saved = tmp_path / "step1" / "megadsl" / "lora"
    assert (saved / "adapter_config.json").is_file() and (saved / "adapter_model.safetensors").is_file()
    resumed = lora_engine(qwen3, checkpoint=full, lora_rank=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"])
    resumed.initialize()
    resumed.load_checkpoint(str(tmp_path / "step1"))
    assert all(torch.equal(t, adapters[n]) for n, t in resumed.model.export_lora())
    resumed.model.close()
    again = lora_engine(qwen3, lora_rank=8, lora_adapter_path=str(saved))
    again.initialize()
    with torch.no_grad():
        assert all(torch.equal(t, adapters[n]) for n, t in again.model.export_lora())
    merged = lora_engine(qwen3, lora_adapter_path=str(saved), lora_rank=8, lora={"merge": True})
    merged.initialize()
    weights, config = merged.get_per_tensor_param()
    weights = dict(weights)
    assert config is None and "model.layers.0.self_attn.q_proj.weight" in weights
    q = "model.layers.0.self_attn.q_proj"
    a, b = adapters[f"base_model.model.{q}.lora_A.weight"], adapters[f"base_model.model.{q}.lora_B.weight"]
    expect = first[q + ".base_layer.weight"].float() + 2.0 * b @ a  # scaling alpha / r = 16 / 8
    assert (weights[q + ".weight"].float() - expect).abs().max() < 2e-2  # both in bf16 (export_dtype)
    assert not torch.equal(weights[q + ".weight"], first[q + ".base_layer.weight"])
    for x in (e, again, merged):
        x.model.close()


def test_verls_target_parameters_adapt_a_mixtures_experts(fixtures):
    """model.target_parameters (verl's FSDP key, PEFT's ParamWrapper on transformers' fused experts):
    every expert's adapter trains beside its expert and ships stacked under PEFT's names, the
    gate_up_proj adapter nested under down_proj's (".base_layer"), with the LoraConfig naming them."""
    moe = fixtures / "qwen3-moe-tf5"
    experts = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    e = lora_engine(moe, lora_rank=4, lora_alpha=8, target_modules=["q_proj"], target_parameters=experts)
    e.initialize()
    before = dict(e.get_per_tensor_param(base_sync_done=True)[0])
    with e.train_mode():
        trained = e.train_batch(ranks.make_batch(0, e.model.vocab), loss_function=partial(ppo_loss, config=ranks.actor_config()))
    assert trained["metrics"]["grad_norm"] > 0
    adapters, config = e.get_per_tensor_param(base_sync_done=True)
    adapters = dict(adapters)
    assert config["target_parameters"] == experts
    stem = "base_model.model.model.layers.0.mlp.experts"
    # 4 experts of ffn 48 over hidden 64, r 4: A (r E, in), B (out, r E).
    assert adapters[f"{stem}.base_layer.lora_A.weight"].shape == (16, 64)  # gate_up_proj
    assert adapters[f"{stem}.base_layer.lora_B.weight"].shape == (96, 16)
    assert adapters[f"{stem}.lora_A.weight"].shape == (16, 48)  # down_proj
    assert adapters[f"{stem}.lora_B.weight"].shape == (64, 16)
    assert not torch.equal(adapters[f"{stem}.lora_B.weight"], before[f"{stem}.lora_B.weight"])  # trained
    e.model.close()


def test_disable_adapter_gives_the_base_policy(qwen3):
    """verl takes the reference log-probs from a LoRA actor under engine.disable_adapter()
    (no_lora_adapter): the base model's, bit for bit; outside it, the adapted policy's."""
    e = lora_engine(qwen3, lora_rank=8, lora_alpha=16)
    e.initialize()
    loss = partial(ppo_loss, config=ranks.actor_config())
    with e.train_mode():
        e.train_batch(ranks.make_batch(0, e.model.vocab), loss_function=loss)  # B off zero
    plain = engine(qwen3)
    plain.initialize()
    out = {}
    for name, eng, off in (("ref", e, True), ("actor", e, False), ("base", plain, False)):
        with eng.eval_mode():
            with eng.disable_adapter() if off else nullcontext():
                out[name] = eng.infer_batch(ranks.make_batch(0, e.model.vocab))["model_output"]["log_probs"].values()
    assert torch.equal(out["ref"], out["base"]) and not torch.equal(out["actor"], out["base"])
    assert e.model.lora_enabled
    with pytest.raises(ValueError, match="LoRA on a critic"):
        EngineRegistry.new(model_type="value_model", backend="megadsl",
                           model_config=HFModelConfig(path=str(qwen3), load_tokenizer=False, lora_rank=8),
                           engine_config=megadsl.verl.MegadslEngineConfig(), optimizer_config=FSDPOptimizerConfig(lr=1e-4),
                           checkpoint_config=None).initialize()
    for x in (e, plain):
        x.model.close()


def test_megatrons_lora_keys_map_to_the_hf_modules(qwen3):
    e = lora_engine(qwen3, lora={"rank": 4, "alpha": 8, "type": "canonical_lora", "lora_A_init_method": "kaiming",
                                 "target_modules": ["linear_q", "linear_v", "linear_proj", "linear_fc2"]})
    e.initialize()
    assert sorted(e.model.lora_config["target_modules"]) == ["down_proj", "o_proj", "q_proj", "v_proj"]
    assert e.model.lora_config["r"] == 4
    e.model.close()
    # lora.dropout: PEFT's lora_dropout on the adapters' inputs in training
    e = lora_engine(qwen3, lora={"rank": 4, "dropout": 0.1, "type": "canonical_lora", "lora_A_init_method": "kaiming",
                                 "target_modules": ["linear_q"]})
    e.initialize()
    assert e.model.lora_config["lora_dropout"] == 0.1
    e.model.close()


@pytest.mark.parametrize("model, match", [
    (dict(lora={"rank": 8, "type": "dora"}), r"model.lora.type: 'dora' is not supported"),
    (dict(lora={"rank": 8, "lora_A_init_method": "kaiming"}), r"names linear_qkv, Megatron's fused LoRA"),
    (dict(lora={"rank": 8, "target_modules": ["linear_q"]}), r"model.lora.lora_A_init_method: 'xavier'"),
    (dict(lora_rank=8, exclude_modules="o_proj"), r"model.exclude_modules"),
    (dict(lora_rank=8, target_modules=".*proj"), r"\"all-linear\" or a list of module names"),
])
def test_lora_keys_megadsl_cannot_honour_are_refused(qwen3, model, match):
    with pytest.raises(ValueError, match=match) as info:
        lora_engine(qwen3, **model)
    assert "\n" not in str(info.value)


def test_another_engines_keys_name_the_key_and_the_group():
    """The README's first attempt: verl's fsdp engine group with only _target_ and strategy replaced."""
    from hydra import compose, initialize_config_module
    from verl.utils.config import omega_conf_to_dataclass

    with initialize_config_module("verl.trainer.config", version_base=None):
        cfg = compose("sft_trainer_engine", overrides=["engine._target_=megadsl.verl.MegadslEngineConfig",
                                                       "engine.strategy=megadsl"])
    with pytest.raises(Exception) as info:
        omega_conf_to_dataclass(cfg.engine)
    assert "engine config key 'entropy_checkpointing' is not one of megadsl's" in str(info.value)
    assert "engine=megadsl" in str(info.value)


def test_the_config_groups_reach_verls_trainers():
    from hydra import compose, initialize_config_module
    from verl.utils.config import omega_conf_to_dataclass

    with initialize_config_module("verl.trainer.config", version_base=None):
        sft = compose("sft_trainer_engine", overrides=["engine=megadsl", "engine.tensor_model_parallel_size=2"])
        ppo = compose("ppo_trainer", overrides=["model_engine=megadsl",
                                                "actor_rollout_ref.actor.megadsl.pipeline_model_parallel_size=2"])
    assert omega_conf_to_dataclass(sft.engine).tensor_model_parallel_size == 2
    assert ppo.actor_rollout_ref.actor.strategy == ppo.actor_rollout_ref.ref.strategy == ppo.critic.strategy == "megadsl"
    ref = ppo.actor_rollout_ref.ref.megadsl
    assert ref.forward_only and ref.pipeline_model_parallel_size == 2  # the reference follows the actor's layout


@pytest.mark.parametrize("field, match", [
    ("loss_mask", "field 'loss_mask' is missing"),
    ("advantages", "field 'advantages' is missing: verl's ppo_loss reads it"),
    ("temperature", "temperature has 3 values for 8 rows"),
    ("responses", "row 0: prompt .* tokens are not its"),
    ("short advantages", "field 'advantages' is 8 wide, shorter than the longest response"),
    ("long advantages", "field 'advantages' is 10 wide, the batch's responses are padded to 9"),
])
def test_a_batch_without_what_the_loss_reads_names_the_field(qwen3, field, match):
    e = engine(qwen3)
    e.initialize()
    data = ranks.make_batch(0, e.model.vocab)
    if field == "temperature":
        tu.assign_non_tensor(data, temperature=torch.ones(3))
    elif field in ("short advantages", "long advantages"):
        a = data["advantages"]
        data["advantages"] = a[:, :-1] if field.startswith("short") else torch.cat([a, a[:, :1]], 1)
    elif field == "responses":
        data["responses"] = torch.nested.as_nested_tensor([r[:-1] if len(r) > 1 else r for r in data["responses"].unbind()],
                                                          layout=torch.jagged)
    else:
        data.pop(field)
    with pytest.raises(ValueError, match=match) as info:
        with e.train_mode():
            e.train_batch(data, loss_function=partial(ppo_loss, config=ranks.actor_config()))
    assert "\n" not in str(info.value)
    e.model.close()


def test_megatron_optimizer_config_trains_as_verls_megatron_engine(qwen3):
    """McoreOptimizerConfig: AdamW with Megatron's decay rule (matrices only) and verl's Megatron
    scheduler (get_megatron_optimizer_param_scheduler over megatron-core's OptimizerParamScheduler,
    stepped once per lr_scheduler_step): the same losses, grad norms, rates and weights as a single
    process running them on transformers."""
    from transformers import AutoModelForCausalLM
    from verl.utils.megatron.optimizer import get_megatron_optimizer_param_scheduler

    oc = McoreOptimizerConfig(lr=1e-3, min_lr=1e-4, lr_warmup_init=1e-5, lr_warmup_steps=1, lr_decay_style="cosine",
                              total_training_steps=ranks.STEPS, weight_decay=0.1, clip_grad=1.0,
                              override_optimizer_config={"eps": ranks.EPS})
    e = engine(qwen3, optim=oc, use_dynamic_bsz=False, micro_batch_size_per_gpu=ranks.MICRO, export_dtype="fp32")
    e.initialize()
    model = AutoModelForCausalLM.from_pretrained(str(qwen3), dtype=torch.float32)
    params = [p for p in model.parameters()]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "wd_mult": 1.0},
                             {"params": [p for p in params if p.dim() < 2], "wd_mult": 0.0}],
                            lr=oc.lr, betas=(0.9, 0.999), eps=ranks.EPS, weight_decay=oc.weight_decay)
    sched = get_megatron_optimizer_param_scheduler(opt, oc)  # sets each group's lr and weight_decay
    loss_fn = partial(ppo_loss, config=ranks.actor_config())
    for step in range(ranks.STEPS):
        data = ranks.make_batch(step, e.model.vocab)
        lr_before = opt.param_groups[0]["lr"]
        with e.train_mode():
            out = e.train_batch(data.clone(), loss_function=loss_fn)
            lr = e.lr_scheduler_step()
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(data["loss_mask"].sum()))
        opt.zero_grad()
        loss, _ = loss_fn(model_output=ranks.reference_output(model, data, False), data=data)
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
        assert abs(e.trainer.lr - lr) < 1e-15 and abs(out["metrics"]["grad_norm"] - norm) < 1e-5 * max(1, norm)
        assert abs(sum(out["loss"]) - loss.item()) < 1e-5
        opt.step()
        sched.step(1)
        assert abs(opt.param_groups[0]["lr"] - lr) < 1e-12, (step, lr, opt.param_groups[0]["lr"], lr_before)
    assert opt.param_groups[1]["weight_decay"] == 0.0 and opt.param_groups[0]["weight_decay"] == oc.weight_decay
    mine = dict(e.get_per_tensor_param()[0])
    for name, w in model.state_dict().items():
        assert (mine[name] - w).abs().max().item() < 1e-5, name
    e.model.close()


def test_checkpoint_contents_are_honoured(qwen3, tmp_path):
    """save_contents [model] writes no optimizer state; loading it with the default load_contents
    (model, optimizer, extra) names what is missing; load_contents [model] loads the weights alone."""
    data = ranks.make_batch(0, 300)
    loss_fn = partial(ppo_loss, config=ranks.actor_config())
    saver = engine(qwen3, checkpoint=CheckpointConfig(save_contents=["model"]), use_dynamic_bsz=False,
                   micro_batch_size_per_gpu=ranks.MICRO)
    saver.initialize()
    with saver.train_mode():
        saver.train_batch(data.clone(), loss_function=loss_fn)
    saver.save_checkpoint(str(tmp_path / "ckpt"), global_step=1)
    saved = dict(saver.get_per_tensor_param()[0])
    saver.model.close()
    full = engine(qwen3, checkpoint=CheckpointConfig())
    full.initialize()
    with pytest.raises(ValueError, match="load_contents names optimizer, which .* does not hold"):
        full.load_checkpoint(str(tmp_path / "ckpt"))
    full.model.close()
    weights_only = engine(qwen3, checkpoint=CheckpointConfig(save_contents=["model", "optimizer", "extra"],
                                                             load_contents=["model"]))
    weights_only.initialize()
    weights_only.load_checkpoint(str(tmp_path / "ckpt"))
    for name, w in weights_only.get_per_tensor_param()[0]:
        assert torch.equal(w, saved[name]), name
    assert weights_only.trainer.optimizer_bytes == 0  # a fresh AdamW: nothing loaded into it
    weights_only.model.close()


def _with_override(path, override, critic=False):
    return EngineRegistry.new(model_type="value_model" if critic else "language_model", backend="megadsl",
                              model_config=HFModelConfig(path=str(path), load_tokenizer=False, override_config=override),
                              engine_config=megadsl.verl.MegadslEngineConfig(
                                  use_dynamic_bsz=False, micro_batch_size_per_gpu=ranks.MICRO),
                              optimizer_config=FSDPOptimizerConfig(lr=1e-4))


def test_override_config_sets_dropout_and_refuses_what_megadsl_cannot_honour(fixtures):
    """verl applies model.override_config to the HF config before its engines build the model:
    the family's dropout keys reach megadsl's model (trained with them, as transformers' train mode
    and verl's Megatron engine do), keys that change nothing pass, others are refused in one line."""
    seed = fixtures / "seed-oss-tf5"  # config.json states both dropouts 0.0
    e = _with_override(seed, {"attention_dropout": 0.1, "attn_implementation": "eager", "pad_token_id": 0})
    e.initialize()
    assert e.model.dropout == {"attention": 0.1, "residual": 0.0, "embedding": 0.0}
    e = _with_override(seed, {"model_config": {"residual_dropout": 0.2}})  # verl's Megatron-style override
    e.initialize()
    assert e.model.dropout == {"attention": 0.0, "residual": 0.2, "embedding": 0.0}
    assert _with_override(seed, {}).dropout is None  # config.json's rates
    with pytest.raises(ValueError, match=r"override_config.rope_theta is not supported: megadsl reads the model from "):
        _with_override(seed, {"rope_theta": 1e6})
    with pytest.raises(ValueError, match=r"\"hidden_dropout\" is not a dropout key of Seed-OSS \(seed_oss\); its are "
                                         r"attention_dropout, residual_dropout"):
        _with_override(seed, {"hidden_dropout": 0.1}).initialize()
    with pytest.raises(ValueError, match=r"attention_dropout = 1(\.0)? is not a dropout probability"):
        _with_override(seed, {"attention_dropout": 1.0}).initialize()


def test_dropout_applies_in_train_batch_only(fixtures):
    """infer_batch (log-probs) runs without dropout, equal bit for bit; a training step with it."""
    seed = fixtures / "seed-oss-tf5"
    on, off = _with_override(seed, {"attention_dropout": 0.3, "residual_dropout": 0.3}), _with_override(seed, {})
    on.initialize()
    off.initialize()
    loss = partial(ppo_loss, config=ranks.actor_config())
    out = {}
    for name, e in (("on", on), ("off", off)):
        with e.eval_mode():
            inferred = e.infer_batch(ranks.make_batch(0, e.model.vocab), loss_function=None)
        with e.train_mode():
            trained = e.train_batch(ranks.make_batch(0, e.model.vocab), loss_function=loss)
        out[name] = (inferred["model_output"]["log_probs"].values(), sum(trained["loss"]))
    assert torch.equal(out["on"][0], out["off"][0])
    assert abs(out["on"][1] - out["off"][1]) > 1e-6


def test_head_chunk_tokens_reaches_the_training_step(qwen3):
    """The engine key head_chunk_tokens: the LM head of train_batch in chunks of 4 tokens, forward
    and backward, gives the whole head's loss and metrics."""
    loss = partial(ppo_loss, config=ranks.actor_config())
    out = {}
    for chunk in (-1, 4):
        e = engine(qwen3, head_chunk_tokens=chunk, use_dynamic_bsz=False, micro_batch_size_per_gpu=ranks.MICRO)
        e.initialize()
        with e.train_mode():
            trained = e.train_batch(ranks.make_batch(0, e.model.vocab), loss_function=loss)
        out[chunk] = (sum(trained["loss"]), trained["metrics"]["actor/pg_loss"].values + trained["metrics"]["actor/ppo_kl"].values)
        e.model.close()
    assert abs(out[4][0] - out[-1][0]) < 1e-6
    assert len(out[4][1]) == len(out[-1][1]) > 0
    assert all(abs(a - b) < 1e-6 for a, b in zip(out[4][1], out[-1][1]))


@pytest.mark.parametrize("setting", [{}, {"invariant": True}, {"full_determinism": True}])
def test_the_first_ratio_is_exactly_one_whatever_the_micro_batches(fixtures, setting):
    """verl#6280 on gpt-oss (a mixture with sinks): the old log-probs from compute_log_prob's micro-batches (8 rows), the
    update one row at a time: on policy, the first step's ratio is exactly 1 (ppo_kl 0, nothing
    clipped) with megadsl's invariant arithmetic (the engine's `invariant`, or verl's
    full_determinism); without it the two passes differ in the last bits."""
    from verl.workers.utils.padding import no_padding_2_padding

    e = engine(fixtures / "gpt-oss-tf5", **setting)
    e.initialize()
    assert e.model.layout.invariant == bool(setting)
    data = ranks.make_batch(0, e.model.vocab, response_lengths=(40, 120))
    tu.assign_non_tensor(data, micro_batch_size_per_gpu=8)
    with e.eval_mode():
        log_probs = e.infer_batch(data, loss_function=None)["model_output"]["log_probs"]
    data = ranks.make_batch(0, e.model.vocab, response_lengths=(40, 120))
    data["old_log_probs"] = no_padding_2_padding(log_probs, data) * data["response_mask"]
    tu.assign_non_tensor(data, micro_batch_size_per_gpu=1)
    with e.train_mode():
        out = e.train_batch(data, loss_function=partial(ppo_loss, config=ranks.actor_config()))
    kl = out["metrics"]["actor/ppo_kl"].values  # verl's Metric: one value per micro-batch
    assert len(kl) == 8  # micro-batches of 1 row
    if setting:
        assert all(k == 0.0 for k in kl), kl
        assert all(c == 0.0 for c in out["metrics"]["actor/pg_clipfrac"].values)
    else:
        assert any(k != 0.0 for k in kl), kl  # the mismatch verl#6280 reports, here in fp32
    e.model.close()


def test_enable_activation_offload_trains_as_full_recompute_and_needs_it(qwen3):
    """verl's model.enable_activation_offload: with the engine's recompute full, train_batch gives
    the bits it gives without offload; with another recompute it is one line naming both keys."""
    loss = partial(ppo_loss, config=ranks.actor_config())
    out = {}
    for offload in (False, True):
        e = EngineRegistry.new(
            model_type="language_model", backend="megadsl",
            model_config=HFModelConfig(path=str(qwen3), use_remove_padding=True, load_tokenizer=False,
                                       enable_activation_offload=offload),
            engine_config=megadsl.verl.MegadslEngineConfig(recompute="full", use_dynamic_bsz=False,
                                                           micro_batch_size_per_gpu=ranks.MICRO),
            optimizer_config=FSDPOptimizerConfig(lr=1e-4), checkpoint_config=None)
        e.initialize()
        assert e.model.offload_activations == offload
        before = megadsl.activation_offload_bytes()
        with e.train_mode():
            trained = e.train_batch(ranks.make_batch(0, e.model.vocab), loss_function=loss)
        assert (megadsl.activation_offload_bytes() > before) == offload
        with e.eval_mode():
            inferred = e.infer_batch(ranks.make_batch(1, e.model.vocab), loss_function=None)
        out[offload] = (sum(trained["loss"]), inferred["model_output"]["log_probs"].values())
        e.model.close()
    assert out[True][0] == out[False][0]
    assert torch.equal(out[True][1], out[False][1])
    with pytest.raises(ValueError, match="enable_activation_offload .*recompute is none") as info:
        EngineRegistry.new(model_type="language_model", backend="megadsl",
                           model_config=HFModelConfig(path=str(qwen3), load_tokenizer=False,
                                                      enable_activation_offload=True),
                           engine_config=megadsl.verl.MegadslEngineConfig(),
                           optimizer_config=FSDPOptimizerConfig(lr=1e-4), checkpoint_config=None)
    assert "\n" not in str(info.value)
