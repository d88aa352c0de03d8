"""hvdliterun's elastic mode as pure logic: the mpiexec command and the job's exit code."""

import subprocess
import sys

from hvdlite.runner.command import LaunchSpec, build_mpiexec_command
from hvdlite.runner.elastic.service import ElasticService
from hvdlite.runner.elastic.watch import died_before_init, elastic_exit_code

from hvdlite.elastic.wrapper import RANK_WRAPPER, wrapped


def test_elastic_ranks_run_under_a_wrapper_that_outlives_them_and_hydra_keeps_the_survivors():
    argv = build_mpiexec_command(LaunchSpec(3, ("python", "train.py"), elastic=True), "mpiexec")
    assert "-disable-auto-cleanup" in argv
    assert argv[-8:-4] == ["sh", "-c", RANK_WRAPPER, "hvdlite-rank"] and argv[-2:] == ["python", "train.py"]
    assert argv[-4] == sys.executable and argv[-3].endswith("hvdlite/elastic/channel.py")
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


def test_a_warm_spare_fails_nothing_until_it_is_admitted(tmp_path):
    for process_id, status in (("0", 0), ("1", 0), ("g1.0", 137), ("g2.0", 3)):
        (tmp_path / f"rank.{process_id}.status").write_text(f"{status}\n")
    (tmp_path / "rank.g1.0.spare").write_text("")  # killed while it waited
    (tmp_path / "rank.g2.0.spare").write_text("")
    assert died_before_init(str(tmp_path)) is None and elastic_exit_code(str(tmp_path), 2, 0) == 0
    (tmp_path / "rank.g2.0.pid").write_text("42 node")  # admitted (it announced itself), then failed
    assert elastic_exit_code(str(tmp_path), 2, 0) == 3
    (tmp_path / "rank.g2.0.spare").unlink()
    (tmp_path / "rank.g2.0.pid").unlink()
    assert died_before_init(str(tmp_path)) == "g2.0"  # a new rank that died before hvd.init() as before
    (tmp_path / "rank.g2.0.abandoned").write_text("")  # given up while it joined: its end fails nothing
    assert died_before_init(str(tmp_path)) is None


def test_the_wrapper_records_each_ranks_status_under_its_process_id(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HVDLITE_RUN_DIR": str(tmp_path), "PMI_RANK": "1"}
    killed = wrapped(["sh", "-c", "kill -9 $$"])
    assert subprocess.run(killed, env=env).returncode == 137  # a death by a signal becomes an exit
    assert (tmp_path / "rank.1.status").read_text().strip() == "137"
    spawned = wrapped(["sh", "-c", "exit 3"])
    assert subprocess.run(spawned, env={**env, "HVDLITE_ELASTIC_SPAWN_PREFIX": "g2."}).returncode == 3
    assert (tmp_path / "rank.g2.1.status").read_text().strip() == "3"


def test_spawned_ranks_count_in_the_exit_code_unless_removed(tmp_path):
    for name, status in (("0", 0), ("1", 0), ("g1.0", 0)):
        (tmp_path / f"rank.{name}.status").write_text(f"{status}\n")
    assert elastic_exit_code(str(tmp_path), 2, 5) == 0
    (tmp_path / "rank.g1.1.status").write_text("1\n")
    assert elastic_exit_code(str(tmp_path), 2, 5) == 1
    (tmp_path / "elastic.removed").write_text("g1.1\n")
    assert elastic_exit_code(str(tmp_path), 2, 5) == 0


def test_the_wrapper_reports_the_status_to_a_launcher_that_shares_no_directory_with_it(tmp_path):
    launcher_dir, rank_dir = tmp_path / "launcher", tmp_path / "rank"
    launcher_dir.mkdir()
    service = ElasticService(str(launcher_dir), "127.0.0.1", ["127.0.0.1"])
    try:
        env = {"PATH": "/usr/bin:/bin", "HVDLITE_RUN_DIR": str(rank_dir), "PMI_RANK": "2",
               "HVDLITE_ELASTIC_SPAWN_PREFIX": "g1.", **service.environment()}
        assert subprocess.run(wrapped(["sh", "-c", "kill -9 $$"]), env=env).returncode == 137
    finally:
        service.stop()
    assert (launcher_dir / "rank.g1.2.status").read_text().strip() == "137"
    assert not rank_dir.exists()
