"""megadsl's native losses against verl's own functions (verl 0.9's trainer/ppo/core_algos.py, a pinned
test dependency) on random inputs: every policy loss, every loss_agg_mode, rollout IS weights, every
KL type, the value loss, and their metrics, within 1e-6. And the case that started it: verl's default
dual-clip zeroes the gradient of negative advantages with ratio e^2, megadsl's trainer now too."""

import math

import pytest
import torch

import megadsl

from omegaconf import OmegaConf  # verl's dependency
from verl.trainer.ppo import core_algos

AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def verl_config(**kw):
    """verl's ActorConfig with the fields its policy losses read (its other fields are not needed)."""
    from verl.workers.config import ActorConfig

    policy = OmegaConf.create({"loss_mode": kw.get("policy_loss", "vanilla"), "clip_cov_ratio": kw.get("clip_cov_ratio"),
                               "clip_cov_lb": kw.get("clip_cov_lb"), "clip_cov_ub": kw.get("clip_cov_ub"),
                               "kl_cov_ratio": kw.get("kl_cov_ratio"), "ppo_kl_coef": kw.get("ppo_kl_coef")})
    c = object.__new__(ActorConfig)
    for k, v in dict(clip_ratio=kw.get("clip_ratio", 0.2), clip_ratio_low=kw.get("clip_ratio_low"),
                     clip_ratio_high=kw.get("clip_ratio_high"), clip_ratio_c=kw.get("clip_ratio_c", 3.0),
                     policy_loss=policy, global_batch_info={}).items():
        object.__setattr__(c, k, v)
    return c


def batch(seed, b=6, s=24, spread=0.8):
    g = torch.Generator().manual_seed(seed)
    old = -2.0 + torch.randn(b, s, generator=g, dtype=torch.float64)
    new = old + spread * torch.randn(b, s, generator=g, dtype=torch.float64)
    adv = torch.randn(b, s, generator=g, dtype=torch.float64)
    mask = torch.zeros(b, s, dtype=torch.bool)
    for i in range(b):  # a prompt, then a response of its own length; one row without response
        start = int(torch.randint(2, 8, (1,), generator=g))
        end = start if i == b - 1 else int(torch.randint(start + 1, s + 1, (1,), generator=g))
        mask[i, start:end] = True
    return old, new, adv, mask


def close(a, b, what):
    a, b = float(a), float(b)
    assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), f"{what}: megadsl {a!r}, verl {b!r}"


def run_both(mode, agg, seed, is_weights=False, global_counts=False, **kw):
    old, new, adv, mask = batch(seed)
    weights = torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64) + 0.5
    w = weights if is_weights else None
    scale = 16.0 if agg == "seq-mean-token-sum-norm" else None
    counts = dict(batch_num_tokens=int(mask.sum()) * 3, global_batch_size=int((mask.sum(-1) > 0).sum()) * 3) if global_counts else {}
    cfg = verl_config(policy_loss=mode, **kw)
    cfg.global_batch_info.update(counts)
    cfg.global_batch_info["loss_scale_factor"] = scale
    torch.manual_seed(seed)  # clip_cov draws which tokens it clips from the global generator
    ref_loss, ref_metrics = core_algos.get_policy_loss_fn(mode)(
        old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask, loss_agg_mode=agg, config=cfg,
        rollout_is_weights=w)
    torch.manual_seed(seed)
    ours, metrics = megadsl.policy_loss(old, new, adv, mask, rollout_is_weights=w, policy_loss=mode,
                                        loss_agg_mode=agg, loss_scale_factor=scale, **counts, **kw)
    close(ours, ref_loss, f"{mode} {agg} loss")
    for k, v in ref_metrics.items():
        close(metrics[k], v, f"{mode} {agg} {k}")
    return ours, new


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("mode", ["vanilla", "gspo", "gpg", "clip_cov", "kl_cov"])
def test_policy_losses_equal_verls(mode, agg):
    extra = {"clip_cov_ratio": 0.2, "clip_cov_lb": -1.0, "clip_cov_ub": 5.0} if mode == "clip_cov" else {}
    if mode == "kl_cov":
        extra = {"kl_cov_ratio": 0.1, "ppo_kl_coef": 0.5}
    for seed in range(3):
        run_both(mode, agg, seed, **extra)
    run_both(mode, agg, 7, is_weights=True, global_counts=True, **extra)


def test_asymmetric_clip_and_dual_clip_bound():
    for seed in range(3):
        run_both("vanilla", "token-mean", seed, clip_ratio=0.2, clip_ratio_low=0.1, clip_ratio_high=0.28, clip_ratio_c=2.5)


def test_gradients_equal_verls():
    """The losses' gradients with respect to the log-probs, not just their values."""
    for mode in ["vanilla", "gspo", "gpg"]:
        old, new, adv, mask = batch(11)
        a = new.clone().requires_grad_()
        b = new.clone().requires_grad_()
        ref, _ = core_algos.get_policy_loss_fn(mode)(old_log_prob=old, log_prob=a, advantages=adv, response_mask=mask,
                                                     loss_agg_mode="token-mean", config=verl_config(policy_loss=mode))
        ours, _ = megadsl.policy_loss(old, b, adv, mask, policy_loss=mode)
        ref.backward()
        ours.backward()
        assert torch.allclose(a.grad, b.grad, atol=1e-9, rtol=1e-7), mode


