"""Horovod's estimator parameters that hvdlite has no use for: accepted with a warning where their
effect does not exist here, refused where a script would lose what it asked for without noticing.

The ignored ones are declared with the estimators' own parameters (:mod:`.params`), so that Horovod's
getters and setters work too; setting one logs the warning. A Horovod estimator script runs with
only its imports changed, or stops at once naming a refused parameter and why.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("hvdlite.spark")

_PETASTORM = "hvdlite reads each rank's Parquet share with pyarrow in the rank's own process, without Petastorm"
_NVTABULAR = "it feeds Horovod's NVTabular data module; hvdlite's features are feature_cols"

# name: why it changes nothing here (a warning names it and this reason).
IGNORED = {
    "train_reader_num_workers": _PETASTORM,
    "val_reader_num_workers": _PETASTORM,
    "reader_pool_type": _PETASTORM,
    "mp_start_method": f"it is the start method of Petastorm's reader processes; {_PETASTORM}",
    "loader_num_epochs": _PETASTORM,
    "debug_data_loader": _PETASTORM,
    "train_async_data_loader_queue_size": _PETASTORM,
    "val_async_data_loader_queue_size": _PETASTORM,
    "transformation_edit_fields": "Petastorm's schema for transformation_fn's output; hvdlite takes the dict "
                                  "transformation_fn returns as it is",
    "transformation_removed_fields": "Petastorm's schema for transformation_fn's output; hvdlite takes the dict "
                                     "transformation_fn returns as it is",
    "compress_sparse_cols": "hvdlite writes vector columns dense, so there is nothing to compress; training is "
                            "the same",
    "tensorflow_dataset_prefetch_buffer_size": "hvdlite feeds Keras its batches from pyarrow, without a "
                                               "tf.data pipeline to prefetch",
    "continuous_cols": _NVTABULAR,
    "categorical_cols": _NVTABULAR,
}

# name: why it is refused (the error names it, this reason, and what to do).
REFUSED = {
    "data_module": "hvdlite reads the Parquet data itself, so the data module's loading would not run; "
                   "leave it out (Horovod's default, Petastorm's, is what hvdlite replaces) or give "
                   "transformation_fn for per-batch changes",
    "checkpoint_callback": "Horovod's Keras estimator keeps the epoch it saves (the best val_loss); hvdlite "
                           "keeps the last epoch, so the model returned would silently differ; put "
                           "keras.callbacks.ModelCheckpoint(save_best_only=True) in callbacks instead",
}


def refusals(kwargs: dict[str, Any], kind: str) -> list[str]:
    """Why each :data:`REFUSED` parameter given a value in ``kwargs`` is refused."""
    return [f"{kind}({name}=...) is not supported: {REFUSED[name]}" for name in REFUSED
            if kwargs.get(name) is not None]


def warn_if_ignored(name: str, value: Any, kind: str) -> None:
    """A warning when one of the :data:`IGNORED` parameters is given a value."""
    if name in IGNORED and value is not None:
        log.warning("%s: %s is ignored: %s", kind, name, IGNORED[name])


def ignored_table() -> dict[str, tuple[None, str]]:
    """The :data:`IGNORED` parameters as rows of a parameter table (declared, so that Horovod's
    ``setMpStartMethod`` / ``getMpStartMethod`` work; their values are kept and unused)."""
    return {name: (None, f"Horovod's; accepted and unused: {why}") for name, why in IGNORED.items()}


__all__ = ["IGNORED", "REFUSED", "ignored_table", "refusals", "warn_if_ignored"]
