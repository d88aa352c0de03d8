"""Gradient buckets: dense CPU gradients reduced a bucket at a time, one request per bucket.

Per gradient, the hook inside backward only counts an arrival; when every gradient of a bucket
has arrived, the bucket is submitted as one in-place request whose pieces (the gradients' own
memory) are resolved on the engine thread (see :mod:`hvdlite.core.work.segments`). Buckets follow the
reverse of the optimizer's parameter order, the order backward usually produces gradients in, as
DDP's do; a different order is still correct, only later.

Buckets are laid out after the first synchronized step, from the gradients that took the in-place
path in it (dense, contiguous, on the CPU, no compression), so every rank builds the same buckets
from the same model. A sparse gradient keeps its own path.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ... import api
from ...core.work.request import Handle, RequestMeta
from ...core.work.segments import Segments
from ...ops import ReduceOp
from ...process_sets import ProcessSet
from ...utils import dtypes
from ..collectives import tensors


class Bucket:
    """Gradients reduced together; ``arrived`` counts this step's hooks."""

    __slots__ = ("params", "meta", "arrived")

    def __init__(self, params: list[torch.Tensor], meta: RequestMeta) -> None:
        self.params = params
        self.meta = meta
        self.arrived = 0


def plan_buckets(params: list[torch.Tensor], names: dict[torch.Tensor, str], cap_bytes: int, op: ReduceOp,
                 prescale: float, postscale: float) -> list[Bucket]:
    """Split ``params`` (in backward order) into buckets of one dtype and about ``cap_bytes`` each."""
    runs: list[list[torch.Tensor]] = []
    open_runs: dict[torch.dtype, tuple[list[torch.Tensor], int]] = {}
    for param in params:
        run, used = open_runs.get(param.dtype, (None, 0))
        if run is None or used >= cap_bytes:
            run, used = [], 0
            runs.append(run)
        run.append(param)
        open_runs[param.dtype] = (run, used + param.numel() * param.element_size())
    buckets = []
    for run in runs:
        name = f"{names[run[0]]}+{len(run) - 1} (bucket)"
        size = sum(p.numel() for p in run)
        meta = api.prepare_segmented_allreduce(name, dtypes.NUMPY_DTYPE[tensors.core_dtype(run[0])], size, op,
                                               prescale, postscale)
        buckets.append(Bucket(run, meta))
    return buckets


def start_bucket(bucket: Bucket, process_set: ProcessSet | None = None) -> tuple[Handle, Callable[[], None]]:
    """Submit ``bucket``; returns its handle and what to run after waiting for it."""
    params = bucket.params
    # Gradients that were not dense and contiguous after all (a user assigned .grad): reduced as a
    # contiguous copy, written back after the wait. Filled on the engine thread, read after the wait.
    copies: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def resolve() -> list[np.ndarray]:
        arrays = []
        for param in params:
            grad = param.grad
            if grad.is_sparse or not grad.is_contiguous():
                reduced = grad.to_dense().contiguous()
                copies.append((param, grad, reduced))
                grad = reduced
            arrays.append(tensors.host_view(grad))
        return arrays

    segments = Segments(bucket.meta.name, dtypes.NUMPY_DTYPE[bucket.meta.dtype], bucket.meta.shape[0], resolve)
    handle = api.allreduce_segments_async(bucket.meta, segments, process_set)

    def after_wait() -> None:
        for param, grad, reduced in copies:
            if grad.is_sparse:  # reduced dense (sparse_as_dense); the optimizer gets it sparse, as in Horovod
                param.grad = reduced.to_sparse(grad.sparse_dim())
            else:
                grad.copy_(reduced)
    return handle, after_wait
