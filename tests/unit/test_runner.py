"""Launcher logic in process: host parsing, command building, flag/env handling, output tagging."""

import pytest
from hvdlite.runner.cli import LaunchError, all_hosts_local, prepare
from hvdlite.runner.cluster.hosts import HostError, HostSlots, parse_hostfile, parse_hosts, total_slots
from hvdlite.runner.command import TAG_PATTERN, LaunchSpec, build_mpiexec_command, flag_environment, ssh_agent_script
from hvdlite.runner.process import _report_failed_rank, local_pids, read_pid_files
from hvdlite.runner.tagging import LineTagger


def test_parse_hosts():
    assert parse_hosts("a:2,b:2,c") == [HostSlots("a", 2), HostSlots("b", 2), HostSlots("c", 1)]
    assert parse_hosts("a:1,a:2") == [HostSlots("a", 3)]
    assert total_slots(parse_hosts("a:2,b:3")) == 5


@pytest.mark.parametrize("spec,fragment", [("a:x", "slots for 'a' must be an integer"), ("a:0", "must be >= 1"),
                                           ("", "empty host list"), ("a,,b", "bad host name ''"),
                                           ("-Efoo:1", "bad host name '-Efoo'")])  # ssh would take it as an option
def test_bad_hosts(spec, fragment):
    with pytest.raises(HostError, match=None) as info:
        parse_hosts(spec)
    assert fragment in str(info.value)


def test_parse_hostfile():
    text = "# cluster\nnode1 slots=4\nnode2:2\n\nnode3  # one slot\n"
    assert parse_hostfile(text) == [HostSlots("node1", 4), HostSlots("node2", 2), HostSlots("node3", 1)]
    with pytest.raises(HostError, match="hf:2: expected 'host slots=N'"):
        parse_hostfile("a\nb c d\n", "hf")


def test_command_local_and_remote():
    local = build_mpiexec_command(LaunchSpec(3, ("python", "t.py")), "/x/mpiexec")
    assert local == ["/x/mpiexec", "-n", "3", "-prepend-pattern", TAG_PATTERN, "python", "t.py"]
    spec = LaunchSpec(4, ("python", "t.py"), (HostSlots("h1", 2), HostSlots("h2", 2)),
                      mpi_args="-genv FOO 'a b'", launcher_agent="/tmp/agent.sh")
    assert build_mpiexec_command(spec, "mpiexec") == [
        "mpiexec", "-n", "4", "-hosts", "h1:2,h2:2", "-launcher", "ssh", "-launcher-exec", "/tmp/agent.sh",
        "-prepend-pattern", TAG_PATTERN, "-genv", "FOO", "a b", "python", "t.py"]


def test_output_files_replace_tagging():
    argv = build_mpiexec_command(LaunchSpec(2, ("p",), output_dir="/o"), "m")
    assert "-outfile-pattern" in argv and "/o/rank.%r/stdout" in argv and "-prepend-pattern" not in argv


def test_ssh_agent_script():
    assert ssh_agent_script(2222, "/k ey") == "#!/bin/sh\nexec ssh -p 2222 -i '/k ey' \"$@\"\n"


def test_flags_become_variables():
    env = flag_environment({"fusion_threshold_mb": 2.0, "cycle_time_ms": 1.5, "no_stall_check": True,
                            "log_level": "DEBUG", "cache_capacity": None, "timeline_filename": "t.json",
                            "timeline_mark_cycles": True, "autotune": True, "autotune_log_file": "a.csv",
                            "hierarchical_allreduce": True})
    assert env == {"HVDLITE_FUSION_THRESHOLD": "2097152", "HVDLITE_CYCLE_TIME": "1.5",
                   "HVDLITE_STALL_CHECK": "0", "HVDLITE_LOG_LEVEL": "DEBUG", "HVDLITE_TIMELINE": "t.json",
                   "HVDLITE_TIMELINE_MARK_CYCLES": "1", "HVDLITE_AUTOTUNE": "1", "HVDLITE_AUTOTUNE_LOG": "a.csv",
                   "HVDLITE_HIERARCHICAL_ALLREDUCE": "1"}


