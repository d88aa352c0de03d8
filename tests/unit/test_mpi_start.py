"""Which MPICH settings hvdlite adds before MPI starts, from the environment a launcher gave the rank."""

import subprocess
import sys

from hvdlite.core.mpi_start import NETMOD, started_by_slurm_pmi, unconnected_step, variables_before_mpi

# What Slurm's pmi2 plugin gives a task of `srun --mpi=pmi2` (seen in this project's test cluster).
SLURM_PMI = {"PMI_FD": "13", "PMI_JOBID": "1.0", "PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_MPI_TYPE": "pmi2",
             "SLURM_STEP_ID": "0", "SLURM_PROCID": "3"}
# What Hydra (hvdliterun's mpiexec) gives a rank.
HYDRA = {"PMI_FD": "9", "PMI_RANK": "0", "PMI_SIZE": "1", "MPI_LOCALNRANKS": "1", "MPI_LOCALRANKID": "0"}


def test_a_task_of_plain_srun_gets_libfabric():
    assert started_by_slurm_pmi(SLURM_PMI)
    assert variables_before_mpi(SLURM_PMI) == {NETMOD: "ofi"}


def test_the_users_own_netmod_is_kept():
    assert variables_before_mpi({**SLURM_PMI, NETMOD: "ucx"}) == {}


def test_an_empty_netmod_counts_as_unset():
    assert variables_before_mpi({**SLURM_PMI, NETMOD: ""}) == {NETMOD: "ofi"}


def test_hydra_ranks_are_left_alone_even_inside_a_slurm_step():
    # hvdliterun inside an allocation: Hydra's proxies run under srun, so its ranks may inherit
    # Slurm's variables; Hydra's own marker decides.
    assert not started_by_slurm_pmi(HYDRA)
    assert not started_by_slurm_pmi({**SLURM_PMI, **HYDRA})
    assert variables_before_mpi({**SLURM_PMI, **HYDRA}) == {}


def test_a_singleton_or_a_batch_script_is_left_alone():
    assert variables_before_mpi({}) == {}
    assert variables_before_mpi({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "4294967294"}) == {}
    assert variables_before_mpi({k: v for k, v in SLURM_PMI.items() if k != "PMI_JOBID"}) == {}


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
