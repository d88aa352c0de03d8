"""Horovod's own PyTorch estimator tests (test/integration/test_spark_torch.py in horovod/horovod) on
hvdlite: the user-facing ones (fit, restore from a checkpoint, transform of a multi-class model built
by hand, direct Parquet training), with only their imports and harness changed
(horovod_spark_common.py: the shared Spark session, a local store, ``CallbackBackend``). Where a
test watched Horovod's private ``_load_checkpoint`` with a mock, it looks at the history instead.
Direct Parquet training loops over ``inmemory_cache_all`` with one ``reader_pool_type`` (Petastorm's,
unused here: both values fit the same), as in test_horovod_spark_keras.py."""

import sys

import cloudpickle
import pytest

from . import horovod_spark_common
from .horovod_spark_common import CallbackBackend, create_xor_data, create_xor_data_with_val, local_store

pytestmark = pytest.mark.multirank
torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
from pyspark.ml.linalg import VectorUDT  # noqa: E402
from pyspark.sql.types import FloatType, IntegerType  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import hvdlite.spark.torch as hvd_spark  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(horovod_spark_common)


class XOR(nn.Module):
    def __init__(self, input_dim, output_dim):
        super().__init__()
        self.lin1 = nn.Linear(input_dim, 8)
        self.lin2 = nn.Linear(8, output_dim)

    def forward(self, features):
        x = features.float()
        x = self.lin1(x)
        x = torch.tanh(x)
        x = self.lin2(x)
        x = torch.sigmoid(x)
        return x


def create_xor_model(input_dim=2, output_dim=1):
    return XOR(input_dim, output_dim)


def test_fit_model(spark):
    model = create_xor_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = F.binary_cross_entropy

    df = create_xor_data(spark)

    with local_store() as store:
        torch_estimator = hvd_spark.TorchEstimator(
            num_proc=2,
            store=store,
            model=model,
            optimizer=optimizer,
            loss=loss,
            input_shapes=[[2]],
            feature_cols=['features'],
            label_cols=['y'],
            batch_size=1,
            epochs=3,
            random_seed=1,
            verbose=2,
            backward_passes_per_step=3,
            sample_weight_col='weight')

        torch_model = torch_estimator.fit(df)

        trained_model = torch_model.getModel()
        pred = trained_model(torch.ones([1, 2], dtype=torch.int32))
        assert len(pred) == 1
        assert pred.dtype == torch.float32


def test_restore_from_checkpoint(spark):
    model = create_xor_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = nn.BCELoss()

    df = create_xor_data(spark)

    ctx = CallbackBackend()

    run_id = 'run01'
    with local_store() as store:
        torch_estimator = hvd_spark.TorchEstimator(
            backend=ctx,
            store=store,
            model=model,
            optimizer=optimizer,
            loss=loss,
            input_shapes=[[2]],
            feature_cols=['features'],
            label_cols=['y'],
            batch_size=1,
            epochs=1,
            verbose=2,
            backward_passes_per_step=3,
            run_id=run_id)

        ckpt_path = store.get_checkpoint_path(run_id)
        assert not store.exists(ckpt_path)
        first = torch_estimator.fit(df)

        assert store.exists(ckpt_path)
        second = torch_estimator.fit(df)
        # Horovod's test: _load_checkpoint was called. Here: the second fit went on from the first's epoch.
        assert [e['epoch'] for e in second.getHistory()] == [0, 1]
        assert second.getHistory()[0] == first.getHistory()[0]


def test_transform_multi_class(spark):
    # set dim as 2, to mock a multi class model.
    model = create_xor_model(output_dim=2)

    df = create_xor_data(spark)
    metadata = None  # Horovod's test passes its private util._get_metadata(df); hvdlite reads the types from df

    torch_model = hvd_spark.TorchModel(history=None,
                                       model=model,
                                       input_shapes=[[2]],
                                       feature_columns=['features'],
                                       label_columns=['y'],
                                       _metadata=metadata)
    out_df = torch_model.transform(df)

    # in multi class model, model output is a vector but label is number.
    expected_types = {
        'x1': IntegerType,
        'x2': IntegerType,
        'features': VectorUDT,
        'weight': FloatType,
        'y': FloatType,
        'y__output': VectorUDT
    }

    for field in out_df.schema.fields:
        assert type(field.dataType) is expected_types[field.name]


# Horovod's loop over validation, as two tests: eight fits in one would take most of a test's time limit here.
@pytest.mark.parametrize('validation', [None, 'val'])
def test_torch_direct_parquet_train(spark, validation):
    df = create_xor_data_with_val(spark)

    backend = CallbackBackend()
    with local_store() as store:
        store.get_train_data_path = lambda v=None: store._train_path
        store.get_val_data_path = lambda v=None: store._val_path

        # Make sure we cover validation dataloader as well
        if True:
            # Need validation ratio to split data
            with horovod_spark_common.prepare_data(backend.num_processes(),
                                                   store,
                                                   df,
                                                   feature_columns=['features'],
                                                   label_columns=['y'],
                                                   validation=validation):
                model = create_xor_model()
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                loss = nn.BCELoss()

                for inmemory_cache_all in [False, True]:
                    for reader_pool_type in ['process']:  # Horovod's: ['process', 'thread'] (Petastorm's, unused here)
                        est = hvd_spark.TorchEstimator(
                            backend=backend,
                            store=store,
                            model=model,
                            optimizer=optimizer,
                            input_shapes=[[2]],
                            feature_cols=['features'],
                            label_cols=['y'],
                            batch_size=1,
                            epochs=3,
                            verbose=2,
                            reader_pool_type=reader_pool_type,
                            inmemory_cache_all=inmemory_cache_all,
                            backward_passes_per_step=3,
                            validation=validation)

                        # To make sure that setLoss works with non-list loss.
                        est.setLoss(loss)

                        transformer = est.fit_on_parquet()
                        predictions = transformer.transform(df)
                        assert predictions.count() == df.count()
