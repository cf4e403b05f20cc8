"""verl's SFT trainer (verl.trainer.sft_trainer's own main) with each training step timed on every
rank: the wall time of TrainingWorker.train_batch (forward, backward and optimizer of one global
batch, what verl's perf/mfu divides by), written as JSON to $MEGADSL_STEP_TIMES on rank 0.
Run by bench/verl_sft.py under torchrun, with the trainer's hydra arguments."""

import json
import os
import time

import torch.distributed as dist
from verl.trainer import sft_trainer
from verl.workers import engine_workers

_train_batch = engine_workers.TrainingWorker.train_batch
times = []


def train_batch(self, data):
    start = time.perf_counter()
    out = _train_batch(self, data)
    times.append(time.perf_counter() - start)
    return out


engine_workers.TrainingWorker.train_batch = train_batch
_run_sft = sft_trainer.run_sft


def run_sft(config):
    _run_sft(config)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(os.environ["MEGADSL_STEP_TIMES"], "w") as f:
            json.dump(times, f)


sft_trainer.run_sft = run_sft

if __name__ == "__main__":
    sft_trainer.main()
