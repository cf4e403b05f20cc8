"""megadsl: Transformer models whose parallel layout is part of their type, from Python.

A PyTorch C++ extension on the same LibTorch as ``import torch``: tensors go in and come out as
``torch.Tensor`` without copies.

    import megadsl
    ok, why = megadsl.check("llama3-8b", tp=3)          # (False, "heads_divisible_by_tp: ...")
    print(megadsl.describe("llama3-8b", tp=4))
    print(megadsl.plan("llama3-8b", tp=8, pp=4, sp=True, seq=8192))

    megadsl.init()                                       # under torchrun: join the job
    model = megadsl.Model.from_hf("path/to/hf-model", tp=2, pp=2)
    out = model.forward(input_ids, attention_mask)       # log_probs, entropy, valid
    trainer = model.trainer(lr=1e-6, clip_ratio=0.2)
    metrics = trainer.step({"input_ids": ..., "attention_mask": ..., "loss_mask": ...,
                            "old_log_probs": ..., "advantages": ...}, microbatches=2)

See python/README.md.
"""

import atexit as _atexit
import os as _os

import torch as _torch  # noqa: F401  (torch's tensor type must be registered before _C converts one)


def _libstdcxx_first():
    """The process's libstdc++ in the global scope before _C loads, so that _C's references to
    libstdc++'s template data (the locale facets' ids) bind to that one copy, as in a C++ program.
    Python loads extensions with RTLD_LOCAL: without this, _C bound them to copies of its own where
    the toolchain instantiates them, and its first number written to a stream crashed (seen with
    the GPU image's g++ 13 and LD_PRELOAD of the same libstdc++ curing it)."""
    import ctypes

    try:
        ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
    except OSError:  # another C++ runtime (libc++): nothing to put first
        pass


_libstdcxx_first()

from . import _C
from ._C import (
    CheckpointError,
    ConfigError,
    Layout,
    LayoutError,
    Model,
    Trainer,
    activation_offload_bytes,
    actor_loss,
    families_table,
    kernels,
    is_initialized,
    kl_penalty,
    policy_loss,
    presets,
    presets_table,
    rank,
    read_hf_config,
    shutdown,
    value_loss,
    world_size,
)
from ._dist import LaunchError, init, launch_local

__version__ = "0.1.0"

# Models are closed (and the job left) while the interpreter still lets Gloo's threads take the GIL.
_atexit.register(shutdown)

__all__ = [
    "ConfigError",
    "LayoutError",
    "CheckpointError",
    "Layout",
    "Model",
    "Trainer",
    "LaunchError",
    "check",
    "describe",
    "plan",
    "presets",
    "presets_table",
    "families_table",
    "read_hf_config",
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "world_size",
    "launch_local",
    "policy_loss",
    "actor_loss",
    "value_loss",
    "kl_penalty",
    "activation_offload_bytes",
]

_LAYOUT_FIELDS = ("tp", "pp", "vpp", "sp", "rmpad", "first_stage_layers", "last_stage_layers", "vocab_pad_multiple",
                  "ep", "etp", "recompute", "cp", "invariant", "cp_comm", "cp_a2a")


def _layout_of(where, layout, kwargs):
    """A Layout from a Layout (or None) and layout keywords (tp=, pp=, ...), not both."""
    unknown = sorted(set(kwargs) - set(_LAYOUT_FIELDS))
    if unknown:
        raise TypeError(
            f"megadsl.{where}: unknown keyword {unknown[0]!r}; the layout keywords are {', '.join(_LAYOUT_FIELDS)}"
        )
    if layout is not None:
        if kwargs:
            raise TypeError(f"megadsl.{where}: give a Layout or layout keywords ({', '.join(sorted(kwargs))}), not both")
        if not isinstance(layout, Layout):
            raise TypeError(f"megadsl.{where}: layout must be a megadsl.Layout, got {type(layout).__name__}")
        return layout
    return Layout(**kwargs)


def _model_arg(model):
    return _os.fspath(model) if isinstance(model, _os.PathLike) else model


