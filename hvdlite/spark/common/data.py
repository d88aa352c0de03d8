"""Each rank's share of a Parquet dataset, streamed in shuffled batches (pyarrow, no Petastorm).

Spark writes the estimator's DataFrame as Parquet into the store; a rank reads only its share. The
share is by rows, not by files: the dataset's rows (files in name order, row groups in file order)
are cut into ``size`` contiguous ranges that differ by one row at most, and a rank reads the row
groups its range touches, slicing the first and last. So every rank gets the same number of rows
(and of batches: a rank that ran out first would leave the others waiting in an allreduce), however
few files or row groups Spark wrote.

Shuffling is two-level, as a shuffle buffer over a stream is: each pass over the share visits its
row groups in a fresh random order, and rows are drawn at random from a buffer of up to
``shuffle_buffer_size`` rows, which a pass empties before the next begins (all but fewer rows than
a batch, carried over). ``shuffle_buffer_size=0`` keeps the file order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ...errors import HvdliteError


class DataError(HvdliteError):
    """Training data that cannot be read as the estimator needs it."""


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rows ``[start, start + count)`` of one row group of one Parquet file."""

    path: str
    row_group: int
    start: int
    count: int


def row_groups(dataset: Any) -> list[tuple[str, int, int]]:
    """``(file, row group, rows)`` of every row group of a ``pyarrow.dataset`` in reading order."""
    groups = []
    for fragment in sorted(dataset.get_fragments(), key=lambda fragment: fragment.path):
        fragment.ensure_complete_metadata()
        groups += [(fragment.path, group.id, group.num_rows) for group in fragment.row_groups]
    return groups


def share(groups: Sequence[tuple[str, int, int]], rank: int, size: int) -> list[Piece]:
    """The pieces of rows that rank ``rank`` of ``size`` reads: its contiguous range of every row."""
    total = sum(rows for _, _, rows in groups)
    first, last = total * rank // size, total * (rank + 1) // size
    pieces, at = [], 0
    for path, group, rows in groups:
        start, end = max(first, at), min(last, at + rows)
        if start < end:
            pieces.append(Piece(path, group, start - at, end - start))
        at += rows
    return pieces


def read_piece(fragment: Any, piece: Piece, columns: Sequence[str]) -> Any:
    """``piece``'s rows of ``columns`` from ``fragment`` (its Parquet file) as a ``pyarrow.Table``."""
    table = fragment.subset(row_group_ids=[piece.row_group]).to_table(columns=list(columns))
    return table.slice(piece.start, piece.count)


def to_numpy(table: Any, column: str) -> np.ndarray:
    """Column ``column`` of ``table`` as an array: scalars ``(rows,)``, fixed-length arrays (of
    arrays) ``(rows, n, ...)``; a clear error for ragged arrays or values missing."""
    import pyarrow as pa

    values = table.column(column).combine_chunks()
    if values.null_count:
        raise DataError(f"column {column!r} has {values.null_count} missing values; fill or drop them first")
    shape = [len(values)]
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or pa.types.is_fixed_size_list(values.type):
        lengths = np.asarray(values.value_lengths()) if len(values) else np.zeros(0, dtype=np.int64)
        if len(lengths) and (lengths != lengths[0]).any():
            raise DataError(f"column {column!r} holds arrays of different lengths ({int(lengths.min())} to "
                            f"{int(lengths.max())}); a model input needs one shape")
        shape.append(int(lengths[0]) if len(lengths) else 0)
        values = values.flatten()
    return values.to_numpy(zero_copy_only=False).reshape(shape)


class Batches:
    """Endless shuffled batches of ``columns`` from one rank's share of a Parquet dataset."""

    def __init__(self, dataset: Any, columns: Sequence[str], rank: int, size: int, batch_size: int,
                 shuffle_buffer_size: int = 0, seed: int | None = None, cache: bool = False) -> None:
        """``cache``: keep the share's rows in memory after the first pass (``inmemory_cache_all``)."""
        self._columns, self._batch_size = list(columns), batch_size
        self._fragments = {fragment.path: fragment for fragment in dataset.get_fragments()}  # once, not per read
        self._cache: dict[int, Any] | None = {} if cache else None
        groups = row_groups(dataset)
        total = sum(rows for _, _, rows in groups)
        if total < size:  # the same answer on every rank: each reads the same metadata
            raise DataError(f"the dataset holds {total} rows, fewer than the {size} ranks that read it")
        self._pieces = share(groups, rank, size)
        self._buffer_size = max(shuffle_buffer_size, batch_size) if shuffle_buffer_size else 0
        self._random = np.random.default_rng(None if seed is None else (seed, rank))

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        pending: dict[str, np.ndarray] | None = None
        while True:  # one pass over the share per round
            for table in self._tables():
                pending = self._shuffled(_append(pending, {column: to_numpy(table, column) for column in self._columns}))
                while _rows(pending) >= max(self._buffer_size, self._batch_size):
                    batch, pending = _split(pending, self._batch_size)
                    yield batch
            while _rows(pending) >= self._batch_size:  # the pass's last rows, before the next pass mixes in
                batch, pending = _split(pending, self._batch_size)
                yield batch

    def _tables(self) -> Iterator[Any]:
        order = self._random.permutation(len(self._pieces)) if self._buffer_size else range(len(self._pieces))
        for index in order:
            if self._cache is not None and index in self._cache:
                yield self._cache[index]
                continue
            piece = self._pieces[index]
            table = read_piece(self._fragments[piece.path], piece, self._columns)
            if self._cache is not None:
                self._cache[index] = table
            yield table

    def _shuffled(self, pending: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``pending`` in a random order (with a shuffle buffer): the batches taken from its front
        until more rows arrive are then random rows of the buffer, drawn without replacement, at
        one permutation per row group read instead of a copy of the buffer per batch."""
        if not self._buffer_size:
            return pending
        order = self._random.permutation(_rows(pending))
        return {name: values[order] for name, values in pending.items()}


def _rows(columns: dict[str, np.ndarray]) -> int:
    return len(next(iter(columns.values())))


def _split(pending: dict[str, np.ndarray], count: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The first ``count`` rows of ``pending`` and the rest (views, no copies)."""
    return ({name: values[:count] for name, values in pending.items()},
            {name: values[count:] for name, values in pending.items()})


def _append(pending: dict[str, np.ndarray] | None, more: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if pending is None:
        return more
    return {name: np.concatenate([pending[name], values]) for name, values in more.items()}


__all__ = ["Batches", "DataError", "Piece", "row_groups", "share", "read_piece", "to_numpy"]
