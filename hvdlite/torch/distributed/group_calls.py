"""What every call of the hvdlite process group shares: naming a call, refusing one on every rank,
reducing with any of torch's ops, and writing results into the tensors torch passed in.

Calls are unnamed: the core names them in call order (:class:`~hvdlite.core.work.naming.CallNames`),
as torch issues them in the same order on every rank, and a rank that called something else (another
shape, another op, another collective, a skipped call) gets the core's error naming each rank's call.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import torch

from ...core.work.naming import CallNames
from ...core.work.request import MappedHandle
from ...errors import HvdliteError, InvalidArgumentError
from ...process_sets import ProcessSet
from ..collectives.async_ops import allgather_async, allreduce_async
from .gathered import bitwise_fold, bitwise_reason, fold_rows
from .reductions import core_reduction
from .work import core_handles

_ROWS_MAY_DIFFER = ("allgather", "alltoall")  # ranks may bring different numbers of rows


_SIGNATURES: dict[tuple, str] = {}  # (kind, dtype, shape, extra) -> signature: the same few, every step


def signature(kind: str, tensors: list[torch.Tensor], extra: str = "") -> str:
    """What must be the same on every rank for a call of ``kind`` (dtype[shape] of its tensors, a
    digest for several; ``extra``: the op, root), and so is part of its name."""
    first = 1 if kind in _ROWS_MAY_DIFFER else 0
    if len(tensors) == 1:
        t = tensors[0]
        key = (first, t.dtype, t.shape, extra)
        found = _SIGNATURES.get(key)
        if found is None:
            if len(_SIGNATURES) > 4096:
                _SIGNATURES.clear()
            found = _SIGNATURES[key] = \
                f"{str(t.dtype).removeprefix('torch.')}{list(t.shape[first:])}{extra}".replace(" ", "")
        return found
    described = ";".join(f"{t.dtype}{list(t.shape[first:])}" for t in tensors)
    return f"{len(tensors)}x{zlib.crc32(described.encode()):08x}{extra}"


def rows_of(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as one row (allgather concatenates rows; the flat layout is torch's)."""
    return tensor.reshape(1, -1)


def copy_rows(outputs: list[torch.Tensor], rows: torch.Tensor) -> None:
    with torch.no_grad():
        for output, row in zip(outputs, rows, strict=True):
            output.copy_(row.view_as(output))


def copy_flat(output: torch.Tensor, result: torch.Tensor) -> None:
    """``result``'s elements into ``output`` in order (any strides; the same number of elements)."""
    with torch.no_grad():
        output.copy_(result.reshape(output.shape))


class GroupCalls:
    """The shared part of :class:`~.process_group.ProcessGroupHvdlite` (a mixin before torch's
    ``ProcessGroup``, which gives ``rank()`` and ``size()``)."""

    process_set: ProcessSet
    _names: CallNames
    rank: Callable[[], int]
    size: Callable[[], int]

    def _start(self, kind: str, tensors: list[torch.Tensor], start: Callable[[str], Any], extra: str = "") -> Any:
        """``start(name)``'s handle, under the name of this call (see :class:`CallNames`)."""
        name = self._names.take(kind, signature(kind, tensors, extra))
        handle = start(name)
        self._names.used(name, core_handles(handle))
        return handle

    def _refuse(self, kind: str, reason: str) -> None:
        """Raise ``reason`` here, after making this call as one its peers cannot match.

        The ranks that did not refuse made the call and wait for this one; a call of the same kind
        whose name carries the reason makes the core fail theirs at once (ranks made different
        calls), naming this rank and why, instead of leaving them to wait. Where every rank refused
        alike, the refused calls match: one small exchange, then each rank raises."""
        flag = torch.zeros(1)
        handle = self._start(kind, [flag], lambda name: allreduce_async(
            flag, name=name, process_set=self.process_set), "!refused:" + reason.replace(" ", "_"))
        try:
            handle.wait()
        except HvdliteError:
            pass  # the peers' error says what they called; this rank's reason says more
        raise InvalidArgumentError(f"{reason} (group rank {self.rank()} of {self!r})")

    def _check(self, kind: str, *reasons: str) -> None:
        """Refuse the call (:meth:`_refuse`) with the first non-empty reason, if any."""
        for reason in reasons:
            if reason:
                self._refuse(kind, reason)

    def _reduced(self, tensor: torch.Tensor, op: Any, call: str) -> Any:
        """A handle whose result is ``tensor`` reduced over the group with torch's ``op`` (a new
        tensor): the core's reduction, or for a bitwise op an allgather folded here."""
        fold = bitwise_fold(op)
        if fold is None:
            core_op, scale = core_reduction(op, call)
            return self._start("allreduce", [tensor], lambda name: allreduce_async(
                tensor, name=name, op=core_op, prescale_factor=scale, process_set=self.process_set),
                f"{core_op.name}{scale}")
        self._check("allreduce", bitwise_reason(call, op, tensor))
        handle = self._start("allgather", [tensor], lambda name: allgather_async(
            rows_of(tensor), name=name, process_set=self.process_set),
            f"{getattr(op, 'op', op)}{list(tensor.shape)}".replace("RedOpType.", ""))
        return MappedHandle(handle, lambda rows: fold_rows(rows, fold, tensor.shape))

    def _gather_rows(self, tensor: torch.Tensor, extra: str = "") -> Any:
        """A handle whose result is every rank's ``tensor`` as one row each (rank order)."""
        return self._start("allgather", [tensor], lambda name: allgather_async(
            rows_of(tensor), name=name, process_set=self.process_set), extra)

    def _concatenated(self, tensor: torch.Tensor, extra: str = "") -> Any:
        """A handle whose result is every rank's ``tensor`` concatenated along dimension 0."""
        return self._start("allgather", [tensor], lambda name: allgather_async(
            tensor, name=name, process_set=self.process_set), extra)
