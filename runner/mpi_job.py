"""A Kubernetes MPI job (Kubeflow's MPI Operator) as hvdliterun's hosts and remote-start program.

The operator runs the launcher pod's command with the job's hostfile mounted (``/etc/mpi/hostfile``,
``worker-0.job.ns.svc:2`` or ``... slots=2`` lines) and names it in the variable its MPI reads:
``HYDRA_HOST_FILE`` for MPICH (hvdlite's MPI), ``I_MPI_HYDRA_HOST_FILE`` for Intel MPI,
``OMPI_MCA_orte_default_hostfile`` for Open MPI. The program that starts processes in worker pods
is ssh (v2, with keys it mounts) or ``kubectl exec`` through ``/etc/mpi/kubexec.sh`` (v1), named by
``HYDRA_LAUNCHER_EXEC`` / ``I_MPI_HYDRA_BOOTSTRAP_EXEC`` / ``OMPI_MCA_plm_rsh_agent``. So the launcher
pod's command can be just ``hvdliterun python train.py``. Pure functions: the caller passes the
environment in.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping

from .cluster.hosts import HostError, HostSlots, parse_hostfile

HOSTFILE_VARIABLES = ("HYDRA_HOST_FILE", "I_MPI_HYDRA_HOST_FILE", "OMPI_MCA_orte_default_hostfile")
AGENT_VARIABLES = ("HYDRA_LAUNCHER_EXEC", "I_MPI_HYDRA_BOOTSTRAP_EXEC", "OMPI_MCA_plm_rsh_agent")


class MpiJobError(ValueError):
    """The MPI job's hostfile or agent cannot be used; the message names the variable and the path."""


@dataclasses.dataclass(frozen=True)
class MpiJob:
    """What the MPI job's launcher pod offers: hosts with slots, and the program that reaches them."""

    hosts: tuple[HostSlots, ...]
    hostfile_variable: str
    agent: str = ""  # empty: Hydra's default, ssh

    def describe(self) -> str:
        via = f", processes started with {self.agent}" if self.agent else ", processes started with ssh"
        slots = sum(host.slots for host in self.hosts)
        return f"MPI job hostfile from {self.hostfile_variable} ({len(self.hosts)} host(s), {slots} slot(s)){via}"


def detect(env: Mapping[str, str], read_text=None) -> MpiJob | None:
    """The MPI job this launcher runs in, from its variables; ``None`` when none names a hostfile."""
    variable = next((name for name in HOSTFILE_VARIABLES if env.get(name)), None)
    if variable is None:
        return None
    path = env[variable]
    try:
        text = (read_text or _read)(path)
        hosts = tuple(parse_hostfile(text, path))
    except OSError as exc:
        raise MpiJobError(f"{variable}={path!r} names a hostfile that cannot be read: {exc.strerror}") from None
    except HostError as exc:
        raise MpiJobError(f"{variable}={path!r}: {exc}") from None
    agent_variable = next((name for name in AGENT_VARIABLES if env.get(name)), None)
    agent = env[agent_variable] if agent_variable else ""
    if agent and shutil.which(agent) is None:
        raise MpiJobError(f"{agent_variable}={agent!r} is not an executable program")
    return MpiJob(hosts, variable, agent)


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()
