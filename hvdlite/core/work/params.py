"""The settings every rank runs the pipeline with at one time (autotune moves them; a negotiation
round publishes a change, so all ranks switch between the same two cycles)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Params:
    """The settings the tuner moves. Every rank must use the same ones at the same time."""

    fusion_threshold: int
    chunk_bytes: int

    def describe(self) -> str:
        return f"fusion_threshold={self.fusion_threshold} chunk_bytes={self.chunk_bytes}"
