"""megadsl as a verl engine (megadsl.verl): created through verl's EngineRegistry on ranks that started
torch.distributed first, as verl's workers do; verl's own ppo_loss and value_loss through megadsl's
pipeline (the actor at tp 2 x pp 2 x dp 2, the critic at cp 2 x pp 2 x dp 2) with remove-padding,
3 steps under verl's cosine schedule. Losses, metrics, grad norms, the updated weights and the
log-probs / values afterwards equal a single process running transformers with verl's loss
functions, torch's AdamW and the same schedule."""

import io
import multiprocessing
import queue
import socket
import time

import pytest
import torch

import verl_engine_ranks as ranks

WORLD = 8
TOL = 1e-5


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(path, critic_path, tmp, timeout=600):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=ranks.engine_rank, args=(r, WORLD, port, str(path), str(critic_path), str(tmp), results))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    out, deadline = {}, time.time() + timeout
    try:
        while len(out) < WORLD:
            try:
                rank, status, value = results.get(timeout=5)
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in out]
                if dead or time.time() > deadline:
                    pytest.fail(f"rank {dead[0] if dead else '?'} died or the job timed out")
                continue
            if status != "ok":
                pytest.fail(f"rank {rank} failed: {value}")
            out[rank] = torch.load(io.BytesIO(value), weights_only=False)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return out


@pytest.fixture(scope="module")
def job(fixtures, tmp_path_factory):
    path = fixtures / "qwen3-tf5"
    return {"ranks": _run(path, path / "critic", tmp_path_factory.mktemp("verl_engine")),
            "actor": ranks.reference_run(str(path), critic=False),
            "critic": ranks.reference_run(str(path / "critic"), critic=True)}


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_training_matches_the_single_process_reference(job, role):
    ref = job[role]
    assert {r[role]["cp"] for r in job["ranks"].values()} == {2 if role == "critic" else 1}
    reporting = [r[role] for r in job["ranks"].values() if r[role]["steps"]]
    assert sorted(r["dp_rank"] for r in reporting) == [0, 1]  # one reporting rank per dp rank (tp 0, last stage)
    for step in range(ranks.STEPS):
        want = ref["steps"][step]
        for r in reporting:
            got = r["steps"][step]
            assert abs(got["loss"] - want["loss"]) < TOL, (role, step, got["loss"], want["loss"])
            assert abs(got["grad_norm"] - want["grad_norm"]) < TOL * max(1.0, want["grad_norm"]), (role, step)
            assert abs(got["lr"] - want["lr"]) < 1e-12
            mine = want["micro"][2 * r["dp_rank"]: 2 * r["dp_rank"] + 2]  # this dp rank's two micro-batches
            assert len(got["micro"]) == len(mine)
            for g, w in zip(got["micro"], mine):
                assert set(w) <= set(g), (set(w) - set(g))
                for k in w:
                    assert abs(g[k] - w[k]) < TOL, (role, step, k, g[k], w[k])


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_updated_weights_and_outputs_match(job, role):
    ref = job[role]
    weights = job["ranks"][0][role]["weights"]
    assert set(weights) == set(ref["weights"])
    for name, t in weights.items():
        assert (t - ref["weights"][name]).abs().max().item() < TOL, name
    # inference after the update (infer_batch), each dp rank its own rows
    by_dp = {}
    for r in sorted(job["ranks"]):  # every rank of a dp replica gets its rows' outputs
        by_dp.setdefault(job["ranks"][r][role]["dp_rank"], job["ranks"][r][role]["final"])
    final = torch.cat([by_dp[d] for d in sorted(by_dp)])
    keep = ref["keep"]
    assert final.numel() == keep.numel()
    assert (final - ref["final"])[keep].abs().max().item() < TOL


