"""The pid files ``hvdlite.init`` writes into hvdliterun's run directory: which process is which rank."""

from __future__ import annotations

import os
import re
import socket


def read_pid_files(run_dir: str, host: str | None = None) -> dict[int | str, tuple[int, str]]:
    """``{rank: (pid, host)}`` from the pid files ``hvdlite.init`` writes; only ``host``'s ranks if given.

    Ranks on other hosts write theirs only where the run directory is a shared file system; their
    pids mean nothing here, so only this host's ranks are ever watched or killed.
    """
    ranks = {}
    try:
        names = os.listdir(run_dir)
    except OSError:
        return ranks
    for name in names:
        # A launched rank's file is rank.N.pid; one an elastic job spawned is rank.gG.N.pid.
        match = re.fullmatch(r"rank\.((g\d+\.)?\d+)\.pid", name)
        if match:
            try:
                with open(os.path.join(run_dir, name)) as handle:
                    pid_text, rank_host = handle.read().split()
                key = match.group(1)
                ranks[key if match.group(2) else int(key)] = (int(pid_text), rank_host)
            except (OSError, ValueError):
                continue
    return {rank: found for rank, found in ranks.items() if host is None or found[1] == host}


def local_pids(run_dir: str) -> dict[int | str, int]:
    """``{rank: pid}`` of the ranks on this host."""
    return {rank: pid for rank, (pid, _) in read_pid_files(run_dir, socket.gethostname()).items()}