def test_flag_beats_environment_beats_default():
    _, env, _ = prepare(["-np", "2", "--cycle-time-ms", "3", "python", "x.py"],
                        {"HVDLITE_CYCLE_TIME": "7", "HVDLITE_CACHE_CAPACITY": "9"})
    assert env["HVDLITE_CYCLE_TIME"] == "3.0" and env["HVDLITE_CACHE_CAPACITY"] == "9"
    _, env, _ = prepare(["-np", "2", "python", "x.py"], {})
    assert "HVDLITE_CYCLE_TIME" not in env


@pytest.mark.parametrize("argv,fragment", [
    (["-np", "0", "python"], "-np must be at least 1, got 0"),
    (["python"], "-np is required"),
    (["-np", "5", "-H", "a:2,b:2", "python"], "-np 5 needs more processes than the 4 slots in a:2, b:2"),
    (["-np", "2", "-H", "a:two", "python"], "slots for 'a' must be an integer"),
    (["-np", "2", "no-such-program-xyz"], "program 'no-such-program-xyz' not found on PATH"),
    (["-np", "2", "./missing.sh"], "program './missing.sh' does not exist"),
    (["-np", "2"], "no program given"),
    (["-np", "2", "--cycle-time-ms", "-1", "python"], "HVDLITE_CYCLE_TIME='-1.0' is invalid"),
    (["-np", "2", "--hostfile", "/nonexistent/hosts", "python"], "cannot read --hostfile"),
    (["-np", "two", "python"], "invalid int value: 'two'"),
])
def test_bad_input(argv, fragment):
    with pytest.raises(LaunchError) as info:
        prepare(argv, {})
    assert fragment in str(info.value)


def test_bad_environment_variable_is_a_launch_error():
    with pytest.raises(LaunchError, match="HVDLITE_FUSION_THRESHOLD='big' is invalid"):
        prepare(["-np", "2", "python"], {"HVDLITE_FUSION_THRESHOLD": "big"})


def test_tagger_reassembles_split_and_interleaved_lines():
    tagger = LineTagger()
    out = tagger.feed(b"\x1e1\x1fhello a\x1e0\x1fzero\n\x1e1\x1f\n\x1e1\x1fb1\nb2\npart")
    out += tagger.feed(b"\x1e1\x1fial") + b"mpiexec says hi\n" + tagger.flush()
    assert out.split(b"\n") == [b"[0]: zero", b"[1]: hello a", b"[1]: b1", b"[1]: b2", b"mpiexec says hi",
                                b"[1]: partial", b""]


def test_failed_rank_report_never_claims_an_order_it_did_not_see(capsys):
    _report_failed_rank([(1, 101)], [])
    assert capsys.readouterr().err == "hvdliterun: rank 1 (pid 101) was the first rank to end; the job failed\n"
    # seen gone together (a late look on a busy machine): MPI's report says which one it means
    _report_failed_rank([(0, 100), (1, 101)], ["=   PID 101 RUNNING AT vm"])
    err = capsys.readouterr().err
    assert "ranks [0, 1] ended before hvdliterun could tell them apart; MPI reports rank 1 (pid 101)" in err
    _report_failed_rank([(0, 100), (1, 101)], ["=   PID 555 RUNNING AT vm"])
    assert "MPI reports pid 555 on vm terminated abnormally (it may name a rank it killed" in capsys.readouterr().err


