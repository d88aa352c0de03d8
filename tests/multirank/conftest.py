"""The Spark session the Spark tests share (test_spark.py, test_spark_estimators.py: one xdist group)."""

import shutil
import sys

import pytest

from .harness import ONE_THREAD

# The three JVMs (driver, two executors) live for seconds of work each: the C1 compiler alone and the
# serial collector cost them half the CPU of the default tiered JIT and parallel GC (Spark tests
# alone: 288 -> 201 CPU s, 173 -> 135 s). Four shuffle partitions for the tests' few hundred rows,
# not Spark's 200 tasks per shuffle. Spark itself is unchanged: these are the JVM's and SQL's settings.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


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
                   .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
                   .config("spark.sql.shuffle.partitions", "4")
                   .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
                   .config("spark.executor.extraJavaOptions", JVM_OPTIONS)
                   .getOrCreate())
        yield session
        session.stop()
