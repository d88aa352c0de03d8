"""Argument checks of the hvdlite process group: what this rank can tell is wrong before it sends.

Each returns a reason (a sentence naming the call, the value and what the group allows) or ''.
torch checks roots and peers against a sub-group's members itself, but not on the default group,
where a root of ``world_size`` reached the backend and was accepted; gloo refuses it. A reason
found here is not raised at once: the group makes the call refused (``ProcessGroupHvdlite._refuse``)
so that the ranks that did not refuse learn it too, instead of waiting for this rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...errors import InvalidArgumentError


def root_reason(call: str, root: int, size: int) -> str:
    """Why ``root`` (a rank of the group) cannot be the root of ``call``, or ''."""
    if 0 <= root < size:
        return ""
    return f"{call}: root {root} is not a rank of the group (ranks 0 to {size - 1}); pass a member's rank"


def count_reason(call: str, what: str, items: Sequence[object], size: int) -> str:
    """Why ``items`` (one per rank of the group) cannot be ``what`` of ``call``, or ''."""
    if len(items) == size:
        return ""
    return f"{call}: {what} has {len(items)} tensors, the group {size} ranks; pass one per rank"


def numel_reason(call: str, what: str, tensor: torch.Tensor, expected: int) -> str:
    """Why ``tensor`` (``what`` of ``call``) cannot hold ``expected`` elements, or ''."""
    if tensor.numel() == expected:
        return ""
    shape = f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}".replace(" ", "")
    return f"{call}: {what} {shape} has {tensor.numel()} elements, the call needs {expected}"


def check_peer(peer: int, rank: int, size: int, what: str) -> None:
    """Raise naming ``what`` if ``peer`` is not another rank of a group of ``size`` (point-to-point
    involves two ranks only: nobody else waits for this one)."""
    if not 0 <= peer < size:
        raise InvalidArgumentError(f"{what}, on group rank {rank}: rank {peer} is not in the group (ranks 0 to "
                                   f"{size - 1}); pass a member's rank")
    if peer == rank:
        raise InvalidArgumentError(f"{what}, on group rank {rank}: a rank cannot send to or receive from itself")
