"""hvdlite inside Spark: ``hvdlite.spark.run(fn, num_proc=N)`` runs ``fn`` as N MPI ranks in Spark tasks.

As Horovod's ``horovod.spark.run``: one rank per barrier-mode task (so Spark places the ranks and
keeps their slots), the results returned to the driver by rank, and a failing rank raised on the
driver with its traceback. The MPI world is formed by hvdlite's launcher. ``run_elastic`` runs an
elastic job whose ranks survive a lost executor (:mod:`.elastic`). The estimators live in
``hvdlite.spark.torch`` and ``hvdlite.spark.keras`` (and the store they save into is :class:`Store`).
Needs ``pip install hvdlite[spark]``.
"""

from ..runner.remote.job import RemoteJobError
from .common.backend import use_spark_run
from .common.store import Store
from .elastic import run_elastic
from .job import SparkJobError, run

use_spark_run(run)

__all__ = ["RemoteJobError", "SparkJobError", "Store", "run", "run_elastic"]
