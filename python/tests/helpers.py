"""Functions the tests run on several ranks (megadsl.launch_local pickles them by name), and the
comparisons they share."""

import torch

import megadsl


def max_diff(a, b, where):
    """Largest |a - b| over the positions where `where` is true."""
    return (a.double() - b.double()).abs()[where].max().item()


def lp_valid(mask):
    """Where a log-prob is defined (generate_fixtures.py): the token and the next one are real."""
    m = mask.bool()
    pair = torch.zeros_like(m)
    pair[:, :-1] = m[:, :-1] & m[:, 1:]
    return pair


def forward_on_ranks(path, ids, mask, layout):
    """Loads `path` in `layout` on the job's ranks and returns rank 0's outputs (every rank gets them)."""
    model = megadsl.Model.from_hf(path, **layout)
    with torch.no_grad():
        out = model.forward(ids, mask)
    return {k: v.clone() for k, v in out.items()}, (model.tp_rank, model.pp_rank, model.dp_rank)


def rank_and_world():
    return megadsl.rank(), megadsl.world_size()


def fail_on_rank(bad_rank):
    if megadsl.rank() == bad_rank:
        raise ValueError(f"rank {bad_rank} says no")
    return megadsl.rank()


def forward_with_disagreeing_batches(path, kind):
    """tp 2 over two ranks, each given its own batch: of another length ("length") or of the same
    shape with other tokens ("values"). Every rank must raise naming what differs."""
    model = megadsl.Model.from_hf(path, tp=2)
    rank = megadsl.rank()
    seq = 12 if kind != "length" or rank == 0 else 10
    ids = torch.randint(0, 300, (2, seq), generator=torch.Generator().manual_seed(rank if kind == "values" else 0))
    with torch.no_grad():
        return model.forward(ids, torch.ones_like(ids))


def build_with_disagreeing_layouts(path):
    """Rank 0 asks for tp 2, rank 1 for tp 1: both must raise naming the layouts."""
    megadsl.Model.from_hf(path, tp=2 if megadsl.rank() == 0 else 1)


def export_on_ranks(path, layout, dtype):
    """Every rank streams the weights; returns this rank's copy of them (a name -> tensor dict)."""
    model = megadsl.Model.from_hf(path, **layout)
    return {name: t.clone() for name, t in model.export_weights(dtype=dtype, bucket_mb=0.01)}


def verl_style_loss(outputs, micro_batch, counts):
    """A loss of the caller's own, as verl's ppo_loss composes it, from megadsl's loss functions and
    an extra batch field (per-token weights) the built-in loss does not know."""
    loss, metrics = megadsl.policy_loss(micro_batch["old_log_probs"], outputs["log_probs"], micro_batch["advantages"],
                                        micro_batch["loss_mask"], rollout_is_weights=micro_batch["token_weights"],
                                        batch_num_tokens=counts["batch_num_tokens"],
                                        global_batch_size=counts["global_batch_size"])
    return loss, {"my/pg_clipfrac": metrics["actor/pg_clipfrac"]}


def train_with_custom_loss(path, layout, batch, steps):
    """`steps` Trainer.step calls with verl_style_loss; the metrics and the updated weights."""
    model = megadsl.Model.from_hf(path, **layout)
    trainer = model.trainer(lr=1e-3)
    metrics = [trainer.step(batch, microbatches=2, loss_fn=verl_style_loss) for _ in range(steps)]
    return metrics, {name: t.clone() for name, t in model.export_weights(dtype="fp32")}


def train_dp_local(path, batch, steps, dynamic):
    """dp 2 over two ranks, each given only its own half of the rows (dp_local=True, as verl
    dispatches); the metrics and the updated weights."""
    model = megadsl.Model.from_hf(path, tp=1)
    trainer = model.trainer(lr=1e-3)
    half = batch["input_ids"].shape[0] // 2
    rows = slice(megadsl.rank() * half, (megadsl.rank() + 1) * half)
    mine = {k: v[rows] for k, v in batch.items()}
    split = dict(max_token_len=16) if dynamic else dict(microbatches=1)
    metrics = [trainer.step(mine, dp_local=True, **split) for _ in range(steps)]
    return metrics, {name: t.clone() for name, t in model.export_weights(dtype="fp32")}


def forward_with_row_temperatures(path, ids, mask, temps, layout):
    model = megadsl.Model.from_hf(path, **layout)
    with torch.no_grad():
        out = model.forward(ids, mask, temperature=temps)
    return {k: v.clone() for k, v in out.items()}


def train_on_ranks(path, batch, steps, trainer_kwargs):
    """`steps` PPO steps of `path` at dp = the job's size; returns the parameters and the losses."""
    model = megadsl.Model.from_hf(path)
    trainer = model.trainer(lr=1e-3, **trainer_kwargs)
    losses = [trainer.step(batch)["loss"] for _ in range(steps)]
    return {k: v.detach().clone() for k, v in model.parameters().items()}, losses


def forward_whole_and_micro(path, ids, mask, layout):
    """The batch's outputs in one pass and one row at a time (pipelined over the stages at pp > 1)."""
    model = megadsl.Model.from_hf(path, **layout)
    with torch.no_grad():
        whole = model.forward(ids, mask)
        parts = model.forward(ids, mask, micro_batch_size=1)
    keep = ("log_probs", "entropy", "valid")
    return {k: whole[k].clone() for k in keep}, {k: parts[k].clone() for k in keep}


