"""How DiLoCo's pseudo-gradients cross the link: averaged as they are, or compressed.

``compression=None``: one grouped, fused allreduce (Average) of the fragment's pseudo-gradients.

``"bf16"`` and ``"int8"``: each rank encodes its pseudo-gradients, the encodings are allgathered
and every rank decodes and averages them in float32, in rank order (so every rank computes the same
average). The core reduces 16-bit floats in a float32 wire buffer, so an allreduce would move as
many bytes as no compression; an allgather moves each rank's encoding as it is. For the two to
four groups DiLoCo spans, an allgather moves about what an allreduce would (each rank receives
``(P - 1)`` encodings against ``2 (P - 1) / P`` full tensors).

``int8``: per block of :data:`BLOCK` elements, a float32 scale (the block's largest magnitude / 127)
and the values rounded to the nearest multiple of it; 1.016 bytes per element. Error feedback
(Seide et al., 2014; Karimireddy et al., 2019): what rounding dropped from a rank's pseudo-gradient
is added to its next one, so no part of an update is lost for good, only delayed.

Sliced (:class:`SlicedExchange`): where the ranks of a group hold the same parameters (the inner
optimizer is a ``DistributedOptimizer`` over the group) and each rank of ``process_set`` holds the
same place in its group, the rank at place ``i`` of a group of ``N`` exchanges only slice ``i`` of
the fragment's pseudo-gradients (flattened into one buffer) across groups, and the group then
all-gathers the averaged slices over its own, fast, link: each byte of the model crosses the slow
link once per group instead of ``N`` times.

An exchange runs on the calling thread (``delay=0``), or on a helper thread during the next inner
steps, where its blocking collectives run the engine's cycles themselves, at the training thread's
priority (see :class:`hvdlite.torch.slow_links.local_sgd._BackgroundAverage` for why that matters).
"""

from __future__ import annotations

import torch

from ...process_sets import ProcessSet
from ...training.diloco_exchange import InFlight, Pending, check_compression, done, in_thread

BLOCK = 256  # elements per int8 scale: 4 bytes of scale per 256 of values (1.6 %)


class Exchange:
    """Averages pseudo-gradients as they are: one fused allreduce."""

    label: str | None = None

    def __init__(self, process_set: ProcessSet) -> None:
        self.process_set = process_set

    def start(self, deltas: list[torch.Tensor], names: list[str], request: str, background: bool) -> Pending:
        """Start averaging ``deltas`` (owned by the exchange from here on) over the process set, on a
        helper thread with ``background``."""
        if not background:
            return done(self.average(deltas, names, request))
        return in_thread(lambda: self.average(deltas, names, request))

    def average(self, deltas: list[torch.Tensor], names: list[str], request: str) -> list[torch.Tensor]:
        """``deltas`` averaged over the process set (in place), now."""
        from ...ops import Average
        from ..collectives.async_ops import grouped_allreduce_

        return grouped_allreduce_(deltas, op=Average, name=request, process_set=self.process_set)


