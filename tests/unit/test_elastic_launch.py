"""hvdliterun's elastic mode as pure logic: the mpiexec command and the job's exit code."""

from runner.command import ELASTIC_RANK_WRAPPER, LaunchSpec, build_mpiexec_command
from runner.process import elastic_exit_code


def test_elastic_ranks_run_under_a_wrapper_that_outlives_them_and_hydra_keeps_the_survivors():
    argv = build_mpiexec_command(LaunchSpec(3, ("python", "train.py"), elastic=True), "mpiexec")
    assert "-disable-auto-cleanup" in argv
    assert argv[-6:] == ["sh", "-c", ELASTIC_RANK_WRAPPER, "hvdlite-rank", "python", "train.py"]
    assert "trap '' USR1" in ELASTIC_RANK_WRAPPER and "rank.$PMI_RANK.status" in ELASTIC_RANK_WRAPPER
    static = build_mpiexec_command(LaunchSpec(3, ("python", "train.py")), "mpiexec")
    assert "-disable-auto-cleanup" not in static and static[-2:] == ["python", "train.py"]


def test_the_exit_code_is_the_survivors(tmp_path):
    for rank, status in ((0, 0), (1, 0), (2, 137)):
        (tmp_path / f"rank.{rank}.status").write_text(f"{status}\n")
    assert elastic_exit_code(str(tmp_path), 3, 137) == 137  # nobody re-formed the job without rank 2
    (tmp_path / "elastic.removed").write_text("2\n")
    assert elastic_exit_code(str(tmp_path), 3, 137) == 0
    (tmp_path / "rank.1.status").write_text("1\n")
    assert elastic_exit_code(str(tmp_path), 3, 137) == 1  # a survivor failed
    (tmp_path / "rank.0.status").unlink()
    assert elastic_exit_code(str(tmp_path), 3, 9) == 9  # unknown: mpiexec's code