def forward_until_stopped(path, pid_dir):
    """tp 2 forward passes for a minute, the rank's pid in pid_dir/<rank> once the model is built:
    the test stops one rank (SIGSTOP) and times how the job ends."""
    import os

    model = megadsl.Model.from_hf(path, tp=2)
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with open(os.path.join(pid_dir, str(megadsl.rank())), "w") as f:
        f.write(str(os.getpid()))
    import time

    end = time.monotonic() + 60
    with torch.no_grad():
        while time.monotonic() < end:
            model.forward(ids, torch.ones_like(ids))
    raise RuntimeError("nothing ended this rank within 60 s")


def forward_with_lora(path, adapter, ids, mask, layout):
    """`path` with the PEFT adapter in `adapter`, in `layout` on the job's ranks: the log-probs."""
    model = megadsl.Model.from_hf(path, lora_adapter=adapter, **layout)
    with torch.no_grad():
        out = model.forward(ids, mask)
    return out["log_probs"].clone()


def save_merged(path, adapter, out, layout):
    """`path` with the PEFT adapter in `adapter`, in `layout`, saved to `out` with the adapter merged."""
    model = megadsl.Model.from_hf(path, lora_adapter=adapter, **layout)
    model.save_hf(out, merge_lora=True)
    return True


def export_merged(path, adapter, layout):
    """`path` with the PEFT adapter in `adapter`, in `layout`: export_weights(merge_lora=True) in fp32."""
    model = megadsl.Model.from_hf(path, lora_adapter=adapter, **layout)
    return {n: t.clone() for n, t in model.export_weights(dtype="fp32", bucket_mb=1, merge_lora=True)}


def advantage_loss(outputs, micro_batch, counts):
    """-sum(advantage * log p) over the loss mask / the global batch's loss tokens: a policy-gradient
    loss simple enough to write on PEFT's side too (test_lora.py)."""
    return -(micro_batch["advantages"] * outputs["log_probs"] * micro_batch["loss_mask"]).sum() / counts["batch_num_tokens"]


def train_lora(path, adapter, batch, steps, layout, lr, out):
    """`steps` Trainer.step calls on `path` with the adapter in `adapter` (the base frozen), in `layout`;
    the adapters saved with save_lora to `out`; each step's loss and gradient norm."""
    model = megadsl.Model.from_hf(path, lora_adapter=adapter, **layout)
    trainer = model.trainer(lr=lr, clip_grad=1.0, weight_decay=0.01)
    metrics = [trainer.step(batch, microbatches=2, loss_fn=advantage_loss) for _ in range(steps)]
    model.save_lora(out)
    return [(m["loss"], m["grad_norm"]) for m in metrics]


def train_fresh_lora(path, batch, steps, layout, out, parameters=None, dropout=0.0):
    """Fresh rank-8 adapters on every linear (verl's lora_rank / lora_alpha / target_modules) and on
    the experts' `parameters` (target_parameters), `steps` steps in `layout`, saved with save_lora to
    `out`; each step's loss and gradient norm."""
    model = megadsl.Model.from_hf(path, lora_rank=8, lora_alpha=16, lora_target_modules="all-linear",
                                  lora_target_parameters=parameters, lora_dropout=dropout, **layout)
    trainer = model.trainer(lr=1e-3)
    metrics = [trainer.step(batch, microbatches=2, loss_fn=advantage_loss) for _ in range(steps)]
    model.save_lora(out)
    return [(m["loss"], m["grad_norm"]) for m in metrics]


def lora_steps_with_checkpoint(path, adapter, batch, layout, ckpt, phase, out):
    """phase "save": 2 steps of the adapter's training, then save_distributed with the trainer;
    "resume": load_distributed into a fresh model and trainer, 1 step; "straight": 3 steps. The
    adapters saved with save_lora to `out` (resume and straight); each step's loss."""
    model = megadsl.Model.from_hf(path, lora_adapter=adapter, **layout)
    trainer = model.trainer(lr=1e-3, weight_decay=0.01)
    if phase == "resume":
        model.load_distributed(ckpt, trainer=trainer)
    steps = {"save": 2, "resume": 1, "straight": 3}[phase]
    losses = [trainer.step(batch, microbatches=2, loss_fn=advantage_loss)["loss"] for _ in range(steps)]
    if phase == "save":
        model.save_distributed(ckpt, trainer=trainer)
    else:
        model.save_lora(out)
    return losses, trainer.steps


def lora_gradients(path, adapter, batch, layout):
    """One forward and backward of advantage_loss through the adapters (pp 1), finalize_grads: this
    rank's adapter gradients by lora_parameters' names."""
    model = megadsl.Model.from_hf(path, lora_adapter=adapter, **layout)
    out = model.forward(batch["input_ids"], batch["attention_mask"])
    loss = -(batch["advantages"] * out["log_probs"] * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
    loss.backward()
    model.finalize_grads()
    return {name: t.grad.clone() for name, t in model.lora_parameters().items()}