def check(model, layout=None, *, critic=False, value_bias=True, world=None, global_batch=None, micro_batch=None,
          microbatches=None, config=None, **layout_kwargs):
    """Validates `model` (a preset name or an HF model directory / config.json) under a layout.

    Returns ``(ok, message)``: ``(True, "ok: ... is valid")``, or ``(False, ...)`` with one line per
    violated rule (its name, the values, the valid alternatives), the words of ``megadsl check``.
    The facts world, global_batch, micro_batch, microbatches are checked when given. Raises
    ConfigError (a ValueError) when the model argument is neither a preset nor a readable config.json.
    """
    l = _layout_of("check", layout, layout_kwargs)
    return _C._check(_model_arg(model), l, critic=critic, value_bias=value_bias, world=world,
                     global_batch=global_batch, micro_batch=micro_batch, microbatches=microbatches,
                     config=None if config is None else _os.fspath(config))


def describe(model, layout=None, *, critic=False, value_bias=True, world=None, global_batch=None, micro_batch=None,
             microbatches=None, config=None, **layout_kwargs):
    """The shard plan (``megadsl describe``): every parameter's HF name(s), global and per-rank shape,
    pipeline stages, the per-rank fused QKV. Raises LayoutError (a ValueError) naming the violated rules."""
    l = _layout_of("describe", layout, layout_kwargs)
    return _C._describe(_model_arg(model), l, critic=critic, value_bias=value_bias, world=world,
                        global_batch=global_batch, micro_batch=micro_batch, microbatches=microbatches,
                        config=None if config is None else _os.fspath(config))


def plan(model, layout=None, *, seq=4096, critic=False, value_bias=True, world=None, global_batch=None,
         micro_batch=None, microbatches=None, config=None, **layout_kwargs):
    """Memory per rank, activations, FLOPs per token (``megadsl plan``) for sequences of `seq` tokens.
    Raises LayoutError (a ValueError) naming the violated rules."""
    l = _layout_of("plan", layout, layout_kwargs)
    return _C._plan(_model_arg(model), l, critic=critic, value_bias=value_bias, world=world,
                    global_batch=global_batch, micro_batch=micro_batch, microbatches=microbatches,
                    config=None if config is None else _os.fspath(config), seq=seq)


def _export_weights(self, dtype="bf16", bucket_mb=512, shard_tp=1, shard_rank=0, merge_lora=None):
    """Streams the model's weights as (HF name, tensor) pairs for a rollout engine (vLLM, SGLang),
    without a disk: gathered over tp, pp and ep in buckets of about `bucket_mb` MB, in HF's layout
    and `dtype` ("bf16", "fp16", "fp32"): the tensors save_hf writes, bit for bit. A collective:
    every rank iterates the generator to its end, in step, and every rank gets every tensor (or,
    with shard_tp > 1, rollout tp rank `shard_rank`'s slice of it). At most one bucket is held
    beyond the model. A model loaded with a LoRA adapter needs merge_lora: True sends its bases
    with the adapters merged (as save_hf(merge_lora=True) writes them), False the base alone."""
    stream = self._weight_stream(dtype, float(bucket_mb), int(shard_tp), int(shard_rank), merge_lora)
    while True:
        bucket = stream.next_bucket()
        if not bucket:
            return
        yield from bucket


Model.export_weights = _export_weights


def _one_line_errors(cls, name, where, static=False):
    """pybind11 answers a wrong keyword with a screen of overloads; this says it in one line."""
    import functools
    import re

    fn = getattr(cls, name)
    signature = (fn.__doc__ or "").splitlines()[0] if fn.__doc__ else ""
    inside = signature.split("(", 1)[1].rsplit(")", 1)[0] if "(" in signature else ""
    params = [p for p in re.findall(r"(?:^|, )\*?(\w+): ", inside) if p != "self"]

    @functools.wraps(fn)
    def call(*args, **kwargs):
        unknown = [k for k in kwargs if params and k not in params]
        if unknown:
            raise TypeError(f"megadsl.{where}() got an unexpected keyword argument {unknown[0]!r}; "
                            f"it takes {', '.join(params)}")
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            if "incompatible function arguments" not in str(e):
                raise
            given = ", ".join([type(a).__name__ for a in args[0 if static else 1:]] +
                              [f"{k}={type(v).__name__}" for k, v in kwargs.items()])
            raise TypeError(f"megadsl.{where}({given}): the arguments do not fit; it takes {', '.join(params)}") from None

    setattr(cls, name, staticmethod(call) if static else call)


_one_line_errors(Model, "from_hf", "Model.from_hf", static=True)
for _name in ("forward", "save_hf", "save_distributed", "load_distributed"):
    _one_line_errors(Model, _name, f"Model.{_name}")
_one_line_errors(Trainer, "step", "Trainer.step")