@pytest.mark.parametrize("kind", ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k1+", "k3+", "low_var_kl+", "abs+"])
def test_kl_penalties_equal_verls(kind):
    old, new, _, _ = batch(3, spread=3.0)  # differences past verl's clamps too
    a = new.clone().requires_grad_()
    b = new.clone().requires_grad_()
    ref = core_algos.kl_penalty(a, old, kind)
    ours = megadsl.kl_penalty(b, old, kind)
    assert torch.allclose(ours, ref, atol=1e-12), kind
    ref.sum().backward()
    ours.sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-12), kind


@pytest.mark.parametrize("agg", AGG_MODES)
def test_value_loss_equals_verls(agg):
    old, new, adv, mask = batch(5)
    values, vpreds, returns = old, new, old + adv
    scale = 16.0 if agg == "seq-mean-token-sum-norm" else None
    ref, clipfrac = core_algos.compute_value_loss(vpreds=vpreds, returns=returns, values=values, response_mask=mask,
                                                  cliprange_value=0.3, loss_agg_mode=agg, loss_scale_factor=scale)
    ours, metrics = megadsl.value_loss(vpreds, returns, values, mask, value_clip=0.3, loss_agg_mode=agg,
                                       loss_scale_factor=scale)
    close(ours, ref, f"value loss {agg}")
    close(metrics["critic/vf_clipfrac"], clipfrac, "vf_clipfrac")


def test_verls_ppo_loss_composition():
    """verl's workers/utils/losses.py ppo_loss: policy loss - entropy_coeff * entropy + kl_coef * kl,
    each aggregated with the same mode."""
    old, new, adv, mask = batch(9)
    ref_lp = new - 0.3 * torch.randn(new.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    entropy = torch.rand(new.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 3
    for agg in AGG_MODES:
        scale = 16.0 if agg == "seq-mean-token-sum-norm" else None
        cfg = verl_config()
        cfg.global_batch_info["loss_scale_factor"] = scale
        pg, _ = core_algos.compute_policy_loss_vanilla(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                                                       loss_agg_mode=agg, config=cfg)
        ent = core_algos.agg_loss(entropy, mask, agg, loss_scale_factor=scale)
        kl = core_algos.agg_loss(core_algos.kl_penalty(new, ref_lp, "low_var_kl"), mask, agg, loss_scale_factor=scale)
        expected = pg - 0.01 * ent + kl * 0.05
        ours, metrics = megadsl.actor_loss(old, new, adv, mask, entropy=entropy, ref_log_prob=ref_lp, entropy_coeff=0.01,
                                           kl_coeff=0.05, kl="low_var_kl", loss_agg_mode=agg, loss_scale_factor=scale)
        close(ours, expected, f"ppo_loss {agg}")
        close(metrics["actor/entropy_loss"], ent, "entropy_loss")
        close(metrics["actor/kl_loss"], kl, "kl_loss")


def test_bad_options_are_one_line():
    old, new, adv, mask = batch(0)
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'clip_ration'; it takes policy_loss, clip_ratio"):
        megadsl.policy_loss(old, new, adv, mask, clip_ration=0.2)
    with pytest.raises(ValueError, match="clip_ratio_c = 1.000000 must be greater than 1"):
        megadsl.policy_loss(old, new, adv, mask, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm divides by loss_scale_factor"):
        megadsl.policy_loss(old, new, adv, mask, loss_agg_mode="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="policy_loss \"ppo\" is not one of verl's"):
        megadsl.policy_loss(old, new, adv, mask, policy_loss="ppo")


def test_dual_clip_zeroes_the_gradient_of_far_off_negative_advantages(gqa, reference):
    """The issue's case: negative advantages, ratio e^2. verl's default vanilla loss (clip_ratio_c 3)
    holds the loss at -A * 3 there, so the gradient is 0; the old megadsl loss gave a grad norm of 43.7."""
    model = megadsl.Model.from_hf(gqa)
    ids, mask = reference["right.input_ids"], reference["right.attention_mask"]
    with torch.no_grad():
        now = model.forward(ids, mask)
    valid = now["valid"].float()
    batch_ = {"input_ids": ids, "attention_mask": mask, "loss_mask": valid,
              "old_log_probs": now["log_probs"] - 2.0, "advantages": -torch.ones(ids.shape)}
    m = model.trainer(lr=1e-3).step(batch_)
    assert m["grad_norm"] == 0.0
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(1.0, abs=1e-6)
    # Without dual-clip (a bound past e^2) the same batch does move the policy.
    m2 = model.trainer(lr=1e-3, clip_ratio_c=10.0).step(batch_)
    assert m2["grad_norm"] > 1.0 and math.isfinite(m2["grad_norm"])
