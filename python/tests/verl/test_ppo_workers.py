"""verl's PPO workers on megadsl (model_engine=megadsl) against verl's FSDP engine (model_engine=dp):
the workers verl's PPO trainer builds (ActorRolloutRefWorker as actor and as reference, the critic's
TrainingWorker), driven by verl's own RayPPOTrainer methods through two steps of batches sampled
from the tiny chat model (ppo_workers_rank.py): old and reference log-probs, entropy, values, rollout
correction's IS weights, GAE, update_critic (value_loss) and update_actor (ppo_loss: dual-clip, KL
loss, entropy bonus, IS weights), all within 1e-5. A dense Llama at tp 2 x pp 2, and a Qwen3-MoE
mixture at pp 2 x ep 2 x dp 2 with router replay R2 (the log-prob pass records the routing, the
update replays it)."""

import pytest
import torch

import ppo_batch
import sft_runs
import tiny_chat

TOL = 1e-5
HERE = sft_runs.HERE


def overrides(data, engine, mini_batch):
    model = f"{data}/model"
    common = [
        f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}/critic",
        "actor_rollout_ref.model.use_remove_padding=True", "critic.model.use_remove_padding=True",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch}", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_dynamic_bsz=False", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.1",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.actor.clip_ratio_c=3.0", "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.use_torch_compile=False",
        f"critic.ppo_mini_batch_size={mini_batch}", "critic.ppo_micro_batch_size_per_gpu=2", "critic.optim.lr=1e-3",
        "algorithm.adv_estimator=gae", "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=2.0"]
    if engine == "fsdp":
        fp32 = "mixed_precision.param_dtype=fp32"
        return common + [
            "model_engine=dp", "actor_rollout_ref.actor.strategy=fsdp2", "critic.strategy=fsdp2",
            f"+actor_rollout_ref.actor.fsdp_config.{fp32}", f"+actor_rollout_ref.ref.fsdp_config.{fp32}",
            f"+critic.fsdp.{fp32}", "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
            "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False", "critic.fsdp.use_torch_compile=False",
            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            "+critic.model.override_config.attn_implementation=sdpa"]
    return common + ["model_engine=megadsl"] + [f"{role}.megadsl.{k}={v}" for role in ("actor_rollout_ref.actor", "critic")
                                               for k, v in engine.items() if role != "critic" or "replay" not in k]


def run(tmp, data, world, engine, mini_batch):
    batches = tmp / "batches.pt"
    if not batches.exists():
        torch.save(ppo_batch.make_batches(f"{data}/model"), batches)
    out = tmp / f"{'fsdp' if engine == 'fsdp' else 'megadsl'}.pt"
    code, log, _ = sft_runs.run(world, [str(batches), str(out), *overrides(data, engine, mini_batch)],
                                tmp / "unused.jsonl", script=str(HERE / "ppo_workers_rank.py"))
    assert code == 0, log[-8000:]
    return torch.load(out, weights_only=False)


def close(got, want, what, tol=TOL):
    assert got.shape == want.shape, (what, got.shape, want.shape)
    diff = (got.float() - want.float()).abs().max().item()
    assert diff <= tol, (what, diff)


def compare(mine, fsdp):
    for step, (a, b) in enumerate(zip(mine["steps"], fsdp["steps"])):
        for key in ("old_log_probs", "entropys", "ref_log_prob", "values", "advantages", "returns", "rollout_is_weights"):
            close(a[key], b[key], (step, key))
        for role in ("actor", "critic"):
            for key, want in b[f"{role}_reduced"].items():
                if "mfu" in key or "memory" in key or key.endswith("/lr"):
                    continue
                assert key in a[f"{role}_reduced"], (step, key)
                got = a[f"{role}_reduced"][key]
                assert abs(got - want) <= TOL * max(1.0, abs(want)), (step, key, got, want)
    close(mine["after"], fsdp["after"], "log-probs after the updates")


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ppo_dense")
    data = tiny_chat.make(tmp / "chat")
    return {"fsdp": run(tmp, data, 1, "fsdp", 4),
            "megadsl": run(tmp, data, 4, {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}, 4)}


def test_dense_tp2_pp2_equals_the_fsdp_engine(dense):
    compare(dense["megadsl"], dense["fsdp"])
    assert dense["megadsl"]["steps"][0]["rollout_is_weights"].ne(1).any()  # rollout correction had work


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ppo_moe")
    data = tiny_chat.make(tmp / "chat", moe=True)
    layout = {"pipeline_model_parallel_size": 2, "expert_model_parallel_size": 2, "router_replay.mode": "R2"}
    return {"fsdp": run(tmp, data, 2, "fsdp", 8), "megadsl": run(tmp, data, 4, layout, 8)}


def test_mixture_with_router_replay_equals_the_fsdp_engine(moe):
    """One mini-batch per update: the update's live routing is the log-prob pass's, so FSDP (live)
    and megadsl (replaying what the log-prob pass recorded) see the same experts."""
    compare(moe["megadsl"], moe["fsdp"])
    for step in moe["megadsl"]["steps"]:
        routed = step["routed_experts"]  # R2: recorded by compute_log_prob, replayed by update_actor
        assert routed.shape[-2:] == (4, 2), routed.shape
