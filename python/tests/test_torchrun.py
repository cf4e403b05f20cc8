"""The acceptance test: under torchrun, 4 ranks at tp 2 x pp 2 (fp32), the llama-gqa fixture's
log-probs equal those `transformers` computes here, within 1e-4."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import lp_valid

HERE = Path(__file__).resolve().parent


def transformers_reference(fixture, ids, mask):
    """log_probs / entropy per generate_fixtures.py's DEFINITIONS, from transformers itself."""
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(fixture), attn_implementation="eager", dtype=torch.float32).eval()
    pos = torch.clamp(torch.cumsum(mask, -1) - 1, min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits.float()
    logp = torch.log_softmax(logits.double(), -1)
    entropy = -(logp.exp() * logp).sum(-1)
    nxt = torch.zeros_like(ids)
    nxt[:, :-1] = ids[:, 1:]
    lp = logp.gather(-1, nxt[..., None])[..., 0]
    where = lp_valid(mask)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "lp_valid": where,
        "log_probs": torch.where(where, lp, torch.zeros_like(lp)),
        "entropy": torch.where(mask.bool(), entropy, torch.zeros_like(entropy)),
    }


@pytest.mark.parametrize("side", ["left"])
def test_torchrun_tp2_pp2_matches_transformers(gqa, reference, tmp_path, side):
    ids, mask = reference[f"{side}.input_ids"], reference[f"{side}.attention_mask"]
    ref = transformers_reference(gqa, ids, mask)
    # transformers here agrees with the committed fixture (same definitions)
    assert (ref["log_probs"].float() - reference[f"{side}.log_probs"]).abs().max() < 1e-5
    torch.save(ref, tmp_path / "reference.pt")

    env = dict(os.environ, OMP_NUM_THREADS="1", MEGADSL_TIMEOUT_S="120")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(HERE)) if p)
    with socket.socket() as sock:  # a free port for torchrun's store (not 29500: another job may hold it)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port", str(port),
               str(HERE / "torchrun_logprobs.py"), str(gqa), str(tmp_path / "reference.pt"), "--tp", "2", "--pp", "2"]
    try:
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun did not finish in 600 s:\n{e.stdout}\n{e.stderr}")
    print(run.stdout)
    assert run.returncode == 0, f"torchrun exited {run.returncode}:\n{run.stdout}\n{run.stderr[-6000:]}"
    assert "max |log_probs - transformers|" in run.stdout
