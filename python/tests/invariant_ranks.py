"""What test_invariant.py runs on each rank (megadsl.launch_local pickles these by name): one
sequence's outputs inside batches, under a layout with invariant arithmetic on."""

import json
from pathlib import Path

import torch

LENGTH = 29  # the target sequence's tokens


def text_config(path):
    config = json.loads((Path(path) / "config.json").read_text())
    return config.get("text_config", config)


def is_mixture(path):
    text = text_config(path)
    return any(k in text for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"))


def cases(vocab, rows_max=16):
    """{name: (input_ids, attention_mask, row of the target, micro_batch_size)}: the target alone,
    then inside left- and right-padded batches of other sequences, whole and in micro-batches."""
    g = torch.Generator().manual_seed(11)
    target = torch.randint(1, vocab, (LENGTH,), generator=g)
    out = {"alone": (target.unsqueeze(0), torch.ones(1, LENGTH, dtype=torch.long), 0, None)}
    for rows, side, micro in ((4, "left", (None,)), (8, "right", (None, 3)), (rows_max, "left", (None, 5, 1))):
        width = LENGTH + 7
        ids = torch.zeros(rows, width, dtype=torch.long)
        mask = torch.zeros(rows, width, dtype=torch.long)
        lengths = torch.randint(3, width + 1, (rows,), generator=g)
        at = rows // 2 + 1
        lengths[at] = LENGTH
        for r in range(rows):
            n = int(lengths[r])
            seq = target if r == at else torch.randint(1, vocab, (n,), generator=g)
            cols = slice(width - n, width) if side == "left" else slice(0, n)
            ids[r, cols], mask[r, cols] = seq, 1
        for mb in micro:
            name = f"{side}-padded {rows}" + (f" in micro-batches of {mb}" if mb else "")
            out[name] = (ids, mask, at, mb)
    return out


def _target(t, mask, row):
    """The target row's entries at its real tokens."""
    return t[row][mask[row].bool()].clone()


def outputs(path, layout, dtype, names, critic):
    """{case: {"log_probs", "entropy", ["routed_experts"], ["values"]}} for the target row, or a str:
    the reason the layout does not fit this checkpoint."""
    import megadsl

    vocab = int(text_config(path)["vocab_size"])
    all_cases = cases(vocab)
    wanted = {n: all_cases[n] for n in names}
    try:
        actor = megadsl.Model.from_hf(path, dtype=dtype, invariant=True, **layout)
    except ValueError as e:
        return str(e).splitlines()[0]
    moe = is_mixture(path)
    got = {}
    with torch.no_grad():
        for name, (ids, mask, row, mb) in wanted.items():
            o = actor.forward(ids, mask, micro_batch_size=mb, record_routing=moe)
            got[name] = {k: _target(o[k], mask, row) for k in ("log_probs", "entropy") + (("routed_experts",) if moe else ())}
    actor.close()
    if critic:
        value = megadsl.Model.from_hf(Path(path) / "critic", dtype=dtype, invariant=True, critic=True, **layout)
        with torch.no_grad():
            for name, (ids, mask, row, mb) in wanted.items():
                got[name]["values"] = _target(value.forward(ids, mask, micro_batch_size=mb)["values"], mask, row)
        value.close()
    return got


def sweep(paths, layout, dtypes, names, critic_dtypes):
    """outputs() of every checkpoint and dtype: {(path, dtype): ...}."""
    return {(p, d): outputs(p, layout, d, names, d in critic_dtypes) for p in paths for d in dtypes}


def train(path, layout, steps):
    """`steps` PPO steps with invariant arithmetic; (losses, grad norms, parameters) on rank 0's view."""
    import megadsl

    model = megadsl.Model.from_hf(path, invariant=True, **layout)
    vocab = int(text_config(path)["vocab_size"])
    ids, mask, _, _ = cases(vocab)["right-padded 8"]
    g = torch.Generator().manual_seed(3)
    batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": mask.float(),
             "old_log_probs": -torch.rand(ids.shape, generator=g), "advantages": torch.randn(ids.shape, generator=g)}
    trainer = model.trainer(lr=1e-3, clip_grad=1.0, clip_ratio=0.2, entropy_coeff=0.01)
    losses, norms = [], []
    for _ in range(steps):
        m = trainer.step(batch, microbatches=2)
        losses.append(m["loss"])
        norms.append(m["grad_norm"])
    params = {k: v.detach().clone() for k, v in model.parameters().items()}
    model.close()
    return losses, norms, params
