"""Responses: the coordinator's verdict on one name, executed in the same order on every rank."""

from __future__ import annotations

import dataclasses

from .autotune import Params
from .ops import Collective
from .request import RequestMeta


@dataclasses.dataclass(frozen=True)
class Response:
    """What every rank does next for one name.

    ``per_rank`` carries what differs by rank: each rank's first dimension for allgather, each
    rank's split list for alltoall. ``joined`` lists ranks that called ``join()`` and contribute
    zeros to this allreduce. A response with ``error`` set completes the name's handles with
    that error instead of moving data.
    """

    meta: RequestMeta
    per_rank: tuple = ()
    joined: tuple[int, ...] = ()
    error: str = ""
    error_type: str = ""
    last_joined: int = -1

    @property
    def cacheable(self) -> bool:
        """Only plain successful data collectives are worth a cache bit; generated names never repeat."""
        return (
            not self.error
            and not self.joined
            and self.meta.collective not in (Collective.BARRIER, Collective.JOIN)
        )


@dataclasses.dataclass(frozen=True)
class RankMessage:
    """One rank's report to the coordinator for one negotiation round."""

    rank: int
    requests: tuple[RequestMeta, ...]
    ages: tuple[float, ...]  # seconds each request has waited on that rank
    shutdown: bool = False


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """The coordinator's answer to one round, broadcast to every rank."""

    responses: tuple[Response, ...] = ()
    warnings: tuple[str, ...] = ()
    fatal: str = ""
    # Settings every rank switches to after this round (autotune), or None.
    params: Params | None = None
