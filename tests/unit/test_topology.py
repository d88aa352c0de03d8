import os

from hvdlite.core.topology import topology_from_hosts, usable_cores


def test_one_host():
    t = topology_from_hosts(["a", "a", "a"], 2)
    assert (t.local_rank, t.local_size, t.cross_rank, t.cross_size, t.is_homogeneous) == (2, 3, 0, 1, True)


def test_two_hosts_interleaved():
    hosts = ["a", "b", "a", "b"]
    t = topology_from_hosts(hosts, 3)
    assert (t.local_rank, t.local_size, t.cross_rank, t.cross_size) == (1, 2, 1, 2)
    t0 = topology_from_hosts(hosts, 0)
    assert (t0.local_rank, t0.cross_rank, t0.cross_size) == (0, 0, 2)


def test_uneven_hosts_are_not_homogeneous():
    hosts = ["a", "a", "a", "b"]
    t = topology_from_hosts(hosts, 2)
    assert (t.local_rank, t.local_size, t.cross_rank, t.cross_size, t.is_homogeneous) == (2, 3, 0, 1, False)
    t3 = topology_from_hosts(hosts, 3)
    assert (t3.local_rank, t3.local_size, t3.cross_rank, t3.cross_size) == (0, 1, 1, 2)


def test_a_host_with_more_ranks_than_the_processes_cores_is_told_apart(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert usable_cores() == 2
    assert topology_from_hosts(["a", "a", "a", "b"], 0).outnumbers_cores()
    assert not topology_from_hosts(["a", "a", "b", "b"], 0).outnumbers_cores()


def test_without_cpu_affinity_the_machines_cores_count(monkeypatch):
    # macOS has no os.sched_getaffinity: hvd.init() must not fail there.
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert usable_cores() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert usable_cores() == 1
    assert topology_from_hosts(["a", "a"], 1).outnumbers_cores()
