"""Elastic jobs' host list: ``--host-discovery-script`` (polled) or the fixed ``-H`` hosts, published to the ranks.

The launcher writes the list to ``elastic.hosts`` in its run directory
(:func:`hvdlite.elastic.hosts.write_hosts_file`); rank 0 reads it at each ``state.commit()`` and
plans the world's changes from it. Names meaning this machine are written as its host name, the
name the ranks' MPI reports, so that the ranks can tell which of them run where.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Callable

from hvdlite.elastic.hosts import write_hosts_file

from ..cluster.hosts import DiscoveryError, HostError, HostSlots, parse_hostfile

_THIS_MACHINE = {"localhost", "127.0.0.1", "::1"}


def discover(script: str, slots_per_host: int, timeout: float = 30.0) -> list[HostSlots]:
    """Run ``script`` once; its ``host`` or ``host:slots`` lines (``slots_per_host`` when a line has none)."""
    try:
        done = subprocess.run(shlex.split(script), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DiscoveryError(f"--host-discovery-script {script!r} could not run: {exc}") from None
    if done.returncode != 0:
        raise DiscoveryError(f"--host-discovery-script {script!r} exited with {done.returncode}: "
                             f"{done.stderr.strip()[-500:]}")
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    if not lines:
        return []
    text = "\n".join(line if ":" in line or " " in line else f"{line}:{slots_per_host}" for line in lines)
    try:
        return parse_hostfile(text, f"output of --host-discovery-script {script!r}")
    except HostError as exc:
        raise DiscoveryError(str(exc)) from None


def published(hosts: list[HostSlots]) -> dict[str, int]:
    """``{host: slots}`` as the ranks name hosts (this machine by its host name)."""
    here = socket.gethostname()
    table: dict[str, int] = {}
    for entry in hosts:
        name = here if entry.host in _THIS_MACHINE else entry.host
        table[name] = table.get(name, 0) + entry.slots
    return table


class DiscoveryPoller:
    """Asks ``find`` for the hosts every ``interval`` seconds and republishes the list when it changes.

    ``find``: the discovery script (:func:`discover`), or the usable nodes of a Slurm allocation; it
    raises :class:`DiscoveryError` when it cannot tell, and the last list is kept.
    """

    def __init__(self, find: Callable[[], list[HostSlots]], path: str, first: list[HostSlots],
                 interval: float = 1.0) -> None:
        self._find, self._path, self._interval = find, path, interval
        self._last = published(first)
        self._last_error = ""
        write_hosts_file(path, self._last, discovery=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                table = published(self._find())
            except DiscoveryError as exc:  # keep the last list; say so once per distinct failure
                if str(exc) != self._last_error:
                    sys.stderr.write(f"hvdliterun: {exc}; keeping the last host list\n")
                    self._last_error = str(exc)
                continue
            self._last_error = ""
            if table != self._last:
                sys.stderr.write(f"hvdliterun: hosts now {', '.join(f'{h}:{s}' for h, s in table.items()) or 'none'}\n")
                write_hosts_file(self._path, table, discovery=True)
                self._last = table

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
