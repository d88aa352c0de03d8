"""hvdlite.ray.RayExecutor on a real local Ray (``ray.init`` in the fixture, 4 CPUs, everything on
the loopback): training, an actor killed mid-run, start/shutdown twice, and bad input."""

import sys
import threading
import time

import cloudpickle
import pytest
from hvdlite.runner.remote.job import RemoteJobError

from . import remote_training
from .harness import ONE_THREAD
from .remote_training import (
    check_matches_one_process,
    counts_through_a_lost_slot,
    run_example,
    train_distributed,
    waits_until_killed,
)

pytestmark = pytest.mark.multirank
# The ranks and actors need not import the test modules.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(remote_training)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in ONE_THREAD.items():
            patch.setenv(name, value)
        ray.init(num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
        yield ray
        ray.shutdown()


def all_cpus_free(ray, seconds=30.0):
    """Ray reports freed resources a little later than it frees them: wait for it, generously."""
    deadline = time.monotonic() + seconds
    while ray.available_resources().get("CPU") != 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    return ray.available_resources().get("CPU") == 4


def test_torch_training_on_two_actors_equals_one_process(ray_cluster):
    from hvdlite.ray import RayExecutor

    executor = RayExecutor(num_workers=2)
    executor.start()
    try:
        results = executor.run(train_distributed)
    finally:
        executor.shutdown()
    check_matches_one_process(results)


def rank_and_size(offset):
    import hvdlite as hvd

    hvd.init()
    return hvd.rank() + offset, hvd.size()


class Counter:
    """An executable object for ``start(executable_cls=...)`` and ``execute``."""

    def __init__(self, start):
        self.value = start


def test_start_and_shutdown_twice_in_one_driver(ray_cluster):
    from hvdlite.ray import RayExecutor

    for round_ in range(2):
        executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=3)
        executor.start(executable_cls=Counter, executable_args=[round_])
        assert executor.execute(lambda counter: counter.value) == [round_] * 3
        assert executor.run(rank_and_size, args=[10 * round_]) == [(10 * round_ + r, 3) for r in range(3)]
        refs = executor.run_remote(rank_and_size, kwargs={"offset": 1})
        assert ray_cluster.get(refs) == [(1 + r, 3) for r in range(3)]
        executor.shutdown()
    assert all_cpus_free(ray_cluster)  # every actor and bundle released


def test_an_actor_killed_mid_run_fails_the_job_naming_its_rank(ray_cluster, tmp_path):
    from hvdlite.ray import RayExecutor

    executor = RayExecutor(num_workers=2)
    executor.start()
    marker = tmp_path / "rank1-started"

    def kill_once_started():
        while not marker.exists():
            time.sleep(0.1)
        ray_cluster.kill(executor._workers[1])

    threading.Thread(target=kill_once_started, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(RemoteJobError, match=r"rank 1 has no result: its Ray actor died"):
            executor.run(waits_until_killed, args=[str(marker)])
        assert time.monotonic() - started < 120  # generous: the job ends with the actor, not at a deadline
    finally:
        executor.shutdown()


def test_bad_input_is_refused_on_the_driver_at_once(ray_cluster):
    from hvdlite.ray import RayExecutor, RayJobError

    executor = RayExecutor(num_workers=2)
    with pytest.raises(RayJobError, match=r"run\(\) before start\(\)"):
        executor.run(rank_and_size, args=[0])
    with pytest.raises(RayJobError, match="num_workers"):
        RayExecutor(num_workers=0)
    with pytest.raises(RayJobError, match="num_hosts not supported"):
        RayExecutor(num_workers=2, num_hosts=1)
    with pytest.raises(RayJobError, match="5 workers of .* need 5 CPU; the Ray cluster has 4 CPU in all"):
        RayExecutor(num_workers=5).start()
    # 3 workers fit the cluster, but not beside the 2 CPUs taken here: start() waits, then gives up.
    busy = RayExecutor(RayExecutor.create_settings(placement_group_timeout_s=2), num_workers=3)
    blocker = ray_cluster.util.placement_group([{"CPU": 2}])
    ray_cluster.get(blocker.ready())
    with pytest.raises(RayJobError, match="no room for 3 workers .* within 2 s"):
        busy.start()
    ray_cluster.util.remove_placement_group(blocker)
    assert all_cpus_free(ray_cluster)
    executor.start()
    try:
        lock = threading.Lock()
        with pytest.raises(RayJobError, match="cannot be pickled"):
            executor.run(lambda: lock.locked())
        assert executor.run(rank_and_size, args=[0]) == [(0, 2), (1, 2)]  # the executor still works
    finally:
        executor.shutdown()
    assert all_cpus_free(ray_cluster)


def test_the_ray_example_trains(ray_cluster):
    """examples/ray_train.py as a user runs it on a running cluster: a driver of its own, joining the
    fixture's Ray (``--address``; a Ray of its own would start a second set of daemons)."""
    address = ray_cluster.get_runtime_context().gcs_address
    done, accuracies = run_example("ray_train.py", {}, "--address", address)
    assert len(accuracies) == 2 and min(accuracies) > 0.8, done.stdout


def is_ray_actor(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().startswith(b"ray::")  # the command line Ray gives its workers


@pytest.mark.parametrize("leaves", ["killed", "raised"])
def test_elastic_executor_replaces_an_actor_killed_or_whose_rank_raised_at_np_3(ray_cluster, tmp_path, leaves):
    """A killed actor is started again as a new actor; one whose rank raised serves its slot's next
    attempt itself."""
    from hvdlite.ray import ElasticRayExecutor

    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=3, timeout_s=60))
    executor.start()
    how = ("Ray actor", is_ray_actor) if leaves == "killed" else ("", None)
    results = executor.run(counts_through_a_lost_slot, args=(str(tmp_path / leaves), 3, *how))
    assert [(rank, size) for rank, size, _, _ in results] == [(0, 3), (1, 3), (2, 3)], results
    # Two ranks trained through the loss in one process each (3 ranks, then 2, then 3 again); the
    # third is the slot's new attempt, which saw only the full world.
    # (The job may start at 2, min_num_proc, and grow to 3 at its first commit.)
    through = [seen for _, _, seen, _ in results if 2 in seen[seen.index(3):]]
    assert len(through) == 2 and all(seen[-1] == 3 for seen in through), results
    assert [set(seen) for _, _, seen, _ in results if 2 not in seen] == [{3}], results
    assert all_cpus_free(ray_cluster)


def test_ray_executor_with_min_and_max_workers_is_elastic(ray_cluster):
    from hvdlite.ray import RayExecutor, RayJobError

    executor = RayExecutor(min_workers=2, max_workers=2)
    executor.start()
    assert executor.run(rank_and_size, args=[5]) == [(5, 2), (6, 2)]
    with pytest.raises(RayJobError, match="not supported in elastic mode"):
        executor.run_remote(rank_and_size, args=[0])
    with pytest.raises(RayJobError, match="num_workers .* or min_workers/max_workers"):
        RayExecutor(num_workers=2, min_workers=1, max_workers=2)
    with pytest.raises(RayJobError, match=r"min_np <= num_proc <= max_np, got min_np=3, num_proc=2, max_np=2"):
        RayExecutor(min_workers=3, max_workers=2).start()
    with pytest.raises(RayJobError, match="min_num_proc=5 actors .* which holds 4"):
        RayExecutor(min_workers=5, max_workers=6).start()
    assert all_cpus_free(ray_cluster)
