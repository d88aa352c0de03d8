"""Starting and finishing gradient allreduces for :mod:`hvdlite.torch.optimizer`.

Gradients are reduced in place in ``param.grad`` (no copy for a contiguous CPU gradient) under
the name ``grad.<parameter name>``, so ranks match them by name whatever order their hooks fire
in. A gradient that never arrived on this rank is reduced as zeros, so a rank whose graph skipped
a parameter does not leave its peers waiting. From the second step on, dense CPU gradients go in
buckets instead (one request per bucket, see :mod:`hvdlite.torch.gradients.buckets`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable

import torch

from ... import api
from ...compression import Compressor, NoneCompressor
from ...core.work.request import Handle, MappedHandle, RequestMeta
from ...ops import ReduceOp
from ...process_sets import ProcessSet, global_process_set
from ...training.sparse import allreduce_sparse
from ..collectives import async_ops, tensors
from . import sparse
from .buckets import Bucket, plan_buckets, start_bucket

Finisher = Callable[[], None]


def name_parameters(optimizer: torch.optim.Optimizer,
                    named_parameters: Iterable[tuple[str, torch.Tensor]] | None) -> dict[torch.Tensor, str]:
    """Collective name of each trainable parameter of ``optimizer``, in the optimizer's order."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        given: dict[torch.Tensor, str] = {}
        for index, param in enumerate(params):
            given.setdefault(param, f"noname.{index}")
    else:
        pairs = list(named_parameters)
        if not all(isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) for pair in pairs):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                             "usually produced by model.named_parameters().")
        seen: set[str] = set()
        duplicates = sorted({name for name, _ in pairs if name in seen or seen.add(name)})
        if duplicates:
            raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: {duplicates}")
        given = {}
        for name, param in pairs:
            given.setdefault(param, name)  # a tied parameter listed twice keeps its first name
        unnamed = [f"param_groups[{g}]['params'][{i}] of shape {tuple(p.shape)}"
                   for g, group in enumerate(optimizer.param_groups)
                   for i, p in enumerate(group["params"]) if p not in given]
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model parameters were not named: "
                             + "; ".join(unnamed))
    names: dict[torch.Tensor, str] = {}
    for param in params:
        # A fully_shard unit's shards come out of backward already averaged (reduce-scattered), and
        # each rank's holds other rows: they are stepped as they are, never reduced again.
        if param.requires_grad and param not in names and not getattr(param, "_hvdlite_fully_sharded", False):
            names[param] = f"grad.{given[param]}"
    return names


