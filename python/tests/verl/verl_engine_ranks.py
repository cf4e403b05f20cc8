"""The verl-engine test's batches, its single-process reference (transformers + verl's own loss
functions + torch's AdamW + verl's LR schedule) and the work of each rank, which runs megadsl
behind verl's EngineRegistry as a verl worker would (torch.distributed first, then the engine)."""

import io
import os
import traceback
from functools import partial

import torch

STEPS = 3
ROWS = 8            # the global mini-batch; each of the 2 dp ranks gets 4
MICRO = 2           # micro_batch_size_per_gpu
TEMPERATURE = 0.9
EPS = 1e-6
LR = 1e-4            # each weight moves ~3e-4 over the 3 steps, 30x the tolerance


def actor_config():
    from verl.workers.config import ActorConfig

    return ActorConfig(strategy="megadsl", ppo_mini_batch_size=ROWS, ppo_micro_batch_size_per_gpu=MICRO, rollout_n=1,
                       clip_ratio=0.2, entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1,
                       kl_loss_type="low_var_kl", loss_agg_mode="token-mean")


def critic_config():
    from verl.workers.config import CriticConfig

    return CriticConfig(strategy="megadsl", ppo_mini_batch_size=ROWS, ppo_micro_batch_size_per_gpu=MICRO, rollout_n=1,
                        cliprange_value=0.5, loss_agg_mode="token-mean")


def optimizer_config():
    from verl.workers.config import FSDPOptimizerConfig

    # Adam's eps 1e-6 (verl's override_optimizer_config): with 1e-8 an element whose gradient is
    # near zero turns fp32 summation-order noise into update differences near the tolerance.
    return FSDPOptimizerConfig(lr=LR, lr_scheduler_type="cosine", total_training_steps=STEPS, lr_warmup_steps=1,
                               min_lr_ratio=0.1, weight_decay=0.01, clip_grad=1.0,
                               override_optimizer_config={"eps": EPS})


