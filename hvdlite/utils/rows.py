"""How a reducescatter divides rows among ranks: the one rule the data planes and adapters share."""

from __future__ import annotations


def scatter_rows(rows: int, size: int) -> list[int]:
    """Rows each rank keeps after a reducescatter: equal shares, the first ranks take the remainder."""
    return [rows // size + (1 if r < rows % size else 0) for r in range(size)]
