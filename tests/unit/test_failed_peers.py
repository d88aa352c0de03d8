"""Which members' status files record a failure (the rank wrapper writes them; waits look every few ms)."""

from hvdlite.utils.failed_peers import _failed_statuses, status_file


def test_only_members_whose_recorded_status_is_a_failure_count(tmp_path):
    for process_id, text in (("1", "137\n"), ("2", "0\n"), ("g1.0", "1\n"), ("g1.1", ""), ("7", "9\n")):
        with open(status_file(str(tmp_path), process_id), "w") as handle:
            handle.write(text)
    (tmp_path / "rank.3.pid").write_text("123 host")
    members = ["0", "1", "2", "3", "g1.0", "g1.1"]
    assert _failed_statuses(str(tmp_path), members) == {"1", "g1.0"}  # 7 is no member; g1.1 is mid-write


def test_no_run_directory_means_no_status_files():
    assert _failed_statuses("", ["0"]) == set()
    assert _failed_statuses("/nonexistent/hvdliterun-x", ["0"]) == set()
