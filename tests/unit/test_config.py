import time

import pytest

from hvdlite.errors import ConfigError
from hvdlite.settings.config import MIB, Config, load_config
from hvdlite.utils.polling import WaitTimeout, wait_until


def test_defaults_without_variables():
    config = load_config({"PATH": "/bin"})
    assert config == Config()
    assert config.stall_check_seconds == 60 and config.stall_shutdown_seconds == 600
    assert config.fusion_threshold == 2 * MIB


def test_values_are_parsed():
    config = load_config({"HVDLITE_FUSION_THRESHOLD": "1048576", "HVDLITE_STALL_CHECK": "0",
                          "HVDLITE_LOG_LEVEL": "debug", "HVDLITE_CYCLE_TIME": "2.5"})
    assert config.fusion_threshold == MIB and not config.stall_check
    assert config.log_level == "DEBUG" and config.cycle_time_ms == 2.5


@pytest.mark.parametrize("name,value,fragment", [
    ("HVDLITE_FUSION_THRESHOLD", "lots", "HVDLITE_FUSION_THRESHOLD='lots' is invalid"),
    ("HVDLITE_CACHE_CAPACITY", "-1", "HVDLITE_CACHE_CAPACITY='-1' is invalid: must be >= 0"),
    ("HVDLITE_POLL_TIME", "0", "HVDLITE_POLL_TIME='0' is invalid: must be > 0"),
    ("HVDLITE_STALL_CHECK_TIME_SECONDS", "nan", "must be a finite number"),
    ("HVDLITE_LOG_LEVEL", "LOUD", "must be one of TRACE"),
    ("HVDLITE_STALL_CHECK", "maybe", "must be 0/1"),
    ("HVDLITE_FUSION_TRESHOLD", "1", "unknown environment variable HVDLITE_FUSION_TRESHOLD"),
])
def test_bad_values_name_the_variable(name, value, fragment):
    with pytest.raises(ConfigError, match=None) as info:
        load_config({name: value})
    assert fragment in str(info.value)


def test_shutdown_must_not_precede_warning():
    with pytest.raises(ConfigError, match="HVDLITE_STALL_SHUTDOWN_TIME_SECONDS=5.0 is shorter"):
        load_config({"HVDLITE_STALL_CHECK_TIME_SECONDS": "10", "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "5"})


def test_reserved_test_variables_are_ignored():
    assert load_config({"HVDLITE_TEST_GPU": "1"}) == Config()


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        Config().fusion_threshold = 1


def test_comm_timeout_must_outlast_an_idle_cycle():
    assert load_config({}).comm_timeout == 60.0 and load_config({}).probe_window_seconds == 2.0
    assert load_config({"HVDLITE_COMM_TIMEOUT_SECONDS": "0"}).comm_timeout is None  # 0: wait forever
    with pytest.raises(ConfigError, match=r"HVDLITE_COMM_TIMEOUT_SECONDS=1.5 must be 0 or at least twice "
                                          r"HVDLITE_IDLE_CYCLE_SECONDS=1.0"):
        load_config({"HVDLITE_COMM_TIMEOUT_SECONDS": "1.5"})
    assert load_config({"HVDLITE_COMM_TIMEOUT_SECONDS": "2", "HVDLITE_IDLE_CYCLE_SECONDS": "0.5"}).comm_timeout == 2


def test_elastic_jobs_cycle_faster_by_default_so_a_silent_host_is_found_sooner():
    elastic = load_config({"HVDLITE_ELASTIC_MIN_NP": "2"})
    assert elastic.idle_cycle_seconds == 0.5 and elastic.probe_window_seconds == 1.5
    chosen = load_config({"HVDLITE_ELASTIC_MIN_NP": "2", "HVDLITE_IDLE_CYCLE_SECONDS": "2"})
    assert chosen.idle_cycle_seconds == 2.0 and chosen.probe_window_seconds == 3.0
    assert load_config({"HVDLITE_IDLE_CYCLE_SECONDS": "0.2", "HVDLITE_COMM_TIMEOUT_SECONDS": "0.5"}).probe_window_seconds == 0.5


def test_wait_until_gives_up_at_its_deadline():
    start = time.monotonic()
    with pytest.raises(WaitTimeout, match="no progress for 0.2 s"):
        wait_until(lambda: False, spin_seconds=0.01, max_sleep=0.01, timeout=0.2)
    assert 0.2 <= time.monotonic() - start < 2
    calls = iter([False, False, True])
    wait_until(lambda: next(calls), spin_seconds=0, max_sleep=0.01, timeout=0.2)  # done in time: no error
