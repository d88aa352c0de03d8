"""Two "hosts" on one machine: network namespaces joined by a veth pair, for multi-host tests and benches.

``hostA`` (10.77.0.1) and ``hostB`` (10.77.0.2) each see one interface, ``eth1``, and run their
commands under their own host name (a UTS namespace), because Hydra and hvdlite tell hosts apart
by name. The processes share this machine's file system and process table, so a test can check
for leftovers on every "host" at once. Needs root and iproute2; :func:`unavailable` says why not.

A launch agent script stands in for ssh: Hydra calls ``AGENT [-x] HOST COMMAND...`` and the agent
runs COMMAND inside HOST's namespace with an empty environment, as a fresh ssh login would, so
what reaches a remote rank came through the launcher's environment forwarding.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import secrets
import shutil
import subprocess
from pathlib import Path

HOSTS = {"hostA": "10.77.0.1", "hostB": "10.77.0.2"}
_SETUPS = itertools.count()  # make_two_hosts calls in this process
IFACE = "eth1"
_AGENT = """#!/bin/sh
# Stand-in for ssh, called by Hydra as: AGENT [-x] HOST COMMAND...
[ "$1" = "-x" ] && shift
host=$1; shift
case "$host" in
{cases}
  *) echo "launch agent: unknown host $host" >&2; exit 255 ;;
esac
exec env -i PATH=/usr/sbin:/usr/bin:/bin ip netns exec "$ns" unshare --uts {mount}sh -c "{tmpfs}hostname $host && exec $*"
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or ``None`` if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "iproute2 (ip) and util-linux (unshare) are needed"
    probe = f"hvdprobe{os.getpid()}"
    result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if result.returncode != 0:
        return f"'ip netns add' failed: {result.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


@dataclasses.dataclass
class TwoHosts:
    """Namespaces ``{host: namespace}`` and the launch agent that reaches them."""

    namespaces: dict[str, str]
    agent: str

    def command_on(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run on ``host``: in its namespace, under its host name, with this environment."""
        return ["ip", "netns", "exec", self.namespaces[host], "unshare", "--uts",
                "sh", "-c", 'hostname "$0" && exec "$@"', host, *argv]

    def agent_without_run_dirs(self, path: str, temporary_folder: str) -> str:
        """A launch agent (written to ``path``) whose remote commands see empty, private directories in
        place of hvdliterun's run directories (``hvdliterun-*`` in ``temporary_folder``, the launcher's
        ``TMPDIR``): a host that shares no scratch directory with the launcher, as real hosts do. The
        rest of the file system stays shared. Finding no run directory fails the launch (exit 97), so
        that a test cannot pass with nothing hidden, nor hide another job's directory."""
        missing = f"echo 'launch agent: no hvdliterun-* in {temporary_folder}' >&2; exit 97"
        hide = (f"for d in {temporary_folder}/hvdliterun-*; do [ -d \\$d ] || {{ {missing}; }}; "
                "mount -t tmpfs tmp \\$d || exit 97; done && ")
        Path(path).write_text(_AGENT.format(cases=self._cases(), mount="--mount ", tmpfs=hide))
        os.chmod(path, 0o755)
        return path

    def _cases(self) -> str:
        return "\n".join(f"  {host}) ns={namespace} ;;" for host, namespace in self.namespaces.items())

    def set_link(self, host: str, up: bool) -> None:
        _ip("-n", self.namespaces[host], "link", "set", IFACE, "up" if up else "down")

    def rate_limit(self, rate: str) -> None:
        """Shape both directions of the link with a token bucket (the kernel here has no netem)."""
        for namespace in self.namespaces.values():
            _ip("-n", namespace, "link", "set", IFACE, "txqueuelen", "1000")
            subprocess.run(["tc", "-n", namespace, "qdisc", "replace", "dev", IFACE, "root", "tbf", "rate", rate,
                            "burst", "256kb", "latency", "50ms"], check=True, capture_output=True, timeout=30)

    def bytes_sent(self, host: str) -> int:
        """Bytes ``host`` has sent through its ``eth1``."""
        out = subprocess.run(["ip", "netns", "exec", self.namespaces[host], "cat",
                              f"/sys/class/net/{IFACE}/statistics/tx_bytes"],
                             check=True, capture_output=True, text=True, timeout=30).stdout
        return int(out)

    def close(self) -> None:
        for namespace in self.namespaces.values():  # deleting a namespace deletes its veth end
            subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)


def make_two_hosts(workdir: Path) -> TwoHosts:
    """Create both namespaces, the veth pair between them, and the launch agent in ``workdir``.

    Every setup gets names of its own (this process's id and a count), so that two setups alive in
    one process (a module's fixture and a Slurm cluster's) do not collide; a setup that fails
    removes what it made."""
    tag = f"hvd{os.getpid()}n{next(_SETUPS)}"
    namespaces = {host: f"{tag}{host[-1].lower()}" for host in HOSTS}
    hosts = TwoHosts(namespaces, str(workdir / "launch-agent.sh"))
    # A veth end lives in this namespace until it is moved: a random name fits its 15 characters.
    token = secrets.token_hex(4)
    ends = {host: f"hv{token}{host[-1].lower()}" for host in HOSTS}
    try:
        for namespace in namespaces.values():
            _ip("netns", "add", namespace)
        _ip("link", "add", ends["hostA"], "type", "veth", "peer", "name", ends["hostB"])
        for host, address in HOSTS.items():
            namespace = namespaces[host]
            _ip("link", "set", ends[host], "netns", namespace)
            _ip("-n", namespace, "link", "set", ends[host], "name", IFACE)
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", IFACE)
            _ip("-n", namespace, "link", "set", IFACE, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
    except BaseException:
        hosts.close()
        subprocess.run(["ip", "link", "delete", ends["hostA"]], capture_output=True)  # if it was not moved yet
        raise
    Path(hosts.agent).write_text(_AGENT.format(cases=hosts._cases(), mount="", tmpfs=""))
    os.chmod(hosts.agent, 0o755)
    return hosts
