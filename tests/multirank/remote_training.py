"""What the Spark and Ray tests share: one small torch training job, run as ranks
(``train_distributed``) and as one process on every rank's batches together (``train_one_process``);
a job whose rank 1 waits to be killed; killing the engine's process a rank runs under; and running
an example as a user does, or its functions in the test's driver."""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import numpy as np

from .harness import ONE_THREAD

STEPS, PER_RANK, FEATURES = 4, 3, 5


def batches(rank):
    rng = np.random.default_rng(rank)
    return [(rng.normal(size=(PER_RANK, FEATURES)).astype(np.float32),
             rng.normal(size=(PER_RANK, 1)).astype(np.float32)) for _ in range(STEPS)]


def model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


def train_distributed():
    import torch

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    net = model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    for x, y in batches(hvd.rank()):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        optimizer.step()
    return [p.detach().numpy() for p in net.parameters()]


def train_one_process(size):
    import torch

    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x = torch.from_numpy(np.concatenate([batches(rank)[step][0] for rank in range(size)]))
        y = torch.from_numpy(np.concatenate([batches(rank)[step][1] for rank in range(size)]))
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
    return [p.detach().numpy() for p in net.parameters()]


def check_matches_one_process(results):
    """Two ranks' results of :func:`train_distributed`: equal to one process's, and to each other bit for bit."""
    for got, want in zip(results[0], train_one_process(2), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(results[0], results[1], strict=True):
        np.testing.assert_array_equal(mine, theirs)


def waits_until_killed(marker):
    import hvdlite as hvd

    hvd.init()
    if hvd.rank() == 1:
        open(marker, "w").close()
        time.sleep(600)
    hvd.allreduce(np.ones(3), name="waits for rank 1")


def kill_ancestor(what, is_it):
    """SIGKILL the nearest ancestor of this process for which ``is_it(pid)`` holds (``what`` names it),
    then wait to die with it."""
    import signal

    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/stat") as handle:
            pid = int(handle.read().rpartition(")")[2].split()[1])
        if is_it(pid):
            os.kill(pid, signal.SIGKILL)
            time.sleep(600)
    raise AssertionError(f"no {what} above this process")


def full_again_after_a_loss(sizes, full):
    """Whether the sizes a job trained at went from ``full`` to ``full - 1`` and back to ``full``."""
    if full not in sizes:
        return False
    after_full = sizes[sizes.index(full):]
    return full - 1 in after_full and sizes[-1] == full


def counts_through_a_lost_slot(marker, full, what, is_it):
    """An elastic job that counts its ranks every step; at step 3 or later of a full world (``full``
    ranks), the first rank 1 there kills the engine's process it runs under (``what``, found by
    ``is_it``), or raises if ``is_it`` is None. Stops once the world is full again after the loss, or after 600 steps. Returns the
    rank, the size, the sizes this process trained at itself, and the job's record of them.

    (A job may start below ``full`` and grow, while it trains, to ``full``: only a smaller world
    after a full one is the loss.)"""
    import hvdlite as hvd
    from hvdlite.elastic import ObjectState

    hvd.init()
    seen = []
    state = ObjectState(hvd.broadcast_object, hvd.rank, step=0, sizes=[])

    @hvd.elastic.run
    def train(state):
        while state.step < 600 and not (state.step >= 10 and full_again_after_a_loss(state.sizes, full)):
            size = int(hvd.allreduce(np.ones(1), op=hvd.Sum, name="size")[0])
            seen.append(size)
            if size == full and hvd.rank() == 1 and state.step >= 3 and not os.path.exists(marker):
                open(marker, "w").close()
                if is_it is None:
                    raise RuntimeError(f"rank 1 raised at step {state.step}")
                kill_ancestor(what, is_it)
            state.sizes.append(size)
            state.step += 1
            time.sleep(0.1)
            state.commit()

    train(state)
    return hvd.rank(), hvd.size(), seen, state.sizes


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name):
    """examples/``name``.py as a module whose functions pickle by value (the ranks need not import it)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cloudpickle.register_pickle_by_value(module)
    return sys.modules[name]


def run_example(name, env, *args):
    """examples/``name`` run with ``--epochs 1`` and ``args`` in a driver of its own; (the finished process,
    the accuracies its ranks printed)."""
    done = subprocess.run([sys.executable, str(EXAMPLES / name), "--epochs", "1", *args], capture_output=True, text=True,
                          timeout=240, env={**os.environ, **ONE_THREAD, **env})
    assert done.returncode == 0, done.stdout + done.stderr
    return done, [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("rank ")]
