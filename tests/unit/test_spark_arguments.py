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


def test_run_elastic_sizes_take_horovods_names_and_the_issues_and_refuse_disorder():
    from hvdlite.spark import elastic

    assert elastic._either("min_np", None, 2) == 2 and elastic._either("max_np", 3, 3) == 3
    with pytest.raises(hvdlite.spark.SparkJobError, match="max_np=3 and max_num_proc=4 disagree"):
        elastic._either("max_np", 3, 4)
    sizes = elastic._sizes(2, None, None, None, None)
    assert (sizes.num_proc, sizes.min_np, sizes.max_np) == (2, 2, 2)
    with pytest.raises(hvdlite.spark.SparkJobError, match="run_elastic: .*min_np=3, num_proc=2"):
        elastic._sizes(2, 3, None, None, None)


def test_spark_backend_without_num_proc_or_a_session_says_what_it_needs(monkeypatch):
    import pyspark

    from hvdlite.errors import HvdliteError
    from hvdlite.spark.common.backend import SparkBackend

    # This worker may hold the suite's Spark session (the multirank spark fixture): not this test's.
    monkeypatch.setattr(pyspark.SparkContext, "_active_spark_context", None)
    assert SparkBackend(num_proc=3).num_processes() == 3
    with pytest.raises(HvdliteError, match="SparkBackend\\(\\) without num_proc needs a running Spark session"):
        SparkBackend().num_processes()
