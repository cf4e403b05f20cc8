"""The optimizer and learning-rate schedule verl's optimizer config asks for, with the semantics of
the engine verl would build for that config:

- FSDPOptimizerConfig (verl's FSDP engine): torch's AdamW over every parameter (weight decay on
  biases and norms too), verl's constant or cosine schedule with warmup;
- McoreOptimizerConfig (verl's Megatron engine): Megatron's decay rule (matrices only) and its
  OptimizerParamScheduler (constant, linear, cosine, inverse-square-root, WSD; warmup from
  lr_warmup_init), stepped once per lr_scheduler_step;
- the engine config's weight_decay_on ("all" / "matrices") over either.
"""

from __future__ import annotations

import warnings

import torch

from .. import _C

__all__ = ["adamw_options", "build_schedule"]


def _cfg(obj, name, default=None):
    """An option of a verl config object (a dataclass, an omegaconf node or a dict)."""
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(name, default)
    value = getattr(obj, name, default)
    return default if value is None else value


def is_megatron(oc):
    """An optimizer config of verl's Megatron engine (McoreOptimizerConfig, or its keys)."""
    return type(oc).__name__ == "McoreOptimizerConfig" or _cfg(oc, "lr_decay_style") is not None


def adamw_options(oc, engine_config):
    """Model.trainer's keywords for verl's optimizer config `oc`."""
    name = str(_cfg(oc, "optimizer", "AdamW")).lower()
    if name not in ("adamw", "adam"):
        raise ValueError(f"megadsl.verl: optimizer {_cfg(oc, 'optimizer')!r} is not supported; megadsl trains with "
                         "AdamW (optim.optimizer: AdamW, or adam for McoreOptimizerConfig)")
    impl = _cfg(oc, "optimizer_impl", "torch.optim")
    if impl != "torch.optim":
        raise ValueError(f"megadsl.verl: optimizer_impl {impl!r} is not supported; megadsl's AdamW is torch's "
                         "(optim.optimizer_impl: torch.optim)")
    if _cfg(oc, "use_precision_aware_optimizer", False):
        raise ValueError("megadsl.verl: use_precision_aware_optimizer is not supported; megadsl keeps fp32 moments")
    betas = tuple(_cfg(oc, "betas", (0.9, 0.999)))
    override = dict(_cfg(oc, "override_optimizer_config", None) or {})
    unknown = sorted(set(override) - {"eps", "betas", "weight_decay", "lr"})
    if unknown:
        raise ValueError(f"megadsl.verl: override_optimizer_config key {unknown[0]!r} is not supported (megadsl's "
                         "AdamW takes eps, betas, weight_decay, lr)")
    betas = tuple(override.get("betas", betas))
    clip = _cfg(oc, "clip_grad", 1.0)
    scope = _cfg(engine_config, "weight_decay_on", None) or ("matrices" if is_megatron(oc) else "all")
    return dict(lr=float(override.get("lr", _cfg(oc, "lr", 1e-6))),
                weight_decay=float(override.get("weight_decay", _cfg(oc, "weight_decay", 0.01))),
                weight_decay_on=scope, beta1=float(betas[0]), beta2=float(betas[1]),
                eps=float(override.get("eps", 1e-8)), clip_grad=float(clip) if clip is not None else 0.0,
                use_distributed_optimizer=bool(_cfg(engine_config, "use_distributed_optimizer", True)))


