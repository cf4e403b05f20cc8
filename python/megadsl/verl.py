"""megadsl as a verl engine: verl 0.9's ``BaseEngine`` behind ``EngineRegistry`` (backend "megadsl").

    import megadsl.verl      # registers the engines: language_model and value_model, on cuda and cpu

    engine = EngineRegistry.new(model_type="language_model", backend="megadsl",
                                model_config=HFModelConfig(path=...),
                                engine_config=megadsl.verl.MegadslEngineConfig(tensor_model_parallel_size=2,
                                                                               pipeline_model_parallel_size=2),
                                optimizer_config=FSDPOptimizerConfig(lr=1e-6, lr_scheduler_type="cosine", ...),
                                checkpoint_config=CheckpointConfig())
    engine.initialize()
    with engine.train_mode():
        out = engine.train_batch(data, loss_function=partial(ppo_loss, config=actor_config))
        lr = engine.lr_scheduler_step()

It takes verl's batches as verl's trainer hands them to an engine (TensorDicts in the no-padding
format: nested input_ids / position_ids, padded response fields) and runs verl's own loss functions
(``verl.workers.utils.losses.ppo_loss``, ``value_loss`` or any with their signature) per
micro-batch on the last pipeline stage, through megadsl's pipelined schedule at any tp / pp / vpp /
sp / ep and dp, padded or remove-padding. verl is needed only here (``import megadsl`` does not
import it).

The process groups: verl's workers start ``torch.distributed`` first; the engine then joins
megadsl's own job over the same ranks (a rendezvous on a port rank 0 publishes through torch's
store), and gives verl torch process groups of its data-parallel ranks
(``get_data_parallel_group``). A job megadsl.init() joined already is used as it is.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from tensordict import TensorDict
from verl.base_config import BaseConfig
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.dataset_utils import DatasetPadMode
from verl.utils.py_functional import append_to_dict
from verl.workers.engine.base import BaseEngine, EngineRegistry

import megadsl

from . import _C

__all__ = ["MegadslEngineConfig", "MegadslEngine", "MegadslEngineWithLMHead", "MegadslEngineWithValueHead"]


@dataclass
class MegadslEngineConfig(BaseConfig):
    """The engine's layout and run options, under the names of verl's Megatron engine config where
    one exists (``tensor_model_parallel_size``, ...), so ``actor.megatron``-style settings carry over.

    dtype: the compute dtype ("fp32", or "bf16" over fp32 parameters and optimizer).
    recompute: None, "selective" (the attention core) or "full" (each layer).
    export_dtype: the dtype of get_per_tensor_param's tensors (the rollout engine's weights).
    """

    _mutable_fields = {"use_remove_padding", "use_fused_kernels", "use_dynamic_bsz", "max_token_len_per_gpu",
                       "micro_batch_size_per_gpu", "infer_max_token_len_per_gpu", "infer_micro_batch_size_per_gpu",
                       "forward_only", "param_offload", "grad_offload", "optimizer_offload"}

    strategy: str = "megadsl"
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: Optional[int] = None
    sequence_parallel: bool = False
    expert_model_parallel_size: int = 1
    context_parallel_size: int = 1
    recompute: Optional[str] = None
    dtype: str = "fp32"
    use_distributed_optimizer: bool = True
    param_offload: bool = False
    grad_offload: bool = False
    optimizer_offload: bool = False
    use_remove_padding: bool = True
    use_fused_kernels: bool = False
    use_dynamic_bsz: bool = True
    max_token_len_per_gpu: int = 16384
    micro_batch_size_per_gpu: Optional[int] = None
    infer_max_token_len_per_gpu: int = 16384
    infer_micro_batch_size_per_gpu: Optional[int] = None
    forward_only: bool = False
    seed: int = 42
    moe_aux_loss_coeff: float = 0.0
    moe_z_loss_coeff: float = 0.0
    moe_router_bias_update_rate: float = 1e-3  # Megatron's: the expert bias balancing (0: off)
    export_dtype: str = "bf16"
    export_bucket_mb: float = 512.0
    timeout: Optional[float] = None


def _cfg(obj, name, default=None):
    """An option of a verl config object (a dataclass, an omegaconf node or a dict)."""
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(name, default)
    value = getattr(obj, name, default)
    return default if value is None else value


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def join_torch_job(timeout=None):
    """Joins megadsl to the job torch.distributed runs (its ranks and world size): rank 0 picks a
    free port for megadsl's rendezvous and publishes it through torch's store. Does nothing when
    megadsl has joined a job already; without torch.distributed, megadsl.init() from the launcher's
    environment, or nothing (a world of one process) when there is none."""
    if _C.is_initialized():
        return
    if not dist.is_available() or not dist.is_initialized():
        if any(os.environ.get(k) for k in ("RANK", "SLURM_PROCID")):
            megadsl.init(timeout=timeout)  # a launcher's job without torch.distributed
        return  # else a world of one process
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    key = "megadsl/rendezvous_port"
    if rank == 0:
        store.set(key, str(_free_port()))
    port = int(store.get(key).decode())
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    _C._init(rank, world, local_rank, local_world, addr, port, timeout)


def _nested(values, lengths):
    """A (rows, jagged) nested tensor of `values` (sum(lengths), ...) (autograd flows through it)."""
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64, device=values.device)
    offsets[1:] = torch.as_tensor(lengths, device=values.device).cumsum(0)
    return torch.nested.nested_tensor_from_jagged(values, offsets)


class _Rows:
    """A verl no-padding batch as the rows megadsl takes: input_ids right-padded (b, s) with their
    attention_mask, the lengths, each row's temperature and a replayed routing."""

    def __init__(self, data: TensorDict):
        pad_mode = tu.get_non_tensor_data(data=data, key="pad_mode", default=DatasetPadMode.NO_PADDING)
        if pad_mode != DatasetPadMode.NO_PADDING:
            raise ValueError(f"megadsl.verl: pad_mode {pad_mode} is not supported; the engine takes verl's "
                             "no-padding batches (left_right_2_no_padding), as verl's trainer hands them to engines")
        ids = data["input_ids"]
        if not ids.is_nested:
            raise ValueError("megadsl.verl: input_ids must be a jagged nested tensor (verl's no-padding format), "
                             f"got a dense tensor of shape {tuple(ids.shape)}")
        self.lengths = ids.offsets().diff().tolist()
        rows, longest = len(self.lengths), max(self.lengths)
        self.input_ids = ids.to_padded_tensor(0, output_size=(rows, longest)).to(torch.int64)
        self.attention_mask = (torch.arange(longest).unsqueeze(0) < torch.tensor(self.lengths).unsqueeze(1)).to(
            torch.int64)
        if "position_ids" in data.keys():
            pos = data["position_ids"]
            if pos.dim() == 3:
                raise ValueError("megadsl.verl: 3-D position_ids (multimodal RoPE) are not supported: megadsl's "
                                 "families are text models")
            values = pos.values() if pos.is_nested else pos[self.attention_mask.bool()]
            expect = torch.cat([torch.arange(n) for n in self.lengths]).to(values.device)
            if not torch.equal(values.to(torch.int64), expect):
                raise ValueError("megadsl.verl: position_ids are not 0, 1, ..., n-1 in each sequence; megadsl "
                                 "derives the positions from each sequence's tokens (no offsets or packing in a row)")
        t = tu.get(data, "temperature", 1.0)
        if isinstance(t, torch.Tensor) and t.numel() == rows and t.dim() == 1:
            self.temperature = t.to(torch.float32).cpu()
        else:
            value = float(t.item()) if isinstance(t, torch.Tensor) else float(t)
            self.temperature = torch.full((rows,), value, dtype=torch.float32)
        self.routed_experts = None
        if "routed_experts" in data.keys():
            r = data["routed_experts"]
            if r.is_nested:
                r = r.to_padded_tensor(-1, output_size=(rows, longest, *r.shape[2:]))
            self.routed_experts = r.to(torch.int64)
        self.mask = self.attention_mask.bool()

    def jagged(self, padded, mask=None):
        """(b, s, ...) padded per-token outputs as verl's (b, jagged) nested tensor."""
        mask = self.mask if mask is None else mask
        return _nested(padded[mask.to(padded.device)], mask.sum(1).tolist())


