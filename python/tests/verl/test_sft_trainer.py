"""verl's own SFT trainer, from its command line as the README gives it (`torchrun -m
verl.trainer.sft_trainer engine=megadsl ...`), against verl's FSDP engine on the same tiny chat model,
data, seed and schedule (fp32 on the CPU): 8 steps of loss and grad norm, and validation, within
1e-5 at tp 2, pp 2, dp 2 and tp 2 x pp 2 x dp 2 with sequence parallelism, dynamic batch size on and
off; a run saved at step 4 and resumed (resume_mode auto) continues bit for bit; the HF checkpoint
save_contents asks for loads in transformers with the FSDP run's weights."""

import shutil

import pytest
import torch

import sft_runs
import tiny_chat

STEPS = 8
TOL = 1e-5


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_chat.make(tmp_path_factory.mktemp("chat"))


def _run(world, args, tmp, name):
    code, out, steps = sft_runs.run(world, args, tmp / f"{name}.jsonl")
    assert code == 0, f"{name}: exit {code}\n{out[-6000:]}"
    assert sorted(steps) == list(range(1, STEPS + 1)), (name, sorted(steps))
    return steps


@pytest.fixture(scope="module")
def fsdp(data, tmp_path_factory):
    """verl's FSDP engine (fsdp2, fp32) on 2 ranks, dynamic batch size on and off; the dynamic run
    also saves the HF checkpoint at the end."""
    tmp = tmp_path_factory.mktemp("fsdp")
    runs = {}
    for dynamic in (True, False):
        args = sft_runs.common(data, tmp / f"out{dynamic}", STEPS) + sft_runs.FSDP + [f"data.use_dynamic_bsz={dynamic}"]
        if dynamic:
            args.append("checkpoint.save_contents=[model,optimizer,extra,hf_model]")
        runs[dynamic] = _run(2, args, tmp, f"fsdp_{dynamic}")
    runs["hf"] = tmp / "outTrue" / f"global_step_{STEPS}" / "huggingface"
    return runs


def _megadsl(data, out, layout, dynamic=True, extra=()):
    return (sft_runs.common(data, out, STEPS) + ["engine=megadsl", f"data.use_dynamic_bsz={dynamic}"]
            + [f"engine.{k}={v}" for k, v in layout.items()] + list(extra))


def _same(got, want, what, tol=TOL):
    for step in range(1, STEPS + 1):
        for key in ("train/loss", "train/grad_norm", "train/lr", "val/loss"):
            if key in want[step]:
                assert key in got[step], (what, step, key)
                assert abs(got[step][key] - want[step][key]) <= tol * max(1.0, abs(want[step][key])), \
                    (what, step, key, got[step][key], want[step][key])


LAYOUTS = {
    "pp2_fixed": (2, {"pipeline_model_parallel_size": 2}, False),
    "dp2_fixed": (2, {}, False),
    "tp2_pp2_dp2_sp": (8, {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
                           "sequence_parallel": True}, True),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_megadsl_equals_the_fsdp_engine(data, fsdp, tmp_path, name):
    world, layout, dynamic = LAYOUTS[name]
    got = _run(world, _megadsl(data, tmp_path / "out", layout, dynamic), tmp_path, name)
    _same(got, fsdp[dynamic], name)


@pytest.fixture(scope="module")
def resumed(data, tmp_path_factory):
    """tp 2 with dynamic batching, saving every 3 steps and at the end (with the HF checkpoint); then
    the step-8 checkpoint set aside, the tracker put back to 6, and the same command again with
    resume_mode auto: verl's CheckpointHandler loads step 6 (engine, and the dataloader in the
    middle of its second epoch) and trains steps 7 and 8. (verl 0.9.1's SFT trainer resumes a
    checkpoint taken at an epoch's last step with other batches than the run that went on, with
    its FSDP engine as well: the dataloader state it saves is that of the finished epoch.)"""
    tmp = tmp_path_factory.mktemp("resume")
    out = tmp / "out"
    args = _megadsl(data, out, {"tensor_model_parallel_size": 2},
                    extra=["trainer.save_freq=3", "checkpoint.save_contents=[model,optimizer,extra,hf_model]"])
    first = _run(2, args, tmp, "first")
    shutil.move(str(out / f"global_step_{STEPS}"), str(tmp / "first_final"))
    (out / "latest_checkpointed_iteration.txt").write_text("6")
    code, log, second = sft_runs.run(2, args + ["trainer.resume_mode=auto"], tmp / "second.jsonl")
    assert code == 0, log[-6000:]
    return {"first": first, "second": second, "first_hf": tmp / "first_final" / "huggingface",
            "second_hf": out / f"global_step_{STEPS}" / "huggingface"}


def test_megadsl_tp2_equals_the_fsdp_engine(fsdp, resumed):
    _same(resumed["first"], fsdp[True], "tp2")


def test_resume_continues_bit_for_bit(resumed):
    first, second = resumed["first"], resumed["second"]
    assert sorted(second) == list(range(7, STEPS + 1)), sorted(second)  # resumed at step 6
    for step in second:
        for key in ("train/loss", "train/grad_norm", "train/lr", "val/loss"):
            if key in first[step]:
                assert second[step][key] == first[step][key], (step, key, second[step][key], first[step][key])
    from safetensors.torch import load_file

    a = {k: v for f in sorted(resumed["first_hf"].glob("*.safetensors")) for k, v in load_file(f).items()}
    b = {k: v for f in sorted(resumed["second_hf"].glob("*.safetensors")) for k, v in load_file(f).items()}
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_hf_model_loads_in_transformers_with_the_fsdp_weights(fsdp, resumed):
    """save_contents hf_model: transformers loads megadsl's HF checkpoint; after 8 AdamW steps its
    weights are the FSDP run's, and so are its log-probs."""
    from transformers import AutoModelForCausalLM

    mine = AutoModelForCausalLM.from_pretrained(resumed["first_hf"], dtype=torch.float32)
    theirs = AutoModelForCausalLM.from_pretrained(fsdp["hf"], dtype=torch.float32)
    a, b = mine.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < 1e-4, worst  # 8 AdamW steps at lr 1e-3 from states equal within 1e-6
    ids = torch.randint(3, mine.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        la, lb = mine(ids).logits.log_softmax(-1), theirs(ids).logits.log_softmax(-1)
    assert (la - lb).abs().max().item() < 1e-4