def make_batch(step, vocab, response_lengths=(2, 10)):
    """verl's no-padding batch of ROWS sequences (prompt + response of varied lengths: responses
    of response_lengths[0] to response_lengths[1] - 1 tokens)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.dataset_utils import DatasetPadMode

    g = torch.Generator().manual_seed(100 + step)
    prompts = [torch.randint(3, vocab, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g) for _ in range(ROWS)]
    responses = [torch.randint(3, vocab, (int(torch.randint(*response_lengths, (1,), generator=g)),), generator=g)
                 for _ in range(ROWS)]
    longest = max(len(r) for r in responses)
    mask = torch.zeros(ROWS, longest)
    for i, r in enumerate(responses):
        mask[i, : len(r)] = 1
    mask[1, 0] = 0  # a response token the loss skips
    seqs = [torch.cat([p, r]) for p, r in zip(prompts, responses)]
    nested = lambda ts: torch.nested.as_nested_tensor(ts, layout=torch.jagged)  # noqa: E731
    data = TensorDict({
        "input_ids": nested(seqs),
        "position_ids": nested([torch.arange(len(s)) for s in seqs]),
        "prompts": nested(prompts),
        "responses": nested(responses),
        "response_mask": mask,
        "loss_mask": mask.clone(),
        "old_log_probs": (-5.5 + 0.6 * torch.randn(ROWS, longest, generator=g)) * mask,
        "ref_log_prob": (-5.5 + 0.6 * torch.randn(ROWS, longest, generator=g)) * mask,
        "advantages": torch.randn(ROWS, longest, generator=g) * mask,
        "values": torch.randn(ROWS, longest, generator=g) * mask,
        "returns": torch.randn(ROWS, longest, generator=g) * mask,
    }, batch_size=[ROWS])
    tu.assign_non_tensor(data, pad_mode=DatasetPadMode.NO_PADDING, max_response_len=longest,
                         temperature=TEMPERATURE, calculate_entropy=True, use_dynamic_bsz=False,
                         micro_batch_size_per_gpu=MICRO, global_batch_size=ROWS, use_remove_padding=True)
    return data


def _padded(data):
    ids = data["input_ids"]
    lengths = ids.offsets().diff()
    longest = int(lengths.max())
    padded = ids.to_padded_tensor(0, output_size=(len(lengths), longest))
    mask = torch.arange(longest).unsqueeze(0) < lengths.unsqueeze(1)
    return padded, mask


def reference_output(model, data, critic):
    """What verl's FSDP engine hands its loss: jagged log-probs (of the next token, at temperature)
    and entropy, or values, from transformers' model."""
    ids, mask = _padded(data)
    logits = model(input_ids=ids, attention_mask=mask.long()).logits
    lengths = mask.sum(1).tolist()
    offsets = torch.tensor([0] + lengths).cumsum(0)
    jag = lambda t: torch.nested.nested_tensor_from_jagged(t[mask], offsets)  # noqa: E731
    if critic:
        return {"values": jag(logits.squeeze(-1))}
    logp = torch.log_softmax(logits / TEMPERATURE, dim=-1)
    nxt = torch.zeros_like(ids)
    nxt[:, :-1] = ids[:, 1:]
    lp = logp.gather(-1, nxt.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return {"log_probs": jag(lp), "entropy": jag(entropy)}


def _metric_value(v):
    from verl.utils.metric import Metric

    if isinstance(v, Metric):
        v = v.aggregate()
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


def defined_positions(data, critic):
    """Where an output is defined in the jagged values: every position of a value model; for
    log-probs, all but each sequence's last (it has no next token; verl never reads it)."""
    lengths = data["input_ids"].offsets().diff().tolist()
    keep = torch.ones(sum(lengths), dtype=torch.bool)
    if not critic:
        keep[torch.tensor(lengths).cumsum(0) - 1] = False
    return keep


def reference_run(path, critic):
    """Single process: transformers, verl's loss on the whole mini-batch (dp 1), torch's AdamW over
    every parameter (what verl's FSDP engine builds for FSDPOptimizerConfig) and verl's cosine schedule. Per step: the loss, the
    grad norm, each micro-batch's metrics as verl's engines at dp 2 would give them; and the
    weights after the last step."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification
    from verl.utils import tensordict_utils as tu
    from verl.utils.torch_functional import get_cosine_schedule_with_warmup
    from verl.workers.utils.losses import ppo_loss, value_loss

    torch.manual_seed(0)
    if critic:
        model = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    vocab = model.config.vocab_size
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=EPS, weight_decay=0.01)  # verl's FSDP engine's
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=1, num_training_steps=STEPS, min_lr_ratio=0.1)
    loss_fn = partial(value_loss, config=critic_config()) if critic else partial(ppo_loss, config=actor_config())
    steps = []
    for step in range(STEPS):
        data = make_batch(step, vocab)
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(data["loss_mask"].sum()))
        opt.zero_grad()
        loss, _ = loss_fn(model_output=reference_output(model, data, critic), data=data)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
        micro = []  # the metrics of each dp-2 micro-batch, with the pre-step weights
        with torch.no_grad():
            for start in range(0, ROWS, MICRO):
                part = tu.index_select_tensor_dict(data, torch.arange(start, start + MICRO))
                tu.assign_non_tensor(part, dp_size=2)
                l, m = loss_fn(model_output=reference_output(model, part, critic), data=part)
                micro.append({"loss": float(l), **{k: _metric_value(v) for k, v in m.items()}})
        opt.step()
        sched.step()
        steps.append({"loss": float(loss), "grad_norm": grad_norm, "micro": micro, "lr": sched.get_last_lr()[0]})
    with torch.no_grad():
        final = make_batch(STEPS, vocab)
        out = reference_output(model, final, critic)
    key = "values" if critic else "log_probs"
    return {"steps": steps, "keep": defined_positions(final, critic), "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "final": out[key].values().detach().clone()}


def engine_rank(rank, world, port, path, critic_path, tmp, results):
    """One rank: torch.distributed, then the actor and the critic engines from verl's registry, the
    actor at tp 2 x pp 2 x dp 2, the critic at cp 2 x pp 2 x dp 2 (ring context parallelism,
    Megatron's cp_comm_type p2p), both with
    remove-padding: 3 training steps, a checkpoint, the weights, inference."""
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "MEGADSL_TIMEOUT_S": "120"})
    try:
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=rank, world_size=world)
        import megadsl.verl  # noqa: F401  (registers the engines)
        from verl.utils import tensordict_utils as tu
        from verl.workers.config import HFModelConfig
        from verl.workers.engine.base import EngineRegistry
        from verl.workers.utils.losses import ppo_loss, value_loss

        out = {}
        for critic, p in ((False, path), (True, critic_path)):
            engine = EngineRegistry.new(
                model_type="value_model" if critic else "language_model", backend="megadsl",
                model_config=HFModelConfig(path=p, use_remove_padding=True, load_tokenizer=False),
                engine_config=megadsl.verl.MegadslEngineConfig(
                    tensor_model_parallel_size=1 if critic else 2, context_parallel_size=2 if critic else 1,
                    cp_comm_type="p2p" if critic else "a2a",  # the critic's context parallelism: Megatron's ring
                    pipeline_model_parallel_size=2, use_dynamic_bsz=False,
                    micro_batch_size_per_gpu=MICRO, export_dtype="fp32", optimizer_offload=True),
                optimizer_config=optimizer_config(), checkpoint_config=None)
            engine.initialize()
            dp, dp_rank = engine.get_data_parallel_size(), engine.get_data_parallel_rank()
            rows = torch.arange(dp_rank * ROWS // dp, (dp_rank + 1) * ROWS // dp)
            loss_fn = partial(value_loss, config=critic_config()) if critic else partial(ppo_loss, config=actor_config())
            steps = []
            for step in range(STEPS):
                data = tu.index_select_tensor_dict(make_batch(step, engine.model.vocab), rows)
                with engine.train_mode():
                    o = engine.train_batch(data, loss_function=loss_fn)
                    lr = engine.lr_scheduler_step()
                if engine.is_mp_src_rank_with_outputs():  # as verl's worker reduces the loss
                    loss = torch.tensor(sum(o["loss"]), dtype=torch.float64)
                    dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=engine.get_data_parallel_group())
                    listed = {k: getattr(v, "values", v) for k, v in o["metrics"].items() if k != "grad_norm"}
                    micro = [{"loss": l, **{k: _metric_value(v[i]) for k, v in listed.items()}}
                             for i, l in enumerate(o["loss"])]
                    steps.append({"loss": float(loss), "grad_norm": o["metrics"]["grad_norm"], "micro": micro, "lr": lr,
                                  "dp_rank": dp_rank})
            ckpt = os.path.join(tmp, "critic" if critic else "actor")
            engine.save_checkpoint(ckpt, global_step=STEPS)
            weights = {n: t.clone() for n, t in engine.get_per_tensor_param()[0]}
            shards = [(n, t.clone(), s.full_shape, getattr(s.place, "global_offset", None),
                       getattr(s.place, "local_shape", None), s.contributes)
                      for n, t, s in engine.get_per_tensor_param_shard()[0]] if not critic else []
            final = make_batch(STEPS, engine.model.vocab)
            with engine.eval_mode():
                inferred = engine.infer_batch(tu.index_select_tensor_dict(final, rows), loss_function=None)
            key = "values" if critic else "log_probs"
            out["critic" if critic else "actor"] = {
                "steps": steps, "weights": weights if rank == 0 else None, "shards": shards,
                "tp_rank": engine.model.tp_rank, "dp_rank": dp_rank, "cp": engine.model.layout.cp,
                "final": inferred["model_output"][key].values().clone(), "rows": rows,
                "optimizer_bytes_offloaded": engine.trainer.optimizer_bytes}
        buf = io.BytesIO()
        torch.save(out, buf)  # bytes, not shared memory: readable after this process is gone
        results.put((rank, "ok", buf.getvalue()))
    except BaseException as e:  # noqa: BLE001
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    results.close()
    results.join_thread()


def single_process_run(path, critic, max_token_len):
    """The engine in this process (a world of one, no torch.distributed) with verl's dynamic
    batching: micro-batches of at most max_token_len tokens. Per step the loss and grad norm, and
    the weights after the last step."""
    import megadsl.verl
    from verl.workers.config import HFModelConfig
    from verl.workers.engine.base import EngineRegistry
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss, value_loss

    engine = EngineRegistry.new(
        model_type="value_model" if critic else "language_model", backend="megadsl",
        model_config=HFModelConfig(path=path, use_remove_padding=True, load_tokenizer=False),
        engine_config=megadsl.verl.MegadslEngineConfig(use_dynamic_bsz=True, max_token_len_per_gpu=max_token_len,
                                                       export_dtype="fp32"),
        optimizer_config=optimizer_config(), checkpoint_config=None)
    engine.initialize()
    loss_fn = partial(value_loss, config=critic_config()) if critic else partial(ppo_loss, config=actor_config())
    steps = []
    for step in range(STEPS):
        data = make_batch(step, engine.model.vocab)
        tu.assign_non_tensor(data, use_dynamic_bsz=True, max_token_len_per_gpu=max_token_len)
        with engine.train_mode():
            o = engine.train_batch(data, loss_function=loss_fn)
            engine.lr_scheduler_step()
        steps.append({"loss": sum(o["loss"]), "grad_norm": o["metrics"]["grad_norm"], "micro": len(o["loss"])})
    weights = {n: t.clone() for n, t in engine.get_per_tensor_param()[0]}
    engine.model.close()
    return {"steps": steps, "weights": weights}