class CompressedExchange(Exchange):
    """Encodes each rank's pseudo-gradients, allgathers the encodings, decodes and averages them."""

    def __init__(self, process_set: ProcessSet, label: str) -> None:
        super().__init__(process_set)
        self.label = label
        self.residuals: dict[str, torch.Tensor] = {}  # int8's error feedback, per name of what is sent

    def average(self, deltas: list[torch.Tensor], names: list[str], request: str) -> list[torch.Tensor]:
        payload = [part for delta, name in zip(deltas, names, strict=True) for part in self._encode(delta, name)]
        return self._decode_average(_gather(payload, request, self.process_set), deltas)

    def _encode(self, delta: torch.Tensor, name: str) -> list[torch.Tensor]:
        if self.label == "bf16":
            return [delta.to(torch.bfloat16).view(torch.int16).reshape(-1)]
        flat = delta.reshape(-1).float()
        residual = self.residuals.get(name)
        if residual is not None:
            flat = flat + residual
        values, scales = quantize_int8(flat)
        self.residuals[name] = flat - dequantize_int8(values, scales, flat.numel())
        return [values, scales]

    def _decode_average(self, gathered: list[torch.Tensor], deltas: list[torch.Tensor]) -> list[torch.Tensor]:
        """Decode every rank's encoding of each delta and average them, in rank order."""
        size = self.process_set.size()
        parts = 1 if self.label == "bf16" else 2
        averages = []
        for index, delta in enumerate(deltas):
            total = torch.zeros(delta.numel(), dtype=torch.float32, device=delta.device)
            chunks = [gathered[index * parts + part].chunk(size) for part in range(parts)]
            for rank in range(size):
                total += self._decode([chunk[rank] for chunk in chunks], delta.numel())
            averages.append(total.div_(size).to(delta.dtype).reshape(delta.shape))
        return averages

    def _decode(self, parts: list[torch.Tensor], count: int) -> torch.Tensor:
        if self.label == "bf16":
            return parts[0].view(torch.bfloat16).float()
        return dequantize_int8(parts[0], parts[1], count)


class SlicedExchange(Exchange):
    """Each rank of a group of identical replicas exchanges its slice, then the group all-gathers."""

    def __init__(self, across: Exchange, group: ProcessSet) -> None:
        super().__init__(across.process_set)
        self.across, self.group, self.label = across, group, across.label

    @property
    def residuals(self) -> dict[str, torch.Tensor]:
        return getattr(self.across, "residuals", {})

    def average(self, deltas: list[torch.Tensor], names: list[str], request: str) -> list[torch.Tensor]:
        flat = torch.cat([delta.reshape(-1) for delta in deltas])
        size, place = self.group.size(), self.group.rank()
        width = -(-flat.numel() // size)
        padded = torch.nn.functional.pad(flat, (0, width * size - flat.numel()))
        mine = padded[place * width:(place + 1) * width].clone()
        averaged = self.across.average([mine], [f"{request}.slice{place}"], f"{request}.slice")[0]
        every = _gather([averaged], f"{request}.group", self.group)[0][:flat.numel()]
        return [part.view_as(delta) for part, delta in zip(every.split([d.numel() for d in deltas]), deltas,
                                                           strict=True)]


def _gather(tensors: list[torch.Tensor], request: str, process_set: ProcessSet) -> list[torch.Tensor]:
    """Every rank's ``tensors``, concatenated in rank order, now (blocking: the caller drives the engine)."""
    from ... import api
    from ..collectives.async_ops import grouped_allgather_async, synchronize

    return synchronize(api.blocking(lambda: grouped_allgather_async(tensors, name=request, process_set=process_set)))


def quantize_int8(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``flat`` (float32) as int8 values (padded to whole blocks) and one float32 scale per block."""
    padded = torch.nn.functional.pad(flat, (0, -flat.numel() % BLOCK)).view(-1, BLOCK)
    scales = padded.abs().amax(dim=1) / 127.0
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    values = torch.round(padded / safe[:, None]).clamp_(-127, 127).to(torch.int8)
    return values.reshape(-1), scales


def dequantize_int8(values: torch.Tensor, scales: torch.Tensor, count: int) -> torch.Tensor:
    """The float32 values :func:`quantize_int8` encoded, its padding dropped."""
    return (values.view(-1, BLOCK).float() * scales[:, None]).reshape(-1)[:count]


def make_exchange(compression: object, process_set: ProcessSet, group: ProcessSet | None = None) -> Exchange:
    """The exchange for DiLoCo's ``compression`` argument (sliced over ``group``, a set of identical
    replicas, when given), or a ValueError naming what is accepted."""
    label = check_compression(compression)
    across = Exchange(process_set) if label is None else CompressedExchange(process_set, label)
    return across if group is None else SlicedExchange(across, group)


__all__ = ["InFlight", "Exchange", "CompressedExchange", "SlicedExchange", "Pending", "done", "make_exchange", "quantize_int8", "dequantize_int8",
           "BLOCK"]
