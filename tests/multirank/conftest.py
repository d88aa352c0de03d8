"""The Spark session the Spark tests share (test_spark.py, test_spark_estimators.py: one xdist group)."""

import shutil
import sys

import pytest

from .harness import ONE_THREAD


@pytest.fixture(scope="session")
def spark():
    """A local Spark cluster, ``local-cluster[2,1,1024]``: two executor processes of one core each."""
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime (Debian: default-jre-headless); no java on PATH")
    from pyspark.sql import SparkSession

    with pytest.MonkeyPatch.context() as patch:
        # Executors run this Python with one compute thread; everything stays on the loopback.
        for name, value in {**ONE_THREAD, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}.items():
            patch.setenv(name, value)
        session = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("hvdlite-tests")
                   .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1").getOrCreate())
        yield session
        session.stop()
