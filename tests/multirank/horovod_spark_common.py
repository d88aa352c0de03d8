"""The harness of Horovod's Spark estimator tests (horovod/horovod test/utils/spark_common.py), for
their ports in test_horovod_spark_torch.py and test_horovod_spark_keras.py: the same data and helpers
on hvdlite. Horovod's ``spark_session`` is the suite's shared ``spark`` fixture; its
``CallbackBackend`` ran the training in the test's own process, one rank, and here runs it as one
rank through ``hvdlite.spark.run``; its private ``util.prepare_data`` is hvdlite's ``prepare``."""

import contextlib
import tempfile

from pyspark.ml import Pipeline
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.linalg import DenseVector, VectorUDT
from pyspark.sql.types import FloatType, IntegerType, StructField, StructType

from hvdlite.spark.common.backend import Backend
from hvdlite.spark.common.prepare import prepare
from hvdlite.spark.common.store import LocalStore


class CallbackBackend(Backend):
    def run(self, fn, args=(), kwargs=None, env=None):
        import hvdlite.spark

        return hvdlite.spark.run(fn, args=args, kwargs=kwargs, num_proc=self.num_processes())

    def num_processes(self):
        return 1


@contextlib.contextmanager
def local_store():
    with tempfile.TemporaryDirectory() as tmp:
        yield LocalStore(tmp)


@contextlib.contextmanager
def prepare_data(num_processes, store, df, feature_columns, label_columns, validation=None):
    columns = list(dict.fromkeys(feature_columns + label_columns))
    yield prepare(store, df, columns, validation, num_processes * 10, seed=None)


def with_features(raw_df, feature_cols):
    vector_assembler = VectorAssembler().setInputCols(feature_cols).setOutputCol('features')
    pipeline = Pipeline().setStages([vector_assembler])
    return pipeline.fit(raw_df).transform(raw_df)


def create_xor_data(spark):
    data = [[0, 0, 0.0, 0.1], [0, 1, 1.0, 0.2], [1, 0, 1.0, 0.3], [1, 1, 0.0, 0.4]]
    schema = StructType([StructField('x1', IntegerType()),
                         StructField('x2', IntegerType()),
                         StructField('y', FloatType()),
                         StructField('weight', FloatType())])
    raw_df = spark.createDataFrame(data, schema=schema)
    return with_features(raw_df, ['x1', 'x2'])


def create_xor_data_with_val(spark):
    data = [[0, 0, 0.0, 0.1, 1], [0, 1, 1.0, 0.2, 0], [1, 0, 1.0, 0.3, 1], [1, 1, 0.0, 0.4, 0],
            [0, 0, 0.0, 0.1, 1], [0, 1, 1.0, 0.2, 0], [1, 0, 1.0, 0.3, 1], [1, 1, 0.0, 0.4, 0]]
    schema = StructType([StructField('x1', IntegerType()),
                         StructField('x2', IntegerType()),
                         StructField('y', FloatType()),
                         StructField('weight', FloatType()),
                         StructField('val', IntegerType())])
    raw_df = spark.createDataFrame(data, schema=schema)
    return with_features(raw_df, ['x1', 'x2'])


def create_mnist_data(spark):
    features = DenseVector([1.0] * 64)
    label_vec = DenseVector([0.0, 0.0, 1.0] + [0.0] * 7)
    label = 2.0
    data = [[features, label_vec, label]] * 10
    schema = StructType([StructField('features', VectorUDT()),
                         StructField('label_vec', VectorUDT()),
                         StructField('label', FloatType())])
    return spark.createDataFrame(data, schema=schema)
