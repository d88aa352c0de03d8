"""Elastic training of a fully sharded model: one of the ranks is SIGKILLed in the middle of an epoch,
one step after a commit; the survivors keep their processes, rebuild its shards from the copies
their neighbours committed, re-shard for one rank fewer and finish with the parameters and Adam state
of one process that trained on every global batch (the same as a run that resumed from the commit at
the new size: every step averages over the whole global batch, whatever the number of ranks).

Usage: fully_sharded_elastic.py [VICTIM] (launch rank VICTIM, default the last, is killed). Run with
``hvdliterun -np N --min-np N-1``. Each survivor prints 'new rank R size S' and 'ok fully sharded elastic'.

``fully_sharded_elastic.py grow HOSTS_FILE``: the job grows instead. Rank 0 adds a slot to HOSTS_FILE
(what the discovery script prints) after the third step; the launcher starts a rank there, which
builds the model, joins at the next commit with no commit of its own and receives its rows; steps
go on, paced, until the job has had one more rank for 3 steps. Every rank prints 'new rank R size S'
and 'ok fully sharded elastic'.
"""

import os
import signal
import sys
import time

import torch

import hvdlite.torch as hvd

torch.set_num_threads(1)
STEPS, COMMIT_EVERY, KILL_AT, GLOBAL_BATCH = 8, 2, 5, 12  # commits after the 2nd and 4th steps: the 5th is lost and redone
WIDTH = 7  # rows no rank count here divides: uneven shards before and after


def build() -> torch.nn.Sequential:
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()) for _ in range(2)]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(WIDTH, 3))


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randn(GLOBAL_BATCH, WIDTH, generator=generator), torch.randn(GLOBAL_BATCH, 3, generator=generator)


def step_on(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


def reference(steps: int = STEPS) -> tuple[dict, dict]:
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(steps):
        step_on(model, optimizer, *global_batch(step))
    return model.state_dict(), optimizer.state_dict()


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    error = (actual - expected).abs().max().item()
    assert error <= 1e-5, f"{what} differs from the one-process reference by {error}"


def main() -> None:
    hvd.init()
    first_size, pid = hvd.size(), os.getpid()
    grow = sys.argv[1:2] == ["grow"]
    victim = None if grow else int(sys.argv[1]) if len(sys.argv) > 1 else first_size - 1
    world_rank = hvd.rank()
    model = build()
    for block in list(model)[:2]:
        hvd.fully_shard(block)
    hvd.fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    state = hvd.elastic.TorchState(model, optimizer, step=0, grown_steps=0)
    spawned = bool(os.environ.get("HVDLITE_ELASTIC_SPAWN_PREFIX"))  # started by the job, to grow it

    @hvd.elastic.run
    def train(state):
        for step in range(state.step, 400 if grow else STEPS):
            if grow and state.grown_steps >= 3:
                return
            if not grow and world_rank == victim and step == KILL_AT:
                os.kill(pid, signal.SIGKILL)
            if grow and step == 3 and hvd.rank() == 0 and hvd.size() == first_size and not spawned:
                with open(sys.argv[2] + ".tmp", "w") as handle:
                    handle.write(f"localhost:{first_size + 1}\n")
                os.replace(sys.argv[2] + ".tmp", sys.argv[2])
            x, y = global_batch(step)
            share = GLOBAL_BATCH // hvd.size()
            mine = slice(hvd.rank() * share, (hvd.rank() + 1) * share)
            step_on(model, optimizer, x[mine], y[mine])
            state.step = step + 1
            if grow:
                state.grown_steps += hvd.size() > 2  # launched at 2, grown to 3 (12 rows split either way)
                time.sleep(0.05)  # paced: the launcher looks at the host list once a second
            if grow or state.step % COMMIT_EVERY == 0:
                state.commit()

    train(state)
    expected_size = 3 if grow else first_size - 1
    assert hvd.size() == expected_size, (hvd.size(), expected_size)
    assert grow or os.getpid() == pid
    rows = -(-WIDTH // hvd.size())
    local = model[0][0].weight.to_local()
    assert local.shape == (min(rows, max(0, WIDTH - hvd.rank() * rows)), WIDTH), local.shape  # re-sharded for the new size
    params, optimizer_state = hvd.full_state_dict(model), hvd.full_optimizer_state_dict(model, optimizer)
    if hvd.rank() == 0:
        expected_params, expected_state = reference(state.step)
        for key, value in expected_params.items():
            assert_close(params[key], value, key)
        for index, values in expected_state["state"].items():
            for key, value in values.items():
                assert_close(optimizer_state["state"][index][key], value, f"optimizer state {index}.{key}")
    print(f"new rank {hvd.rank()} size {hvd.size()}", flush=True)
    hvd.shutdown()
    print("ok fully sharded elastic", flush=True)


if __name__ == "__main__":
    main()
