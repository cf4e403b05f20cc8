"""The configs verl's hydra trainers instantiate for megadsl: the engine's (``engine=megadsl`` for the
SFT trainer), and the actor / reference / critic configs of the PPO trainer (``model_engine=megadsl``).
Their YAML groups are in ``megadsl/verl/groups`` (found by verl's trainers through the hydra plugin
``hydra_plugins.megadsl_verl``)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

from verl.workers.config import ActorConfig, CriticConfig, EngineConfig

__all__ = ["MegadslEngineConfig", "MegadslActorConfig", "MegadslCriticConfig", "DTYPES"]

# verl's dtype names and megadsl's, to megadsl's compute dtype.
DTYPES = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16"}


@dataclass
class MegadslEngineConfig(EngineConfig):
    """The engine's layout and run options, under the names of verl's Megatron engine config where
    one exists (``tensor_model_parallel_size``, ...), so ``actor.megatron`` settings carry over; the
    rest of verl's EngineConfig (dynamic batching, offload, forward_only, router_replay) as verl
    sets it.

    dtype: the compute dtype: "fp32", or "bf16" / "bfloat16" over fp32 parameters and optimizer.
    recompute: None, "selective" (the attention core) or "full" (each layer).
    cp_comm_type: context parallelism's attention, Megatron's key: "p2p" (a ring of k/v blocks over a
        load-balanced split, any head count; Megatron's default), "a2a" (Ulysses: heads all-to-all;
        megadsl's default, which the gated DeltaNet needs) or "a2a+p2p" (hierarchical: all-to-all
        within groups of hierarchical_context_parallel_sizes[0] ranks, a ring across them).
    hierarchical_context_parallel_sizes: under a2a+p2p, Megatron's [a2a, p2p] sizes, their product
        context_parallel_size.
    weight_decay_on: which parameters AdamW decays: None follows the optimizer config verl hands the
        engine (FSDPOptimizerConfig: every parameter, as verl's FSDP engine; McoreOptimizerConfig:
        Megatron's rule, matrices only), or "all" / "matrices" over both.
    export_dtype, export_bucket_mb: the rollout engine's weights (get_per_tensor_param).
    timeout: seconds before a collective that waits on a peer fails (default megadsl's 120).
    invariant: megadsl's invariant arithmetic (Layout(invariant=True)): a sequence's log-probs,
        entropy, values and routing are the same bits whatever the micro-batch, the padding and the
        layout (CPU). verl's full_determinism: true turns it on too.
    head_chunk_tokens: the LM head's log-probs and entropy this many tokens at a time in training
        too, forward and backward (Model.from_hf's head_chunk_tokens): 0 chunks where a micro-batch's
        logits would pass 1 GiB (long responses), -1 keeps them whole.
    """

    _mutable_fields = EngineConfig._mutable_fields | {"optimizer_offload", "grad_offload", "sequence_parallel"}

    strategy: str = "megadsl"
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: Optional[int] = None
    sequence_parallel: bool = False
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: Optional[int] = None
    context_parallel_size: int = 1
    cp_comm_type: str = "a2a"
    hierarchical_context_parallel_sizes: Optional[list] = None
    recompute: Optional[str] = None
    dtype: str = "fp32"
    use_distributed_optimizer: bool = True
    grad_offload: bool = False
    weight_decay_on: Optional[str] = None
    moe_aux_loss_coeff: float = 0.0
    moe_z_loss_coeff: float = 0.0
    # Megatron's moe_router_bias_update_rate: the expert-bias balancing of sigmoid routers (0: off)
    moe_router_bias_update_rate: float = 1e-3
    export_dtype: str = "bf16"
    export_bucket_mb: float = 512.0
    timeout: Optional[float] = None
    invariant: bool = False
    head_chunk_tokens: int = 0
    max_token_len_per_gpu: int = 16384
    infer_max_token_len_per_gpu: int = 16384

    def __post_init__(self):
        super().__post_init__()
        if self.strategy != "megadsl":
            raise ValueError(f"megadsl.verl: engine strategy {self.strategy!r}: this config is megadsl's engine "
                             "(strategy: megadsl); select another engine's config group for another strategy")
        if str(self.dtype) not in DTYPES:
            raise ValueError(f"megadsl.verl: engine dtype {self.dtype!r} is not one of {', '.join(DTYPES)} "
                             "(megadsl computes in fp32 or in bf16 over fp32 parameters; fp16 is not supported)")
        if self.weight_decay_on not in (None, "all", "matrices"):
            raise ValueError(f"megadsl.verl: weight_decay_on {self.weight_decay_on!r} is null (follow the optimizer "
                             "config), \"all\" or \"matrices\"")
        if int(self.head_chunk_tokens) < -1:
            raise ValueError(f"megadsl.verl: head_chunk_tokens {self.head_chunk_tokens} is a chunk of tokens > 0, "
                             "0 (chunks where a micro-batch's logits would pass 1 GiB) or -1 (whole)")
        if self.cp_comm_type not in ("a2a", "p2p", "ring", "a2a+p2p", "a2a+ring"):
            raise ValueError(f"megadsl.verl: cp_comm_type {self.cp_comm_type!r} is \"p2p\" (or \"ring\"), \"a2a\" "
                             "(Ulysses) or \"a2a+p2p\" (or \"a2a+ring\"; hierarchical, with "
                             "hierarchical_context_parallel_sizes [a2a, p2p])")
        if self.recompute not in (None, "none", "selective", "full"):
            raise ValueError(f"megadsl.verl: recompute {self.recompute!r} is null, \"selective\" or \"full\"")


def _refuse_unknown_keys(cls, where):
    """A dataclass __init__ that names an unknown key and the fix in one line, instead of Python's
    "unexpected keyword argument" from hydra's instantiate (e.g. another engine's group with only
    _target_ replaced)."""
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        known = {f.name for f in fields(cls)}
        unknown = sorted(k for k in kwargs if k not in known and k != "_target_")
        if unknown:
            raise TypeError(f"megadsl.verl: {where} key {unknown[0]!r} is not one of megadsl's ({len(unknown)} unknown); "
                            f"select megadsl's config group ({'engine=megadsl' if cls is MegadslEngineConfig else 'model_engine=megadsl'}) "
                            "instead of overriding _target_ in another engine's group")
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


_refuse_unknown_keys(MegadslEngineConfig, "engine config")


@dataclass
class MegadslActorConfig(ActorConfig):
    """The PPO trainer's actor (and reference) with megadsl's engine, its settings under ``megadsl``
    (``actor_rollout_ref.actor.megadsl.tensor_model_parallel_size=2``)."""

    strategy: str = "megadsl"
    megadsl: MegadslEngineConfig = field(default_factory=MegadslEngineConfig)
    use_rollout_log_probs: bool = False

    def __post_init__(self):
        super().__post_init__()
        self.engine = self.megadsl


@dataclass
class MegadslCriticConfig(CriticConfig):
    """The PPO trainer's critic with megadsl's engine (``critic.megadsl.*``)."""

    strategy: str = "megadsl"
    megadsl: MegadslEngineConfig = field(default_factory=MegadslEngineConfig)

    def __post_init__(self):
        super().__post_init__()
        self.engine = self.megadsl


_refuse_unknown_keys(MegadslActorConfig, "actor config")
_refuse_unknown_keys(MegadslCriticConfig, "critic config")
