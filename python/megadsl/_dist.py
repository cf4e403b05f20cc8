"""Joining a job (megadsl.init) and starting one on this machine (megadsl.launch_local)."""

import io
import multiprocessing
import os
import queue
import re
import shutil
import socket
import tempfile
import time
import traceback

from . import _C


def _env_int(names, default=None):
    for n in names:
        v = os.environ.get(n)
        if v is not None and v != "":
            try:
                return int(v)
            except ValueError:
                raise ValueError(f"megadsl.init: {n}={v!r} is not an integer") from None
    return default


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(timeout=None):
    """Joins the job this process belongs to, from the launcher's environment: RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun, megadsl.launch_local; under
    srun SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID). Every Model built afterwards runs over this
    job's ranks. Does nothing when this process has joined already. `timeout` (seconds) bounds the
    rendezvous and every collective (default: MEGADSL_TIMEOUT_S or 120).

    Without init(), a Model runs in a world of one process.
    """
    if _C.is_initialized():
        return
    rank = _env_int(("RANK", "SLURM_PROCID"))
    world = _env_int(("WORLD_SIZE", "SLURM_NTASKS"))
    if rank is None or world is None:
        raise RuntimeError(
            "megadsl.init: RANK and WORLD_SIZE are not set: start this program with torchrun (or srun), or run "
            "a function on local ranks with megadsl.launch_local; without init() a Model uses one process"
        )
    local_rank = _env_int(("LOCAL_RANK", "SLURM_LOCALID"), 0)
    local_world = _env_int(("LOCAL_WORLD_SIZE",), 1)
    addr = os.environ.get("MASTER_ADDR")
    if addr is None:
        if world > 1:
            raise RuntimeError("megadsl.init: MASTER_ADDR is not set; set it to the address of rank 0 "
                               "(torchrun and megadsl.launch_local do)")
        addr = "127.0.0.1"
    port = _env_int(("MASTER_PORT",), 29500)
    # Under torchrun the agent already serves a store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE);
    # c10d's TCPStore then uses that one instead of hosting its own on rank 0.
    _C._init(rank, world, local_rank, local_world, addr, port, timeout)


class LaunchError(RuntimeError):
    """A rank of megadsl.launch_local failed. `rank` is the first rank that failed, `errors` maps every
    rank that reported an error (or died) to its text."""

    def __init__(self, message, rank, errors):
        super().__init__(message)
        self.rank = rank
        self.errors = errors


