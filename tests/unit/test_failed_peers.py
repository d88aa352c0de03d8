"""Which members' status files record a failure (the rank wrapper writes them; waits look every few ms)."""

from hvdlite.utils import failed_peers
from hvdlite.utils.failed_peers import failed_statuses, status_file


def test_only_members_whose_recorded_status_is_a_failure_count(tmp_path):
    for process_id, text in (("1", "137\n"), ("2", "0\n"), ("g1.0", "1\n"), ("g1.1", ""), ("7", "9\n")):
        with open(status_file(str(tmp_path), process_id), "w") as handle:
            handle.write(text)
    (tmp_path / "rank.3.pid").write_text("123 host")
    members = ["0", "1", "2", "3", "g1.0", "g1.1"]
    assert failed_statuses(str(tmp_path), members) == {"1", "g1.0"}  # 7 is no member; g1.1 is mid-write


def test_no_run_directory_means_no_status_files():
    assert failed_statuses("", ["0"]) == set()
    assert failed_statuses("/nonexistent/hvdliterun-x", ["0"]) == set()


def test_while_a_spawn_runs_the_list_of_the_dead_is_the_last_one_read(monkeypatch):
    reads = []

    def read(world):
        reads.append(world)
        return [2] if len(reads) == 1 else [2, 3]

    monkeypatch.setattr(failed_peers, "_read_failed_world_ranks", read)
    assert failed_peers.failed_world_ranks("world") == [2]
    with failed_peers.spawning():
        assert failed_peers.failed_world_ranks("world") == [2] and len(reads) == 1  # MPI not asked
    assert failed_peers.failed_world_ranks("world") == [2, 3] and len(reads) == 2
