"""Pure functions that turn a launch request into the ``mpiexec`` (MPICH Hydra) command line.

Nothing here starts a process or reads the environment, so every flag is unit-tested directly.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping

from hvdlite.elastic.wrapper import wrapped  # elastic: each rank runs under a shell that outlives it
from hvdlite.settings.config import SETTING_FLAGS

from .cluster.hosts import HostSlots

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
    elastic: bool = False  # survivors of a dead rank go on (hvdliterun --min-np)
    env_forward: tuple[str, ...] | None = None  # the variables sent to other hosts (None: all)
    slurm: bool = False  # inside a Slurm allocation: Hydra starts its proxies with srun, not ssh


def build_mpiexec_command(spec: LaunchSpec, mpiexec: str) -> list[str]:
    """The argv that runs ``spec`` with the Hydra ``mpiexec`` at path ``mpiexec``."""
    argv = [mpiexec, "-n", str(spec.num_proc)]
    if spec.hosts:
        argv += ["-hosts", ",".join(f"{h.host}:{h.slots}" for h in spec.hosts)]
    if spec.launcher_agent:
        argv += ["-launcher", "ssh", "-launcher-exec", spec.launcher_agent]
    elif spec.slurm:
        argv += ["-launcher", "slurm"]
    if spec.network_interface:
        argv += ["-iface", spec.network_interface]
    if spec.output_dir:
        argv += ["-outfile-pattern", f"{spec.output_dir}/rank.%r/stdout",
                 "-errfile-pattern", f"{spec.output_dir}/rank.%r/stderr"]
    else:
        argv += ["-prepend-pattern", TAG_PATTERN]
    if spec.env_forward is not None:  # names only: the values stay off the command line
        argv += ["-genvlist", ",".join(spec.env_forward)]
    if spec.elastic:
        argv += ["-disable-auto-cleanup"]
    argv += shlex.split(spec.mpi_args)
    if spec.elastic:
        return argv + wrapped(list(spec.command))
    return argv + list(spec.command)


def ssh_agent_script(port: int, identity_file: str) -> str:
    """A tiny ssh wrapper Hydra can exec, carrying ``-p`` / ``-i`` (Hydra has no flags for them)."""
    options = []
    if port:
        options += ["-p", str(port)]
    if identity_file:
        options += ["-i", identity_file]
    return "#!/bin/sh\nexec ssh " + " ".join(shlex.quote(o) for o in options) + ' "$@"\n'


def flag_environment(values: Mapping[str, object]) -> dict[str, str]:
    """``HVDLITE_*`` variables for the flags the user gave (``None`` means not given), keyed by flag dest.

    Flags win over variables already in the environment, which win over defaults: the launcher
    only adds variables for given flags, and ranks read everything through ``hvdlite.settings.config``.
    """
    env: dict[str, str] = {}
    for setting, flag in SETTING_FLAGS:
        text = flag.variable(values.get(flag.dest))
        if text is not None:
            env[setting.env] = text
    return env
