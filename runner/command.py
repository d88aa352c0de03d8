"""Pure functions that turn a launch request into the ``mpiexec`` (MPICH Hydra) command line.

Nothing here starts a process or reads the environment, so every flag is unit-tested directly.
"""

from __future__ import annotations

import dataclasses
import shlex

from .hosts import HostSlots

# Hydra writes this marker (with %r replaced by the rank) before every piece of a rank's output.
# Its own tagging is unreliable (measured: the tag sometimes lands before the newline), so the
# launcher splits the stream on the marker and re-tags whole lines as "[rank]: line".
TAG_PATTERN = "\x1e%r\x1f"


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to build the command. ``hosts`` empty means: all ranks on this machine."""

    num_proc: int
    command: tuple[str, ...]
    hosts: tuple[HostSlots, ...] = ()
    mpi_args: str = ""
    output_dir: str = ""
    launcher_agent: str = ""  # executable Hydra uses instead of plain ssh (port / identity file, or the user's)
    network_interface: str = ""  # Hydra's control connections use this interface


def build_mpiexec_command(spec: LaunchSpec, mpiexec: str) -> list[str]:
    """The argv that runs ``spec`` with the Hydra ``mpiexec`` at path ``mpiexec``."""
    argv = [mpiexec, "-n", str(spec.num_proc)]
    if spec.hosts:
        argv += ["-hosts", ",".join(f"{h.host}:{h.slots}" for h in spec.hosts)]
    if spec.launcher_agent:
        argv += ["-launcher", "ssh", "-launcher-exec", spec.launcher_agent]
    if spec.network_interface:
        argv += ["-iface", spec.network_interface]
    if spec.output_dir:
        argv += ["-outfile-pattern", f"{spec.output_dir}/rank.%r/stdout",
                 "-errfile-pattern", f"{spec.output_dir}/rank.%r/stderr"]
    else:
        argv += ["-prepend-pattern", TAG_PATTERN]
    argv += shlex.split(spec.mpi_args)
    return argv + list(spec.command)


def ssh_agent_script(port: int, identity_file: str) -> str:
    """A tiny ssh wrapper Hydra can exec, carrying ``-p`` / ``-i`` (Hydra has no flags for them)."""
    options = []
    if port:
        options += ["-p", str(port)]
    if identity_file:
        options += ["-i", identity_file]
    return "#!/bin/sh\nexec ssh " + " ".join(shlex.quote(o) for o in options) + ' "$@"\n'


def flag_environment(values: dict[str, object]) -> dict[str, str]:
    """``HVDLITE_*`` variables for the flags the user gave (``None`` means not given).

    Flags win over variables already in the environment, which win over defaults: the launcher
    only adds variables for given flags, and ranks read everything through ``hvdlite.config``.
    """
    env: dict[str, str] = {}

    def put(key: str, var: str, convert=str) -> None:
        if values.get(key) is not None:
            env[var] = convert(values[key])

    put("fusion_threshold_mb", "HVDLITE_FUSION_THRESHOLD", lambda mb: str(int(float(mb) * 1024 * 1024)))
    put("cycle_time_ms", "HVDLITE_CYCLE_TIME")
    put("cache_capacity", "HVDLITE_CACHE_CAPACITY")
    put("timeline_filename", "HVDLITE_TIMELINE")
    put("autotune_log_file", "HVDLITE_AUTOTUNE_LOG")
    put("stall_check_warning_time_seconds", "HVDLITE_STALL_CHECK_TIME_SECONDS")
    put("stall_check_shutdown_time_seconds", "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS")
    put("log_level", "HVDLITE_LOG_LEVEL")
    put("mpi_args", "HVDLITE_MPI_ARGS")
    put("output_filename", "HVDLITE_OUTPUT_FILENAME")
    put("ssh_port", "HVDLITE_SSH_PORT")
    put("ssh_identity_file", "HVDLITE_SSH_IDENTITY_FILE")
    put("launcher_agent", "HVDLITE_LAUNCHER_AGENT")
    put("network_interface", "HVDLITE_NETWORK_INTERFACE")
    put("comm_timeout_seconds", "HVDLITE_COMM_TIMEOUT_SECONDS")
    if values.get("no_stall_check"):
        env["HVDLITE_STALL_CHECK"] = "0"
    if values.get("verbose"):
        env["HVDLITE_VERBOSE"] = "1"
    if values.get("autotune"):
        env["HVDLITE_AUTOTUNE"] = "1"
    if values.get("timeline_mark_cycles"):
        env["HVDLITE_TIMELINE_MARK_CYCLES"] = "1"
    if values.get("hierarchical_allreduce"):
        env["HVDLITE_HIERARCHICAL_ALLREDUCE"] = "1"
    return env
