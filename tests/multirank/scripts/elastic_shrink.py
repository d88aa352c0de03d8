"""Elastic on one host: rank 2 of 3 is SIGKILLed mid-training; the two survivors keep their
processes, re-form the job inside @hvd.elastic.run, restore the last commit and finish at size 2.

Usage: elastic_shrink.py kill|raise|double [VICTIM] (launch rank VICTIM, default 2, is SIGKILLed, or raises
an uncaught exception; ``double``: VICTIM is SIGKILLed and launch rank VICTIM - 1 dies in the recovery, in
its reset callback). Run with ``hvdliterun -np 3 --min-np 2`` (or any -np N: the job finishes at N - 1,
or N - 2 with ``double``). Each survivor prints 'recovered <seconds>' (kill to the
first step completed in the new world), its new rank and size, and 'ok elastic shrink'.
"""

import os
import signal
import sys
import time

import numpy as np
import torch

import hvdlite
import hvdlite.torch as hvd

STEPS, KILL_AT = 8, 3
VICTIM = int(sys.argv[2]) if len(sys.argv) > 2 else 2


def main() -> None:
    torch.set_num_threads(1)
    hvd.init()
    world_rank, pid, first_size = hvd.rank(), os.getpid(), hvd.size()
    run_dir = os.environ["HVDLITE_RUN_DIR"]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    initial = model.weight.detach().clone()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    resets = []
    double = sys.argv[1] == "double"

    def on_reset():
        resets.append(hvd.size())
        if double and world_rank == VICTIM - 1:  # a second failure, while the job re-forms
            os.kill(pid, signal.SIGKILL)

    state.register_reset_callbacks([on_reset])
    timings = {}

    @hvd.elastic.run
    def train(state):
        for step in range(state.step, STEPS):
            if world_rank == VICTIM and step == KILL_AT:
                with open(os.path.join(run_dir, "killed_at"), "w") as handle:
                    handle.write(str(time.time()))
                if sys.argv[1] in ("kill", "double"):
                    os.kill(pid, signal.SIGKILL)
                raise RuntimeError(f"rank {VICTIM} fails in the middle of a step (on purpose)")
            # A blocking, named, small allreduce first: from the second step on it takes the small-op
            # path (hvdlite.core.pipeline.lone), so the survivors are inside one when the victim dies.
            ranks = hvdlite.allreduce(np.ones(1, np.float32), name="ranks.in.step", op=hvdlite.Sum)
            assert ranks.tolist() == [float(hvd.size())], (ranks, hvd.size())
            optimizer.zero_grad()
            x = torch.full((2, 4), float(hvd.rank() + 1))
            model(x).sum().backward()
            optimizer.step()
            if resets and "recovered" not in timings:
                with open(os.path.join(run_dir, "killed_at")) as handle:
                    timings["recovered"] = time.time() - float(handle.read())
            state.step = step + 1  # committed: the step a restored state resumes at
            state.commit()

    train(state)
    size = first_size - (2 if double else 1)
    expected_resets = [size + 1, size] if double else [size]
    assert hvd.size() == size and state.step == STEPS and resets == expected_resets, (hvd.size(), state.step, resets)
    weights = hvd.allgather_object(model.weight.detach().tolist())
    assert all(w == weights[0] for w in weights), weights  # the survivors trained in step
    # Nothing lost or applied twice: the weight's gradient is 2 * x per step (two rows of x), averaged
    # over the ranks: x = 1..N for the KILL_AT steps at size N, then 1..F at the final size F: 2 * mean = N + 1, F + 1.
    expected = initial - 0.1 * (KILL_AT * (first_size + 1) + (STEPS - KILL_AT) * (size + 1))
    assert torch.allclose(model.weight, expected, atol=1e-5), (model.weight, expected)
    print(f"recovered {timings['recovered']:.3f}", flush=True)
    print(f"new rank {hvd.rank()} size {hvd.size()}", flush=True)
    hvd.shutdown()
    print("ok elastic shrink", flush=True)


if __name__ == "__main__":
    main()
