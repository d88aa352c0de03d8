"""The one place that reads ``HVDLITE_*`` environment variables (and Horovod's ``HOROVOD_*`` names for them).

:class:`Config` is a frozen dataclass; :func:`load_config` builds it from an environment mapping
and rejects unknown ``HVDLITE_*`` names and bad values with a message naming the variable. The
launcher turns its flags into these same variables, so a rank sees one source of truth.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigError
from . import horovod as horovod_settings
from .values import (
    LOG_LEVELS,
    any_text,
    cooldown_range,
    env_forward,
    flag,
    gpu_operations,
    log_level,
    nice,
    non_negative_float,
    non_negative_int,
    pair,
    positive_float,
    positive_int,
    torch_backend,
)

MIB = 1024 * 1024



@dataclasses.dataclass(frozen=True)
class Config:
    """Runtime and launcher settings. Build it with :func:`load_config`, never by hand in user code."""

    fusion_threshold: int = 2 * MIB
    chunk_bytes: int = 4 * MIB
    pipeline_depth: int = 1
    shm: bool = True
    shm_min_bytes: int = 32 * 1024
    bucket_bytes: int = 25 * MIB
    cycle_time_ms: float = 0.0
    poll_time_ms: float = 1.0
    idle_cycle_seconds: float = 1.0
    engine_nice: int = 19
    autotune: bool = False
    autotune_log: str = ""
    autotune_sample_seconds: float = 2.0
    autotune_samples: int = 2
    cache_capacity: int = 1024
    timeline: str = ""
    timeline_mark_cycles: bool = False
    stall_check: bool = True
    stall_check_seconds: float = 60.0
    stall_shutdown_seconds: float = 600.0
    comm_timeout_seconds: float = 60.0
    elastic_min_np: int = 0  # elastic (survivors re-form the job) when > 0
    elastic_max_np: int = 0  # 0: as many ranks as the hosts have slots
    elastic_timeout_seconds: float = 600.0
    start_timeout_seconds: float = 30.0  # elastic: a new rank's start, before the communication deadline counts
    elastic_reset_limit: int = 0  # 0: no limit
    elastic_cooldown: tuple[float, float] = (0.0, 0.0)  # (0, 0): a failed host is blacklisted for good
    elastic_spawn_prefix: str = ""  # set for processes the job spawned (their rank status files' prefix)
    elastic_warm_spares: int = 0  # processes rank 0 keeps started ahead, admitted when a slot opens
    elastic_cold_joins: bool = False  # new ranks start while the world waits in MPI's spawn, not as spares first
    elastic_spare_of: str = ""  # set in a warm spare: the process id of the rank that started it
    elastic_service: str = ""  # hvdliterun's control channel (hvdlite/elastic/channel.py)
    elastic_token: str = dataclasses.field(default="", repr=False)  # a secret: kept out of logs
    host_alias: str = ""  # the name the launcher's host list gives this rank's host, when not its own
    log_level: str = "WARNING"
    run_dir: str = ""
    mpi_args: str = ""
    output_filename: str = ""
    ssh_port: int = 0
    ssh_identity_file: str = ""
    launcher_agent: str = ""
    env_forward: str = "all"  # which variables travel to other hosts: all, none, or NAME,PREFIX*,...
    network_interface: str = ""
    verbose: bool = False
    gpu_operations: str = "NCCL"
    hierarchical_allreduce: bool = False
    async_completion: bool = True  # NCCL results stream-ordered: no host synchronization per collective
    dynamic_process_sets: bool = False
    torch_backend: str = ""  # hvdlite: hvdliterun's torchrun mode (hvdlite.torch.distributed.torchrun)
    nccl_multi_rank_gpu: bool = False  # NCCL's own NCCL_MULTI_RANK_GPU_ENABLE, read here so NCCL and hvdlite agree
    notes: tuple[str, ...] = dataclasses.field(default=(), compare=False)  # HOROVOD_* settings to report (rank 0)

    @property
    def comm_timeout(self) -> float | None:
        """The deadline of one communication wait in seconds, or ``None`` for no deadline."""
        return self.comm_timeout_seconds or None

    @property
    def join_deadline(self) -> float:
        """Seconds the ranks of an elastic job wait for new ones to join: their start, then the
        communication deadline (none when that is 0: the start timeout alone)."""
        return self.start_timeout_seconds + self.comm_timeout_seconds

    @property
    def probe_window_seconds(self) -> float:
        """How long a rank that timed out waits for its peers to answer, to name the missing ones.

        Healthy peers time out on the same step within one idle cycle of each other (an idle rank
        joins a round that late); the second is margin for a loaded machine. In elastic mode the
        ranks the probe misses are taken as dead, so this window is part of a silent host's cost.
        """
        return min(self.comm_timeout_seconds, self.idle_cycle_seconds + 1.0)

    @property
    def python_log_level(self) -> int:
        """The ``logging`` level for :attr:`log_level` (TRACE maps to DEBUG, FATAL to CRITICAL)."""
        return {"TRACE": logging.DEBUG, "FATAL": logging.CRITICAL}.get(
            self.log_level, getattr(logging, self.log_level)
        )


@dataclasses.dataclass(frozen=True)
class Flag:
    """The ``hvdliterun`` option that sets one :class:`Setting` for every rank.

    ``names`` are the option strings (Horovod's ``horovodrun`` names: users rely on them). A
    ``switch`` flag takes no value and sets the variable to ``switch``; any other flag parses its
    value with ``type`` and writes ``to_env(value)``, which converts units (MB to bytes).
    """

    names: tuple[str, ...]
    type: Callable[[str], Any] = str
    to_env: Callable[[Any], str] = str
    switch: str | None = None
    nargs: int | None = None  # values the flag takes (None: one)
    note: str = ""  # what the flag's help adds to the setting's, when the flag's unit is not the variable's

    @property
    def dest(self) -> str:
        """The attribute name the parsed value gets (from the long option, as argparse derives it)."""
        return self.names[-1].lstrip("-").replace("-", "_")

    def variable(self, value: Any) -> str | None:
        """The variable's text for a parsed ``value``, or ``None`` when the flag was not given."""
        if self.switch is not None:
            return self.switch if value else None
        return None if value is None else self.to_env(value)


def _switch(name: str, value: str = "1") -> Flag:
    return Flag((name,), switch=value)


def _mb_to_bytes(mb: float) -> str:
    return str(int(float(mb) * MIB))


@dataclasses.dataclass(frozen=True)
class Setting:
    """One ``HVDLITE_*`` variable: the field it fills, how its text is parsed, and its launcher flag if any."""

    env: str
    field: str
    parse: Callable[[str], Any]
    help: str
    flag: Flag | None = None


SETTINGS: tuple[Setting, ...] = (
    Setting("HVDLITE_FUSION_THRESHOLD", "fusion_threshold", non_negative_int,
            "bytes of small tensors packed into one fusion buffer (0 disables fusion)",
            Flag(("--fusion-threshold-mb",), float, _mb_to_bytes, note="; the flag gives MB")),
    Setting("HVDLITE_CHUNK_BYTES", "chunk_bytes", positive_int,
            "large buffers are reduced in pieces of this many bytes"),
    Setting("HVDLITE_PIPELINE_DEPTH", "pipeline_depth", positive_int,
            "host reductions (pieces of chunk size) kept in flight at once; 1 runs them one at a time"),
    Setting("HVDLITE_SHM", "shm", flag,
            "1 (default): when every rank runs on one host, the negotiation and host allreduces of "
            "HVDLITE_SHM_MIN_BYTES or more go through shared memory (about 4 MiB of /dev/shm per rank); 0 leaves "
            "them to MPI"),
    Setting("HVDLITE_SHM_MIN_BYTES", "shm_min_bytes", positive_int,
            "smallest host allreduce that goes through shared memory (smaller ones are faster through MPI)"),
    Setting("HVDLITE_BUCKET_BYTES", "bucket_bytes", non_negative_int,
            "DistributedOptimizer reduces dense CPU gradients in buckets of about this many bytes, one request "
            "each (0: one request per gradient)"),
    Setting("HVDLITE_CYCLE_TIME", "cycle_time_ms", non_negative_float,
            "ms the engine waits after new work arrives so more requests share one negotiation",
            Flag(("--cycle-time-ms",), float)),
    Setting("HVDLITE_POLL_TIME", "poll_time_ms", positive_float,
            "longest sleep (ms) between polls while waiting on other ranks"),
    Setting("HVDLITE_IDLE_CYCLE_SECONDS", "idle_cycle_seconds", positive_float,
            "an idle rank joins an empty negotiation this often so stalls can be diagnosed"),
    Setting("HVDLITE_ENGINE_NICE", "engine_nice", nice,
            "nice value of the engine thread (Linux); 0 keeps the process's priority"),
    Setting("HVDLITE_AUTOTUNE", "autotune", flag,
            "tune the fusion threshold and chunk size online from the job's reduced bytes per second",
            _switch("--autotune")),
    Setting("HVDLITE_AUTOTUNE_LOG", "autotune_log", any_text, "CSV file where rank 0 logs every autotune sample",
            Flag(("--autotune-log-file",))),
    Setting("HVDLITE_AUTOTUNE_SAMPLE_SECONDS", "autotune_sample_seconds", positive_float,
            "length of the warm-up window; every later sample reduces as many bytes as it did"),
    Setting("HVDLITE_AUTOTUNE_SAMPLES", "autotune_samples", positive_int,
            "samples per candidate setting (the median counts)"),
    Setting("HVDLITE_CACHE_CAPACITY", "cache_capacity", non_negative_int,
            "response-cache entries (0 disables the bit-vector fast path)", Flag(("--cache-capacity",), int)),
    Setting("HVDLITE_TIMELINE", "timeline", any_text, "path of the timeline file rank 0 writes (Chrome trace JSON)",
            Flag(("--timeline-filename",))),
    Setting("HVDLITE_TIMELINE_MARK_CYCLES", "timeline_mark_cycles", flag,
            "mark every engine cycle that did work in the timeline", _switch("--timeline-mark-cycles")),
    Setting("HVDLITE_STALL_CHECK", "stall_check", flag, "0 disables the stall inspector",
            _switch("--no-stall-check", "0")),
    Setting("HVDLITE_STALL_CHECK_TIME_SECONDS", "stall_check_seconds", positive_float,
            "seconds before a stall warning names the waiting tensors and missing ranks",
            Flag(("--stall-check-warning-time-seconds",), float)),
    Setting("HVDLITE_STALL_SHUTDOWN_TIME_SECONDS", "stall_shutdown_seconds", positive_float,
            "seconds before a stall becomes an error on every rank",
            Flag(("--stall-check-shutdown-time-seconds",), float)),
    Setting("HVDLITE_COMM_TIMEOUT_SECONDS", "comm_timeout_seconds", non_negative_float,
            "a collective or negotiation step that makes no progress this long ends the job, naming the "
            "ranks that stopped answering (0: wait forever)", Flag(("--comm-timeout-seconds",), float)),
    Setting("HVDLITE_ELASTIC_MIN_NP", "elastic_min_np", non_negative_int,
            "elastic: when a rank dies the others re-form the job without it, while at least this many "
            "remain (0: a dead rank ends the job)", Flag(("--min-np",), int)),
    Setting("HVDLITE_ELASTIC_MAX_NP", "elastic_max_np", non_negative_int,
            "elastic: never more ranks than this (0: as many as the hosts have slots)", Flag(("--max-np",), int)),
    Setting("HVDLITE_ELASTIC_TIMEOUT", "elastic_timeout_seconds", non_negative_float,
            "elastic: seconds to wait for --min-np slots before the job ends", Flag(("--elastic-timeout",), float)),
    Setting("HVDLITE_START_TIMEOUT", "start_timeout_seconds", positive_float,
            "elastic: seconds new ranks may take to start (their framework imported) before the "
            "communication deadline counts; then the job goes on without them", Flag(("--start-timeout",), float)),
    Setting("HVDLITE_ELASTIC_RESET_LIMIT", "elastic_reset_limit", non_negative_int,
            "elastic: the job ends after this many re-formations (0: no limit)", Flag(("--reset-limit",), int)),
    Setting("HVDLITE_ELASTIC_COOLDOWN", "elastic_cooldown", cooldown_range,
            "elastic: 'LOW HIGH' seconds a host whose rank failed gets no new ranks, doubled per failure "
            "(unset: never again)", Flag(("--blacklist-cooldown-range",), float, to_env=pair, nargs=2)),
    Setting("HVDLITE_ELASTIC_SPAWN_PREFIX", "elastic_spawn_prefix", any_text,
            "elastic: set for ranks the job spawned (by hvdlite itself)"),
    Setting("HVDLITE_ELASTIC_WARM_SPARES", "elastic_warm_spares", non_negative_int,
            "elastic: processes kept started ahead (the script run up to hvd.init(), its framework imported), "
            "admitted at a commit when a slot opens instead of a new process", Flag(("--warm-spares",), int)),
    Setting("HVDLITE_ELASTIC_COLD_JOINS", "elastic_cold_joins", flag,
            "elastic: new ranks start while the whole job waits in MPI's spawn (as before hvdlite started each "
            "as a spare, admitted once its framework is imported, while the job trains)", _switch("--cold-joins")),
    Setting("HVDLITE_ELASTIC_SPARE_OF", "elastic_spare_of", any_text,
            "elastic: set in a warm spare (by hvdlite itself): the process id of the rank that started it"),
    Setting("HVDLITE_ELASTIC_SERVICE", "elastic_service", any_text,
            "elastic: HOST:PORT[,...] of hvdliterun's control channel (set by hvdliterun)"),
    Setting("HVDLITE_ELASTIC_TOKEN", "elastic_token", any_text,
            "elastic: the job's secret for that channel (set by hvdliterun)"),
    Setting("HVDLITE_HOST_ALIAS", "host_alias", any_text,
            "elastic: the name the launcher's host list gives this rank's host (set by a Spark task or Ray actor)"),
    Setting("HVDLITE_LOG_LEVEL", "log_level", log_level, f"log level: {', '.join(LOG_LEVELS)}",
            Flag(("--log-level",))),
    Setting("HVDLITE_RUN_DIR", "run_dir", any_text, "launcher scratch directory (set by hvdliterun)"),
    Setting("HVDLITE_MPI_ARGS", "mpi_args", any_text, "extra arguments for mpiexec, quoted as one string",
            Flag(("--mpi-args",))),
    Setting("HVDLITE_OUTPUT_FILENAME", "output_filename", any_text,
            "directory for per-rank output files (DIR/rank.N/stdout and stderr)", Flag(("--output-filename",))),
    Setting("HVDLITE_SSH_PORT", "ssh_port", non_negative_int, "ssh port of remote hosts",
            Flag(("-p", "--ssh-port"), int)),
    Setting("HVDLITE_SSH_IDENTITY_FILE", "ssh_identity_file", any_text, "ssh identity file for remote hosts",
            Flag(("-i", "--ssh-identity-file"))),
    Setting("HVDLITE_LAUNCHER_AGENT", "launcher_agent", any_text,
            "program that starts processes on remote hosts instead of ssh (AGENT [-x] HOST COMMAND...)",
            Flag(("--launcher-agent",))),
    Setting("HVDLITE_ENV_FORWARD", "env_forward", env_forward,
            "which of hvdliterun's environment variables are sent to ranks on other hosts: all (default, "
            "as Horovod), none (only HVDLITE_*, MPI transport settings and -x), or NAME,PREFIX*,... in "
            "addition to those", Flag(("--env-forward",))),
    Setting("HVDLITE_NETWORK_INTERFACE", "network_interface", any_text,
            "network interface (e.g. eth1) for MPI's control and data traffic", Flag(("--network-interface",))),
    Setting("HVDLITE_VERBOSE", "verbose", flag, "hvdliterun prints the mpiexec command", _switch("--verbose")),
    Setting("HVDLITE_GPU_OPERATIONS", "gpu_operations", gpu_operations,
            "NCCL (default: device tensors reduced on the GPU) or MPI (staged through host memory)"),
    Setting("HVDLITE_HIERARCHICAL_ALLREDUCE", "hierarchical_allreduce", flag,
            "GPU allreduce as NCCL reduce inside each host, MPI across hosts, NCCL broadcast",
            _switch("--hierarchical-allreduce")),
    Setting("HVDLITE_ASYNC_COMPLETION", "async_completion", flag,
            "1 (default): a GPU collective's handle completes once NCCL's work is enqueued, and waiting on it "
            "makes torch's current stream wait (JAX and TensorFlow: the host waits); 0: synchronize() returns "
            "after the work finished on the GPU (Horovod's default)"),
    Setting("HVDLITE_DYNAMIC_PROCESS_SETS", "dynamic_process_sets", flag,
            "1: process sets may be added and removed after init (hvd.add_process_set, remove_process_set), "
            "as with init(process_sets='dynamic')", _switch("--process-sets-dynamic")),
    Setting("HVDLITE_TORCH_BACKEND", "torch_backend", torch_backend,
            "hvdlite: run a script written for torchrun unchanged: each rank starts hvdlite before the script's "
            "first line, gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...), and the "
            "process groups it asks for (gloo, nccl, or none named) run on hvdlite's backend",
            Flag(("--torch-backend",))),
)
SETTINGS_BY_ENV = {s.env: s for s in SETTINGS}
# The settings hvdliterun has a flag for: its parser and the ranks' environment are both built from these.
SETTING_FLAGS: tuple[tuple[Setting, Flag], ...] = tuple((s, s.flag) for s in SETTINGS if s.flag is not None)

ELASTIC_IDLE_CYCLE_SECONDS = 0.5  # elastic jobs' default HVDLITE_IDLE_CYCLE_SECONDS (see load_config)

# Variables read by other programs in the hvdlite family (tests; the rank wrapper of Spark and Ray
# jobs, hvdlite.runner.remote), accepted but not parsed here.
_RESERVED_PREFIXES = ("HVDLITE_TEST_", "HVDLITE_REMOTE_")


def environ() -> dict[str, str]:
    """A copy of the process environment: the launcher's only way to see it."""
    return dict(os.environ)


def set_environ(variables: Mapping[str, str]) -> None:
    """Add ``variables`` to this process's environment (for libraries that read their own, as MPICH
    reads its ``MPIR_CVAR_*`` in ``MPI_Init``)."""
    os.environ.update(variables)


def unset_environ(names: list[str]) -> None:
    """Remove ``names`` from this process's environment (what its children must not inherit)."""
    for name in names:
        os.environ.pop(name, None)


def load_config(env: Mapping[str, str] | None = None) -> Config:
    """Build a :class:`Config` from ``env`` (default: ``os.environ``): its ``HVDLITE_*`` variables and
    the ``HOROVOD_*`` ones that stand for them (:mod:`hvdlite.settings.horovod`).

    Raises :class:`ConfigError` naming the variable and its bad value, or an unknown
    ``HVDLITE_*`` name (usually a typo) together with the known names.
    """
    env = os.environ if env is None else env
    values = _hvdlite_values(env)
    notes = _horovod_values(env, values)
    if values.get("elastic_min_np") and "idle_cycle_seconds" not in values:
        # A silent host costs the deadline plus a probe window of an idle cycle + 1 s: elastic jobs
        # cycle twice as often by default to find it within the deadline + 1.5 s.
        values["idle_cycle_seconds"] = ELASTIC_IDLE_CYCLE_SECONDS
    values["nccl_multi_rank_gpu"] = env.get("NCCL_MULTI_RANK_GPU_ENABLE", "0").strip() not in ("", "0")
    config = Config(**values, notes=notes)
    _check_together(config)
    return config


def _parse(setting: Setting, text: str, shown: str) -> Any:
    try:
        return setting.parse(text)
    except ValueError as exc:
        raise ConfigError(f"{shown} is invalid: {exc}") from None


def _hvdlite_values(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, text in env.items():
        if not name.startswith("HVDLITE_") or name.startswith(_RESERVED_PREFIXES):
            continue
        setting = SETTINGS_BY_ENV.get(name)
        if setting is None:
            known = ", ".join(sorted(SETTINGS_BY_ENV))
            raise ConfigError(f"unknown environment variable {name}={text!r}; known names: {known}")
        values[setting.field] = _parse(setting, text, f"{name}={text!r}")
    return values


def _horovod_values(env: Mapping[str, str], values: dict[str, Any]) -> tuple[str, ...]:
    """Add to ``values`` what ``env``'s ``HOROVOD_*`` variables set; returns the notes to report."""
    translation = horovod_settings.translate(env)
    notes = list(translation.notes)
    for name, (text, horovod_name) in translation.texts.items():
        setting = SETTINGS_BY_ENV[name]
        value = _parse(setting, text, f"{horovod_name}={env[horovod_name]!r}")
        if name not in env:
            values[setting.field] = value
        elif value != values[setting.field]:
            notes.append(horovod_settings.disagreement(name, env[name], horovod_name, env[horovod_name]))
    return tuple(notes)


def _check_together(config: Config) -> None:
    """Settings that are valid alone but not together."""
    if config.stall_shutdown_seconds < config.stall_check_seconds:
        raise ConfigError(
            f"HVDLITE_STALL_SHUTDOWN_TIME_SECONDS={config.stall_shutdown_seconds} is shorter than "
            f"HVDLITE_STALL_CHECK_TIME_SECONDS={config.stall_check_seconds}"
        )
    if 0 < config.comm_timeout_seconds < 2 * config.idle_cycle_seconds:
        # An idle rank joins negotiation only every idle_cycle_seconds: a shorter deadline would
        # fail healthy jobs whenever one rank waits on an idle peer.
        raise ConfigError(
            f"HVDLITE_COMM_TIMEOUT_SECONDS={config.comm_timeout_seconds} must be 0 or at least twice "
            f"HVDLITE_IDLE_CYCLE_SECONDS={config.idle_cycle_seconds}"
        )
