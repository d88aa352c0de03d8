"""Which MPICH settings hvdlite adds before MPI starts, from the environment a launcher gave the rank."""

import subprocess
import sys
import threading

from hvdlite.core.mpi_start import (
    NETMOD,
    QUIET_WAITS,
    started_by_slurm_pmi,
    unconnected_step,
    variables_before_mpi,
    wait_for_local_ranks,
)

# What Slurm's pmi2 plugin gives a task of `srun --mpi=pmi2` (seen in this project's test cluster).
SLURM_PMI = {"PMI_FD": "13", "PMI_JOBID": "1.0", "PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_MPI_TYPE": "pmi2",
             "SLURM_STEP_ID": "0", "SLURM_PROCID": "3"}
# What Hydra (hvdliterun's mpiexec) gives a rank.
HYDRA = {"PMI_FD": "9", "PMI_RANK": "0", "PMI_SIZE": "1", "MPI_LOCALNRANKS": "1", "MPI_LOCALRANKID": "0"}


def test_a_task_of_plain_srun_gets_libfabric():
    assert started_by_slurm_pmi(SLURM_PMI)
    assert variables_before_mpi(SLURM_PMI, cores=64) == {NETMOD: "ofi"}


def test_the_users_own_netmod_is_kept():
    assert variables_before_mpi({**SLURM_PMI, NETMOD: "ucx"}, cores=64) == {}


def test_an_empty_netmod_counts_as_unset():
    assert variables_before_mpi({**SLURM_PMI, NETMOD: ""}, cores=64) == {NETMOD: "ofi"}


def test_hydra_ranks_are_left_alone_even_inside_a_slurm_step():
    # hvdliterun inside an allocation: Hydra's proxies run under srun, so its ranks may inherit
    # Slurm's variables; Hydra's own marker decides.
    assert not started_by_slurm_pmi(HYDRA)
    assert not started_by_slurm_pmi({**SLURM_PMI, **HYDRA})
    assert variables_before_mpi({**SLURM_PMI, **HYDRA}, cores=64) == {}


def test_a_singleton_or_a_batch_script_is_left_alone():
    assert variables_before_mpi({}, cores=64) == {}
    assert variables_before_mpi({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "4294967294"}, cores=64) == {}
    assert variables_before_mpi({k: v for k, v in SLURM_PMI.items() if k != "PMI_JOBID"}, cores=64) == {}


def test_mpich_sleeps_in_its_blocking_waits_where_a_host_has_more_ranks_than_cores():
    assert QUIET_WAITS == {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
    assert variables_before_mpi({**HYDRA, "MPI_LOCALNRANKS": "3"}, cores=2) == QUIET_WAITS
    assert variables_before_mpi({**HYDRA, "MPI_LOCALNRANKS": "2"}, cores=2) == {}
    assert variables_before_mpi({**HYDRA, "MPI_LOCALNRANKS": "3", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "0"}, cores=2) == {}
    assert variables_before_mpi({**SLURM_PMI, "MPI_LOCALNRANKS": "9"}, cores=2) == QUIET_WAITS  # Hydra inside an allocation
    assert variables_before_mpi(SLURM_PMI, cores=1) == {NETMOD: "ofi"}  # Slurm says nothing of the host's tasks


def test_importing_hvdlite_and_its_adapters_does_not_start_mpi():
    # mpi4py's MPI starts MPI when imported; before hvd.init() it would be too late to choose the
    # netmod above (and a script that only imports hvdlite would start MPI for nothing).
    modules = ["hvdlite", "hvdlite.torch", "hvdlite.jax", "hvdlite.tensorflow.keras"]
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint('mpi4py.MPI' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False", done.stdout


# What srun gives a task without a PMI (`--mpi=none`, Slurm's usual default).
SLURM_NO_PMI = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "2"}


def test_tasks_of_srun_without_a_pmi_are_refused_naming_the_step_and_the_fix():
    problem = unconnected_step(SLURM_NO_PMI, world_size=1)
    assert problem is not None
    assert "srun started 4 tasks in Slurm step 7.0, but MPI started task 2 alone (size 1)" in problem
    assert "srun --mpi=pmi2" in problem and "hvdliterun" in problem


def test_a_connected_step_a_one_task_step_and_hydra_ranks_pass():
    assert unconnected_step(SLURM_NO_PMI, world_size=4) is None
    assert unconnected_step({**SLURM_NO_PMI, "SLURM_STEP_NUM_TASKS": "1"}, world_size=1) is None
    assert unconnected_step({**SLURM_NO_PMI, **HYDRA}, world_size=1) is None  # hvdliterun -np 1 in a step
    assert unconnected_step({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}, world_size=1) is None  # the batch script
    assert unconnected_step({}, world_size=1) is None


def _local_rank(run_dir, rank: int, ranks: int) -> dict[str, str]:
    return {**HYDRA, "HVDLITE_RUN_DIR": str(run_dir), "MPI_LOCALNRANKS": str(ranks), "MPI_LOCALRANKID": str(rank)}


def test_a_rank_waits_before_mpi_init_until_its_hosts_other_ranks_arrive(tmp_path):
    done = []
    first = threading.Thread(target=lambda: done.append(wait_for_local_ranks(_local_rank(tmp_path, 0, 2), host="a")))
    first.start()
    first.join(0.3)
    assert first.is_alive() and not done  # rank 1 of host "a" has not come yet
    assert not wait_for_local_ranks(_local_rank(tmp_path, 0, 2), timeout=0.1, host="b")  # another host's count
    assert first.is_alive()
    assert wait_for_local_ranks(_local_rank(tmp_path, 1, 2), host="a")
    first.join(30)
    assert done == [True]


def test_a_rank_that_never_comes_only_costs_the_timeout(tmp_path):
    assert not wait_for_local_ranks(_local_rank(tmp_path, 0, 3), timeout=0.1, host="a")


def test_without_hvdliterun_or_its_run_folder_nothing_waits(tmp_path):
    assert not wait_for_local_ranks(HYDRA)  # plain mpiexec: no run folder
    assert not wait_for_local_ranks(_local_rank(tmp_path / "on-the-launchers-host-only", 0, 2))
    assert not wait_for_local_ranks({"HVDLITE_RUN_DIR": str(tmp_path)})  # not started by Hydra
    assert not (tmp_path / "arrived").exists()
