"""The watch over a joining rank (hvdlite/elastic/join_watch.py, run by path as hvd.init() runs it) and
the helper-thread watch over a join's MPI calls (hvdlite.elastic.forming.watched)."""

import subprocess
import sys
import threading

import pytest

from hvdlite.elastic import join_watch, joining
from hvdlite.elastic.forming import watched
from hvdlite.errors import HvdliteError


def _watch(target: subprocess.Popen, run_dir, process_id: str) -> subprocess.Popen:
    watcher = subprocess.Popen([sys.executable, join_watch.__file__, str(target.pid), str(run_dir), "", process_id],
                               stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher.stdin.write("token\n")
    watcher.stdin.flush()
    return watcher


def test_the_watcher_kills_the_joining_process_once_the_job_gave_it_up(tmp_path):
    target = subprocess.Popen(["sleep", "600"])
    watcher = _watch(target, tmp_path, "g3.0")
    (tmp_path / join_watch.abandoned_marker("g3.0")).write_text("")
    assert target.wait(timeout=120) == -9
    assert "the job gave new rank g3.0 up" in watcher.communicate(timeout=120)[1]


def test_the_watcher_ends_without_a_kill_when_its_stdin_closes(tmp_path):
    target = subprocess.Popen(["sleep", "600"])
    watcher = _watch(target, tmp_path, "g3.0")
    watcher.stdin.close()  # the rank joined
    assert watcher.wait(timeout=120) == 0
    (tmp_path / join_watch.abandoned_marker("g3.0")).write_text("")
    assert target.poll() is None
    target.kill()
    target.wait()


def test_gone_names_the_processes_that_exited_or_were_given_up(tmp_path):
    assert join_watch.gone(str(tmp_path), "", "", ["g1.0", "g1.1"]) == set()
    (tmp_path / "rank.g1.0.status").write_text("137\n")
    assert join_watch.gone(str(tmp_path), "", "", ["g1.0", "g1.1"]) == {"g1.0"}
    (tmp_path / join_watch.abandoned_marker("g1.1")).write_text("")
    assert join_watch.gone(str(tmp_path), "", "", ["g1.0", "g1.1"]) == {"g1.0", "g1.1"}
    assert join_watch.gone(str(tmp_path / "missing"), "", "", ["g1.0"]) == set()


def test_new_ranks_late_past_the_join_deadline_read_as_dead_and_are_given_up_once():
    given: list[str] = []
    late = joining.late_as_dead(lambda members: [], ["g1.0", "g1.1"], 0.0, given.append)
    assert late(["0", "1", "g1.0", "g1.1"]) == ["g1.0", "g1.1"]
    assert late(["0", "g1.1"]) == ["g1.1"]
    assert given == ["g1.0", "g1.1"]  # marked once, however often the watch reads


def test_before_the_join_deadline_only_the_dead_are_read():
    given: list[str] = []
    late = joining.late_as_dead(lambda members: ["1"], ["g1.0"], 0.0, given.append)
    assert late(["0", "1", "g1.0"]) == ["1"] and given == []  # a death is the reason, not lateness
    waiting = joining.late_as_dead(lambda members: [], ["g1.0"], 3600.0, given.append)
    assert waiting(["0", "g1.0"]) == [] and given == []


def test_watched_returns_the_result_or_none_once_a_member_died():
    assert watched(lambda: 7, ["0", "1"], lambda members: [], None, "the grown world") == 7
    blocked = threading.Event()
    assert watched(blocked.wait, ["0", "1"], lambda members: ["1"], None, "the grown world") is None
    blocked.set()


def test_watched_raises_the_calls_error_and_names_a_stopped_member():
    def fail():
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        watched(fail, ["0"], lambda members: [], None, "the grown world")
    blocked = threading.Event()
    with pytest.raises(HvdliteError, match=r"the grown world of rank\(s\) \['0', '1'\] was not formed"):
        watched(blocked.wait, ["0", "1"], lambda members: [], 0.05, "the grown world")
    blocked.set()
