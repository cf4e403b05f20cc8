"""megadsl's kernels against transformers' own functions on the same tensors (fp32, CPU)."""

import pytest
import torch

import megadsl

qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def _inputs(b, length, hk, hv, dk, dv, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, length, hk, dk, generator=gen)
    k = torch.randn(b, length, hk, dk, generator=gen)
    v = torch.randn(b, length, hv, dv, generator=gen)
    g = -0.1 * torch.rand(b, length, hv, generator=gen)
    beta = torch.rand(b, length, hv, generator=gen)
    return [t.requires_grad_(True) for t in (q, k, v, g, beta)]


@pytest.mark.parametrize("length", [50, 64, 150])
def test_chunked_delta_rule_matches_transformers(length):
    """transformers' torch_chunk_gated_delta_rule (its fallback without flash-linear-attention),
    with use_qk_l2norm_in_kernel as Qwen3-Next calls it, value heads two per key head: the outputs
    and the gradients of every input agree."""
    ours_in = _inputs(2, length, 2, 4, 16, 8, seed=length)
    theirs_in = [t.detach().clone().requires_grad_(True) for t in ours_in]
    ours = megadsl.kernels.chunk_gated_delta_rule(*ours_in)
    theirs, _ = qwen3_next.torch_chunk_gated_delta_rule(*theirs_in, use_qk_l2norm_in_kernel=True)
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5), (ours - theirs).abs().max()
    weight = torch.linspace(-1, 1, ours.numel()).view(ours.shape)
    grads = torch.autograd.grad((ours * weight).sum(), ours_in)
    want = torch.autograd.grad((theirs * weight).sum(), theirs_in)
    for name, a, b in zip(("q", "k", "v", "g", "beta"), grads, want):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), f"d{name}: {(a - b).abs().max()}"


def test_causal_conv_matches_transformers():
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(2, 9, 6, generator=gen), torch.randn(6, 4, generator=gen)
    ours = megadsl.kernels.causal_conv1d_silu(x, w)
    theirs = qwen3_next.causal_conv1d_fn(x.transpose(1, 2), w, None, activation="silu").transpose(1, 2)
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=1e-6)
