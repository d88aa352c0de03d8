"""One worker of bench/elastic_recovery.py: trains an MLP and, once, loses the last rank mid-run.

Usage: elastic_worker.py hvdlite|silent|torchrun|join|warm RESULTS_DIR. The last rank SIGKILLs itself
(``silent``: SIGSTOPs itself, a process that neither dies nor answers) at step KILL_AT after writing the time; the first step a surviving (hvdlite) or restarted (torchrun)
worker completes afterwards writes the recovery time. hvdlite also times ``state.commit()``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch

STEPS, KILL_AT, BATCH, WIDTH = 12, 6, 32, 1024


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH),
                               torch.nn.ReLU(), torch.nn.Linear(WIDTH, 10))


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    x = torch.randn(BATCH, WIDTH)
    torch.nn.functional.cross_entropy(model(x), torch.randint(0, 10, (BATCH,))).backward()
    optimizer.step()


def record(results: str, name: str, value: float) -> None:
    with open(os.path.join(results, name), "w") as handle:
        handle.write(json.dumps(value))


def die_if_due(results: str, rank: int, size: int, at: int, first_attempt: bool,
               how: signal.Signals = signal.SIGKILL) -> None:
    if first_attempt and rank == size - 1 and at == KILL_AT:
        record(results, "killed_at", time.time())
        os.kill(os.getpid(), how)


def recovered(results: str) -> None:
    if not os.path.exists(os.path.join(results, "recovered")):
        with open(os.path.join(results, "killed_at")) as handle:
            record(results, "recovered", time.time() - json.load(handle))


def hvdlite_worker(results: str, how: signal.Signals = signal.SIGKILL) -> None:
    import hvdlite.torch as hvd

    hvd.init()
    first_size = hvd.size()
    model = mlp()
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters()), named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    commits: list[float] = []

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        for at in range(state.step, STEPS):
            die_if_due(results, hvd.rank(), hvd.size(), at, hvd.size() == first_size, how)
            step(model, optimizer)
            if hvd.size() < first_size and hvd.rank() == 0:
                recovered(results)
            state.step = at + 1
            start = time.perf_counter()
            state.commit()
            commits.append(time.perf_counter() - start)

    train(state)
    if hvd.rank() == 0:
        mbytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3 / 1e6  # weights + Adam's two
        record(results, "commit_ms_per_mb", 1e3 * sorted(commits)[len(commits) // 2] / mbytes)
    hvd.shutdown()


def join_worker(results: str, warm: bool = False) -> None:
    """np=2 under a discovery script that prints RESULTS/hosts: rank 0 adds a slot at step KILL_AT (with
    ``warm``, once its warm spare is ready too); the time from that write to the first step the grown
    world (3 ranks) completes is the join time (``joined``), and from hvdliterun's publication of the
    new list (its 1 s poll saw the change) to that step, ``joined_after_publish``; the longest time
    between two of rank 0's steps meanwhile (the world standing still: 20 ms of sleep and ~10 ms of
    step when nothing waits), ``longest_pause``."""
    import hvdlite.torch as hvd
    from hvdlite.elastic import spares

    hvd.init()
    model = mlp()
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters()), named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    published = os.path.join(os.environ["HVDLITE_RUN_DIR"], "elastic.hosts")

    pauses = {"last": 0.0, "longest": 0.0}  # rank 0's longest time between two steps, from the slot's addition

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        for at in range(state.step, 600):
            ready = not warm or sum(spares.mine().count(ready=True).values()) > 0
            if hvd.size() == 2 and hvd.rank() == 0 and at >= KILL_AT and ready and not os.path.exists(
                    os.path.join(results, "added_at")):
                record(results, "added_at", time.time())
                with open(os.path.join(results, "hosts.tmp"), "w") as handle:
                    handle.write("localhost:3\n")
                os.replace(os.path.join(results, "hosts.tmp"), os.path.join(results, "hosts"))
            step(model, optimizer)
            if hvd.rank() == 0 and pauses["last"] and os.path.exists(os.path.join(results, "added_at")):
                pauses["longest"] = max(pauses["longest"], time.time() - pauses["last"])
            pauses["last"] = time.time()
            if hvd.size() == 3:
                if hvd.rank() == 0 and not os.path.exists(os.path.join(results, "joined")):
                    now = time.time()
                    with open(os.path.join(results, "added_at")) as handle:
                        record(results, "joined", now - json.load(handle))
                    record(results, "joined_after_publish", now - os.path.getmtime(published))
                    record(results, "longest_pause", pauses["longest"])
                if at >= state.step + 2:
                    return
            state.step = at + 1
            state.commit()
            time.sleep(0.02)  # a step of this MLP takes ~10 ms: give the launcher's 1 s poll a few steps

    train(state)
    hvd.shutdown()


def torchrun_worker(results: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    model = torch.nn.parallel.DistributedDataParallel(mlp())
    optimizer = torch.optim.Adam(model.parameters())
    checkpoint = os.path.join(results, "checkpoint.pt")
    start_at = 0
    if os.path.exists(checkpoint):  # torchrun restarted every worker: resume from the checkpoint
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start_at = saved["step"]
    for at in range(start_at, STEPS):
        die_if_due(results, rank, size, at, first_attempt)
        step(model, optimizer)
        if not first_attempt and rank == 0:
            recovered(results)
        if rank == 0:  # the same commit as hvdlite's: every step
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": at + 1},
                       checkpoint + ".tmp")
            os.replace(checkpoint + ".tmp", checkpoint)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    workers = {"hvdlite": hvdlite_worker, "torchrun": torchrun_worker, "join": join_worker,
               "warm": lambda results: join_worker(results, warm=True),
               "silent": lambda results: hvdlite_worker(results, signal.SIGSTOP)}
    workers[sys.argv[1]](sys.argv[2])
