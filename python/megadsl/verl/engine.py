"""megadsl as verl's engine (verl 0.9's BaseEngine), in the order verl's TrainingWorker calls it:

1. ``__init__`` (``EngineRegistry.new``): the configs checked, megadsl joined to torch's ranks, the
   layout checked against the model's config.json and the world, this rank's place in the grid and
   verl's process groups: every query verl makes before ``initialize()`` answers
   (``get_data_parallel_rank/size/group``, ``is_mp_src_rank_with_outputs``).
2. verl sets ``optimizer_config.total_training_steps`` (the SFT trainer) or the engine config's
   batch sizes (the PPO workers).
3. ``initialize()`` (``TrainingWorker.reset``): the model loaded into the layout, AdamW and the
   schedule of verl's optimizer config (optim.py), the configured offload.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from contextlib import contextmanager
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.utils.py_functional import append_to_dict
from verl.workers.engine.base import BaseEngine

import megadsl

from .. import _C
from .batch import Rows
from .config import DTYPES
from .optim import _cfg, adamw_options, build_schedule

__all__ = ["MegadslEngine", "join_torch_job"]

CONTENTS = ("model", "optimizer", "extra", "hf_model")


def join_torch_job(timeout=None):
    """Joins megadsl to the job torch.distributed runs (its ranks and world size): rank 0 picks a
    free port for megadsl's rendezvous and publishes it through torch's store. Does nothing when
    megadsl has joined a job already; without torch.distributed, megadsl.init() from the launcher's
    environment, or nothing (a world of one process) when there is none."""
    import socket

    if _C.is_initialized():
        return
    if not dist.is_available() or not dist.is_initialized():
        if any(os.environ.get(k) for k in ("RANK", "SLURM_PROCID")) and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            megadsl.init(timeout=timeout)  # a launcher's job without torch.distributed
        return  # else a world of one process
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    key = "megadsl/rendezvous_port"
    if rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            store.set(key, str(s.getsockname()[1]))
    port = int(store.get(key).decode())
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    _C._init(rank, world, local_rank, local_world, addr, port, timeout)


def _cp_a2a_of(ec):
    """Megatron's hierarchical_context_parallel_sizes [a2a, p2p] under cp_comm_type a2a+p2p: the
    all-to-all groups' size (Layout.cp_a2a); 1 otherwise. Sizes whose product is not the cp degree
    are refused, naming both."""
    sizes = _cfg(ec, "hierarchical_context_parallel_sizes", None)
    kind = str(_cfg(ec, "cp_comm_type", "a2a") or "a2a")
    if kind not in ("a2a+p2p", "a2a+ring"):
        if sizes:
            raise ValueError(f"megadsl.verl: hierarchical_context_parallel_sizes {list(sizes)} is for cp_comm_type "
                             f"a2a+p2p, and cp_comm_type is {kind}; drop it or set cp_comm_type: a2a+p2p")
        return 1
    cp = int(_cfg(ec, "context_parallel_size", 1) or 1)
    if not sizes or len(sizes) != 2 or int(sizes[0]) * int(sizes[1]) != cp:
        raise ValueError(f"megadsl.verl: cp_comm_type a2a+p2p needs hierarchical_context_parallel_sizes [a2a, p2p] "
                         f"whose product is context_parallel_size {cp}; got {None if sizes is None else list(sizes)}")
    return int(sizes[0])


def _contents(checkpoint_config, key, default):
    value = _cfg(checkpoint_config, key, None)
    contents = list(default if value is None else value)
    unknown = sorted(set(contents) - set(CONTENTS))
    if unknown:
        raise ValueError(f"megadsl.verl: checkpoint.{key} {unknown[0]!r} is not one of {', '.join(CONTENTS)}")
    if "optimizer" in contents and "model" not in contents:
        raise ValueError(f"megadsl.verl: checkpoint.{key} names optimizer without model: megadsl's checkpoint holds "
                         "AdamW's state beside the parameters it belongs to; add model")
    return contents


# model.override_config keys that cannot change megadsl's numbers: the attention kernel verl asks
# transformers for (megadsl's compute the same attention) and the tokenizer's ids verl copies in.
_NO_EFFECT_OVERRIDES = ("attn_implementation", "_attn_implementation", "bos_token_id", "eos_token_id", "pad_token_id")


def _dropout_overrides(model_config, path):
    """model.override_config as verl applies it to the HF config (its ``model_config`` part when it
    has one): dropout keys go to the model (the family's keys, checked by megadsl), the keys that
    change nothing pass, any other is refused (megadsl reads the model from config.json)."""
    oc = _cfg(model_config, "override_config", None) or {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(oc, DictConfig):
            oc = OmegaConf.to_container(oc, resolve=True)
    except ImportError:  # pragma: no cover (verl depends on omegaconf)
        pass
    oc = dict(oc)
    given = dict(oc["model_config"] or {}) if "model_config" in oc else oc
    dropout = {}
    for key, value in given.items():
        if key in _NO_EFFECT_OVERRIDES:
            continue
        if key == "classifier_dropout" and not value:
            continue  # the value head has no dropout (verl's FSDP critic sets it to 0)
        if "dropout" in key or "pdrop" in key:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"megadsl.verl: model.override_config.{key} is {value!r}; a dropout rate is a number in "
                                 "[0, 1)")
            dropout[key] = float(value)
            continue
        raise ValueError(f"megadsl.verl: model.override_config.{key} is not supported: megadsl reads the model from "
                         f"{path}/config.json (write it there); override_config may set the family's dropout keys "
                         f"(say attention_dropout: 0.0) and {', '.join(_NO_EFFECT_OVERRIDES)}")
    extra = sorted(set(oc) - {"model_config"}) if "model_config" in oc else []
    if extra:
        raise ValueError(f"megadsl.verl: model.override_config.{extra[0]} is not supported (megadsl takes "
                         "override_config.model_config's dropout keys)")
    return dropout or None


# Megatron's module names (verl's model.lora.target_modules) as the HF modules PEFT adapts. The
# fused ones (linear_qkv, linear_fc1 under type "lora": one A shared by q, k and v, or by gate and
# up) are not PEFT's per-module adapters and are refused.
MEGATRON_LORA_TARGETS = {
    "linear_q": "q_proj", "linear_k": "k_proj", "linear_v": "v_proj", "linear_proj": "o_proj",
    "linear_fc1_gate": "gate_proj", "linear_fc1_up": "up_proj", "linear_fc2": "down_proj",
    "linear_q_proj": "q_proj", "linear_q_down_proj": "q_a_proj", "linear_q_up_proj": "q_b_proj",
    "linear_kv_down_proj": "kv_a_proj_with_mqa", "linear_kv_up_proj": "kv_b_proj",
}
# verl's replace_lora_wrapper: the projections vLLM's LoRA-enabled model always wraps.
VLLM_WRAPPED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _lora_options(model_config):
    """verl's LoRA keys as from_hf's keywords, and whether weight sync merges (model.lora.merge):
    FSDP's model.lora_rank / lora_alpha / target_modules / lora_adapter_path, or Megatron's
    model.lora.{rank, alpha, target_modules, adapter_path, ...}. None without LoRA. What megadsl
    cannot honour is refused, naming the key."""
    mega = _cfg(model_config, "lora") or {}
    rank = int(_cfg(model_config, "lora_rank", 0) or 0)
    mrank = int(_cfg(mega, "rank", 0) or 0)
    merge = bool(_cfg(mega, "merge", False))

    def refuse(key, why):
        raise ValueError(f"megadsl.verl: model.{key}: {why}")

    if rank > 0 and mrank > 0:
        refuse("lora.rank", "both model.lora_rank and model.lora.rank are set; give one")
    if rank > 0:
        if _cfg(model_config, "exclude_modules"):
            refuse("exclude_modules", "is not supported with megadsl's LoRA; name the targets in target_modules")
        opts = {"lora_rank": rank, "lora_alpha": float(_cfg(model_config, "lora_alpha", 16)),
                "lora_target_modules": _targets(_cfg(model_config, "target_modules", "all-linear"), {})}
        parameters = _cfg(model_config, "target_parameters")
        if parameters:  # PEFT's target_parameters: a mixture's experts ("mlp.experts.gate_up_proj", ...)
            if isinstance(parameters, str):
                refuse("target_parameters", f"{parameters!r}: a list of parameter names (\"mlp.experts.gate_up_proj\")")
            opts["lora_target_parameters"] = [str(p) for p in parameters]
        adapter = _cfg(model_config, "lora_adapter_path")
    elif mrank > 0:
        kind = str(_cfg(mega, "type", "lora"))
        if kind not in ("lora", "canonical_lora"):
            refuse("lora.type", f"{kind!r} is not supported; megadsl trains PEFT's LoRA (type lora or canonical_lora)")
        if _cfg(mega, "exclude_modules"):
            refuse("lora.exclude_modules", "is not supported; name the targets in lora.target_modules")
        if _cfg(mega, "dtype") not in (None, "fp32", "float32"):
            refuse("lora.dtype", "megadsl keeps adapters in fp32 (as its parameters); leave it null")
        # Megatron-Bridge's default A is xavier; megadsl's (and PEFT's) Kaiming must be asked for.
        init_a = str(_cfg(mega, "lora_A_init_method", "xavier"))
        if _cfg(mega, "adapter_path") is None and init_a != "kaiming":
            refuse("lora.lora_A_init_method", f"{init_a!r}: megadsl initialises A as PEFT does "
                   "(Kaiming-uniform, B zero); set lora_A_init_method: kaiming, or start from lora.adapter_path")
        if str(_cfg(mega, "lora_B_init_method", "zero")) != "zero":
            refuse("lora.lora_B_init_method", "B starts at zero (PEFT's); set it to zero")
        dropout = float(_cfg(mega, "dropout", 0.0) or 0.0)
        if dropout and str(_cfg(mega, "dropout_position", "pre")) != "pre":
            refuse("lora.dropout_position", f"{_cfg(mega, 'dropout_position')!r}: megadsl drops the adapters' inputs "
                   "(PEFT's lora_dropout, position pre); set it to pre")
        if dropout and _cfg(mega, "adapter_path"):
            refuse("lora.dropout", "is given with lora.adapter_path, whose adapter_config.json sets lora_dropout; "
                   "set it there")
        opts = {"lora_rank": mrank, "lora_alpha": float(_cfg(mega, "alpha", 32)),
                "lora_target_modules": _targets(_cfg(mega, "target_modules", ["linear_qkv"]), MEGATRON_LORA_TARGETS),
                "lora_dropout": dropout}
        adapter = _cfg(mega, "adapter_path")
    else:
        return None, merge
    if adapter:
        return {"lora_adapter": os.fspath(adapter)}, merge  # rank, alpha and targets from its adapter_config.json
    return opts, merge


def _targets(given, megatron):
    """target_modules as from_hf takes them: "all-linear" or HF module names (Megatron's mapped)."""
    if isinstance(given, str):
        if given != "all-linear":
            raise ValueError(f"megadsl.verl: model target_modules {given!r}: \"all-linear\" or a list of module names")
        return given
    out = []
    for name in list(given):
        name = str(name)
        if name in ("linear_qkv", "linear_fc1"):
            raise ValueError(f"megadsl.verl: model.lora.target_modules names {name}, Megatron's fused LoRA (one A shared "
                             "by its projections), which is not PEFT's per-module adapters; use type canonical_lora "
                             "with linear_q, linear_k, linear_v (linear_fc1_gate, linear_fc1_up)")
        out.append(megatron.get(name, name))
    return out


class _ModeContext:
    """train_mode / eval_mode: brings offloaded state back on entry and offloads it again on exit,
    as the engine config asks (verl's BaseEngineCtx, with megadsl's offload)."""

    def __init__(self, engine, mode, disable_auto_offload=False, **_):
        self.engine, self.mode, self.disable = engine, mode, disable_auto_offload

    def __enter__(self):
        self.engine._model()
        self.engine.mode = self.mode
        if not self.disable:
            self.engine._reload(optimizer=self.mode == "train")
        return self

    def __exit__(self, *exc):
        if not self.disable:
            self.engine._offload_as_configured()
        self.engine.mode = None
        return False


class MegadslEngine(BaseEngine):
    """verl's engine interface over a megadsl.Model and its Trainer (see the module's text)."""

    critic = False

    def __init__(self, model_config, engine_config, optimizer_config, checkpoint_config=None):
        super().__init__()
        from .config import MegadslEngineConfig

        self.model_config = model_config
        self.engine_config = engine_config if engine_config is not None else MegadslEngineConfig()
        self.optimizer_config = optimizer_config
        self.checkpoint_config = checkpoint_config
        self.mode = None
        self.model = self.trainer = self._scheduler = None
        self._saved = []
        ec = self.engine_config
        path = _cfg(model_config, "local_path") or _cfg(model_config, "path")
        if path is None:
            raise ValueError("megadsl.verl: model_config has no local_path or path (the HF checkpoint directory)")
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            raise ValueError(f"megadsl.verl: {self.path} is not a directory; model.path is the HF checkpoint "
                             "directory megadsl loads (download it first)")
        # LoRA: the adapters train, the base is frozen; weight sync ships them, or merged weights.
        self.lora, self.lora_merge = _lora_options(model_config)
        # verl's full_determinism (repeatable runs) is megadsl's invariant arithmetic, which also
        # makes a sequence's outputs independent of the micro-batching, the padding and the layout.
        self.invariant = bool(_cfg(ec, "invariant", False)) or bool(_cfg(ec, "full_determinism", False))
        if str(_cfg(ec, "dtype", "fp32")) not in DTYPES:
            raise ValueError(f"megadsl.verl: engine dtype {_cfg(ec, 'dtype')!r} is not one of {', '.join(DTYPES)}")
        self._save_contents = _contents(checkpoint_config, "save_contents", ("model", "optimizer", "extra"))
        self._load_contents = _contents(checkpoint_config, "load_contents", self._save_contents)

        mode = str(_cfg(_cfg(ec, "router_replay"), "mode", "disabled"))
        if mode not in ("disabled", "R2", "R3"):
            raise ValueError(f"megadsl.verl: router_replay.mode {mode!r} is not one of disabled, R2, R3")
        if mode != "disabled" and self.critic:
            raise ValueError(f"megadsl.verl: router_replay.mode {mode} on the critic: router replay replays the "
                             "policy's routing (R2: its log-prob pass, R3: the rollout's); a value model routes its "
                             "own tokens. Set it on the actor only")
        self.router_replay = mode
        self.use_remove_padding = bool(_cfg(model_config, "use_remove_padding", _cfg(ec, "use_remove_padding", True)))
        # Dropout: config.json's rates in training steps (as transformers' train mode and verl's
        # Megatron engine apply them), some of them set by model.override_config.
        self.dropout = _dropout_overrides(model_config, self.path)
        vpp = _cfg(ec, "virtual_pipeline_model_parallel_size", 1) or 1
        etp = _cfg(ec, "expert_tensor_parallel_size", None)
        self.layout = megadsl.Layout(
            tp=int(_cfg(ec, "tensor_model_parallel_size", 1)), pp=int(_cfg(ec, "pipeline_model_parallel_size", 1)),
            vpp=int(vpp), sp=bool(_cfg(ec, "sequence_parallel", False)), rmpad=self.use_remove_padding,
            ep=int(_cfg(ec, "expert_model_parallel_size", 1)), etp=int(etp) if etp is not None else 0,
            cp=int(_cfg(ec, "context_parallel_size", 1) or 1), cp_comm=str(_cfg(ec, "cp_comm_type", "a2a") or "a2a"),
            cp_a2a=_cp_a2a_of(ec),
            recompute=_cfg(ec, "recompute", None) or "none",
            invariant=self.invariant)
        # verl's model.enable_activation_offload: the layer inputs full recompute keeps wait in host
        # memory (megadsl's offload_activations); without full recompute there is nothing it moves.
        self.offload_activations = bool(_cfg(model_config, "enable_activation_offload", False))
        if self.offload_activations and self.layout.recompute != "full":
            raise ValueError("megadsl.verl: model.enable_activation_offload moves the input each layer keeps under "
                             f"full recompute to host memory, and the engine's recompute is {self.layout.recompute}; "
                             "set recompute: full in the engine config, or enable_activation_offload: false")
        join_torch_job(timeout=_cfg(ec, "timeout"))
        self.rank, self.world = megadsl.rank(), megadsl.world_size()
        if dist.is_initialized() and (dist.get_rank(), dist.get_world_size()) != (self.rank, self.world):
            raise RuntimeError(f"megadsl.verl: megadsl's job (rank {self.rank} of {self.world}) is not "
                               f"torch.distributed's (rank {dist.get_rank()} of {dist.get_world_size()})")
        ok, why = megadsl.check(self.path, self.layout, critic=self.critic, world=self.world)
        if not ok:
            rules = "; ".join(line.strip() for line in why.strip().splitlines() if line.strip())
            raise ValueError(f"megadsl.verl: {self.path} at {self.layout} on {self.world} ranks: {rules}")
        self.coords = self.layout.coords(self.rank, self.world)
        config = megadsl.read_hf_config(self.path)
        if mode != "disabled" and not re.search(r"\.experts = [1-9]", config["shape"]):
            raise ValueError(f"megadsl.verl: router_replay.mode {mode} needs a mixture of experts; {self.path} "
                             f"({config['model_type']}) has no router")
        self._build_groups()

    # ---- set-up ----------------------------------------------------------------------------

    def _build_groups(self):
        """torch process groups for verl, from the grid (no communication): the dp groups (the ranks
        that hold the same model part, same tp, cp and pp: verl all-reduces losses and counts over
        them; the cp ranks of a replica see the same data) and the tp groups (a shard export's gather
        groups). Every rank creates every group, in the same order."""
        self._dp_group = self._tp_group = None
        if not dist.is_initialized() or self.world == 1:
            return
        coords = [self.layout.coords(r, self.world) for r in range(self.world)]

        def group_of(key, order):
            members = {}
            for rank, c in enumerate(coords):
                members.setdefault(key(c), []).append((order(c), rank))
            mine = None
            for k in sorted(members):
                g = dist.new_group([r for _, r in sorted(members[k])])
                if k == key(self.coords):
                    mine = g
            return mine

        self._dp_group = group_of(lambda c: (c["tp"], c["pp"], c["cp"]), lambda c: c["dp"])
        self._tp_group = group_of(lambda c: (c["pp"], c["dp"], c["cp"]), lambda c: c["tp"])

    def initialize(self):
        """Loads the HF checkpoint into the layout on every rank, builds AdamW (the distributed
        optimizer unless use_distributed_optimizer is off) and the schedule of verl's optimizer
        config; verl calls it after setting total_training_steps."""
        if self.model is not None:
            return
        ec = self.engine_config
        device = "cuda" if torch.cuda.is_available() and _device_name() == "cuda" else "cpu"
        self.model = megadsl.Model.from_hf(
            self.path, layout=self.layout, critic=self.critic, dtype=DTYPES[str(_cfg(ec, "dtype", "fp32"))],
            device=device, seed=int(_cfg(ec, "seed", 42)),
            moe_aux_loss_coeff=float(_cfg(ec, "moe_aux_loss_coeff", 0.0)),
            moe_z_loss_coeff=float(_cfg(ec, "moe_z_loss_coeff", 0.0)),
            moe_expert_bias_update_rate=float(_cfg(ec, "moe_router_bias_update_rate", 1e-3)), dropout=self.dropout,
            head_chunk_tokens=int(_cfg(ec, "head_chunk_tokens", 0) or 0),
            offload_activations=self.offload_activations, **(self.lora or {}))
        m = self.model
        assert (m.tp_rank, m.pp_rank, m.dp_rank, m.cp_rank) == tuple(self.coords[k] for k in ("tp", "pp", "dp", "cp"))
        if not _cfg(ec, "forward_only", False):
            if self.optimizer_config is None:
                raise ValueError("megadsl.verl: a training engine needs an optimizer config (optim); set forward_only "
                                 "for a reference model")
            self.trainer = m.trainer(**adamw_options(self.optimizer_config, ec))
            self._scheduler = build_schedule(self.optimizer_config)
            self._apply_schedule()
        self._offload_as_configured()

    def _apply_schedule(self):
        self.trainer.lr = self._scheduler.get_last_lr()[0]
        if self._scheduler.weight_decay is not None:
            self.trainer.weight_decay = self._scheduler.weight_decay

    # ---- verl's engine interface -----------------------------------------------------------

    @property
    def is_param_offload_enabled(self) -> bool:
        return bool(_cfg(self.engine_config, "param_offload", False))

    @property
    def is_optimizer_offload_enabled(self) -> bool:
        return bool(_cfg(self.engine_config, "optimizer_offload", False))

    def train_mode(self, **kwargs):
        return _ModeContext(self, "train", **kwargs)

    def eval_mode(self, **kwargs):
        return _ModeContext(self, "eval", **kwargs)

    def get_data_parallel_rank(self):
        return self.coords["dp"]

    def get_data_parallel_size(self):
        return self.coords["dp_size"]

    def get_data_parallel_group(self):
        return self._dp_group

    def is_mp_src_rank_with_outputs(self):
        c = self.coords
        return c["tp"] == 0 and c["cp"] == 0 and c["pp"] == self.layout.pp - 1

    @contextmanager
    def disable_adapter(self):
        """The forwards without the LoRA adapters (verl's reference log-probs from the actor, its
        no_lora_adapter): the base alone, as PEFT's disable_adapter."""
        model = self._model()
        if self.lora is None:
            yield
            return
        model.lora_enabled = False
        try:
            yield
        finally:
            model.lora_enabled = True

    def optimizer_zero_grad(self):
        """Nothing to do: each megadsl step starts from zero gradients."""

    def optimizer_step(self):
        raise NotImplementedError(
            "megadsl.verl: the optimizer step runs inside train_batch (megadsl's step pipelines the forward and "
            "backward of all micro-batches and then updates); call train_batch, not forward_backward_batch + "
            "optimizer_step")

    def lr_scheduler_step(self):
        """Advances the schedule one step; the next train_batch uses its rate. Returns the rate."""
        if self._scheduler is None:
            raise RuntimeError("megadsl.verl: lr_scheduler_step: the engine has no optimizer (forward_only)"
                               if self.model is not None else "megadsl.verl: call engine.initialize() first")
        self._scheduler.step()
        self._apply_schedule()
        return self._scheduler.get_last_lr()[0]

    def _assign_counts(self, data: TensorDict, needed):
        """What verl's loss functions normalise by: the dp-global loss tokens and the dp size."""
        if "loss_mask" in data.keys():
            mask = data["loss_mask"]
            tokens = (mask.values() if mask.is_nested else mask).sum().to(torch.float64).reshape(1)
            if self._dp_group is not None and self.get_data_parallel_size() > 1:
                tokens = tokens.to(self._collective_device())  # NCCL's groups take device tensors
                dist.all_reduce(tokens, op=dist.ReduceOp.SUM, group=self._dp_group)
            tu.assign_non_tensor(data, batch_num_tokens=int(tokens.item()))
        elif needed:
            raise ValueError("megadsl.verl: the batch's field 'loss_mask' is missing: verl's losses divide by its "
                             "global sum (batch_num_tokens)")
        tu.assign_non_tensor(data, dp_size=self.get_data_parallel_size())
        if "global_batch_size" not in data.keys():
            tu.assign_non_tensor(data, global_batch_size=None)

    def _model_output(self, rows: Rows, outputs: dict, mask=None, entropy=False):
        if self.critic:
            return {"values": rows.jagged(outputs["values"], mask)}
        out = {"log_probs": rows.jagged(outputs["log_probs"], mask)}
        if entropy and "entropy" in outputs:
            out["entropy"] = rows.jagged(outputs["entropy"], mask)
        return out

    def _replayed(self, rows: Rows):
        """The routing to replay (R2's recorded one in the update, R3's rollout one everywhere)."""
        return rows.routed_experts if self.router_replay != "disabled" else None

    def forward_backward_batch(self, data: TensorDict, loss_function: Callable, forward_only=False) -> Any:
        """Forward only (log-probs, entropy or values of every row, and the loss when one is given):
        verl's compute_log_prob, compute_values and the SFT trainer's validation. Training runs
        through train_batch."""
        if not forward_only:
            raise NotImplementedError(
                "megadsl.verl: training runs through train_batch (one pipelined step: forward and backward of every "
                "micro-batch, then the optimizer); forward_backward_batch takes forward_only=True")
        model = self._model()
        rows = Rows(data, loss_function)
        self._assign_counts(data, needed=loss_function is not None)
        entropy = bool(tu.get_non_tensor_data(data=data, key="calculate_entropy", default=False))
        per = self._infer_rows(data, rows)
        kwargs = {} if self.critic else {"temperature": rows.temperature, "entropy": entropy}
        replay = self._replayed(rows)
        record = self.router_replay == "R2" and replay is None and not self.critic
        if replay is not None:
            kwargs["routed_experts"] = replay
        with torch.no_grad():
            outputs = model.forward(rows.input_ids, rows.attention_mask, micro_batch_size=per, record_routing=record,
                                    **kwargs)
            model_output = self._model_output(rows, outputs, entropy=entropy)
            if record:
                model_output["routed_experts"] = rows.jagged(outputs["routed_experts"].to(torch.int16))
            losses, metrics = [], {}
            if loss_function is not None:
                loss, m = loss_function(model_output=model_output, data=data, dp_group=self._dp_group)
                losses.append(float(loss.detach().item()))
                append_to_dict(metrics, m)
        return {"model_output": model_output, "loss": losses, "metrics": metrics}

    def _infer_rows(self, data, rows):
        """Rows per inference micro-batch (a memory bound; the outputs do not depend on it)."""
        if tu.get_non_tensor_data(data=data, key="use_dynamic_bsz", default=True):
            budget = tu.get_non_tensor_data(data=data, key="max_token_len_per_gpu", default=None)
            budget = int(budget or _cfg(self.engine_config, "infer_max_token_len_per_gpu", 16384))
            return max(1, budget // max(rows.lengths))
        mbs = tu.get_non_tensor_data(data=data, key="micro_batch_size_per_gpu",
                                     default=_cfg(self.engine_config, "infer_micro_batch_size_per_gpu", None))
        return int(mbs) if mbs else None

    def train_batch(self, data: TensorDict, loss_function: Callable) -> Any:
        """One optimizer step on this dp rank's rows (verl dispatches each dp rank its share):
        `loss_function(model_output=, data=, dp_group=)` runs per micro-batch on the last pipeline
        stage with the micro-batch's rows of `data` (verl's own sft_loss / ppo_loss / value_loss),
        megadsl backpropagates it through the schedule, reduces the gradients over dp (verl's losses
        carry the dp size, as DDP's averaging expects), clips and steps. Returns verl's output: the
        micro-batches' losses and metrics, and grad_norm."""
        self._model()
        if self.trainer is None:
            raise RuntimeError("megadsl.verl: train_batch: the engine has no optimizer (forward_only: a reference)")
        if loss_function is None:
            raise ValueError("megadsl.verl: train_batch needs a loss function (TrainingWorker.set_loss_fn)")
        tu.maybe_fix_3d_position_ids(data)
        rows = Rows(data, loss_function)
        self._assign_counts(data, needed=True)
        entropy = bool(tu.get_non_tensor_data(data=data, key="calculate_entropy", default=False))
        dp = self.get_data_parallel_size()
        n = len(rows.lengths)
        batch = {"input_ids": rows.input_ids, "attention_mask": rows.attention_mask,
                 "_megadsl_row": torch.arange(n, dtype=torch.int64)}
        if not self.critic:
            batch["temperature"] = rows.temperature
        replay = self._replayed(rows)
        if replay is not None:
            batch["routed_experts"] = replay
        done = []

        def loss_fn(outputs, micro, counts):
            index = micro["_megadsl_row"].cpu()
            micro_data = tu.index_select_tensor_dict(data, index)
            mask = micro["attention_mask"].bool()
            model_output = self._model_output(rows, outputs, mask=mask, entropy=entropy)
            loss, metrics = loss_function(model_output=model_output, data=micro_data, dp_group=self._dp_group)
            done.append({"loss": float(loss.detach().item()), "metrics": metrics})
            return loss / dp  # verl's losses are scaled for DDP's mean over dp; megadsl sums over dp

        step = {"loss_fn": loss_fn, "dp_local": True}
        if tu.get_non_tensor_data(data=data, key="use_dynamic_bsz", default=_cfg(self.engine_config, "use_dynamic_bsz", True)):
            budget = tu.get_non_tensor_data(data=data, key="max_token_len_per_gpu", default=None)
            step["max_token_len"] = int(budget or _cfg(self.engine_config, "max_token_len_per_gpu", 16384))
            if step["max_token_len"] < max(rows.lengths):
                raise ValueError(f"megadsl.verl: max_token_len_per_gpu {step['max_token_len']} is below the batch's "
                                 f"longest sequence ({max(rows.lengths)} tokens); raise it")
            result = self.trainer.step(batch, min_microbatches=1, **step)  # verl's engines set no minimum
        else:
            mbs = tu.get_non_tensor_data(data=data, key="micro_batch_size_per_gpu",
                                         default=_cfg(self.engine_config, "micro_batch_size_per_gpu", None))
            mbs = int(mbs) if mbs else n
            if n % mbs != 0:
                raise ValueError(f"megadsl.verl: this dp rank's {n} rows are not a multiple of micro_batch_size_per_gpu "
                                 f"{mbs}")
            result = self.trainer.step(batch, n // mbs, **step)
        metrics = {}
        for d in done:
            append_to_dict(metrics, d["metrics"])
        if self.is_mp_src_rank_with_outputs():
            metrics["grad_norm"] = result["grad_norm"]
        if result.get("moe_aux_loss"):
            metrics[("critic" if self.critic else "actor") + "/moe_aux_loss"] = result["moe_aux_loss"]
        return {"model_output": {}, "loss": [d["loss"] for d in done], "metrics": metrics,
                "skipped": result["skipped"]}

    # ---- weights to the rollout engine ------------------------------------------------------

    def get_per_tensor_param(self, base_sync_done=False, **kwargs):
        """(HF name, full tensor) in HF's layout and export_dtype, streamed in buckets (every rank
        iterates it in step: a collective) — the tensors save_hf writes, bit for bit.

        With LoRA, as verl's FSDP engine sends them: model.lora.merge the merged weights (W + s B A);
        else the base first (base_sync_done false; an adapted projection's weight under
        "<module>.base_layer.weight", as vLLM's LoRA model names it), then the adapters alone under
        PEFT's names with their LoraConfig as a dict."""
        model = self._model()
        dtype = _cfg(self.engine_config, "export_dtype", "bf16")
        bucket = float(_cfg(self.engine_config, "export_bucket_mb", 512.0))
        if self.lora is None:
            return model.export_weights(dtype=dtype, bucket_mb=bucket), None
        if self.lora_merge:
            return model.export_weights(dtype=dtype, bucket_mb=bucket, merge_lora=True), None
        # verl asks for the adapters first (base_sync_done=True, held), then for the base on its
        # first sync: the adapted modules' names come from that export, not a second gather.
        if base_sync_done:
            adapters = model.export_lora()
            self._adapted = {name[len("base_model.model."):-len(".lora_A.weight")] for name, _ in adapters
                             if name.endswith(".lora_A.weight")}
            return iter(adapters), model.lora_config
        if getattr(self, "_adapted", None) is None:
            self.get_per_tensor_param(base_sync_done=True)
        adapted = self._adapted

        def base():
            for name, t in model.export_weights(dtype=dtype, bucket_mb=bucket, merge_lora=False):
                module, _, leaf = name.rpartition(".")
                if leaf in ("weight", "bias") and (module in adapted or module.endswith(VLLM_WRAPPED)):
                    name = f"{module}.base_layer.{leaf}"
                yield name, t

        return base(), model.lora_config

    def get_per_tensor_param_shard(self, **kwargs):
        """Each HF tensor's slice for this rank's tp rank (gathered over pp and ep), with verl's
        ShardSpec: a block of the full tensor gathered over this rank's tp group, contributed by
        the tp group of the first dp replica's first pipeline stage (a tensor whole on every
        rank: by rank 0). A tensor whose tp slices are not a partition into equal blocks (kv heads
        fewer than tp) is refused."""
        from verl.workers.engine.spec import BlockPlacement, ShardSpec

        if self.lora is not None:
            raise NotImplementedError("megadsl.verl: get_per_tensor_param_shard with LoRA: the sharded export sends base "
                                      "weights only (as verl's FSDP engine); use get_per_tensor_param, which ships the "
                                      "adapters or merged weights (model.lora.merge)")
        model = self._model()
        tp = model.layout.tp
        if getattr(self, "_full_shapes", None) is None:  # once: the HF shapes, from a full export
            self._full_shapes = {name: tuple(t.shape) for name, t in model.export_weights(dtype="bf16", bucket_mb=64.0)}
        full = self._full_shapes
        group = self._tp_group
        dtype = _cfg(self.engine_config, "export_dtype", "bf16")
        bucket = float(_cfg(self.engine_config, "export_bucket_mb", 512.0))

        def gen():
            for name, local in model.export_weights(dtype=dtype, bucket_mb=bucket, shard_tp=tp, shard_rank=model.tp_rank):
                shape = full[name]
                split = [d for d, (a, b) in enumerate(zip(local.shape, shape)) if a != b]
                if not split:  # whole on every rank: the first rank contributes it
                    spec = ShardSpec(full_shape=shape, place=0, gather_group=None, contributes=model.rank == 0)
                else:
                    d = split[0]
                    if len(split) > 1 or local.shape[d] * tp != shape[d]:
                        raise ValueError(f"megadsl.verl: {name}'s tp slices {tuple(local.shape)} of {shape} at tp {tp} "
                                         "are not equal blocks (kv heads fewer than tp are replicated); use "
                                         "get_per_tensor_param")
                    offset = tuple(local.shape[d] * model.tp_rank if i == d else 0 for i in range(len(shape)))
                    spec = ShardSpec(full_shape=shape,
                                     place=BlockPlacement(local_shape=tuple(local.shape), global_offset=offset, full_shape=shape),
                                     gather_group=group, contributes=model.dp_rank == 0 and model.pp_rank == 0)
                yield name, local.reshape(-1), spec

        return gen(), None

    # ---- memory between phases -------------------------------------------------------------

    def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True):
        """"cpu": moves the parameters (and gradients with grad) and/or the optimizer state to host
        memory; any other device brings them back (megadsl's offload: the same tensors return)."""
        super().to(device=device, model=model, optimizer=optimizer, grad=grad)
        self._model()
        if device == "cpu":
            if model:
                self.model.offload(parameters=True, gradients=grad)
            if optimizer and self.trainer is not None:
                self.trainer.offload()
        else:
            self._reload(optimizer=optimizer, model=model)

    def _reload(self, optimizer=True, model=True):
        if model:
            self._model().reload()
        if optimizer and self.trainer is not None:
            self.trainer.reload()

    def _offload_as_configured(self):
        grads = bool(_cfg(self.engine_config, "grad_offload", False))
        if self.is_param_offload_enabled or grads:
            self._model().offload(parameters=self.is_param_offload_enabled,
                                  gradients=self.is_param_offload_enabled or grads)
        if self.is_optimizer_offload_enabled and self.trainer is not None:
            self.trainer.offload()

    # ---- checkpoints -----------------------------------------------------------------------

    def save_checkpoint(self, local_path: str, hdfs_path: Optional[str] = None, global_step: int = 0,
                        max_ckpt_to_keep: Optional[int] = None, **kwargs) -> None:
        """What checkpoint.save_contents names, in `local_path`: "model" the parameters as megadsl's
        layout-independent distributed checkpoint (local_path/megadsl, loadable at any layout),
        "optimizer" AdamW's state in it, "extra" the schedule (megadsl_engine.json), "hf_model" the
        HF checkpoint (local_path/huggingface). Keeps the newest max_ckpt_to_keep checkpoints this
        engine saved. Each part is written atomically."""
        if hdfs_path is not None:
            raise ValueError("megadsl.verl: hdfs_path is not supported; copy local_path yourself")
        model = self._model()
        contents = self._save_contents
        with self._reloaded():
            os.makedirs(local_path, exist_ok=True)
            if "model" in contents:  # with LoRA, the adapters and their moments too (megadsl/lora, PEFT's format)
                model.save_distributed(os.path.join(local_path, "megadsl"),
                                       trainer=self.trainer if "optimizer" in contents else None)
            if "hf_model" in contents:
                model.save_hf(os.path.join(local_path, "huggingface"),
                              **({"merge_lora": True} if self.lora is not None else {}))
        if model.rank == 0:
            state = {"global_step": int(global_step), "contents": contents}
            if "extra" in contents and self._scheduler is not None:
                state["scheduler"] = self._scheduler.state_dict()
            tmp = os.path.join(local_path, ".megadsl_engine.json.tmp")
            with open(tmp, "w") as f:
                json.dump(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, os.path.join(local_path, "megadsl_engine.json"))
        if dist.is_initialized():
            dist.barrier()
        if os.path.abspath(local_path) not in self._saved:
            self._saved.append(os.path.abspath(local_path))
        if max_ckpt_to_keep and max_ckpt_to_keep > 0:
            while len(self._saved) > max_ckpt_to_keep:
                old = self._saved.pop(0)
                if model.rank == 0:
                    shutil.rmtree(old, ignore_errors=True)

    def load_checkpoint(self, local_path: str, hdfs_path: Optional[str] = None, del_local_after_load: bool = True,
                        **kwargs) -> None:
        """Continues from save_checkpoint's directory, saved at any layout: what
        checkpoint.load_contents names of what it holds (the model, the optimizer, the schedule)."""
        if hdfs_path is not None:
            raise ValueError("megadsl.verl: hdfs_path is not supported; give the local copy")
        state_file = os.path.join(local_path, "megadsl_engine.json")
        if not os.path.isfile(state_file):
            raise ValueError(f"megadsl.verl: {local_path} is not a checkpoint of this engine (no megadsl_engine.json); "
                             "give a directory save_checkpoint wrote")
        with open(state_file) as f:
            state = json.load(f)
        saved = state.get("contents", ["model", "optimizer", "extra"])
        want = self._load_contents
        missing = [c for c in want if c in ("model", "optimizer", "extra") and c not in saved
                   and not (c == "extra" and self._scheduler is None)]
        if missing:
            raise ValueError(f"megadsl.verl: checkpoint.load_contents names {missing[0]}, which {local_path} does not "
                             f"hold (saved: {', '.join(saved)})")
        if "model" in want:
            with self._reloaded():
                self._model().load_distributed(os.path.join(local_path, "megadsl"),
                                               trainer=self.trainer if "optimizer" in want else None)
        if "extra" in want and self._scheduler is not None and state.get("scheduler") is not None:
            self._scheduler.load_state_dict(state["scheduler"])
            self._apply_schedule()

    @contextmanager
    def _reloaded(self):
        """Offloaded state back for the length of a save or load, offloaded again after it."""
        self._reload()
        try:
            yield
        finally:
            if self.mode is None:
                self._offload_as_configured()

    def _collective_device(self):
        return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(self._dp_group) == "nccl" \
            else torch.device("cpu")

    def _model(self):
        if self.model is None:
            raise RuntimeError("megadsl.verl: call engine.initialize() first (verl's TrainingWorker.reset does, after "
                               "setting total_training_steps)")
        return self.model


def _device_name():
    from verl.utils.device import get_device_name

    return get_device_name()
