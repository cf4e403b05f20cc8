"""One rank of the PPO workers' test, under torchrun: verl's engine-based workers as verl's PPO trainer
builds them (ActorRolloutRefWorker for the actor and for the reference, a TrainingWorker with
value_loss for the critic; configs from verl's ppo_trainer.yaml with the command line's overrides),
driven by verl's own RayPPOTrainer methods for a step (old log-probs, reference log-probs, values,
rollout correction, GAE, critic update, actor update), on the batches of ppo_batch.py. verl's single
controller dispatches each worker group's calls over its dp ranks and collects the outputs of the
collect ranks; SpmdGroup does that on the ranks themselves (verl's own chunk and concat).

    torchrun --nproc-per-node N ppo_workers_rank.py BATCHES OUT override ...
"""

import pickle
import sys
from functools import partial
from types import SimpleNamespace

import torch
import torch.distributed as dist


class _Done:
    """What a non-blocking call of a Ray worker group returns: .get() gives the result."""

    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


class SpmdGroup:
    """A worker group as verl's trainer calls it, run SPMD on every rank: a data call is dispatched
    over the worker's dp ranks (BatchData.chunk, in dp order), each rank runs its chunk, and the
    outputs of the collect ranks are gathered and concatenated in dp order (BatchData.concat)."""

    def __init__(self, worker, meshes):
        self.worker, self.meshes = worker, meshes

    def __getattr__(self, name):
        from verl.protocol import BatchData

        method = getattr(self.worker, name)
        mesh, blocking = self.meshes[name]

        def call(data):
            dp_rank, collect = self.worker._query_dispatch_info(mesh), self.worker.query_collect_info(mesh)
            ranks = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, dp_rank)
            dp_size = max(ranks) + 1
            # Ray hands each worker its chunk pickled and unpickled: a copy of its own, unlocked.
            out = method(pickle.loads(pickle.dumps(BatchData(data).chunk(chunks=dp_size)[dp_rank])))
            outs = [None] * dist.get_world_size()
            dist.all_gather_object(outs, (dp_rank, out.cpu() if collect and out is not None else None))
            mine = {}
            for d, o in outs:
                if o is not None:
                    mine.setdefault(d, o)
            result = BatchData([mine[d] for d in range(dp_size)]).concat()
            return result if blocking else _Done(result)

        return call


def build(config):
    """The workers of verl's PPO trainer for `config` (model_engine's actor, reference, critic)."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import CriticConfig, TrainingWorkerConfig
    from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker
    from verl.workers.utils.losses import value_loss

    actor = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    actor.init_model()
    ref = ActorRolloutRefWorker(config.actor_rollout_ref, role="ref")
    ref.init_model()
    critic_cfg: CriticConfig = omega_conf_to_dataclass(config.critic)  # as RayPPOTrainer.init_workers does
    engine_config = critic_cfg.engine
    engine_config.infer_max_token_len_per_gpu = critic_cfg.ppo_infer_max_token_len_per_gpu
    engine_config.max_token_len_per_gpu = critic_cfg.ppo_max_token_len_per_gpu
    critic = TrainingWorker(TrainingWorkerConfig(
        model_type="value_model", model_config=critic_cfg.model, engine_config=engine_config,
        optimizer_config=critic_cfg.optim, checkpoint_config=critic_cfg.checkpoint))
    critic.reset()
    critic.set_loss_fn(partial(value_loss, config=critic_cfg))
    return SimpleNamespace(
        config=config, ref_in_actor=False, use_critic=True, use_reference_policy=True, distillation_config=None,
        actor_rollout_wg=SpmdGroup(actor, {"compute_log_prob": ("actor", True), "update_actor": ("actor", True)}),
        ref_policy_wg=SpmdGroup(ref, {"compute_ref_log_prob": ("ref", True)}),
        critic_wg=SpmdGroup(critic, {"infer_batch": ("train", False), "train_mini_batch": ("train", False)}),
        actor=actor)


def ppo_step(t, batch):
    """One step of RayPPOTrainer.fit after the rollout, with verl's own methods and functions."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
    from verl.utils.metric import reduce_metrics

    seen = {}
    batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
    batch.meta_info["images_seqlens"] = []
    old, _ = RayPPOTrainer._compute_old_log_prob(t, batch)
    seen["entropys"] = old.batch["entropys"].clone()
    old.batch.pop("entropys")
    batch = batch.union(old)
    batch = batch.union(RayPPOTrainer._compute_ref_log_prob(t, batch))
    batch = batch.union(RayPPOTrainer._compute_values(t, batch))
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch, _ = compute_rollout_correction_and_add_to_batch(batch, t.config.algorithm.rollout_correction)
    batch = compute_advantage(batch, adv_estimator=t.config.algorithm.adv_estimator, gamma=t.config.algorithm.gamma,
                              lam=t.config.algorithm.lam, num_repeat=1, config=t.config.algorithm)
    for key in ("old_log_probs", "ref_log_prob", "values", "advantages", "returns", "rollout_is_weights"):
        seen[key] = batch.batch[key].clone()
    if "routed_experts" in batch.batch.keys():
        seen["routed_experts"] = batch.batch["routed_experts"]
    critic = RayPPOTrainer._update_critic(t, batch).meta_info["metrics"]
    actor = RayPPOTrainer._update_actor(t, batch).meta_info["metrics"]
    seen["critic"] = {k: v for k, v in critic.items() if not k.startswith("critic/perf")}
    seen["actor"] = {k: v for k, v in actor.items() if not k.startswith("actor/perf")}
    seen["critic_reduced"] = reduce_metrics(seen["critic"])
    seen["actor_reduced"] = reduce_metrics(seen["actor"])
    return seen


def main(batches_file, out_file, *overrides):
    from hydra import compose, initialize_config_module

    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=list(overrides))
    t = build(config)
    batches = torch.load(batches_file, weights_only=False)
    steps = [ppo_step(t, b) for b in batches]
    # The policy after both updates, through the workers again: the first batch's log-probs.
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    first = torch.load(batches_file, weights_only=False)[0]  # as sampled (the step added its fields to its copy)
    first.meta_info["global_token_num"] = torch.sum(first.batch["attention_mask"], dim=-1).tolist()
    after, _ = RayPPOTrainer._compute_old_log_prob(t, first)
    if dist.get_rank() == 0:
        torch.save({"steps": steps, "after": after.batch["old_log_probs"].clone()}, out_file)
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