def _split_groups(params: list[torch.Tensor],
                  groups: int | list[list[torch.Tensor]] | None) -> list[list[torch.Tensor]]:
    if groups is None or groups == 0:
        return []
    if isinstance(groups, int):
        if groups < 0:
            raise ValueError(f"groups must be a non-negative integer or a list of parameter lists, got {groups}")
        count = min(groups, len(params))
        return [params[i * len(params) // count:(i + 1) * len(params) // count] for i in range(count)]
    known = set(params)
    result = []
    for index, group in enumerate(groups):
        members = [p for p in group if p in known]
        if len(members) != len(group):
            raise ValueError(f"groups[{index}] holds tensors that are not trainable parameters of this optimizer")
        result.append(members)
    return result


class GradientSubmitter:
    """Starts each gradient's reduction (alone, with its group, or with its bucket) and finishes them all on demand."""

    def __init__(self, names: dict[torch.Tensor, str], compression: type[Compressor], op: ReduceOp,
                 scales: tuple[float, float], groups: int | list[list[torch.Tensor]] | None, sparse_as_dense: bool,
                 bucket_bytes: int = 0, process_set: ProcessSet = global_process_set) -> None:
        self._names = names
        self._process_set = process_set  # whose ranks average the gradients
        self._compression = compression
        self._op = op
        self._scale = scales  # (prescale, postscale), from hvdlite.training.options.predivide_scales
        self._sparse_as_dense = sparse_as_dense
        self._sparse_dims: dict[torch.Tensor, int] = {}  # param -> sparse_dim of its sparse gradients
        self._densified: dict[torch.Tensor, int] = {}  # this step's sparse gradients reduced dense -> sparse_dim
        self._groups = _split_groups(list(names), groups)
        self._group_of = {p: index for index, group in enumerate(self._groups) for p in group}
        self._ready: dict[int, list[torch.Tensor]] = {}
        self._finishers: list[Finisher] = []
        self._last_handle: Handle | MappedHandle | None = None  # the latest started reduction, usually the last to finish
        self._prepared: dict[torch.Tensor, RequestMeta] = {}  # param -> its in-place allreduce, checked once
        # Buckets (see .buckets) are planned after the first step, from the gradients reduced in place on
        # the CPU in it; until then, and with bucket_bytes=0, every gradient is its own request.
        self._bucket_bytes = bucket_bytes
        self._in_place_cpu: set[torch.Tensor] = set()
        self._buckets: list[Bucket] | None = None if bucket_bytes else []
        self._bucket_of: dict[torch.Tensor, Bucket] = {}

    @property
    def process_set(self) -> ProcessSet:
        """The ranks whose gradients are averaged."""
        return self._process_set

    @property
    def in_flight(self) -> bool:
        """True while some gradient has been handed over and not yet waited for."""
        return bool(self._finishers or self._ready or any(b.arrived for b in self._buckets or ()))

    def abandon(self) -> None:
        """Forget this step's reductions (they failed: a peer died); the next step starts afresh."""
        self._finishers, self._ready, self._last_handle, self._densified = [], {}, None, {}
        for bucket in self._buckets or ():
            bucket.arrived = 0

    def restart(self, process_set: ProcessSet | None = None) -> None:
        """A new world (elastic): plan buckets again after the next step, as a rank that just joined does;
        ``process_set``: average over that (registered) set from now on instead."""
        self.abandon()
        if process_set is not None:
            self._process_set = process_set
        self._prepared.clear()
        self._in_place_cpu.clear()
        if self._bucket_bytes:
            self._buckets, self._bucket_of = None, {}

    def submit(self, param: torch.Tensor) -> None:
        """``param.grad`` is final for this step: start its reduction (or its group's or bucket's, once complete)."""
        bucket = self._bucket_of.get(param)
        if bucket is not None:  # the common case, inside backward: count, and submit a full bucket
            bucket.arrived += 1
            if bucket.arrived == len(bucket.params):
                bucket.arrived = 0
                self._finishers.append(self._start_bucket(bucket))
            return
        index = self._group_of.get(param)
        if index is None:
            self._finishers.append(self._start_one(param))
            return
        ready = self._ready.setdefault(index, [])
        ready.append(param)
        if len(ready) == len(self._groups[index]):
            del self._ready[index]
            self._finishers.append(self._start_group(index))

    def submit_missing(self, params: list[torch.Tensor]) -> None:
        """Submit gradients the hooks never delivered; absent ones as zeros.

        A parameter whose gradients were allgathered as sparse before gets a sparse zero (no
        entries), so it takes the same path as on the ranks that computed it and stays sparse.
        Before its first sparse gradient nothing tells that it is sparse: dense zeros, as in Horovod.
        """
        for param in params:
            if param.grad is None:
                sparse_dim = self._sparse_dims.get(param)
                param.grad = torch.zeros_like(param) if sparse_dim is None else sparse.empty_gradient(param, sparse_dim)
            self.submit(param)

    def wait_all(self) -> None:
        finishers, self._finishers = self._finishers, []
        last, self._last_handle = self._last_handle, None
        if last is not None:
            # One wake-up for the whole step: reductions finish roughly in the order they started,
            # so by the time the last one is done the finishers below rarely block.
            last.join()
        for finish in finishers:
            finish()
        densified, self._densified = self._densified, {}
        for param, sparse_dim in densified.items():
            param.grad = param.grad.to_sparse(sparse_dim)
        if self._buckets is None:
            self._plan_buckets()

    def _plan_buckets(self) -> None:
        """After the first step: bucket the gradients that were reduced in place on the CPU."""
        order = [p for p in reversed(list(self._names)) if p in self._in_place_cpu and p not in self._group_of]
        self._buckets = plan_buckets(order, self._names, self._bucket_bytes, self._op, *self._scale)
        self._bucket_of = {p: bucket for bucket in self._buckets for p in bucket.params}
        self._in_place_cpu.clear()

    def _start_bucket(self, bucket: Bucket) -> Finisher:
        handle, after_wait = start_bucket(bucket, self._process_set)
        self._last_handle = handle

        def finish() -> None:
            handle.wait()
            after_wait()
        return finish

    # ---- starting reductions -----------------------------------------------------------------
    def _dense_grad(self, param: torch.Tensor) -> torch.Tensor:
        """``param.grad`` to reduce as a dense tensor; a sparse one (``sparse_as_dense``) is densified for
        the reduction only and goes back to the optimizer sparse (:meth:`wait_all`), as in Horovod:
        ``SparseAdam`` takes nothing else."""
        if param.grad.is_sparse:
            self._sparse_dims[param] = self._densified[param] = param.grad.sparse_dim()
            param.grad = param.grad.to_dense()
        return param.grad

    def _allgathered(self, param: torch.Tensor) -> bool:
        """Whether ``param``'s gradient is reduced as sparse (allgathered) rather than densified."""
        return param.grad.is_sparse and not self._sparse_as_dense

    def _start_one(self, param: torch.Tensor) -> Finisher:
        if self._allgathered(param):
            return self._start_sparse(param)
        grad = self._dense_grad(param)
        if self._compression is NoneCompressor and tensors.is_aliased(grad):
            return self._start_in_place(param, grad)
        sent, ctx = self._compression.compress(grad)
        handle = async_ops.allreduce_async_(sent, name=self._names[param], op=self._op,
                                            prescale_factor=self._scale[0], postscale_factor=self._scale[1],
                                            process_set=self._process_set)
        self._last_handle = handle

        def finish() -> None:
            result = handle.wait()
            if result is not grad:
                grad.copy_(self._compression.decompress(result, ctx))
        return finish

    def _start_in_place(self, param: torch.Tensor, grad: torch.Tensor) -> Finisher:
        """The common case, kept lean (it runs inside backward for every gradient): reduce the
        gradient's own memory, with the request's checks and description made once per parameter."""
        array = tensors.to_numpy(grad)
        meta = self._prepared.get(param)
        if (meta is None or meta.shape != array.shape or meta.dtype != tensors.core_dtype(grad)
                or meta.device != api.device_of(array)):
            meta = self._prepared[param] = api.prepare_allreduce(
                array, self._names[param], self._op, self._scale[0], self._scale[1])
        if self._buckets is None and meta.device == "cpu":
            self._in_place_cpu.add(param)
        handle = self._last_handle = api.allreduce_prepared_async(meta, array, self._process_set)
        return handle.wait

    def _start_group(self, index: int) -> Finisher:
        """The group's dense gradients in one grouped allreduce; its sparse ones (without
        ``sparse_as_dense``) are allgathered one by one, so that they reach the optimizer
        sparse (``SparseAdam`` refuses dense gradients)."""
        gathered, dense = [], []
        for param in self._groups[index]:
            (gathered if self._allgathered(param) else dense).append(param)
        finishers = [self._start_sparse(p) for p in gathered]
        if dense:
            finishers.append(self._start_dense_group(dense))
        if len(finishers) == 1:
            return finishers[0]

        def finish_all() -> None:
            for finish in finishers:
                finish()
        return finish_all

    def _start_dense_group(self, params: list[torch.Tensor]) -> Finisher:
        grads = [self._dense_grad(p) for p in params]
        pairs = [self._compression.compress(g) for g in grads]
        handles = async_ops.grouped_allreduce_async_(
            # Named after its first gradient (as Horovod does), so two optimizers' groups never collide.
            [sent for sent, _ in pairs], name=f"grad.group.{self._names[params[0]]}", op=self._op,
            prescale_factor=self._scale[0], postscale_factor=self._scale[1], process_set=self._process_set)
        self._last_handle = handles[-1]

        def finish() -> None:
            for grad, (_, ctx), handle in zip(grads, pairs, handles, strict=True):
                result = handle.wait()
                if result is not grad:
                    grad.copy_(self._compression.decompress(result, ctx))
        return finish

    def _start_sparse(self, param: torch.Tensor) -> Finisher:
        """Sparse gradients are allgathered (indices and values) and summed by coalescing, as in Horovod."""
        grad = param.grad.coalesce()
        self._sparse_dims[param] = grad.sparse_dim()
        # Indices are (ndim, nnz): transposed, so that gathering concatenates the entries.
        process_set = self._process_set
        wait = allreduce_sparse(grad.values().contiguous(), grad.indices().t().contiguous(), self._names[param],
                                self._op, *self._scale, sparse.gather_waiter(process_set), operator.mul,
                                size=process_set.size())

        def finish() -> None:
            values, indices = wait()
            param.grad = torch.sparse_coo_tensor(indices.t(), values, grad.shape, check_invariants=True).coalesce()
        return finish