def test_network_interface_reaches_hydra_and_the_transports():
    spec, env, _ = prepare(["-np", "2", "-H", "a:1,b:1", "--network-interface", "lo", "python"], {})
    assert build_mpiexec_command(spec, "m")[:7] == ["m", "-n", "2", "-hosts", "a:1,b:1", "-iface", "lo"]
    assert env["UCX_NET_DEVICES"] == "lo" and env["FI_TCP_IFACE"] == "lo" and env["HVDLITE_NETWORK_INTERFACE"] == "lo"
    _, env, _ = prepare(["-np", "2", "--network-interface", "lo", "python"], {"UCX_NET_DEVICES": "mlx5_0:1"})
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1"  # the user's own transport setting wins


def test_environment_forwarding_flags():
    _, env, _ = prepare(["-np", "2", "-x", "A=1", "-x", "B", "--env", "C=x=y", "python"], {"B": "kept"})
    assert (env["A"], env["B"], env["C"]) == ("1", "kept", "x=y")


def test_launcher_agent_is_resolved_and_passed_to_hydra(tmp_path):
    agent = tmp_path / "agent.sh"
    agent.write_text("#!/bin/sh\n")
    agent.chmod(0o755)
    spec, env, _ = prepare(["-np", "2", "-H", "h1,h2", "--launcher-agent", str(agent), "python"], {})
    assert ["-launcher", "ssh", "-launcher-exec", str(agent)] == build_mpiexec_command(spec, "m")[5:9]


@pytest.mark.parametrize("argv,fragment", [
    (["-x", "B"], "-x B: B is not set in hvdliterun's environment; use -x B=VALUE"),
    (["-x", "1BAD=2"], "-x '1BAD=2': '1BAD' is not an environment variable name"),
    (["--network-interface", "nosuch0"], "--network-interface 'nosuch0' does not exist on this host (it has: "),
    (["--network-interface", "eth0,eth1"], "give one interface name"),
    (["--launcher-agent", "/nonexistent/agent"], "--launcher-agent '/nonexistent/agent' is not an executable"),
    (["--launcher-agent", "sh", "-p", "2222"], "--launcher-agent replaces ssh"),
    (["--comm-timeout-seconds", "1"], "HVDLITE_COMM_TIMEOUT_SECONDS=1.0 must be 0 or at least twice"),
])
def test_bad_multi_host_input(argv, fragment):
    with pytest.raises(LaunchError) as info:
        prepare(["-np", "2", *argv, "python"], {})
    assert fragment in str(info.value)


def test_only_this_hosts_pid_files_are_watched(tmp_path, monkeypatch):
    (tmp_path / "rank.0.pid").write_text("100 here")
    (tmp_path / "rank.1.pid").write_text("100 there")  # the same pid number on another host
    (tmp_path / "rank.2.pid").write_text("garbage")
    assert read_pid_files(str(tmp_path)) == {0: (100, "here"), 1: (100, "there")}
    monkeypatch.setattr("socket.gethostname", lambda: "here")
    assert local_pids(str(tmp_path)) == {0: 100}
    assert all_hosts_local((HostSlots("localhost", 2), HostSlots("here", 1)))
    assert not all_hosts_local((HostSlots("here", 1), HostSlots("there", 1)))


def test_remote_failure_is_named_from_mpis_pid_and_host(capsys):
    known = {0: (100, "hostA"), 3: (100, "hostB")}
    _report_failed_rank([], ["=   PID 100 RUNNING AT hostB"], known)
    assert capsys.readouterr().err == ("hvdliterun: MPI reports rank 3 (pid 100 on hostB) terminated abnormally (it "
                                       "may name a rank it killed while cleaning up; the ranks' own output says "
                                       "more); the job failed\n")


def test_a_process_inside_exit_counts_as_ending_with_the_first_seen():
    import os
    import subprocess
    import time

    from hvdlite.runner.process import dying

    assert not dying(os.getpid())  # running
    child = subprocess.Popen(["sh", "-c", "exit 0"])
    deadline = time.monotonic() + 30
    while open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dying(child.pid)  # a zombie: ended, not yet reaped
    child.wait()
    assert dying(child.pid)  # gone
