"""megadsl.launch_local: two local ranks at tp 2 give the one-process result; a failing rank is named."""

import pytest
import torch

import helpers
import megadsl
from helpers import lp_valid, max_diff


def test_tp2_on_two_ranks_equals_one_process(gqa, reference):
    ids, mask = reference["left.input_ids"], reference["left.attention_mask"]
    single = megadsl.Model.from_hf(gqa)
    with torch.no_grad():
        one = single.forward(ids, mask)
    results = megadsl.launch_local(2, helpers.forward_on_ranks, str(gqa), ids, mask, {"tp": 2, "sp": True},
                                   timeout=300)
    assert [coords for _, coords in results] == [(0, 0, 0), (1, 0, 0)]
    for out, _ in results:
        assert torch.equal(out["valid"], one["valid"])
        assert max_diff(out["log_probs"], one["log_probs"], lp_valid(mask)) < 1e-5
        assert max_diff(out["entropy"], one["entropy"], mask.bool()) < 1e-5


def test_ranks_see_their_job():
    assert megadsl.launch_local(2, helpers.rank_and_world, timeout=120) == [(0, 2), (1, 2)]


def test_a_failing_rank_is_named():
    with pytest.raises(megadsl.LaunchError, match="rank 1 failed: ValueError: rank 1 says no") as e:
        megadsl.launch_local(2, helpers.fail_on_rank, 1, timeout=120, grace=5)
    assert e.value.rank == 1 and 1 in e.value.errors


def test_a_mixture_of_experts_over_two_ranks_matches_transformers(fixtures):
    """Qwen2-MoE (shared expert) with its experts split over ep 2: each rank holds half of them, and
    both give transformers' log-probs."""
    from safetensors.torch import load_file

    path = fixtures / "qwen2-moe-tf5"
    ref = load_file(str(path / "reference.safetensors"))
    ids, mask = ref["left.input_ids"], ref["left.attention_mask"]
    results = megadsl.launch_local(2, helpers.forward_on_ranks, str(path), ids, mask, {"ep": 2, "rmpad": True},
                                   timeout=300)
    assert [coords for _, coords in results] == [(0, 0, 0), (0, 0, 1)]
    for out, _ in results:
        assert max_diff(out["log_probs"], ref["left.log_probs"], lp_valid(mask)) < 1e-4
        assert max_diff(out["entropy"], ref["left.entropy"], mask.bool()) < 1e-4
    assert repr(megadsl.Layout(ep=2)) == "Layout(tp=1, pp=1, vpp=1, sp=False, rmpad=False, ep=2)"


def test_the_distributed_optimizer_trains_like_the_replicated_one(gqa, reference):
    """use_distributed_optimizer (verl's default, and megadsl's) at dp 2: each rank keeps half of the
    AdamW moments, and three steps give the replicated optimizer's parameters."""
    ids, mask = reference["right.input_ids"], reference["right.attention_mask"]
    g = torch.Generator().manual_seed(3)
    batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": mask.float(),
             "old_log_probs": -torch.rand(ids.shape, generator=g), "advantages": torch.randn(ids.shape, generator=g)}
    runs = [megadsl.launch_local(2, helpers.train_on_ranks, str(gqa), batch, 3, {"use_distributed_optimizer": d},
                                 timeout=300) for d in (True, False)]
    (sharded, losses_a), (replicated, losses_b) = runs[0][0], runs[1][0]
    assert losses_a == losses_b
    assert all(torch.allclose(sharded[k], replicated[k], rtol=0, atol=1e-7) for k in replicated)
    with pytest.raises(TypeError, match="use_distributed_optimizer must be True or False"):
        megadsl.Model.from_hf(gqa).trainer(use_distributed_optimizer=1)


@pytest.mark.parametrize("victim", [1, 0])
def test_a_stopped_rank_is_named_and_the_job_ends_within_10_s(gqa, tmp_path, victim):
    """A rank stopped with SIGSTOP (rank 0, the rendezvous store's host, too) cannot speak: the
    other rank's watch names it (a heartbeat that stopped, a store that no longer answers) and
    launch_local raises naming it, having killed it, within 10 s of the stop."""
    import os
    import signal
    import threading
    import time

    outcome = {}

    def launch():
        try:
            megadsl.launch_local(2, helpers.forward_until_stopped, str(gqa), str(tmp_path), timeout=120, grace=3)
        except megadsl.LaunchError as e:
            outcome["error"], outcome["at"] = e, time.monotonic()

    t = threading.Thread(target=launch)
    t.start()
    deadline = time.monotonic() + 120
    while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = int((tmp_path / str(victim)).read_text())
    time.sleep(0.5)  # both ranks in their loop
    stopped = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    t.join(timeout=60)
    assert not t.is_alive() and "error" in outcome
    e, took = outcome["error"], outcome["at"] - stopped
    print(f"rank {victim} stopped: launch_local raised after {took:.1f} s: {str(e).splitlines()[0]}")
    assert took < 10, took
    assert e.rank == victim, str(e)
    first = str(e).splitlines()[0]
    if victim == 1:
        assert first.startswith("megadsl.launch_local: rank 1 stopped responding: no heartbeat for "), first
        assert first.endswith("seen by rank 0 (also ended: ranks 0)"), first
    else:
        assert first.startswith("megadsl.launch_local: rank 0, which hosts the rendezvous store, has not answered "
                                "for "), first
        assert first.endswith("(also ended: ranks 1)"), first
