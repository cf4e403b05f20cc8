"""Runs of verl's own SFT trainer (`torchrun -m verl.trainer.sft_trainer`, its hydra command line) on
the CPU, as the README shows them, for the tests and the benchmark: the tiny chat model of
tiny_chat.py, verl's file logger for the numbers (one JSON line per step)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(log):
    """verl on the CPU (the test-side platform of verl_cpu.py), its file logger writing `log`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(VERL_USE_EXTERNAL_MODULES="verl_cpu", VERL_PLATFORM="cpu", VERL_FILE_LOGGER_PATH=str(log),
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HYDRA_FULL_ERROR="1", PYTHONUNBUFFERED="1")
    return env


def common(data, out, steps):
    """The command line both engines share: data, model, batch, schedule, logging."""
    return [f"data.train_files={data}/train.parquet", f"data.val_files={data}/val.parquet",
            f"model.path={data}/model", "trainer.device=cpu", "trainer.logger=[console,file]",
            f"trainer.total_training_steps={steps}", "trainer.test_freq=4", "trainer.save_freq=-1",
            "data.train_batch_size=8", "data.micro_batch_size_per_gpu=2", "data.max_token_len_per_gpu=512",
            "data.max_length=128", "data.num_workers=0", f"trainer.default_local_dir={out}",
            "optim.lr=1e-3", "optim.lr_scheduler_type=cosine", "optim.lr_warmup_steps=2", "optim.min_lr_ratio=0.1"]


FSDP = ["engine.strategy=fsdp2", "+engine.mixed_precision.param_dtype=fp32",
        "+model.override_config.attn_implementation=sdpa"]


def run(world, args, log, timeout=900, env_extra=None, module="verl.trainer.sft_trainer", script=None):
    """verl's trainer on `world` local ranks; returns (exit code, output, the logged steps)."""
    env = environment(log)
    env.update(env_extra or {})
    target = [script] if script else ["-m", module]
    torchrun = Path(sys.executable).parent / "torchrun"  # the verl environment's (scripts/setup.sh)
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    cmd = [*launcher, f"--nproc-per-node={world}", f"--master-port={free_port()}", *target, *args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                       cwd=Path(log).parent)  # hydra writes its outputs/ folder there
    steps = {}
    if Path(log).exists():
        for line in Path(log).read_text().splitlines():
            row = json.loads(line)
            steps.setdefault(row["step"], {}).update(row["data"])
    return p.returncode, p.stdout + p.stderr, steps
