"""hvdlite.spark.run's checks that need no Spark cluster (the rest: tests/multirank/test_spark.py)."""

import pytest

pytest.importorskip("pyspark")

import hvdlite.spark  # noqa: E402 - after the skip
from hvdlite.spark import job  # noqa: E402


def test_without_a_running_session_it_says_to_start_one(monkeypatch):
    from pyspark import SparkContext

    # As in a fresh driver, whatever session an earlier test of this worker left running (the
    # multi-rank Spark tests share one until the worker ends).
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    with pytest.raises(hvdlite.spark.SparkJobError, match="needs a running Spark session"):
        hvdlite.spark.run(print, num_proc=2)


def test_extra_mpi_args_and_one_network_interface_become_launcher_flags():
    assert job.launcher_args("-verbose", None) == ("--mpi-args", "-verbose")
    assert job.launcher_args(None, ["eth1"]) == ("--network-interface", "eth1")
    with pytest.raises(hvdlite.spark.SparkJobError, match=r"one network interface, got \['eth0', 'eth1'\]"):
        job.launcher_args(None, {"eth0", "eth1"})


def test_another_python_for_the_ranks_is_refused():
    with pytest.raises(hvdlite.spark.SparkJobError, match="executable"):
        hvdlite.spark.run(print, executable="/usr/bin/python3")
