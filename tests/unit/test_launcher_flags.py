"""hvdliterun's setting flags come from ``hvdlite.settings.config.SETTINGS``: same names and environment as before."""

import pytest
from hvdlite.runner.cli import make_parser
from hvdlite.runner.command import flag_environment

from hvdlite.settings.config import SETTING_FLAGS, SETTINGS_BY_ENV

# horovodrun's flag names are the API: every option hvdliterun has had, written out once more on purpose.
LAUNCHER_OPTIONS = {"-h", "--help", "-np", "--num-proc", "-H", "--hosts", "--hostfile", "-x", "--env",
                    "--check-build", "--dry-run", "--host-discovery-script", "--host-discovery-interval",
                    "--slots-per-host"}
SETTING_OPTIONS = {
    "--fusion-threshold-mb", "--cycle-time-ms", "--cache-capacity", "--autotune", "--autotune-log-file",
    "--hierarchical-allreduce", "--timeline-filename", "--timeline-mark-cycles", "--stall-check-warning-time-seconds",
    "--stall-check-shutdown-time-seconds", "--no-stall-check", "--log-level", "--verbose", "--mpi-args",
    "--output-filename", "-p", "--ssh-port", "-i", "--ssh-identity-file", "--launcher-agent", "--env-forward", "--network-interface",
    "--comm-timeout-seconds", "--process-sets-dynamic", "--min-np", "--max-np", "--elastic-timeout", "--start-timeout", "--reset-limit",
    "--blacklist-cooldown-range", "--warm-spares", "--cold-joins", "--torch-backend"}

# The environment each flag produced before the flags came from the table (runner/command.py's hand-written list).
ROUND_TRIPS = [
    (["--fusion-threshold-mb", "2"], {"HVDLITE_FUSION_THRESHOLD": "2097152"}),
    (["--fusion-threshold-mb", "0.5"], {"HVDLITE_FUSION_THRESHOLD": "524288"}),
    (["--cycle-time-ms", "3"], {"HVDLITE_CYCLE_TIME": "3.0"}),
    (["--start-timeout", "45"], {"HVDLITE_START_TIMEOUT": "45.0"}),
    (["--cache-capacity", "0"], {"HVDLITE_CACHE_CAPACITY": "0"}),
    (["--autotune"], {"HVDLITE_AUTOTUNE": "1"}),
    (["--autotune-log-file", "a.csv"], {"HVDLITE_AUTOTUNE_LOG": "a.csv"}),
    (["--hierarchical-allreduce"], {"HVDLITE_HIERARCHICAL_ALLREDUCE": "1"}),
    (["--timeline-filename", "t.json"], {"HVDLITE_TIMELINE": "t.json"}),
    (["--timeline-mark-cycles"], {"HVDLITE_TIMELINE_MARK_CYCLES": "1"}),
    (["--stall-check-warning-time-seconds", "5"], {"HVDLITE_STALL_CHECK_TIME_SECONDS": "5.0"}),
    (["--stall-check-shutdown-time-seconds", "9.5"], {"HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "9.5"}),
    (["--no-stall-check"], {"HVDLITE_STALL_CHECK": "0"}),
    (["--log-level", "debug"], {"HVDLITE_LOG_LEVEL": "debug"}),
    (["--warm-spares", "2"], {"HVDLITE_ELASTIC_WARM_SPARES": "2"}),
    (["--cold-joins"], {"HVDLITE_ELASTIC_COLD_JOINS": "1"}),
    (["--verbose"], {"HVDLITE_VERBOSE": "1"}),
    (["--mpi-args", "-genv A 'b c'"], {"HVDLITE_MPI_ARGS": "-genv A 'b c'"}),
    (["--output-filename", "out"], {"HVDLITE_OUTPUT_FILENAME": "out"}),
    (["-p", "2222", "--ssh-identity-file", "k"], {"HVDLITE_SSH_PORT": "2222", "HVDLITE_SSH_IDENTITY_FILE": "k"}),
    (["--ssh-port", "22", "-i", "/k"], {"HVDLITE_SSH_PORT": "22", "HVDLITE_SSH_IDENTITY_FILE": "/k"}),
    (["--launcher-agent", "agent"], {"HVDLITE_LAUNCHER_AGENT": "agent"}),
    (["--env-forward", "PATH,NCCL_*"], {"HVDLITE_ENV_FORWARD": "PATH,NCCL_*"}),
    (["--network-interface", "eth1"], {"HVDLITE_NETWORK_INTERFACE": "eth1"}),
    (["--comm-timeout-seconds", "0"], {"HVDLITE_COMM_TIMEOUT_SECONDS": "0.0"}),
    (["--process-sets-dynamic"], {"HVDLITE_DYNAMIC_PROCESS_SETS": "1"}),
    (["--min-np", "2"], {"HVDLITE_ELASTIC_MIN_NP": "2"}),
    (["--max-np", "5", "--reset-limit", "3"], {"HVDLITE_ELASTIC_MAX_NP": "5", "HVDLITE_ELASTIC_RESET_LIMIT": "3"}),
    (["--elastic-timeout", "30"], {"HVDLITE_ELASTIC_TIMEOUT": "30.0"}),
    (["--blacklist-cooldown-range", "1", "10"], {"HVDLITE_ELASTIC_COOLDOWN": "1.0 10.0"}),
    (["--torch-backend", "hvdlite"], {"HVDLITE_TORCH_BACKEND": "hvdlite"}),
    ([], {}),
]


def _options() -> set[str]:
    return {name for action in make_parser()._actions for name in action.option_strings}


def test_parser_has_exactly_the_launcher_and_setting_flags():
    assert _options() == LAUNCHER_OPTIONS | SETTING_OPTIONS
    assert {name for _, flag in SETTING_FLAGS for name in flag.names} == SETTING_OPTIONS


@pytest.mark.parametrize("argv,expected", ROUND_TRIPS)
def test_every_setting_flag_round_trips_to_the_same_environment(argv, expected):
    args = make_parser().parse_args([*argv, "python", "x.py"])
    assert flag_environment(vars(args)) == expected
    assert args.command == ["python", "x.py"]


def test_round_trips_cover_every_setting_flag():
    covered = {name for argv, _ in ROUND_TRIPS for name in argv if name.startswith("-")}
    assert SETTING_OPTIONS <= covered
    for setting, flag in SETTING_FLAGS:
        assert SETTINGS_BY_ENV[setting.env] is setting and flag.dest.isidentifier()


def test_help_shows_every_settings_flag_and_help_text(monkeypatch):
    monkeypatch.setenv("COLUMNS", "10000")  # no wrapping, which could split a help text at a hyphen
    text = " ".join(make_parser().format_help().split())
    for setting, flag in SETTING_FLAGS:
        shown = f"{setting.help}{flag.note} [{setting.env}"
        assert shown in text, shown
        assert flag.names[-1] in text.split(shown)[0][-120:], flag.names  # the flag stands just before its help
