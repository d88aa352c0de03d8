"""Responses: the coordinator's verdict on one name, executed in the same order on every rank."""

from __future__ import annotations

import dataclasses
import functools
import math

from ...ops import Collective, ReduceOp
from ...utils import dtypes
from .params import Params
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

    # Computed once per response: a cached response is executed every step, and the fusion plan
    # and the executor read these for every member of a bucket.
    @functools.cached_property
    def count(self) -> int:
        """Number of elements of the tensor."""
        return math.prod(self.meta.shape)

    @functools.cached_property
    def wire_nbytes(self) -> int:
        """Bytes the tensor occupies in the dtype it travels in (0 for a request without data)."""
        meta = self.meta
        return self.count * dtypes.NUMPY_DTYPE[dtypes.wire_name(meta.dtype, meta.device)].itemsize if meta.dtype else 0

    @functools.cached_property
    def fusion_key(self) -> tuple:
        """Allreduces share a fusion buffer only if these agree. Host and device tensors never
        share one: they live in different memories."""
        meta = self.meta
        key = (meta.device, dtypes.wire_name(meta.dtype, meta.device), dtypes.wire_op(meta.dtype, meta.op),
               meta.prescale, meta.postscale)
        # Adasum weighs each tensor by its own dot products and norms, as Horovod does: never fused.
        return key + (meta.name,) if meta.op is ReduceOp.ADASUM else key

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
