"""The one interface every data plane implements (host over MPI and shared memory, NCCL, host-staged).

The executor (:mod:`hvdlite.core.pipeline.execute`) asks its planes in order and the first whose
:meth:`DataPlane.enabled_for` accepts a work item runs it, as Horovod's operation manager does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ... import errors
from ..work.item import WorkItem
from ..work.request import Request
from ..work.response import Response

Outcome = list[tuple[Response, Any, BaseException | None]]  # (response, result, error) per response


class DataPlane(Protocol):
    """Moves the tensors of work items between ranks."""

    name: str

    def enabled_for(self, item: WorkItem) -> bool:
        """True if this plane runs ``item`` (by where its tensors live)."""

    def run(self, item: WorkItem, local: Mapping[str, Request]) -> list:
        """Execute ``item`` now; one result per response (``local``: this rank's requests by name)."""

    def start(self, item: WorkItem, local: Mapping[str, Request], on_done: Callable[[Outcome], None]) -> None:
        """Execute ``item`` and hand its outcome to ``on_done``, now or from a later call on this thread."""

    def finish(self) -> None:
        """Deliver every outcome still in flight (called after each cycle's items started)."""

    def close(self) -> None:
        """Release the plane's resources (collective: at shutdown, on every rank)."""


def error_for(response: Response) -> errors.HvdliteError:
    """The exception a response's error stands for."""
    cls = getattr(errors, response.error_type, errors.HvdliteError)
    return cls(response.error)


def succeeded(responses: tuple[Response, ...], results: list) -> Outcome:
    return [(r, result, None) for r, result in zip(responses, results, strict=True)]


def failed(responses: tuple[Response, ...]) -> Outcome:
    """The outcome of an error response (every member of its item gets the error)."""
    return [(r, None, error_for(r)) for r in responses]
