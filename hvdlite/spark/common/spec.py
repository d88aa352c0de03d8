"""What every rank of an estimator's fit needs to know about its data and its run, whatever the framework.

The driver builds one :class:`DataSpec` (``hvdlite.spark.estimator.data_spec``) and pickles it to
the ranks inside the framework's own spec; a rank reads its batches and the run's history through it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .data import Batches
from .store import Store

Batch = dict[str, np.ndarray]


@dataclasses.dataclass
class DataSpec:
    """The data a fit reads, how, and where its run lives in the store."""

    store: Store
    run_id: str
    train_path: str
    val_path: str | None
    columns: list[str]  # what the batches read: features, labels and weights, each once
    feature_cols: list[str]
    label_cols: list[str]
    sample_weight_col: str | None
    batch_size: int
    val_batch_size: int
    epochs: int
    steps: int
    val_steps: int
    shuffle_buffer_size: int
    seed: int | None
    verbose: int
    transformation_fn: Callable[[Batch], Batch] | None
    inmemory_cache_all: bool

    def train_batches(self, rank: int, size: int) -> Iterator[Batch]:
        """This rank's endless shuffled training batches, each passed through ``transformation_fn``."""
        return self._batches(self.train_path, self.batch_size, self.shuffle_buffer_size, rank, size)

    def val_batches(self, rank: int, size: int) -> Iterator[Batch] | None:
        """This rank's endless validation batches, in order; None without validation data."""
        if self.val_path is None:
            return None
        return self._batches(self.val_path, self.val_batch_size, 0, rank, size)

    def _batches(self, path: str, batch_size: int, buffer: int, rank: int, size: int) -> Iterator[Batch]:
        dataset = self.store.get_parquet_dataset(path)
        batches = iter(Batches(dataset, self.columns, rank, size, batch_size, buffer, self.seed,
                               cache=self.inmemory_cache_all))
        return batches if self.transformation_fn is None else map(self.transformation_fn, batches)

    def saved_checkpoint(self) -> bytes | None:
        """The run's last checkpoint, or None (a new run, or a store that keeps no runs)."""
        path = self.store.get_checkpoint_path(self.run_id)
        return self.store.read(path) if path is not None and self.store.exists(path) else None

    def save(self, checkpoint: bytes, history: Any) -> None:
        """Write the run's checkpoint and its history (JSON, into its logs folder), unless the store
        keeps no runs."""
        path = self.store.get_checkpoint_path(self.run_id)
        if path is not None:
            self.store.write(path, checkpoint)
            self.store.write(self._history_path, json.dumps(history).encode())

    def saved_history(self) -> Any:
        """The history :meth:`save` wrote with the last checkpoint."""
        return json.loads(self.store.read(self._history_path))

    @property
    def _history_path(self) -> str:
        return f"{self.store.get_logs_path(self.run_id)}/history.json"


__all__ = ["Batch", "DataSpec"]
