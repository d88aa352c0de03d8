"""The pure parts of elastic Spark and Ray jobs (hvdlite.runner.remote.elastic): sizes, the run
directory the registry keeps, the launcher command, and results by final rank."""

import json
import os
import secrets
import subprocess
import sys

import cloudpickle
import pytest
from hvdlite.runner.remote import elastic, wire
from hvdlite.runner.remote.job import RemoteJobError
from hvdlite.runner.remote.task import TaskOutcome


def test_sizes_must_be_ordered_and_the_message_names_them():
    assert elastic.ElasticSizes(2, 1, 3).max_np == 3
    with pytest.raises(ValueError, match="got min_np=3, num_proc=2, max_np=4"):
        elastic.ElasticSizes(2, 3, 4)
    with pytest.raises(ValueError, match="num_proc=5, max_np=4"):
        elastic.ElasticSizes(5, 1, 4)


def test_the_command_runs_hvdliterun_elastic_over_the_discovered_tasks(tmp_path):
    sizes = elastic.ElasticSizes(2, 1, 3, elastic_timeout=30, reset_limit=4)
    elastic.write_discovery_script(str(tmp_path))
    argv = elastic.elastic_launcher_command(sizes, str(tmp_path), ["--network-interface", "eth1"])
    flags = dict(zip(argv[3:-3:2], argv[4:-3:2], strict=False))
    assert flags["-np"] == "2" and flags["--min-np"] == "1" and flags["--max-np"] == "3"
    assert flags["--elastic-timeout"] == "30" and flags["--reset-limit"] == "4" and flags["--slots-per-host"] == "1"
    assert flags["--launcher-agent"] == str(tmp_path / "agent")
    assert argv[-3:] == [sys.executable, "-m", "hvdlite.runner.remote.rank"]
    assert os.access(flags["--host-discovery-script"], os.X_OK)


def register(registry, key, index, attempt, port):
    assert wire.request(registry.address, key, ("join", index, attempt, ("127.0.0.1", port))) == "ok"


def test_the_registry_lists_each_tasks_latest_attempt_and_keeps_every_address(tmp_path):
    key = secrets.token_bytes(16)
    registry = elastic.ElasticRegistry("127.0.0.1", key, str(tmp_path))
    try:
        assert (tmp_path / elastic.HOSTS_LIST).read_text() == ""  # published before any task came
        register(registry, key, 1, 0, 5001)
        register(registry, key, 0, 0, 5000)
        assert registry.wait_for(2, 60, lambda: True)
        register(registry, key, 1, 1, 5002)  # task 1 ran again: a new slot
        register(registry, key, 1, 0, 5009)  # a late message from the attempt it replaced
        assert (tmp_path / elastic.HOSTS_LIST).read_text() == "task-0.0:1\ntask-1.1:1\n"
        printed = subprocess.run([str(tmp_path / elastic.DISCOVERY_SCRIPT)], capture_output=True, text=True, check=True)
        assert printed.stdout == "task-0.0:1\ntask-1.1:1\n"  # what hvdliterun's discovery reads
        assert registry.live() == {"task-0.0": ("127.0.0.1", 5000), "task-1.1": ("127.0.0.1", 5002)}
        assert json.loads((tmp_path / "tasks.json").read_text()) == {
            "task-1.0": ["127.0.0.1", 5001], "task-0.0": ["127.0.0.1", 5000], "task-1.1": ["127.0.0.1", 5002]}
        with pytest.raises(TimeoutError, match="only 2 of the 3 tasks"):
            registry.wait_for(3, 0.2, lambda: True)
        assert not registry.wait_for(3, 60, lambda: False)  # the engine's stage ended
    finally:
        registry.close()


def test_outcomes_come_by_alias_and_a_silent_task_is_lost(tmp_path):
    key = secrets.token_bytes(16)
    registry = elastic.ElasticRegistry("127.0.0.1", key, str(tmp_path))
    try:
        sent = TaskOutcome(0, True, cloudpickle.dumps(7), reported=True, final_rank=0)
        assert wire.request(registry.address, key, ("outcome", "task-0.0", sent)) == "ok"
        outcomes = registry.finished(["task-0.0", "task-1.0"], 0.2)
        assert outcomes["task-0.0"] == sent and outcomes["task-1.0"].lost
    finally:
        registry.close()


def done(value, final_rank):
    return TaskOutcome(0, True, cloudpickle.dumps(value), reported=True, final_rank=final_rank)


def test_results_are_those_of_the_finished_ranks_by_final_rank():
    outcomes = {"task-0.0": done("a", 1), "task-1.1": done("b", 0),
                "task-2.0": TaskOutcome(2, False, error="Traceback ...", reported=True)}  # the job went on
    assert elastic.elastic_results(outcomes, 0, []) == ["b", "a"]


def test_a_failed_job_names_the_rank_that_raised_or_quotes_the_output():
    outcomes = {"task-0.0": done("a", 0), "task-1.0": TaskOutcome(1, False, error="ValueError: bad", reported=True)}
    with pytest.raises(RemoteJobError, match=r"exit code 1\); the rank in task-1.0 raised:\nValueError: bad"):
        elastic.elastic_results(outcomes, 1, [])
    with pytest.raises(RemoteJobError, match=r"(?s)exit code 2\); its last output:\nfewer than --min-np"):
        elastic.elastic_results({"task-0.0": done("a", 0)}, 2, ["fewer than --min-np 2"])


def test_an_elastic_task_takes_any_mpi_rank_and_keeps_its_final_rank():
    from hvdlite.runner.remote.task import TaskService

    key = secrets.token_bytes(16)
    task = TaskService(1, b"", key, "127.0.0.1", host_alias="task-1.2")
    assert wire.request(task.address, key, ("result", 0, True, cloudpickle.dumps("x"), 4)) == "ok"
    assert wire.request(task.address, key, ("finish",)) == "ok"
    outcome = task.outcome(timeout=60)
    assert outcome.ok and outcome.final_rank == 4 and cloudpickle.loads(outcome.value) == "x"