def _rank_main(rank, nprocs, port, fn, args, results, extra_env):
    os.environ.update({
        "RANK": str(rank),
        "WORLD_SIZE": str(nprocs),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(nprocs),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    })
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    os.environ.update(extra_env)
    import torch

    import megadsl

    try:
        megadsl.init()
        value = fn(*args)
        buf = io.BytesIO()
        torch.save(value, buf)  # bytes, not shared memory: readable after this process is gone
        message = (rank, "ok", buf.getvalue())
    except BaseException as e:  # noqa: BLE001  (a failed rank reports whatever stopped it)
        message = (rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    results.put(message)
    results.close()
    results.join_thread()
    failed = message[1] != "ok"
    if failed:
        os._exit(1)  # do not wait for peers that may be stuck in a collective with this rank
    megadsl.shutdown()


def launch_local(nprocs, fn, *args, timeout=None, grace=3.0, env=None):
    """Runs ``fn(*args)`` on `nprocs` new local processes (multiprocessing "spawn"), each one rank of
    a job: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free
    MASTER_PORT are set, and megadsl.init() has been called when `fn` starts. `fn` and `args` must
    be picklable (a module-level function). `env`: more environment variables for the ranks.

    Returns the ranks' return values in rank order (tensors come back as copies). When a rank
    raises or dies, the others get `grace` seconds to finish or report (they learn of the failure
    within a second), then are stopped (killed 2 s later if they do not end), and
    LaunchError names the first failed rank with its traceback. `timeout` (seconds) bounds the
    whole job.
    """
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"megadsl.launch_local: nprocs must be a positive integer, got {nprocs!r}")
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    # A rank that ends from its watch thread (a peer stopped, the store's host gone) cannot report
    # through the queue: it leaves the reason, and the rank it names, in <dir>/rank<r>.
    failure_dir = tempfile.mkdtemp(prefix="megadsl-launch-")
    extra = {"MEGADSL_FAILURE_DIR": failure_dir, **{str(k): str(v) for k, v in (env or {}).items()}}
    procs = [ctx.Process(target=_rank_main, args=(r, nprocs, port, fn, args, results, extra), name=f"megadsl-rank-{r}")
             for r in range(nprocs)]
    for p in procs:
        p.start()
    values, errors, first = {}, {}, None
    start = time.monotonic()
    failed_at = None
    try:
        while len(values) + len(errors) < nprocs:
            try:
                rank, status, payload = results.get(timeout=0.1)
                if status == "ok":
                    import torch

                    values[rank] = torch.load(io.BytesIO(payload), weights_only=False)
                else:
                    errors[rank] = payload
                    first = rank if first is None else first
            except queue.Empty:
                pass
            now = time.monotonic()
            for r, p in enumerate(procs):  # a rank that died without a word
                if r not in values and r not in errors and p.exitcode is not None:
                    try:  # its last message may still be in flight
                        rank, status, payload = results.get(timeout=0.5)
                        if status == "ok":
                            import torch

                            values[rank] = torch.load(io.BytesIO(payload), weights_only=False)
                        else:
                            errors[rank] = payload
                            first = rank if first is None else first
                        continue
                    except queue.Empty:
                        pass
                    code = p.exitcode
                    record = _failure_record(failure_dir, r)
                    if record is not None:  # its watch ended it, naming why (and which rank, if one)
                        culprit, text = record
                        errors[r] = text if culprit == r else f"rank {r} ended: {text}"
                        if 0 <= culprit < nprocs and culprit != r and culprit not in values and culprit not in errors:
                            errors[culprit] = text  # a stopped or hung rank: it will not speak, and is ended now
                            procs[culprit].kill()
                        first = (culprit if 0 <= culprit < nprocs else r) if first is None else first
                        continue
                    errors[r] = (f"rank {r} was killed by signal {-code}" if code < 0
                                 else f"rank {r} exited with code {code} without reporting a result")
                    first = r if first is None else first
            if first is not None and failed_at is None:
                failed_at = now
            if failed_at is not None and now - failed_at > grace:
                for r in range(nprocs):
                    if r not in values and r not in errors:
                        errors[r] = f"rank {r} was stopped after rank {first} failed"
                break
            if timeout is not None and now - start > timeout:
                running = [r for r in range(nprocs) if r not in values and r not in errors]
                for r in running:
                    errors[r] = f"rank {r} was still running after the timeout of {timeout} s"
                first = running[0] if first is None else first
                break
    finally:
        for p in procs:
            if p.is_alive() and (first is not None):
                p.terminate()
        for p in procs:  # a stopped (SIGSTOP) or hung rank does not end on SIGTERM: killed after 2 s
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
        shutil.rmtree(failure_dir, ignore_errors=True)
    if first is not None:
        text = errors[first].rstrip()
        others = [r for r in sorted(errors) if r != first]
        more = f" (also ended: ranks {', '.join(map(str, others))})" if others else ""
        if re.match(rf"rank {first}\b", text):  # the reason names the rank already ("rank 1 stopped responding ...")
            raise LaunchError(f"megadsl.launch_local: {text}{more}", first, errors)
        raise LaunchError(f"megadsl.launch_local: rank {first} failed{more}: {text}", first, errors)
    return [values[r] for r in range(nprocs)]


def _failure_record(failure_dir, rank):
    """(the rank the failure names or -1, its text) that rank `rank`'s watch left when it ended it."""
    try:
        with open(os.path.join(failure_dir, f"rank{rank}")) as f:
            culprit, _, text = f.read().partition("\n")
        text = text.strip()
        for prefix in ("ending this rank: ", "the job failed: "):  # the cause, not the watch's words for ending
            text = text[len(prefix):] if text.startswith(prefix) else text
        return int(culprit), text
    except (OSError, ValueError):
        return None