def test_shards_assemble_the_full_tensors(job):
    """get_per_tensor_param_shard: the tp ranks' blocks at their offsets rebuild every tensor."""
    full = job["ranks"][0]["actor"]["weights"]
    built = {n: torch.full(t.shape, float("nan")) for n, t in full.items()}
    written = {n: torch.zeros(t.shape, dtype=torch.int64) for n, t in full.items()}  # each element exactly once
    for r in job["ranks"].values():
        for name, local, shape, offset, local_shape, contributes in r["actor"]["shards"]:
            assert tuple(full[name].shape) == tuple(shape)
            if not contributes:
                continue
            if offset is None:
                built[name].copy_(local.reshape(shape).float())
                written[name] += 1
                continue
            block, count = built[name], written[name]
            for d, (o, n) in enumerate(zip(offset, local_shape)):
                block, count = block.narrow(d, o, n), count.narrow(d, o, n)
            block.copy_(local.reshape(local_shape).float())
            count += 1
    for name, t in full.items():
        assert torch.equal(built[name], t.float()), name
        assert bool((written[name] == 1).all()), name


def test_optimizer_state_was_offloaded(job):
    """optimizer_offload: out of train_mode the moments live in host memory."""
    assert all(r["actor"]["optimizer_bytes_offloaded"] == 0 for r in job["ranks"].values())


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_dynamic_batching_in_one_process_matches(job, fixtures, role):
    """verl's use_dynamic_bsz (micro-batches of at most 20 tokens) in a world of one process: the
    same losses, grad norms and weights as the reference (the split does not change the sums)."""
    path = fixtures / "qwen3-tf5"
    got = ranks.single_process_run(str(path / "critic" if role == "critic" else path), role == "critic", 20)
    ref = job[role]
    for step in range(ranks.STEPS):
        assert got["steps"][step]["micro"] > 2  # the budget split the 8 rows
        assert abs(got["steps"][step]["loss"] - ref["steps"][step]["loss"]) < TOL
        assert abs(got["steps"][step]["grad_norm"] - ref["steps"][step]["grad_norm"]) < TOL * max(1.0, ref["steps"][step]["grad_norm"])
    for name, t in got["weights"].items():
        assert (t - ref["weights"][name]).abs().max().item() < TOL, name


def test_router_replay_fields_reach_the_model(fixtures):
    """With router_replay R3, a batch's routed_experts (the rollout's routing, jagged per sequence)
    route the mixture's tokens in infer_batch: the engine's log-probs are the model's under that
    routing, not the live."""
    import megadsl.verl
    from verl.workers.config import EngineRouterReplayConfig, HFModelConfig
    from verl.workers.engine.base import EngineRegistry

    path = str(fixtures / "qwen3-moe-tf5")
    engine = EngineRegistry.new(model_type="language_model", backend="megadsl",
                                model_config=HFModelConfig(path=path, use_remove_padding=True, load_tokenizer=False),
                                engine_config=megadsl.verl.MegadslEngineConfig(
                                    forward_only=True, router_replay=EngineRouterReplayConfig(mode="R3")),
                                optimizer_config=None, checkpoint_config=None)
    engine.initialize()
    data = ranks.make_batch(0, engine.model.vocab)
    ids, mask = ranks._padded(data)
    with torch.no_grad():
        live = engine.model.forward(ids, mask.long(), temperature=ranks.TEMPERATURE, record_routing=True)
    recorded = live["routed_experts"]  # (b, s, layers, top_k)
    fixed = torch.arange(recorded.shape[-1]).expand_as(recorded).clone()  # every token to experts 0..k-1
    data["routed_experts"] = torch.nested.as_nested_tensor([fixed[i, : int(n)] for i, n in enumerate(mask.sum(1))],
                                                           layout=torch.jagged)
    with engine.eval_mode():
        out = engine.infer_batch(data)["model_output"]["log_probs"].values()
    with torch.no_grad():
        want = engine.model.forward(ids, mask.long(), temperature=ranks.TEMPERATURE, routed_experts=fixed)["log_probs"]
    assert torch.equal(out, want[mask])
    assert not torch.allclose(out, live["log_probs"][mask])
    engine.model.close()
