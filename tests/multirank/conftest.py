"""What the multi-rank tests share: one JAX compilation cache per session, the TensorFlow and JAX
jobs of several files (tensorflow_job.py, jax_job.py), the Spark session of the Spark tests (test_spark.py,
test_spark_estimators.py: one xdist group), and a temporary folder of each test's own."""

import os
import shutil
import sys
import tempfile

import pytest

from .harness import ONE_THREAD
from .jax_job import JaxJobs
from .tensorflow_job import TensorFlowJobs

# The three JVMs (driver, two executors) live for seconds of work each: the C1 compiler alone and the
# serial collector cost them half the CPU of the default tiered JIT and parallel GC (Spark tests
# alone: 288 -> 201 CPU s, 173 -> 135 s). Four shuffle partitions for the tests' few hundred rows,
# not Spark's 200 tasks per shuffle. Spark itself is unchanged: these are the JVM's and SQL's settings.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(autouse=True)
def own_temporary_folder(monkeypatch):
    """The test's jobs keep their temporary files (hvdliterun's run folder first) in a folder of the
    test's own (``TMPDIR``), removed after it: a job whose hvdliterun a test SIGKILLs, or that ends
    at its timeout, leaves nothing in /tmp. Session fixtures (the Spark session) start before it."""
    folder = tempfile.mkdtemp(prefix="hvdlite-test-")
    monkeypatch.setenv("TMPDIR", folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def jax_compilation_cache(tmp_path_factory):
    """Every job of the session (both xdist workers) keeps what XLA compiled in one folder, and a
    program compiled before is loaded instead of compiled again: most ranks of a job, and the next
    job at another size, compile the same update steps and references (test_jax's np=2 job took
    27.2 CPU s cold and 14.7 warm). Tracing and lowering still run, so trace-time errors still
    raise; an unreadable entry is compiled again. The folder goes with pytest's temporary folders."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jax-compilation-cache"
    settings = {"JAX_COMPILATION_CACHE_DIR": str(folder), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in settings.items():
            patch.setenv(name, value)
        yield folder


@pytest.fixture(scope="session")
def jax_job(tmp_path_factory) -> JaxJobs:
    """``jax_job(np)``: the shared JAX job at ``np`` ranks (jax_job.py). A test that asks for this
    fixture runs in the xdist group ``test_jax`` (tests/conftest.py)."""
    return JaxJobs(str(tmp_path_factory.mktemp("jax_state")))


@pytest.fixture(scope="session")
def tensorflow_job(tmp_path_factory) -> TensorFlowJobs:
    """``tensorflow_job(np)``: the shared TensorFlow job at ``np`` ranks (tensorflow_job.py). A test
    that asks for this fixture runs in the xdist group ``test_tensorflow`` (tests/conftest.py)."""
    return TensorFlowJobs(str(tmp_path_factory.mktemp("tf_state")))


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
