"""Where the ranks of an estimator fit train: Horovod's ``use_gpu``.

With ``use_gpu=True`` (Horovod's default) a rank trains on the GPU of its local rank when its
executor has GPUs, and on the CPU otherwise; with ``use_gpu=False`` it trains on the CPU even where
there are GPUs. Gradients are averaged across all ranks, so every rank must train on the same kind
of device: a fit where some executors have GPUs and others do not stops on every rank with an error
naming them, as does a rank whose local rank has no GPU of its own.
"""

from __future__ import annotations

from typing import NamedTuple

from ...errors import HvdliteError


class DeviceError(HvdliteError, RuntimeError):
    """The ranks of a fit cannot all train on the device ``use_gpu`` asks for."""


class RankDevice(NamedTuple):
    """What one rank sees: its local rank and how many GPUs its process can use."""

    local_rank: int
    gpus: int


def uses_gpu(use_gpu: bool, seen: list[RankDevice]) -> bool:
    """Whether the ranks train on GPUs, from what each rank sees (index: rank); a DeviceError
    naming the ranks when only some of them could, or when a rank's local rank has no GPU."""
    if not use_gpu or not any(rank.gpus for rank in seen):
        return False
    without = [rank for rank, device in enumerate(seen) if not device.gpus]
    if without:
        with_gpus = [rank for rank, device in enumerate(seen) if device.gpus]
        raise DeviceError(f"use_gpu=True: ranks {with_gpus} have GPUs but ranks {without} have none; every rank "
                          "must train on the same kind of device (give every executor GPUs, or set use_gpu=False)")
    short = [f"rank {rank} (local rank {device.local_rank}, {device.gpus} GPUs)"
             for rank, device in enumerate(seen) if device.local_rank >= device.gpus]
    if short:
        raise DeviceError(f"use_gpu=True: {', '.join(short)} would share a GPU with another rank; run at most as "
                          "many ranks per executor host as it has GPUs, or set use_gpu=False")
    return True


def agreed_uses_gpu(use_gpu: bool, local_rank: int, gpus: int) -> bool:
    """:func:`uses_gpu` over what every rank of the running job sees (a collective: every rank calls it)."""
    from ...objects import allgather_object

    seen = [RankDevice(*device) for device in allgather_object((local_rank, gpus), name="estimator_devices")]
    return uses_gpu(use_gpu, seen)


__all__ = ["DeviceError", "RankDevice", "uses_gpu", "agreed_uses_gpu"]
