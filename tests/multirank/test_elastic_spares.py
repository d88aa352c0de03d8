"""Warm spares (``hvdliterun --warm-spares``), with real ranks through hvdliterun: a process rank 0
started ahead fills a slot at a commit (a slot added by discovery, or one a dead rank left), and a
spare whose rank 0 died ends instead of holding the job."""

import re
from collections import Counter

import pytest

from .harness import SCRIPTS, run_job

pytestmark = pytest.mark.multirank

SPARE = ["--warm-spares", "1"]


def _worlds(output: str, size: int) -> list[str]:
    """The worlds of ``size`` ranks the job had, each checked by all of its members alike."""
    seen = Counter(re.findall(rf"world ok {size} (\[[^\]]*\])", output))  # two ranks' lines may share one
    assert all(count == size for count in seen.values()), output
    return sorted(seen)


def test_a_slot_added_by_discovery_is_filled_by_the_ready_spare(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    result = run_job(["--min-np", "2", *SPARE, "--host-discovery-script", f"cat {hosts}", "python",
                      str(SCRIPTS / "elastic_spares.py"), "join", str(hosts)], np=None, timeout=180)
    assert result.returncode == 0, result.output
    assert "admitted 1 warm spare(s)" in result.output and "spare joined as rank 2 of 3" in result.output, result.output
    assert _worlds(result.output, 3) == ["['0', '1', 'g1.0']"], result.output
    assert "ok elastic spares join" in result.output, result.output


def test_the_slot_of_a_dead_rank_is_filled_by_the_spare_after_the_cooldown():
    result = run_job(["--min-np", "2", *SPARE, "--blacklist-cooldown-range", "0.5", "1", "python",
                      str(SCRIPTS / "elastic_spares.py"), "refill"], np=3, timeout=180)
    assert result.returncode == 0, result.output
    assert "admitted 1 warm spare(s)" in result.output and "spare joined as rank 2 of 3" in result.output, result.output
    assert _worlds(result.output, 2) == ["['0', '1']"], result.output
    assert _worlds(result.output, 3) == ["['0', '1', '2']", "['0', '1', 'g1.0']"], result.output
    assert "the job went on without rank(s) [2] and finished" in result.output, result.output


def test_a_spare_whose_rank_0_died_ends_and_the_job_goes_on_at_full_size():
    result = run_job(["--min-np", "2", *SPARE, "--blacklist-cooldown-range", "0.5", "1", "python",
                      str(SCRIPTS / "elastic_spares.py"), "orphan"], np=3, timeout=180)
    assert result.returncode == 0, result.output
    assert "the rank that started this warm spare has exited, or gave it up: this process ends" in result.output, result.output
    assert "ok elastic spares orphan" in result.output, result.output
    assert "the job went on without rank(s) [0] and finished" in result.output, result.output


def test_a_spare_that_fails_before_hvd_init_stops_the_spares_and_fails_nothing(tmp_path):
    result = run_job(["--min-np", "2", *SPARE, "python", str(SCRIPTS / "elastic_spares.py"), "crash",
                      str(tmp_path / "crashed")], np=2, timeout=180)
    assert result.returncode == 0, result.output
    assert "exited before it reached hvd.init() (see its output): no more spares are started" in result.output, \
        result.output
    assert "ok elastic spares crash 100 steps" in result.output, result.output
