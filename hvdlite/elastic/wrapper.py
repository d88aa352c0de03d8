"""The shell every elastic rank runs under, so that its death reaches its peers and hvdliterun.

Built by the launcher for the ranks it starts (``hvdlite.runner.command``) and by
:mod:`hvdlite.elastic.reform` for the ranks a job spawns.
"""

from __future__ import annotations

import os
import sys

from . import channel

# Each rank runs under this shell, which outlives it: Hydra's proxy SIGKILLs every rank it started on
# a host when one of them dies *by a signal*, even with -disable-auto-cleanup, but not when one exits
# (docs/design/elastic-mpi.md). The shell turns a death into an exit status, ignores (and makes
# the rank ignore) Hydra's SIGUSR1 failure notice, and records the status: in the run directory,
# where the rank's peers on this host see a spawned rank's death (MPI's list of dead processes
# covers only their own launch), and through the control channel to hvdliterun, which decides the
# job's exit code from it wherever it runs. Its arguments: PYTHON CHANNEL_SCRIPT COMMAND...
RANK_WRAPPER = ("trap '' USR1; py=$1; channel=$2; shift 2; \"$@\"; status=$?; "
                "id=${HVDLITE_ELASTIC_SPAWN_PREFIX}$PMI_RANK; "
                "echo $status > \"$HVDLITE_RUN_DIR/rank.$id.status\" 2>/dev/null; "
                "[ -z \"$HVDLITE_ELASTIC_SERVICE\" ] || printf %s \"$HVDLITE_ELASTIC_TOKEN\" | "
                "\"$py\" -I \"$channel\" exited \"$HVDLITE_ELASTIC_SERVICE\" \"$id\" $status; exit $status")


def wrapped(command: list[str], python: str = sys.executable) -> list[str]:
    """``command`` under :data:`RANK_WRAPPER`, reporting through ``python`` (the same path on every host)."""
    return ["sh", "-c", RANK_WRAPPER, "hvdlite-rank", python, os.path.abspath(channel.__file__), *command]
