"""One rank of the acceptance test (test_torchrun.py starts it with torch.distributed.run):

    torchrun --nproc-per-node 4 torchrun_logprobs.py FIXTURE REFERENCE.pt --tp 2 --pp 2

loads the HF fixture at the layout on the job's ranks, runs the batch stored in REFERENCE.pt, and
on rank 0 compares the log-probs (and entropy) with the reference that transformers computed. Exit
status 1 on a mismatch (torchrun then fails).
"""

import argparse
import sys

import torch

import megadsl


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fixture")
    ap.add_argument("reference")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--sp", action="store_true")
    ap.add_argument("--rmpad", action="store_true")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()

    megadsl.init()
    ref = torch.load(a.reference)
    model = megadsl.Model.from_hf(a.fixture, tp=a.tp, pp=a.pp, sp=a.sp, rmpad=a.rmpad)
    with torch.no_grad():
        out = model.forward(ref["input_ids"], ref["attention_mask"])
    if megadsl.rank() != 0:
        return 0
    where = ref["lp_valid"]
    if not torch.equal(out["valid"], where):
        print("rank 0: the valid mask differs from the reference's", file=sys.stderr)
        return 1
    d_lp = (out["log_probs"].double() - ref["log_probs"]).abs()[where].max().item()
    d_ent = (out["entropy"].double() - ref["entropy"]).abs()[ref["attention_mask"].bool()].max().item()
    print(f"rank 0 of {megadsl.world_size()}: {model.layout}: max |log_probs - transformers| = {d_lp:.3e}, "
          f"max |entropy - transformers| = {d_ent:.3e} over {int(where.sum())} tokens", flush=True)
    if not (d_lp <= a.tol and d_ent <= a.tol):
        print(f"rank 0: MISMATCH (tolerance {a.tol})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
