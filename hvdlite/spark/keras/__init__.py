"""Horovod's ``horovod.spark.keras``: :class:`KerasEstimator` and :class:`KerasModel` on hvdlite, for Keras 3.

Needs ``pip install hvdlite[spark,tensorflow]``.
"""

from typing import TYPE_CHECKING

from ...utils.lazy_names import lazy_names

if TYPE_CHECKING:
    from .estimator import KerasEstimator, KerasModel  # noqa: F401

__all__ = ["KerasEstimator", "KerasModel"]
# Loaded on first use: a rank of a fit unpickles its training function from .remote, which needs neither
# the estimator nor pyspark.ml (half a second of a rank's start).
__getattr__, __dir__ = lazy_names(globals(), dict.fromkeys(__all__, ".estimator"))
