"""Horovod's HOROVOD_* settings read as hvdlite's (hvdlite.settings.horovod through load_config)."""

import pytest
from hvdlite.runner.environment import forwarded_names

from hvdlite.errors import ConfigError
from hvdlite.settings.config import MIB, SETTINGS_BY_ENV, Config, load_config
from hvdlite.settings.horovod import ALIASES

HOROVOD_VALUES = {  # every name the issue lists, in Horovod's units, and what hvdlite makes of it
    "HOROVOD_FUSION_THRESHOLD": ("33554432", "fusion_threshold", 32 * MIB),  # bytes
    "HOROVOD_CYCLE_TIME": ("0.5", "cycle_time_ms", 0.5),  # milliseconds
    "HOROVOD_CACHE_CAPACITY": ("0", "cache_capacity", 0),
    "HOROVOD_TIMELINE": ("/tmp/t.json", "timeline", "/tmp/t.json"),
    "HOROVOD_TIMELINE_MARK_CYCLES": ("1", "timeline_mark_cycles", True),
    "HOROVOD_AUTOTUNE": ("1", "autotune", True),
    "HOROVOD_AUTOTUNE_LOG": ("/tmp/a.csv", "autotune_log", "/tmp/a.csv"),
    "HOROVOD_HIERARCHICAL_ALLREDUCE": ("1", "hierarchical_allreduce", True),
    "HOROVOD_GPU_OPERATIONS": ("MPI", "gpu_operations", "MPI"),
    "HOROVOD_DYNAMIC_PROCESS_SETS": ("1", "dynamic_process_sets", True),
    "HOROVOD_STALL_CHECK_DISABLE": ("1", "stall_check", False),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": ("30", "stall_check_seconds", 30.0),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": ("120", "stall_shutdown_seconds", 120.0),
    "HOROVOD_LOG_LEVEL": ("debug", "log_level", "DEBUG"),
    "HOROVOD_ELASTIC_TIMEOUT": ("60", "elastic_timeout_seconds", 60.0),
    "HOROVOD_START_TIMEOUT": ("45", "start_timeout_seconds", 45.0),
    "HOROVOD_ENABLE_ASYNC_COMPLETION": ("0", "async_completion", False),  # hvdlite's default is 1
}


@pytest.mark.parametrize("name", sorted(HOROVOD_VALUES))
def test_each_horovod_name_sets_its_hvdlite_setting(name):
    text, field, value = HOROVOD_VALUES[name]
    config = load_config({name: text})
    assert getattr(config, field) == value
    assert config.notes == ()


def test_every_alias_names_a_real_setting():
    assert {alias.hvdlite for alias in ALIASES} <= set(SETTINGS_BY_ENV)
    assert {alias.horovod for alias in ALIASES} == set(HOROVOD_VALUES)


def test_timeline_dynamic_starts_no_file_and_stall_check_disable_zero_keeps_it_on():
    config = load_config({"HOROVOD_TIMELINE": "DYNAMIC", "HOROVOD_STALL_CHECK_DISABLE": "0"})
    assert config.timeline == "" and config.stall_check and config.notes == ()


def test_the_hvdlite_name_wins_and_a_disagreement_is_noted():
    config = load_config({"HVDLITE_CYCLE_TIME": "2", "HOROVOD_CYCLE_TIME": "5"})
    assert config.cycle_time_ms == 2.0
    assert config.notes == ("HVDLITE_CYCLE_TIME='2' and HOROVOD_CYCLE_TIME='5' are both set and differ; "
                            "HVDLITE_CYCLE_TIME wins",)


def test_both_names_with_the_same_value_say_nothing():
    config = load_config({"HVDLITE_LOG_LEVEL": "INFO", "HOROVOD_LOG_LEVEL": "info",
                          "HVDLITE_STALL_CHECK": "0", "HOROVOD_STALL_CHECK_DISABLE": "1"})
    assert config.log_level == "INFO" and not config.stall_check and config.notes == ()


@pytest.mark.parametrize("env, fragment", [
    ({"HOROVOD_CPU_OPERATIONS": "gloo"}, "HOROVOD_CPU_OPERATIONS='gloo' is not supported: hvdlite always uses MPI"),
    ({"HOROVOD_CONTROLLER": "GLOO"}, "HOROVOD_CONTROLLER='GLOO' is not supported"),
    ({"HOROVOD_HIERARCHICAL_ALLGATHER": "1"}, "HOROVOD_HIERARCHICAL_ALLGATHER is a Horovod setting hvdlite does not"),
    ({"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0"}, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=0 (never end a stall)"),
    ({"HOROVOD_GPU_ALLREDUCE": "NCCL", "HOROVOD_GPU_ALLGATHER": "MPI"},
     "HOROVOD_GPU_ALLGATHER=MPI, HOROVOD_GPU_ALLREDUCE=NCCL: hvdlite runs every GPU collective on one plane"),
])
def test_what_hvdlite_does_not_support_is_noted_by_name(env, fragment):
    config = load_config(env)
    assert len(config.notes) == 1 and fragment in config.notes[0], config.notes
    assert config == Config()  # nothing else changed


def test_settings_horovod_already_matches_are_accepted_quietly():
    config = load_config({"HOROVOD_CPU_OPERATIONS": "MPI", "HOROVOD_CONTROLLER": "mpi"})
    assert config.notes == ()


def test_one_gpu_plane_for_every_collective_sets_it():
    names = ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER")
    config = load_config({f"HOROVOD_GPU_{op}": "MPI" for op in names})
    assert config.gpu_operations == "MPI" and config.notes == ()
    config = load_config({"HOROVOD_GPU_ALLREDUCE": "MPI", "HOROVOD_GPU_OPERATIONS": "NCCL"})
    assert config.gpu_operations == "NCCL"  # the all-collective setting decides


@pytest.mark.parametrize("name, text", [("HOROVOD_FUSION_THRESHOLD", "64MB"), ("HOROVOD_GPU_OPERATIONS", "DDL"),
                                        ("HOROVOD_STALL_CHECK_DISABLE", "perhaps")])
def test_a_bad_horovod_value_is_an_error_naming_the_horovod_variable(name, text):
    with pytest.raises(ConfigError, match=f"{name}='{text}' is invalid"):
        load_config({name: text})


def test_horovod_settings_travel_to_other_hosts_under_env_forward_none():
    env = {"HOROVOD_FUSION_THRESHOLD": "1", "HVDLITE_LOG_LEVEL": "INFO", "SECRET": "x"}
    names = forwarded_names("none", env, [])
    assert "HOROVOD_FUSION_THRESHOLD" in names and "HVDLITE_LOG_LEVEL" in names and "SECRET" not in names
