"""Horovod's ``horovod.spark.lightning``: :class:`TorchEstimator` and :class:`TorchModel` on hvdlite,
for a Lightning ``LightningModule`` fitted on a Spark DataFrame.

Needs ``pip install hvdlite[spark,torch,trainers]`` (Lightning).
"""

from .estimator import TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel"]
