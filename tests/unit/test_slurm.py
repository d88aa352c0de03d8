"""A Slurm allocation read as hvdliterun's hosts (Slurm's variables, parsed in process)."""

import pytest
from hvdlite.runner.cli import LaunchError, prepare
from hvdlite.runner.cluster.hosts import HostSlots, first_slots
from hvdlite.runner.cluster.slurm import SlurmError, allocation_hosts, expand_counts, expand_hostlist, in_allocation
from hvdlite.runner.command import build_mpiexec_command

ALLOCATION = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_TASKS_PER_NODE": "2(x2)"}


@pytest.mark.parametrize("text, names", [
    ("node01", ["node01"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("a[1-2],b3,c[9-10]", ["a1", "a2", "b3", "c9", "c10"]),
    ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),
    ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ("n[008-010]", ["n008", "n009", "n010"]),
    ("hostA,hostB", ["hostA", "hostB"]),
])
def test_compressed_host_lists_expand_in_slurms_order(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text, fragment", [
    ("node[01-", "unbalanced"), ("node[[1]]", "nested"), ("node[a-b]", "'a-b' is not N or N-M"),
    ("node[5-2]", "range '5-2' runs backwards"), ("", "names no node"),
])
def test_bad_host_lists_are_named(text, fragment):
    with pytest.raises(SlurmError, match="SLURM_JOB_NODELIST") as info:
        expand_hostlist(text)
    assert fragment in str(info.value)


def test_task_counts_expand_repeats():
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("4") == [4]
    for bad in ("x", "0", "2(3)", "2(x)"):
        with pytest.raises(SlurmError, match="SLURM_TASKS_PER_NODE"):
            expand_counts(bad)


def test_the_allocation_becomes_hosts_with_slots():
    assert not in_allocation({}) and in_allocation(ALLOCATION)
    assert allocation_hosts(ALLOCATION) == (HostSlots("node01", 2), HostSlots("node02", 2))
    with pytest.raises(SlurmError, match="gives 1 counts for the 2 nodes"):
        allocation_hosts({**ALLOCATION, "SLURM_TASKS_PER_NODE": "2"})
    assert first_slots((HostSlots("a", 2), HostSlots("b", 2)), 3) == (HostSlots("a", 2), HostSlots("b", 1))


def test_inside_an_allocation_hvdliterun_needs_no_np_and_starts_proxies_with_srun():
    spec, _, _ = prepare(["python"], ALLOCATION)
    assert spec.num_proc == 4 and spec.hosts == (HostSlots("node01", 2), HostSlots("node02", 2))
    argv = build_mpiexec_command(spec, "mpiexec")
    assert argv[:7] == ["mpiexec", "-n", "4", "-hosts", "node01:2,node02:2", "-launcher", "slurm"]
    smaller, _, _ = prepare(["-np", "3", "python"], ALLOCATION)
    assert smaller.hosts == (HostSlots("node01", 2), HostSlots("node02", 1))  # the first slots
    named, _, _ = prepare(["-np", "2", "-H", "other:2", "python"], ALLOCATION)
    assert named.hosts == (HostSlots("other", 2),) and not named.slurm  # -H wins over the allocation


def test_more_ranks_than_the_allocation_is_a_clear_error():
    with pytest.raises(LaunchError, match=r"-np 5 is more than the 4 task slots of Slurm job 42 "
                                          r"\(SLURM_JOB_NODELIST='node\[01-02\]'"):
        prepare(["-np", "5", "python"], ALLOCATION)
    with pytest.raises(LaunchError, match="cannot read the Slurm allocation: SLURM_JOB_NODELIST='n\\[1-': unbalanced brackets"):
        prepare(["python"], {**ALLOCATION, "SLURM_JOB_NODELIST": "n[1-"})


def test_check_build_reports_the_schedulers_it_finds(tmp_path):
    from hvdlite.runner.check_build import schedulers

    assert schedulers({}) == ["[ ] none (hosts come from -H, --hostfile or this machine)"]
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("w-0:2\n")
    found = schedulers({**ALLOCATION, "HYDRA_HOST_FILE": str(hostfile)})
    assert found[0].startswith("[X] Slurm: Slurm job 42") and "4 task slot(s); proxies start with srun" in found[0]
    assert found[1] == "[X] Kubernetes MPI job: MPI job hostfile from HYDRA_HOST_FILE (1 host(s), 2 slot(s)), " \
                       "processes started with ssh"
    assert schedulers({**ALLOCATION, "SLURM_TASKS_PER_NODE": "x"})[0].startswith("[!] Slurm: SLURM_TASKS_PER_NODE")


def test_drained_down_or_failing_nodes_leave_an_elastic_jobs_host_list():
    from hvdlite.runner.cluster.slurm import usable_from_sinfo

    hosts = tuple(HostSlots(f"n{i}", 2) for i in range(1, 7))
    sinfo = "n1 allocated\nn2 draining\nn3 drained\nn4 down*\nn5 mixed\nn6 allocated*\n"
    assert [h.host for h in usable_from_sinfo(hosts, sinfo)] == ["n1", "n5", "n6"]
    assert usable_from_sinfo(hosts, "n1 idle\n") == [HostSlots("n1", 2)]  # a node sinfo omits gets no rank
