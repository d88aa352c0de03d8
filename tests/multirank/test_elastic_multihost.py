"""Elastic jobs across two "hosts" (network namespaces, see testbed/netns.py): a remote rank's death and a
rank spawned onto the other host. hvdliterun runs on hostA; hostB is reached through the launch
agent. Root only: skipped with the reason elsewhere."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import uuid

import pytest

from testbed.netns import IFACE, make_two_hosts, unavailable

from .harness import ONE_THREAD, SCRIPTS, hvdliterun
from .test_multihost import PROBE_SECONDS, TIMEOUT_SECONDS, _assert_nothing_left

pytestmark = [pytest.mark.multirank, pytest.mark.netns]
_WHY_NOT = unavailable()
if _WHY_NOT:
    pytestmark.append(pytest.mark.skip(reason=f"two-host tests need network namespaces: {_WHY_NOT}"))


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    two = make_two_hosts(tmp_path_factory.mktemp("hosts"))
    yield two
    two.close()


def _run(hosts, args: list[str], agent: str = "") -> subprocess.CompletedProcess:
    # No transport flags: in elastic mode across hosts hvdliterun picks libfabric's TCP provider itself.
    argv = hosts.command_on("hostA", [hvdliterun()]) + ["--launcher-agent", agent or hosts.agent,
                                                         "--network-interface", IFACE, "--min-np", "2", *args]
    try:
        return subprocess.run(argv, env={**os.environ, **ONE_THREAD}, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as timeout:  # a hang: show how far the job got
        output = "".join(part.decode(errors="replace") if isinstance(part, bytes) else part or ""
                         for part in (timeout.stdout, timeout.stderr))
        raise AssertionError(f"the job did not end within 240 s; its output:\n{output}") from None


def test_a_remote_ranks_death_leaves_the_other_hosts_ranks_and_its_host_mate_training(hosts):
    done = _run(hosts, ["-np", "4", "-H", "hostA:2,hostB:2", "python", str(SCRIPTS / "elastic_shrink.py"),
                        "kill", "3"])
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for rank in (0, 1, 2):  # rank 2 runs on hostB beside the dead rank 3
        assert f"[{rank}]: new rank {rank} size 3" in output and f"[{rank}]: ok elastic shrink" in output, output
    assert "the job went on without rank(s) [3] and finished" in output, output


@pytest.mark.parametrize(("mode", "delays"), [("apart", "1,8,20"), ("during", "0")])
def test_both_ranks_of_the_other_host_dying_ms_apart_or_while_the_others_agree_leave_one_world(hosts, mode, delays):
    # np=4 over hostA:2,hostB:2: hostB's two ranks die 1, 8, then 20 ms apart (the slots refilled in
    # between, so later victims are spawned ranks, whose exits hostA learns through hvdliterun), or
    # ("during") rank 3 sleeps through rank 2's death and dies while hostA's ranks agree on the new
    # world. Every time hostA's two form one world (checked by collectives on it), the slots are
    # refilled, and the weights equal a replay of the committed steps.
    reps = len(delays.split(","))
    done = _run(hosts, ["-np", "4", "-H", "hostA:2,hostB:2", "--blacklist-cooldown-range", "0.001", "0.001",
                        "python", str(SCRIPTS / "elastic_agreement.py"), mode, delays, "2,3"])
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    worlds = re.findall(r"world ok 2 (\[[^\]]*\])", output)
    assert worlds == ["['0', '1']"] * 2 * reps and f"ok elastic agreement {reps} reps" in output, output
    assert output.count("rank(s) on hostB:2") == reps, output


def test_a_rank_that_dies_while_a_new_rank_starts_on_the_other_host_leaves_two_that_it_joins(hosts):
    # np=4 over hostA:2,hostB:2: rank 3 (hostB) dies; while rank 0 starts a new rank on hostB for its
    # slot (the job trains on), rank 1 (hostA) dies: ranks 0 and 2 re-form alike across the hosts, the
    # new rank joins them, and the weights equal a replay of the committed steps.
    done = _run(hosts, ["-np", "4", "-H", "hostA:2,hostB:2", "--blacklist-cooldown-range", "0.001", "0.001",
                        "python", str(SCRIPTS / "elastic_join_death.py"), "starting"])
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for size, world in ((3, "['0', '1', '2']"), (2, "['0', '2']")):
        assert output.count(f"world ok {size} {world}") == size, output
    assert "starting 1 new rank(s) on hostB:1" in output and "admitted 1 new rank(s) on hostB" in output, output
    assert "the job went on without rank(s) [1, 3] and finished" in output, output
    assert "ok elastic join death at size 4" in output, output


def test_the_job_grows_onto_a_host_the_discovery_script_adds(hosts, tmp_path):
    listed = tmp_path / "hosts.txt"
    listed.write_text("hostA:2\n")
    done = _run(hosts, ["--host-discovery-script", f"cat {listed}", "python", str(SCRIPTS / "elastic_hosts.py"),
                        "grow", str(listed), "3", "hostA:2,hostB:1"])
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "started as rank 2 of 3 on hostB" in output, output  # spawned onto the other host
    assert output.count("ok elastic hosts") == 3 and "starting 1 new rank(s) on hostB:1" in output, output
    assert "admitted 1 new rank(s) on hostB" in output, output


def test_rank_0_on_a_host_without_the_launchers_directory_runs_the_job_through_its_channel(
        hosts, tmp_path, own_temporary_folder):
    """hostB (ranks 0 and 1) does not see hvdliterun's run directory (an empty one of its own): rank 0
    learns the host list, the ranks' starts and exits and the rank the job went on without reach the
    launcher only through its control channel. Rank 2 on hostA is killed; once hostA's cooldown ends,
    rank 0 refills its slot."""
    agent = hosts.agent_without_run_dirs(str(tmp_path / "private-run-dir-agent.sh"), own_temporary_folder)
    done = _run(hosts, ["--blacklist-cooldown-range", "0.5", "1", "-np", "3", "-H", "hostB:2,hostA:1",
                        "python", str(SCRIPTS / "elastic_hosts.py"), "refill", str(tmp_path / "unused"), "3"], agent)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "started as rank 0 of 3 on hostB" in output and "started as rank 2 of 3 on hostA" in output, output
    assert "starting 1 new rank(s) on hostA:1" in output and output.count("ok elastic hosts") == 3, output
    assert "admitted 1 new rank(s) on hostA" in output, output
    assert "the job went on without rank(s) [2] and finished" in output, output


def test_a_host_whose_link_goes_down_is_left_behind_and_the_other_host_finishes(hosts, tmp_path):
    marker = f"HVDLITE_TEST_JOB={uuid.uuid4().hex}"
    argv = hosts.command_on("hostA", [hvdliterun()]) + [
        "--launcher-agent", hosts.agent, "--network-interface", IFACE, "--min-np", "2", "-x", marker,
        "--comm-timeout-seconds", str(TIMEOUT_SECONDS), "-np", "4", "-H", "hostA:2,hostB:2",
        "python", str(SCRIPTS / "elastic_hosts.py"), "cut", str(tmp_path / "unused"), "2"]
    process = subprocess.Popen(argv, env={**os.environ, **ONE_THREAD}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if sum("started as rank" in x for x in lines) == 4:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(90), "ranks did not start:\n" + "".join(lines)
        time.sleep(2)  # mid-training
        hosts.set_link("hostB", up=False)
        down_at = time.monotonic()
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("the job did not end within 120 s of the link going down:\n" + "".join(lines))
        ended = time.monotonic() - down_at
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        hosts.set_link("hostB", up=True)
    reader.join(5)
    output = "".join(lines)
    assert process.returncode == 0, output
    for rank in (0, 1):  # hostA's ranks re-formed the job without hostB's and finished at size 2
        assert f"[{rank}]: ok elastic hosts {rank} 2" in output, output
    assert "the job went on without rank(s) [2, 3] and finished" in output, output
    # The deadline + its probe window, then the steps at size 2 and the launcher's 5 s grace for the
    # unreachable host's proxy, with room for a loaded machine.
    assert ended < TIMEOUT_SECONDS + PROBE_SECONDS + 5 + 30, f"job ended {ended:.1f} s after the link went down\n{output}"
    # hostB's ranks see the other side as unreachable too, have no quorum, and end by themselves.
    _assert_nothing_left(marker, within=60)
