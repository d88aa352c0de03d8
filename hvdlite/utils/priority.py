"""The engine thread's scheduling priority.

The engine thread runs at a low priority (``HVDLITE_ENGINE_NICE``, default 19). Where every core
is busy computing (CPU training with a rank per core), a shared-memory transfer needs both peers'
engine threads on a core at once; at normal priority they time-slice with the compute threads and
spin waiting for each other. At low priority they run when compute waits, which was measured
faster (np=2, 24.8 M-parameter MLP: 214-219 ms per step against 228-234 ms). Where cores are free
the priority changes nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger("hvdlite")


def lower_this_thread(nice: int) -> None:
    """Give the calling thread (only) the niceness ``nice``; 0 leaves it alone. Linux only."""
    if not nice or not sys.platform.startswith("linux"):
        return
    try:  # on Linux, nice applies to a single thread when given its thread id
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except OSError as exc:
        log.debug("could not lower the engine thread's priority: %s", exc)