class _ModeContext:
    """train_mode / eval_mode: brings offloaded state back on entry and offloads it again on exit,
    as the engine config asks (verl's BaseEngineCtx, with megadsl's offload)."""

    def __init__(self, engine, mode, disable_auto_offload=False, **_):
        self.engine, self.mode, self.disable = engine, mode, disable_auto_offload

    def __enter__(self):
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
        self.model_config = model_config
        self.engine_config = engine_config if engine_config is not None else MegadslEngineConfig()
        self.optimizer_config = optimizer_config
        self.checkpoint_config = checkpoint_config
        self.mode = None
        self.model = None
        self.trainer = None
        self._scheduler = None
        self._saved = []
        path = _cfg(model_config, "local_path") or _cfg(model_config, "path")
        if path is None:
            raise ValueError("megadsl.verl: model_config has no local_path or path (the HF checkpoint directory)")
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            raise ValueError(f"megadsl.verl: {self.path} is not a directory; model_config.local_path is the HF "
                             "checkpoint directory megadsl loads (download it first)")
        self.use_remove_padding = bool(_cfg(model_config, "use_remove_padding",
                                            _cfg(self.engine_config, "use_remove_padding", True)))
        if int(_cfg(model_config, "lora_rank", 0) or 0) > 0:
            raise ValueError("megadsl.verl: LoRA (model_config.lora_rank > 0) is not supported; megadsl trains all "
                             "parameters")

    # ---- set-up ----------------------------------------------------------------------------

    def initialize(self):
        """Loads the HF checkpoint into the layout on every rank, builds AdamW (megadsl's, with the
        distributed optimizer unless use_distributed_optimizer is off) and the LR scheduler."""
        if self.model is not None:
            return
        ec = self.engine_config
        join_torch_job(timeout=_cfg(ec, "timeout"))
        device = "cuda" if torch.cuda.is_available() and _device_name() == "cuda" else "cpu"
        vpp = _cfg(ec, "virtual_pipeline_model_parallel_size", 1) or 1
        self.model = megadsl.Model.from_hf(
            self.path, tp=int(_cfg(ec, "tensor_model_parallel_size", 1)),
            pp=int(_cfg(ec, "pipeline_model_parallel_size", 1)), vpp=int(vpp),
            sp=bool(_cfg(ec, "sequence_parallel", False)), rmpad=self.use_remove_padding,
            ep=int(_cfg(ec, "expert_model_parallel_size", 1)), cp=int(_cfg(ec, "context_parallel_size", 1) or 1),
            recompute=_cfg(ec, "recompute", None), critic=self.critic, dtype=_cfg(ec, "dtype", "fp32"),
            device=device, seed=int(_cfg(ec, "seed", 42)),
            moe_aux_loss_coeff=float(_cfg(ec, "moe_aux_loss_coeff", 0.0)),
            moe_z_loss_coeff=float(_cfg(ec, "moe_z_loss_coeff", 0.0)),
            moe_expert_bias_update_rate=float(_cfg(ec, "moe_router_bias_update_rate", 1e-3)))
        self._build_groups()
        if not _cfg(ec, "forward_only", False):
            self.trainer = self.model.trainer(**self._adamw_options())
            self._scheduler = self._build_scheduler()
            self.trainer.lr = self._scheduler.get_last_lr()[0]
        self._offload_as_configured()

    def _adamw_options(self):
        oc = self.optimizer_config
        name = str(_cfg(oc, "optimizer", "AdamW")).lower()
        if name not in ("adamw", "adam"):
            raise ValueError(f"megadsl.verl: optimizer {_cfg(oc, 'optimizer')!r} is not supported; megadsl trains "
                             "with AdamW (Megatron's: no weight decay on biases and norms)")
        betas = tuple(_cfg(oc, "betas", (0.9, 0.999)))
        override = dict(_cfg(oc, "override_optimizer_config", None) or {})
        clip = _cfg(oc, "clip_grad", 1.0)
        return dict(lr=float(_cfg(oc, "lr", 1e-6)), weight_decay=float(_cfg(oc, "weight_decay", 0.01)),
                    beta1=float(betas[0]), beta2=float(betas[1]), eps=float(override.get("eps", 1e-8)),
                    clip_grad=float(clip) if clip is not None else 0.0,
                    use_distributed_optimizer=bool(_cfg(self.engine_config, "use_distributed_optimizer", True)))

    def _build_scheduler(self):
        """verl's schedules (its FSDP engine's): constant or cosine with warmup, stepped by
        lr_scheduler_step; the trainer takes the rate from it."""
        from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

        oc = self.optimizer_config
        style = _cfg(oc, "lr_scheduler_type", None) or _cfg(oc, "warmup_style", None)
        decay_style = _cfg(oc, "lr_decay_style", None)
        if style is None and decay_style not in (None, "constant"):
            raise ValueError(f"megadsl.verl: lr_decay_style {decay_style!r} (Megatron's scheduler options) is not "
                             "read by the engine; give lr_scheduler_type \"constant\" or \"cosine\" with "
                             "lr_warmup_steps / lr_warmup_steps_ratio, min_lr_ratio, num_cycles (verl's schedules)")
        style = style or "constant"
        total = int(_cfg(oc, "total_training_steps", -1))
        warmup = int(_cfg(oc, "lr_warmup_steps", -1) if _cfg(oc, "lr_warmup_steps", -1) is not None else -1)
        if warmup <= 0:
            warmup = int(float(_cfg(oc, "lr_warmup_steps_ratio", 0.0)) * total)
        holder = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=float(_cfg(oc, "lr", 1e-6)))
        if style == "constant":
            return get_constant_schedule_with_warmup(optimizer=holder, num_warmup_steps=warmup)
        if style == "cosine":
            if total <= 0:
                raise ValueError("megadsl.verl: the cosine schedule needs optimizer_config.total_training_steps > 0")
            return get_cosine_schedule_with_warmup(
                optimizer=holder, num_warmup_steps=warmup, num_training_steps=total,
                min_lr_ratio=_cfg(oc, "min_lr_ratio", 0.0) or 0.0, num_cycles=float(_cfg(oc, "num_cycles", 0.5)),
                zero_indexed_step=bool(_cfg(oc, "zero_indexed_step", True)))
        raise ValueError(f"megadsl.verl: lr_scheduler_type {style!r} is not supported; use \"constant\" or \"cosine\"")

    def _build_groups(self):
        """torch process groups for verl: the dp groups (the ranks that hold the same model part,
        same tp, cp and pp: verl all-reduces losses and counts over them; the cp ranks of a replica
        see the same data) and the tp groups (a shard export's gather groups). Every rank creates
        every group, in the same order."""
        m = self.model
        self._dp_group = self._tp_group = None
        if not dist.is_initialized():
            return
        coords = [None] * dist.get_world_size()  # (tp, pp, dp, cp) of every rank
        dist.all_gather_object(coords, (m.tp_rank, m.pp_rank, m.dp_rank, m.cp_rank))

        def group_of(key, order):
            """This rank's group among those of the ranks with equal key(coords), ordered by order."""
            members = {}
            for rank, c in enumerate(coords):
                members.setdefault(key(c), []).append((order(c), rank))
            mine = None
            for k in sorted(members):
                g = dist.new_group([r for _, r in sorted(members[k])])
                if k == key(coords[dist.get_rank()]):
                    mine = g
            return mine

        self._dp_group = group_of(lambda c: (c[0], c[1], c[3]), lambda c: c[2])
        self._tp_group = group_of(lambda c: (c[1], c[2], c[3]), lambda c: c[0])

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
        return self._model().dp_rank

    def get_data_parallel_size(self):
        return self._model().dp_size

    def get_data_parallel_group(self):
        self._model()
        return self._dp_group

    def is_mp_src_rank_with_outputs(self):
        m = self._model()
        return m.tp_rank == 0 and m.cp_rank == 0 and m.pp_rank == m.layout.pp - 1

    def optimizer_zero_grad(self):
        """Nothing to do: each megadsl step starts from zero gradients."""

    def optimizer_step(self):
        raise NotImplementedError(
            "megadsl.verl: the optimizer step runs inside train_batch (megadsl's step pipelines the forward and "
            "backward of all micro-batches and then updates); call train_batch, not forward_backward_batch + "
            "optimizer_step")

    def lr_scheduler_step(self):
        """Advances verl's schedule one step; the next train_batch uses its rate. Returns the rate."""
        if self._scheduler is None:
            raise RuntimeError("megadsl.verl: the engine has no optimizer (forward_only, or not initialized)")
        self._scheduler.step()
        lr = self._scheduler.get_last_lr()[0]
        self.trainer.lr = lr
        return lr

    def _assign_counts(self, data: TensorDict):
        """What verl's loss functions normalise by: the dp-global loss tokens and the dp size."""
        if "loss_mask" in data.keys():
            mask = data["loss_mask"]
            tokens = (mask.values() if mask.is_nested else mask).sum().to(torch.float64).reshape(1)
            if self._dp_group is not None and self.get_data_parallel_size() > 1:
                tokens = tokens.to(self._collective_device())  # NCCL's groups take device tensors
                dist.all_reduce(tokens, op=dist.ReduceOp.SUM, group=self._dp_group)
            tu.assign_non_tensor(data, batch_num_tokens=int(tokens.item()))
        tu.assign_non_tensor(data, dp_size=self.get_data_parallel_size())
        if "global_batch_size" not in data.keys():
            tu.assign_non_tensor(data, global_batch_size=None)

    def _model_output(self, rows: _Rows, outputs: dict, mask=None, entropy=False):
        if self.critic:
            return {"values": rows.jagged(outputs["values"], mask)}
        out = {"log_probs": rows.jagged(outputs["log_probs"], mask)}
        if entropy and "entropy" in outputs:
            out["entropy"] = rows.jagged(outputs["entropy"], mask)
        return out

    def forward_backward_batch(self, data: TensorDict, loss_function: Callable, forward_only=False) -> Any:
        """Forward only (log-probs, entropy or values of every row, and the loss when one is given):
        verl's compute_log_prob / compute_values. Training runs through train_batch."""
        if not forward_only:
            raise NotImplementedError(
                "megadsl.verl: training runs through train_batch (one pipelined step: forward and backward of every "
                "micro-batch, then the optimizer); forward_backward_batch takes forward_only=True")
        model = self._model()
        self._assign_counts(data)
        rows = _Rows(data)
        entropy = bool(tu.get_non_tensor_data(data=data, key="calculate_entropy", default=False))
        per = self._infer_rows(data, rows)
        kwargs = {} if self.critic else {"temperature": rows.temperature, "entropy": entropy}
        if rows.routed_experts is not None:
            kwargs["routed_experts"] = rows.routed_experts
        with torch.no_grad():
            outputs = model.forward(rows.input_ids, rows.attention_mask, micro_batch_size=per, **kwargs)
            model_output = self._model_output(rows, outputs, entropy=entropy)
            losses, metrics = [], {}
            if loss_function is not None:
                loss, m = loss_function(model_output=model_output, data=data, dp_group=self._dp_group)
                losses.append(float(loss.detach().item()))
                append_to_dict(metrics, m)
        return {"model_output": model_output, "loss": losses, "metrics": metrics}

    def _infer_rows(self, data, rows):
        """Rows per inference micro-batch (a memory bound; the outputs do not depend on it)."""
        if tu.get_non_tensor_data(data=data, key="use_dynamic_bsz", default=True):
            budget = int(tu.get_non_tensor_data(data=data, key="max_token_len_per_gpu",
                                                default=_cfg(self.engine_config, "infer_max_token_len_per_gpu", 16384)))
            return max(1, budget // max(rows.lengths))
        mbs = tu.get_non_tensor_data(data=data, key="micro_batch_size_per_gpu",
                                     default=_cfg(self.engine_config, "infer_micro_batch_size_per_gpu", None))
        return int(mbs) if mbs else None

    def train_batch(self, data: TensorDict, loss_function: Callable) -> Any:
        """One optimizer step on this dp rank's rows (verl dispatches each dp rank its share):
        `loss_function(model_output=, data=, dp_group=)` runs per micro-batch on the last pipeline
        stage with the micro-batch's rows of `data` (verl's own ppo_loss / value_loss), megadsl
        backpropagates it through the schedule, reduces the gradients over dp (verl's losses carry
        the dp size, as DDP's averaging expects), clips and steps. Returns verl's output: the
        micro-batches' losses and metrics, and grad_norm."""
        if self.trainer is None:
            raise RuntimeError("megadsl.verl: the engine has no optimizer (forward_only, or not initialized)")
        tu.maybe_fix_3d_position_ids(data)
        self._assign_counts(data)
        rows = _Rows(data)
        entropy = bool(tu.get_non_tensor_data(data=data, key="calculate_entropy", default=False))
        dp = self.get_data_parallel_size()
        n = len(rows.lengths)
        batch = {"input_ids": rows.input_ids, "attention_mask": rows.attention_mask,
                 "_megadsl_row": torch.arange(n, dtype=torch.int64)}
        if not self.critic:
            batch["temperature"] = rows.temperature
        if rows.routed_experts is not None:
            batch["routed_experts"] = rows.routed_experts
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
            step["max_token_len"] = int(tu.get_non_tensor_data(
                data=data, key="max_token_len_per_gpu", default=_cfg(self.engine_config, "max_token_len_per_gpu", 16384)))
            result = self.trainer.step(batch, **step)
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

    def get_per_tensor_param(self, **kwargs):
        """(HF name, full tensor) in HF's layout and export_dtype, streamed in buckets (every rank
        iterates it in step: a collective) — the tensors save_hf writes, bit for bit."""
        gen = self._model().export_weights(dtype=_cfg(self.engine_config, "export_dtype", "bf16"),
                                           bucket_mb=float(_cfg(self.engine_config, "export_bucket_mb", 512.0)))
        return gen, None

    def get_per_tensor_param_shard(self, **kwargs):
        """Each HF tensor's slice for this rank's tp rank (gathered over pp and ep), with verl's
        ShardSpec: a block of the full tensor gathered over this rank's tp group, contributed by
        the tp group of the first dp replica's first pipeline stage (a tensor whole on every
        rank: by rank 0). A tensor whose tp slices are not a partition into equal blocks (kv heads
        fewer than tp) is refused."""
        from verl.workers.engine.spec import BlockPlacement, ShardSpec

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
        if device == "cpu":
            if model:
                self._model().offload(parameters=True, gradients=grad)
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
        if self.is_param_offload_enabled or _cfg(self.engine_config, "grad_offload", False):
            self._model().offload(parameters=self.is_param_offload_enabled,
                                  gradients=self.is_param_offload_enabled or bool(_cfg(self.engine_config, "grad_offload", False)))
        if self.is_optimizer_offload_enabled and self.trainer is not None:
            self.trainer.offload()

    # ---- checkpoints -----------------------------------------------------------------------

    def save_checkpoint(self, local_path: str, hdfs_path: Optional[str] = None, global_step: int = 0,
                        max_ckpt_to_keep: Optional[int] = None, **kwargs) -> None:
        """A layout-independent distributed checkpoint (parameters, AdamW's state, the schedule) in
        `local_path`, loadable at any other layout; with checkpoint_config.save_contents naming
        "hf_model", also the HF checkpoint in `local_path/huggingface`. Keeps the newest
        max_ckpt_to_keep checkpoints this engine saved."""
        if hdfs_path is not None:
            raise ValueError("megadsl.verl: hdfs_path is not supported; copy local_path yourself")
        model = self._model()
        with self._reloaded():
            os.makedirs(local_path, exist_ok=True)
            model.save_distributed(os.path.join(local_path, "megadsl"), trainer=self.trainer)
            contents = list(_cfg(self.checkpoint_config, "save_contents", []) or [])
            if "hf_model" in contents:
                model.save_hf(os.path.join(local_path, "huggingface"))
        if model.rank == 0:
            state = {"global_step": int(global_step),
                     "scheduler": self._scheduler.state_dict() if self._scheduler is not None else None,
                     "lr": self.trainer.lr if self.trainer is not None else None}
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
        """Continues from save_checkpoint's directory, saved at any layout."""
        if hdfs_path is not None:
            raise ValueError("megadsl.verl: hdfs_path is not supported; give the local copy")
        state_file = os.path.join(local_path, "megadsl_engine.json")
        if not os.path.isfile(state_file):
            raise ValueError(f"megadsl.verl: {local_path} is not a checkpoint of this engine (no megadsl_engine.json); "
                             "give a directory save_checkpoint wrote")
        with self._reloaded():
            self._model().load_distributed(os.path.join(local_path, "megadsl"), trainer=self.trainer)
        with open(state_file) as f:
            state = json.load(f)
        if self._scheduler is not None and state.get("scheduler") is not None:
            self._scheduler.load_state_dict(state["scheduler"])
            self.trainer.lr = self._scheduler.get_last_lr()[0]

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
            raise RuntimeError("megadsl.verl: call engine.initialize() first")
        return self.model


def _device_name():
    from verl.utils.device import get_device_name

    return get_device_name()


@EngineRegistry.register(model_type="language_model", backend="megadsl", device=["cuda", "cpu"])
class MegadslEngineWithLMHead(MegadslEngine):
    """The actor (and reference): log-probs and entropy of the next token."""

    critic = False


@EngineRegistry.register(model_type="value_model", backend="megadsl", device=["cuda", "cpu"])
class MegadslEngineWithValueHead(MegadslEngine):
    """The critic: one value per token from the value head (HF's *ForTokenClassification score)."""

    critic = True
