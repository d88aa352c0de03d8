"""The launcher's trust boundary: hostile host names, variable names and values, and program
arguments are refused by name or passed through literally; none reaches a shell as code."""

import json
import subprocess
import sys

import pytest
from hvdlite.runner.cli import LaunchError, prepare
from hvdlite.runner.cluster.hosts import HostError, parse_hostfile, parse_hosts
from hvdlite.runner.command import build_mpiexec_command
from hvdlite.runner.environment import forwarded_names

from hvdlite.elastic.wrapper import wrapped

HOSTILE_HOSTS = ["-oProxyCommand=touch /tmp/x", "host;rm -rf /", "a b", "$(id)", "h`id`", "h\nx", "h/../x",
                 "h'q", 'h"q', "h|x", "h&x", "h>x"]


@pytest.mark.parametrize("host", HOSTILE_HOSTS)
def test_hostile_host_names_are_refused_by_name_in_every_place_hosts_come_from(host):
    with pytest.raises(HostError, match="bad host name"):
        parse_hosts(f"{host}:1")
    if " " not in host and "\n" not in host:  # in a hostfile these split the line instead
        with pytest.raises(HostError, match="bad host name"):
            parse_hostfile(f"{host} slots=1\n", "hosts.txt")
    with pytest.raises(LaunchError, match="bad host name"):
        prepare(["-np", "1", "-H", f"{host}:1", "python"], {})


@pytest.mark.parametrize("item, fragment", [
    ("A;B=1", "'A;B' is not an environment variable name"),
    ("A B=1", "'A B' is not an environment variable name"),
    ("=1", "'' is not an environment variable name"),
    ("A-B=1", "'A-B' is not an environment variable name"),
    ("$(id)=1", "'$(id)' is not an environment variable name"),
])
def test_hostile_variable_names_are_refused_by_name(item, fragment):
    with pytest.raises(LaunchError) as info:
        prepare(["-np", "1", "-x", item, "python"], {})
    assert fragment in str(info.value)


def test_hostile_values_travel_in_the_environment_never_on_a_command_line():
    value = "$(touch /tmp/hvdlite-pwned); `id`\n'\"; rm -rf /"
    spec, env, _ = prepare(["-np", "2", "-H", "a:1,b:1", "--env-forward", "none", "-x", f"EVIL={value}", "python"],
                           {"SECRET_KEY": value})
    argv = build_mpiexec_command(spec, "mpiexec")
    assert env["EVIL"] == value and not any(value in arg for arg in argv)
    forwarded = argv[argv.index("-genvlist") + 1].split(",")
    assert "EVIL" in forwarded and "SECRET_KEY" not in forwarded  # names only, and only the named


@pytest.mark.parametrize("policy, fragment", [
    ("PATH;id", "'PATH;id' is not a variable name or PREFIX*"),
    ("*", "'*' is not a variable name or PREFIX*"),
    ("A*B", "'A*B' is not a variable name or PREFIX*"),
    (",", "give all, none, or a comma-separated list"),
])
def test_hostile_env_forward_lists_are_refused_by_name(policy, fragment):
    with pytest.raises(LaunchError) as info:
        prepare(["-np", "1", "--env-forward", policy, "python"], {})
    assert fragment in str(info.value)


def test_env_forward_chooses_names_and_prefixes_and_keeps_hvdlites_own():
    env = {"AWS_SECRET_ACCESS_KEY": "s", "PATH": "/bin", "NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5",
           "HVDLITE_FUSION_THRESHOLD": "1", "UCX_TLS": "tcp"}
    assert forwarded_names("all", env, []) is None
    assert forwarded_names("PATH,NCCL_*", env, ["A"]) == (
        "A", "HVDLITE_ELASTIC_SERVICE", "HVDLITE_ELASTIC_TOKEN", "HVDLITE_FUSION_THRESHOLD", "HVDLITE_RUN_DIR",
        "NCCL_DEBUG", "NCCL_IB_HCA", "PATH", "UCX_TLS")
    assert "PATH" not in forwarded_names("none", env, []) and "AWS_SECRET_ACCESS_KEY" not in forwarded_names("none", env, [])
    spec, _, _ = prepare(["-np", "1", "python"], {})
    assert "-genvlist" not in build_mpiexec_command(spec, "mpiexec")  # Horovod's default: everything


def test_an_env_forward_name_that_matches_nothing_is_said_not_refused(capsys):
    prepare(["-np", "1", "--env-forward", "NOT_SET_HERE,ALSO_*", "python"], {})
    err = capsys.readouterr().err
    assert "--env-forward NOT_SET_HERE: no such variable here" in err and "--env-forward ALSO_*:" in err


def test_hostile_program_arguments_reach_the_program_literally_through_the_elastic_wrapper(tmp_path):
    marker = tmp_path / "pwned"
    args = [f"$(touch {marker})", f"`touch {marker}`", "; touch x", "a\nb", "'\"", "$HOME", "*"]
    show = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *args]
    env = {"PATH": "/usr/bin:/bin", "HVDLITE_RUN_DIR": str(tmp_path), "PMI_RANK": "0"}
    done = subprocess.run(wrapped(show), env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == args
    assert not marker.exists() and not (tmp_path / "x").exists()
