"""The pure parts of Spark/Ray jobs (hvdlite.runner.remote): arguments, commands, run directory, outcomes."""

import json
import os
import socket
import stat
import sys
import threading

import cloudpickle
import pytest
from hvdlite.runner.remote import agent, job, wire
from hvdlite.runner.remote.task import TaskOutcome


def test_the_agent_takes_hydras_ssh_style_arguments():
    assert agent.split_arguments(["-x", "task-1", "/bin/proxy", "--control-port", "vm:1"]) == \
        ("task-1", "/bin/proxy --control-port vm:1")
    assert agent.split_arguments(["task-0", "true"]) == ("task-0", "true")
    with pytest.raises(ValueError, match="HOST COMMAND"):
        agent.split_arguments(["-x", "task-0"])


def test_addresses_round_trip_and_bad_ones_are_named():
    assert wire.parse_address(wire.format_address(("10.0.0.7", 4242))) == ("10.0.0.7", 4242)
    with pytest.raises(ValueError, match="'nohost'"):
        wire.parse_address("nohost")


def test_the_launcher_runs_the_rank_wrapper_on_one_slot_per_task(tmp_path):
    argv = job.launcher_command(3, str(tmp_path), ["--timeout", "30"])
    assert argv[:4] == [sys.executable, "-m", "hvdlite.runner", "-np"] and argv[4] == "3"
    assert argv[argv.index("--hostfile") + 1] == str(tmp_path / "hostfile")
    assert argv[argv.index("--launcher-agent") + 1] == str(tmp_path / "agent")
    assert argv[-5:] == ["--timeout", "30", sys.executable, "-m", "hvdlite.runner.remote.rank"]


def test_the_run_directory_names_each_task_and_keeps_the_key_private(tmp_path):
    job.write_run_dir(str(tmp_path), [("10.0.0.1", 5000), ("10.0.0.2", 5001)], b"secret")
    assert (tmp_path / "hostfile").read_text() == "task-0 slots=1\ntask-1 slots=1\n"
    assert json.loads((tmp_path / "tasks.json").read_text()) == {"task-0": ["10.0.0.1", 5000],
                                                                  "task-1": ["10.0.0.2", 5001]}
    assert stat.S_IMODE(os.stat(tmp_path / "key").st_mode) == 0o600
    assert os.access(tmp_path / "agent", os.X_OK) and str(tmp_path) in (tmp_path / "agent").read_text()


def ok(index, value):
    return TaskOutcome(index, True, cloudpickle.dumps(value), reported=True)


def test_results_come_back_in_rank_order():
    assert job.results_by_rank([ok(0, "a"), ok(1, {"b": 2})], 0, []) == ["a", {"b": 2}]


def test_the_rank_that_raised_is_named_before_those_that_died_with_the_job():
    outcomes = [TaskOutcome(0, False, error="its rank ended without a result"),
                TaskOutcome(1, False, error="Traceback ...\nValueError: bad batch", reported=True), ok(2, 3)]
    with pytest.raises(job.RemoteJobError, match=r"rank 1 failed \(ranks without a result as well: 0\)"
                                                 r":\nTraceback ...\nValueError: bad batch"):
        job.results_by_rank(outcomes, 1, ["last line"])


def test_a_rank_without_any_report_is_named_with_the_jobs_last_output():
    outcomes = [ok(0, 1), TaskOutcome(1, False, error="the job ended before its rank started here")]
    with pytest.raises(job.RemoteJobError, match=r"(?s)rank 1 has no result: the job ended before.*code 255.*boom"):
        job.results_by_rank(outcomes, 255, ["boom"])


def test_a_failed_job_is_an_error_even_when_every_rank_returned():
    with pytest.raises(job.RemoteJobError, match="exited with code 3"):
        job.results_by_rank([ok(0, 1)], 3, [])


def test_a_rank_whose_task_died_is_named_before_those_that_died_with_the_job():
    outcomes = [TaskOutcome(0, False, error="its rank ended without a result"),
                TaskOutcome(1, False, error="its Ray actor died (ActorDiedError: ...)", lost=True)]
    with pytest.raises(job.RemoteJobError, match=r"rank 1 has no result: its Ray actor died .*\(ranks without a "
                                                 r"result as well: 0\)"):
        job.results_by_rank(outcomes, 255, [])


def test_check_build_names_the_engines_installed_and_the_extra_for_the_others(monkeypatch):
    import importlib.metadata

    from hvdlite.runner.check_build import engines, report

    real = importlib.metadata.version

    def without_ray(package):
        if package == "ray":
            raise importlib.metadata.PackageNotFoundError(package)
        return real(package)

    monkeypatch.setattr(importlib.metadata, "version", without_ray)
    assert engines() == [f"[X] Spark (pyspark {real('pyspark')})", "[ ] Ray (pip install 'hvdlite[ray]')"]
    assert "Average, Sum, Min, Max, Product, Adasum" in report({})


def test_a_task_refuses_the_result_of_a_rank_that_is_not_its_own():
    import secrets

    from hvdlite.runner.remote.task import TaskService

    key = secrets.token_bytes(16)
    task = TaskService(1, b"", key, "127.0.0.1")
    assert wire.request(task.address, key, ("result", 0, True, cloudpickle.dumps("x"))) == "ok"
    assert wire.request(task.address, key, ("finish",)) == "ok"
    outcome = task.outcome(timeout=60)
    assert not outcome.ok and "MPI rank 0 ran in task 1" in outcome.error


def test_ray_ranks_keep_the_gpus_ray_gave_their_actor(monkeypatch):
    pytest.importorskip("ray")
    from hvdlite.ray import RayExecutor

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # the driver's: not forwarded to the ranks
    monkeypatch.setenv("HVDLITE_TEST_MARK", "forwarded")
    env = RayExecutor(num_workers=1)._launch_options().env
    assert "CUDA_VISIBLE_DEVICES" not in env and env["HVDLITE_TEST_MARK"] == "forwarded"


def test_finishing_tells_every_task_and_leaves_a_hung_one_behind(tmp_path):
    key = b"k" * 32
    answering = wire.listen("127.0.0.1", key)
    heard = []

    def serve():
        with answering.accept() as connection:
            heard.append(connection.recv())
            connection.send("ok")

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    hung = socket.create_server(("127.0.0.1", 0))  # the kernel takes the connection; nothing ever answers
    try:
        reached = job.finish_tasks([hung.getsockname(), answering.address, ("127.0.0.1", _closed_port())], key,
                                   timeout=10.0)  # far more than the answering task needs, on a busy machine too
    finally:
        hung.close()
        answering.close()
    assert reached == [1] and heard == [("finish",)]


def _closed_port():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]
