"""A remote job (the machinery under hvdlite.spark and hvdlite.ray) with its tasks served from this
process: real ranks through the real launcher, started by the agent inside each task service."""

import os
import secrets
import sys

import cloudpickle
import pytest
from hvdlite.runner.remote.job import LaunchOptions, RemoteJobError, finish_tasks, results_by_rank, run_launcher
from hvdlite.runner.remote.task import TaskService

from .harness import ONE_THREAD

pytestmark = pytest.mark.multirank
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks need not import this test module


def summed_ranks(fail_rank):
    import numpy as np

    import hvdlite as hvd

    hvd.init()
    if hvd.rank() == fail_rank:
        raise ValueError(f"rank {fail_rank} refuses its batch")
    total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum, name="total")
    return hvd.rank(), hvd.size(), float(total[0])


def run_remote(np, fn, *args):
    key = secrets.token_bytes(32)
    tasks = [TaskService(index, cloudpickle.dumps((fn, args, {})), key, "127.0.0.1") for index in range(np)]
    env = {**os.environ, **ONE_THREAD}
    code, tail = run_launcher([task.address for task in tasks], key, LaunchOptions(env))
    finish_tasks([task.address for task in tasks], key)
    return results_by_rank([task.outcome(timeout=30) for task in tasks], code, tail)


@pytest.mark.parametrize("np", [2, 3])
def test_each_task_runs_one_rank_and_the_results_come_back_by_rank(np):
    total = np * (np + 1) / 2
    assert run_remote(np, summed_ranks, None) == [(rank, np, total) for rank in range(np)]


def test_a_rank_that_raises_is_named_with_its_traceback():
    with pytest.raises(RemoteJobError, match=r"(?s)rank 1 failed.*ValueError: rank 1 refuses its batch"):
        run_remote(3, summed_ranks, 1)
