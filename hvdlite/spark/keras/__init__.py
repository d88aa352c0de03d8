"""Horovod's ``horovod.spark.keras``: :class:`KerasEstimator` and :class:`KerasModel` on hvdlite, for Keras 3.

Needs ``pip install hvdlite[spark,tensorflow]``.
"""

from .estimator import KerasEstimator, KerasModel

__all__ = ["KerasEstimator", "KerasModel"]
