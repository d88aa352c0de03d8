"""A real Slurm cluster for tests, from Debian's packages: munged, slurmctld, and one slurmd per node.

Each node is a network-namespace host of ``testbed/netns.py`` (``hostA``, ``hostB``): its slurmd runs in
that namespace under that host name, the controller runs on ``hostA``, and every client command
(``sbatch``, ``salloc``, ``squeue``, ``scancel``) runs on ``hostA`` too, so every connection stays
inside the namespaces' own network. munged is private to the cluster (its own socket, key, pid
and log files), so a system munged is neither needed nor disturbed. Needs root and the packages
``slurmctld slurmd slurm-client munge``; :func:`unavailable` says why not.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from testbed.netns import HOSTS, TwoHosts

_DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "salloc", "srun", "squeue", "scancel", "sinfo")
_CONF = """ClusterName=hvdlitetest
SlurmctldHost=hostA({controller})
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket={munge_socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={workdir}/state
SlurmdSpoolDir={workdir}/spool/%n
SlurmctldPidFile={workdir}/slurmctld.pid
SlurmdPidFile={workdir}/slurmd.%n.pid
SlurmctldLogFile={workdir}/slurmctld.log
SlurmdLogFile={workdir}/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=2
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def unavailable() -> str | None:
    """Why a Slurm cluster cannot be started here, or ``None`` if it can."""
    if os.geteuid() != 0:
        return "the Slurm daemons are started as root"
    missing = [name for name in _DAEMONS if shutil.which(name) is None and not os.path.exists(f"/usr/sbin/{name}")]
    if missing:
        return f"Slurm is not installed (apt-get install slurmctld slurmd slurm-client munge): no {', '.join(missing)}"
    return None


@dataclasses.dataclass
class SlurmCluster:
    """The running daemons; :meth:`on_controller` builds a client command for ``hostA``."""

    hosts: TwoHosts
    workdir: Path
    conf: str
    daemons: list[subprocess.Popen] = dataclasses.field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": self.conf}

    def on_controller(self, argv: list[str]) -> list[str]:
        """``argv`` run on ``hostA``, where the controller is (clients must not cross namespaces)."""
        return self.hosts.command_on("hostA", ["env", f"SLURM_CONF={self.conf}", *argv])

    def run(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self.on_controller(argv), capture_output=True, text=True, timeout=timeout)

    def log(self) -> str:
        """The daemons' logs, for a failing test's message."""
        return "\n".join(f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(self.workdir.glob("*.log")))

    def close(self) -> None:
        for daemon in reversed(self.daemons):
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for daemon in self.daemons:
            try:
                daemon.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()


def start_cluster(hosts: TwoHosts, workdir: Path, cpus: int = 4) -> SlurmCluster:
    """munged, slurmctld on hostA and a slurmd on each host; returns once every node is idle."""
    for sub in ("state", *(f"spool/{host}" for host in HOSTS)):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    socket_path = str(workdir / "munge.socket")
    nodes = "\n".join(f"NodeName={host} NodeAddr={address} CPUs={cpus} State=UNKNOWN" for host, address in HOSTS.items())
    conf = workdir / "slurm.conf"
    conf.write_text(_CONF.format(controller=HOSTS["hostA"], munge_socket=socket_path, workdir=workdir, nodes=nodes))
    cluster = SlurmCluster(hosts, workdir, str(conf))
    try:
        key = workdir / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        cluster.daemons.append(_daemon(["munged", "--foreground", "--force", f"--socket={socket_path}",
                                        f"--key-file={key}", f"--pid-file={workdir}/munged.pid",
                                        f"--seed-file={workdir}/munged.seed", f"--log-file={workdir}/munged.log"]))
        _wait_for(lambda: os.path.exists(socket_path), "munged's socket", cluster)
        cluster.daemons.append(_daemon(cluster.on_controller(["slurmctld", "-D", "-i"])))
        for host in HOSTS:
            # `ip netns exec` remounts /sys for the namespace (the ranks' transports find its eth1 there),
            # without the cgroup file systems slurmd reads at start-up: mount this machine's again.
            cluster.daemons.append(_daemon(hosts.command_on(host, [
                "sh", "-c", _mount_cgroups() + 'exec "$@"', "slurmd",
                "env", f"SLURM_CONF={conf}", "slurmd", "-D", "-N", host])))
        _wait_for(lambda: _idle_nodes(cluster) == len(HOSTS), "every node idle in sinfo", cluster)
    except BaseException:
        cluster.close()
        raise
    return cluster


def _mount_cgroups() -> str:
    """Shell commands that mount, under a fresh /sys, the cgroup file systems this machine has mounted."""
    commands = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            source, point, kind, options = line.split()[:4]
            if point.startswith("/sys/fs/cgroup") and kind in ("tmpfs", "cgroup", "cgroup2"):
                commands.append(f"mkdir -p {shlex.quote(point)} && mount -t {kind} -o {shlex.quote(options)} "
                                f"{shlex.quote(source)} {shlex.quote(point)} && ")
    return "".join(commands)


def _daemon(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _idle_nodes(cluster: SlurmCluster) -> int:
    done = cluster.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=30)
    return sum(line.split()[1] == "idle" for line in done.stdout.splitlines() if len(line.split()) == 2)


def _wait_for(condition, what: str, cluster: SlurmCluster, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"Slurm test cluster: no {what} after {seconds:g} s\n{cluster.log()}")
        time.sleep(0.5)
