"""A Kubernetes MPI job (Kubeflow MPI Operator conventions) read as hvdliterun's hosts and agent."""

import pytest
from hvdlite.runner.cli import LaunchError, prepare
from hvdlite.runner.cluster.hosts import HostSlots
from hvdlite.runner.command import build_mpiexec_command
from hvdlite.runner.mpi_job import MpiJobError, detect


@pytest.fixture
def hostfile(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("mpi-worker-0.mpi.default.svc:2\nmpi-worker-1.mpi.default.svc:2\n")
    return str(path)


def test_the_operators_variables_name_the_hostfile_and_the_agent(hostfile, tmp_path):
    assert detect({}) is None
    job = detect({"HYDRA_HOST_FILE": hostfile, "HYDRA_LAUNCHER_EXEC": "sh"})
    assert job.hosts == (HostSlots("mpi-worker-0.mpi.default.svc", 2), HostSlots("mpi-worker-1.mpi.default.svc", 2))
    assert job.agent == "sh" and "from HYDRA_HOST_FILE (2 host(s), 4 slot(s))" in job.describe()
    openmpi = tmp_path / "ompi"
    openmpi.write_text("w-0.svc slots=3\nw-1.svc slots=3\n")  # Open MPI's form, as the operator writes it
    job = detect({"OMPI_MCA_orte_default_hostfile": str(openmpi)})
    assert job.hosts == (HostSlots("w-0.svc", 3), HostSlots("w-1.svc", 3)) and job.agent == ""


@pytest.mark.parametrize("env, fragment", [
    ({"HYDRA_HOST_FILE": "/nonexistent/hostfile"}, "HYDRA_HOST_FILE='/nonexistent/hostfile' names a hostfile that "
                                                   "cannot be read"),
    ({"HYDRA_HOST_FILE": "HOSTFILE", "HYDRA_LAUNCHER_EXEC": "/nonexistent/kubexec.sh"},
     "HYDRA_LAUNCHER_EXEC='/nonexistent/kubexec.sh' is not an executable program"),
])
def test_an_unusable_hostfile_or_agent_is_named(env, fragment, hostfile):
    env = {name: hostfile if value == "HOSTFILE" else value for name, value in env.items()}
    with pytest.raises(MpiJobError) as info:
        detect(env)
    assert fragment in str(info.value)


def test_a_hostile_hostfile_is_refused_by_name(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("-oProxyCommand=x:2\n")
    with pytest.raises(MpiJobError, match="bad host name '-oProxyCommand=x'"):
        detect({"HYDRA_HOST_FILE": str(path)})


def test_the_launcher_pods_command_needs_no_np_hosts_or_agent(hostfile):
    env = {"HYDRA_HOST_FILE": hostfile, "HYDRA_LAUNCHER_EXEC": "sh"}
    spec, _, _ = prepare(["python", "train.py"], env)
    argv = build_mpiexec_command(spec, "mpiexec")
    assert spec.num_proc == 4 and argv[:9] == [
        "mpiexec", "-n", "4", "-hosts", "mpi-worker-0.mpi.default.svc:2,mpi-worker-1.mpi.default.svc:2",
        "-launcher", "ssh", "-launcher-exec", spec.launcher_agent]
    assert spec.launcher_agent.endswith("/sh")
    mine, _, _ = prepare(["--launcher-agent", "true", "-np", "3", "python"], env)
    assert mine.launcher_agent.endswith("/true") and mine.hosts[-1] == HostSlots("mpi-worker-1.mpi.default.svc", 1)
    with pytest.raises(LaunchError, match="-np 5 is more than the 4 task slots of MPI job hostfile from HYDRA_HOST_FILE"):
        prepare(["-np", "5", "python"], env)
