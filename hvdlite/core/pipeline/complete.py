"""Stage 6, complete: hand each finished response's result or error to the handle that waits for it."""

from __future__ import annotations

import time

from ..planes.base import Outcome
from .queue import RequestQueue
from .timeline import Timeline, row_name


def complete(queue: RequestQueue, outcome: Outcome, timeline: Timeline | None) -> None:
    """Release the names of ``outcome``'s requests, then wake their waiters with result or error.

    Names are released *before* waking the waiters, so a waiter can resubmit its name at once.
    """
    for request, result, error in queue.release(outcome):
        if timeline is not None:
            timeline.end(row_name(request.meta), time.monotonic(), {"error": str(error)} if error else None)
        if error is not None:
            request.handle.set_error(error)
        else:
            request.handle.set_result(result)
