"""Horovod's ``horovod.spark.torch``: :class:`TorchEstimator` and :class:`TorchModel` on hvdlite.

Needs ``pip install hvdlite[spark,torch]``.
"""

from .estimator import TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel"]
