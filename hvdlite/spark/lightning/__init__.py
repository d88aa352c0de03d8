"""Horovod's ``horovod.spark.lightning``: :class:`TorchEstimator` and :class:`TorchModel` on hvdlite,
for a Lightning ``LightningModule`` fitted on a Spark DataFrame.

Needs ``pip install hvdlite[spark,torch,trainers]`` (Lightning).
"""

from typing import TYPE_CHECKING

from ...utils.lazy_names import lazy_names

if TYPE_CHECKING:
    from .estimator import TorchEstimator, TorchModel  # noqa: F401

__all__ = ["TorchEstimator", "TorchModel"]
# Loaded on first use: a rank of a fit unpickles its training function from .remote, which needs neither
# the estimator nor pyspark.ml (half a second of a rank's start).
__getattr__, __dir__ = lazy_names(globals(), dict.fromkeys(__all__, ".estimator"))
