"""verl's batches as megadsl takes them: the checks made on entry (each failure one line naming the
field), and the rows of a no-padding TensorDict as right-padded (b, s) tensors."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.dataset_utils import DatasetPadMode

__all__ = ["Rows", "check_batch", "jagged"]

# Per-response fields of verl's losses: (rows, response) padded, or jagged with each row's response length.
RESPONSE_FIELDS = ("response_mask", "old_log_probs", "advantages", "ref_log_prob", "rollout_is_weights", "values",
                   "returns")
# What each loss reads, by the name verl's functions give it (the losses check nothing themselves).
LOSS_FIELDS = {"ppo_loss": ("response_mask", "old_log_probs", "advantages", "prompts", "responses"),
               "value_loss": ("response_mask", "values", "returns", "prompts", "responses"),
               "sft_loss": ("loss_mask",)}


def _fail(what):
    raise ValueError(f"megadsl.verl: the batch's {what}")


def _lengths(t):
    """Per-row lengths of a jagged tensor, or None for a dense one."""
    return t.offsets().diff().tolist() if t.is_nested else None


def _loss_name(loss_function):
    fn = getattr(loss_function, "func", loss_function)  # functools.partial(ppo_loss, config=...)
    return getattr(fn, "__name__", None)


def check_batch(data: TensorDict, loss_function=None):
    """One line naming the field when verl's batch does not have what the engine and the loss
    read, or a field's rows or lengths disagree with input_ids' (instead of an error deep in verl)."""
    pad_mode = tu.get_non_tensor_data(data=data, key="pad_mode", default=DatasetPadMode.NO_PADDING)
    if pad_mode != DatasetPadMode.NO_PADDING:
        raise ValueError(f"megadsl.verl: pad_mode {pad_mode} is not supported; the engine takes verl's no-padding "
                         "batches (left_right_2_no_padding), as verl's trainers hand them to engines")
    if "input_ids" not in data.keys():
        _fail("input_ids are missing")
    ids = data["input_ids"]
    if not ids.is_nested:
        _fail(f"input_ids must be a jagged nested tensor (verl's no-padding format), got a dense tensor of shape "
              f"{tuple(ids.shape)}")
    lengths = _lengths(ids)
    rows = len(lengths)
    if rows == 0 or min(lengths) == 0:
        _fail("input_ids have an empty row" if rows else "input_ids have no rows")
    if len(data.batch_size) and data.batch_size[0] != rows:  # (the TensorDict keeps its fields to its batch size)
        _fail(f"batch size {data.batch_size[0]} is not input_ids' {rows} rows")
    for key in ("position_ids", "loss_mask", "routed_experts"):
        if key in data.keys() and data[key].is_nested and _lengths(data[key]) != lengths and not (
                key == "loss_mask" and "response_mask" in data.keys()):
            _fail(f"field {key!r} has other lengths than input_ids (row lengths {_lengths(data[key])[:4]}... against "
                  f"{lengths[:4]}...)")
    name = _loss_name(loss_function)
    for key in LOSS_FIELDS.get(name, ()):
        if key not in data.keys():
            _fail(f"field {key!r} is missing: verl's {name} reads it")
    widths = {}
    for key in RESPONSE_FIELDS:
        if key in data.keys():
            t = data[key]
            widths[key] = _lengths(t) if t.is_nested else t.shape[1] if t.dim() > 1 else None
    dense = {k: w for k, w in widths.items() if isinstance(w, int)}
    if "responses" in data.keys() and "prompts" in data.keys():
        responses, prompts = data["responses"], data["prompts"]
        r_len = _lengths(responses) or [int(responses.shape[1])] * rows
        p_len = _lengths(prompts)
        if p_len is not None:
            for i, (p, r, n) in enumerate(zip(p_len, r_len, lengths)):
                if p + r != n:
                    _fail(f"row {i}: prompt ({p}) + response ({r}) tokens are not its {n} input_ids")
                if p == 0:
                    _fail(f"row {i} has an empty prompt (verl's losses read the token before each response)")
        width = max(r_len)
        padded = tu.get_non_tensor_data(data=data, key="max_response_len", default=None)
        for key, w in dense.items():
            if w < width:
                _fail(f"field {key!r} is {w} wide, shorter than the longest response ({width} tokens)")
            if padded is not None and padded >= 0 and w != padded:
                _fail(f"field {key!r} is {w} wide, the batch's responses are padded to {padded} (max_response_len)")
    if len(set(dense.values())) > 1:
        a, b = sorted(dense, key=lambda k: dense[k])[:: len(dense) - 1]
        _fail(f"fields {a!r} and {b!r} have response widths {dense[a]} and {dense[b]}: every per-response field "
              "is (rows, the longest response)")
    temperature = tu.get(data, "temperature", 1.0)
    if isinstance(temperature, torch.Tensor) and temperature.numel() not in (1, rows):
        _fail(f"temperature has {temperature.numel()} values for {rows} rows (one per row, or one for all)")
    return lengths


def _nested(values, lengths):
    """A (rows, jagged) nested tensor of `values` (sum(lengths), ...) (autograd flows through it)."""
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64, device=values.device)
    offsets[1:] = torch.as_tensor(lengths, device=values.device).cumsum(0)
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def jagged(padded, mask):
    """(b, s, ...) padded per-token outputs as verl's (b, jagged) nested tensor."""
    return _nested(padded[mask.to(padded.device)], mask.sum(1).tolist())


class Rows:
    """A checked verl no-padding batch as the rows megadsl takes: input_ids right-padded (b, s) with
    their attention_mask, the lengths, each row's temperature and a replayed routing."""

    def __init__(self, data: TensorDict, loss_function=None):
        self.lengths = check_batch(data, loss_function)
        rows, longest = len(self.lengths), max(self.lengths)
        ids = data["input_ids"]
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
        return jagged(padded, self.mask if mask is None else mask)