class MegatronSchedule:
    """verl's Megatron engine's schedule (get_megatron_optimizer_param_scheduler): Megatron's
    OptimizerParamScheduler in optimizer steps, decaying over lr_decay_steps (default
    total_training_steps), warmup lr_warmup_steps (or lr_warmup_steps_ratio of the decay)."""

    def __init__(self, oc):
        total = int(_cfg(oc, "total_training_steps", -1))
        decay = _cfg(oc, "lr_decay_steps", None)
        decay = int(decay) if decay is not None else total
        if decay <= 0:
            raise ValueError("megadsl.verl: Megatron's schedule needs optim.total_training_steps (or lr_decay_steps) "
                             "> 0; verl's trainers set it before initialize()")
        warmup = _cfg(oc, "lr_warmup_steps", -1)
        if warmup is None or warmup <= 0:
            warmup = int(float(_cfg(oc, "lr_warmup_steps_ratio", 0.0)) * decay)
        wd = float(_cfg(oc, "weight_decay", 0.01))
        style = str(_cfg(oc, "lr_decay_style", "constant"))
        if _cfg(oc, "use_checkpoint_opt_param_scheduler", False):
            raise ValueError("megadsl.verl: use_checkpoint_opt_param_scheduler is not supported; the schedule "
                             "continues from the engine's checkpoint with the config's values")
        self.s = _C.LrScheduler(max_lr=float(_cfg(oc, "lr", 1e-6)), min_lr=float(_cfg(oc, "min_lr", 0.0)),
                                init_lr=float(_cfg(oc, "lr_warmup_init", 0.0)), lr_warmup_steps=float(warmup),
                                lr_decay_steps=decay, lr_decay_style=style,
                                wsd_decay_steps=int(_cfg(oc, "lr_wsd_decay_steps", 0) or 0),
                                lr_wsd_decay_style=str(_cfg(oc, "lr_wsd_decay_style", "exponential")),
                                start_wd=wd, end_wd=wd, wd_incr_steps=max(total, 1),
                                wd_incr_style=str(_cfg(oc, "weight_decay_incr_style", "constant")))

    def step(self):
        self.s.step(1)

    def get_last_lr(self):
        return [self.s.lr]

    @property
    def weight_decay(self):
        return self.s.weight_decay

    def state_dict(self):
        return {"megatron": self.s.state_dict()}

    def load_state_dict(self, state):
        if "megatron" not in state:
            raise ValueError("megadsl.verl: the checkpoint's schedule is verl's (FSDP) one, this engine's optimizer "
                             "config Megatron's; resume with the optimizer config it was saved with")
        self.s.load_state_dict(state["megatron"])


class VerlSchedule:
    """verl's FSDP engine's schedules: constant or cosine with warmup, on a torch scheduler of a
    placeholder optimizer (the engine takes the rate from it before each step)."""

    def __init__(self, oc):
        from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

        style = _cfg(oc, "lr_scheduler_type", None) or _cfg(oc, "warmup_style", None) or "constant"
        total = int(_cfg(oc, "total_training_steps", -1))
        warmup = _cfg(oc, "lr_warmup_steps", -1)
        warmup = int(warmup) if warmup is not None else -1
        if warmup <= 0:
            warmup = int(float(_cfg(oc, "lr_warmup_steps_ratio", 0.0)) * total)
        holder = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=float(_cfg(oc, "lr", 1e-6)))
        if style == "constant":
            self.s = get_constant_schedule_with_warmup(optimizer=holder, num_warmup_steps=warmup)
        elif style == "cosine":
            if total <= 0:
                raise ValueError("megadsl.verl: the cosine schedule needs optim.total_training_steps > 0; verl's "
                                 "trainers set it before initialize()")
            self.s = get_cosine_schedule_with_warmup(
                optimizer=holder, num_warmup_steps=warmup, num_training_steps=total,
                min_lr_ratio=_cfg(oc, "min_lr_ratio", 0.0) or 0.0, num_cycles=float(_cfg(oc, "num_cycles", 0.5)),
                zero_indexed_step=bool(_cfg(oc, "zero_indexed_step", True)))
        else:
            raise ValueError(f"megadsl.verl: lr_scheduler_type {style!r} is not supported; use \"constant\" or "
                             "\"cosine\" (or McoreOptimizerConfig's lr_decay_style for Megatron's schedules)")
        self.weight_decay = None  # constant: the optimizer's own

    def step(self):
        with warnings.catch_warnings():  # the placeholder optimizer never steps: torch warns of the order
            warnings.simplefilter("ignore", UserWarning)
            self.s.step()

    def get_last_lr(self):
        return self.s.get_last_lr()

    def state_dict(self):
        return {"verl": self.s.state_dict()}

    def load_state_dict(self, state):
        if "megatron" in state:
            raise ValueError("megadsl.verl: the checkpoint's schedule is Megatron's, this engine's optimizer config "
                             "verl's FSDP one; resume with the optimizer config it was saved with")
        self.s.load_state_dict(state.get("verl", state))  # (engines before 0.1.1 saved the torch state bare)


def build_schedule(oc):
    return MegatronSchedule(oc) if is_megatron(oc) else VerlSchedule(oc)
