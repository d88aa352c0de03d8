"""hvdlite.spark.run on a real local Spark cluster: ``local-cluster[2,1,1024]``, two executor
processes of one core each, started by the ``spark`` fixture of conftest.py (PyPI pyspark, Debian's
Java runtime; skipped with the reason where Java is missing)."""

import os
import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest
from hvdlite.runner.remote.job import RemoteJobError

from . import remote_training
from .remote_training import (
    check_matches_one_process,
    counts_through_a_lost_slot,
    example,
    train_distributed,
    waits_until_killed,
)

pytestmark = pytest.mark.multirank
# The ranks need not import the test modules.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(remote_training)


def test_torch_training_on_two_spark_tasks_equals_one_process(spark):
    import hvdlite.spark

    results = hvdlite.spark.run(train_distributed, num_proc=2)
    assert len(results) == 2
    check_matches_one_process(results)


def ranks_and_hosts(offset):
    import socket

    import hvdlite as hvd

    hvd.init()
    return hvd.rank() + offset, hvd.size(), hvd.local_size(), socket.gethostname()


def fails_on_rank_one():
    import hvdlite as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank 1 could not read its shard")
    hvd.allreduce(np.ones(3), name="never completes")


def no_jobs_left(spark):
    return spark.sparkContext.statusTracker().getActiveJobsIds() == []


def test_a_rank_that_raises_is_named_on_the_driver_and_the_next_run_works(spark):
    import hvdlite.spark

    with pytest.raises(RemoteJobError, match=r"(?s)rank 1 failed.*ValueError: rank 1 could not read its shard"):
        hvdlite.spark.run(fails_on_rank_one, num_proc=2)
    assert no_jobs_left(spark)
    assert hvdlite.spark.run(ranks_and_hosts, args=(10,), num_proc=2) == [(10, 2, 2, os.uname().nodename),
                                                                           (11, 2, 2, os.uname().nodename)]


def test_a_task_spark_kills_fails_the_job_naming_its_rank(spark, tmp_path):
    import hvdlite.spark

    marker = tmp_path / "rank1-started"

    def cancel_once_started():
        while not marker.exists():
            time.sleep(0.1)
        spark.sparkContext.cancelAllJobs()  # Spark kills the stage's tasks, and with them their ranks

    canceller = threading.Thread(target=cancel_once_started, daemon=True)
    canceller.start()
    started = time.monotonic()
    with pytest.raises(RemoteJobError, match=r"rank \d (has no result|failed)"):
        hvdlite.spark.run(waits_until_killed, args=(str(marker),), num_proc=2)
    assert time.monotonic() - started < 120  # generous: the job ends with its tasks, not at a deadline
    assert no_jobs_left(spark)


def test_more_ranks_than_the_cluster_has_slots_is_refused_before_anything_starts(spark):
    import hvdlite.spark

    with pytest.raises(hvdlite.spark.SparkJobError, match="num_proc=3 ranks need 3 task slots.*has 2"):
        hvdlite.spark.run(ranks_and_hosts, args=(0,), num_proc=3)
    assert no_jobs_left(spark)


def test_a_function_that_cannot_be_pickled_is_refused_before_anything_starts(spark):
    import hvdlite.spark

    lock = threading.Lock()
    with pytest.raises(hvdlite.spark.SparkJobError, match="cannot be pickled"):
        hvdlite.spark.run(lambda: lock.locked(), num_proc=2)
    assert no_jobs_left(spark)


def test_the_spark_example_trains(spark):
    """examples/spark_train.py's ``train`` for one epoch, run by ``hvdlite.spark.run`` as its ``main`` does,
    on the shared cluster (a cluster of its own would start three more JVMs: over a minute of CPU)."""
    import hvdlite.spark

    results = hvdlite.spark.run(example("spark_train").train, args=(1, 0.05), num_proc=2)
    assert [(result["rank"], result["size"]) for result in results] == [(0, 2), (1, 2)], results
    assert min(result["accuracy"] for result in results) > 0.8, results


def is_java(pid):
    with open(f"/proc/{pid}/comm") as handle:
        return handle.read().strip() == "java"


def test_run_elastic_survives_a_lost_executor_and_grows_back(spark, tmp_path):
    import hvdlite.spark

    args = (str(tmp_path / "killed"), 2, "executor JVM", is_java)
    results = hvdlite.spark.run_elastic(counts_through_a_lost_slot, args=args, num_proc=2, min_num_proc=1,
                                        max_num_proc=2)
    assert [(rank, size) for rank, size, _, _ in results] == [(0, 2), (1, 2)], results
    survivor, joined = results[0][2], results[1][2]
    # The survivor trained through the loss in one process: two ranks, one, then two again.
    assert survivor[:4] == [2, 2, 2, 2] and 1 in survivor and survivor[-1] == 2, survivor
    assert set(joined) == {2} and len(joined) < len(survivor), joined  # the task Spark ran again
    assert results[0][3] == results[1][3], results
    assert no_jobs_left(spark)


def test_run_elastic_goes_on_without_a_rank_that_raised_and_spark_runs_its_task_again(spark, tmp_path):
    import hvdlite.spark

    results = hvdlite.spark.run_elastic(counts_through_a_lost_slot, args=(str(tmp_path / "raised"), 2, "", None),
                                        num_proc=2, min_num_proc=1, max_num_proc=2)
    assert [(rank, size) for rank, size, _, _ in results] == [(0, 2), (1, 2)], results
    survivor, joined = results[0][2], results[1][2]
    # The other rank trained on alone, then with the raising task's new attempt.
    assert survivor[:4] == [2, 2, 2, 2] and 1 in survivor and survivor[-1] == 2, survivor
    assert set(joined) == {2} and len(joined) < len(survivor), joined
    assert results[0][3] == results[1][3], results
    assert no_jobs_left(spark)
