"""Horovod's own Keras estimator tests (test/integration/test_spark_keras.py in horovod/horovod) on
hvdlite: the user-facing ones (fit, multi-class with a 64-value column reshaped to the model's
(8, 8, 1) input, Horovod's parameters, restore from a checkpoint, direct Parquet training), with
only their imports and harness changed (horovod_spark_common.py). Other changes, each marked:
``SGD(lr=...)`` is Keras 3's ``SGD(learning_rate=...)``; the mocks of Horovod's private fit and
``_load_model_from_checkpoint`` are gone (the fits run; the resume is seen in the history); the
multi-class test runs at the shared session's 2 cores only; direct Parquet training loops over
``inmemory_cache_all`` with one ``reader_pool_type`` (Petastorm's, unused here: both values fit
the same)."""

import sys

import cloudpickle
import numpy as np
import pytest

from . import horovod_spark_common
from .horovod_spark_common import (
    CallbackBackend,
    create_mnist_data,
    create_xor_data,
    create_xor_data_with_val,
    local_store,
)

pytestmark = pytest.mark.multirank
tf = pytest.importorskip("tensorflow")

import pyspark.sql.types as T  # noqa: E402, N812 - Horovod's name
from pyspark.sql.functions import udf  # noqa: E402

import hvdlite.spark.keras as hvd  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(horovod_spark_common)


def create_xor_model():
    model = tf.keras.models.Sequential()
    model.add(tf.keras.layers.Dense(8, input_dim=2))
    model.add(tf.keras.layers.Activation('tanh'))
    model.add(tf.keras.layers.Dense(1))
    model.add(tf.keras.layers.Activation('sigmoid'))
    return model


def create_mnist_model():
    model = tf.keras.models.Sequential()
    model.add(tf.keras.layers.Conv2D(32, kernel_size=(3, 3),
                                     activation='relu',
                                     input_shape=(8, 8, 1)))
    model.add(tf.keras.layers.MaxPooling2D(pool_size=(2, 2)))
    model.add(tf.keras.layers.Dropout(0.25))
    model.add(tf.keras.layers.Flatten())
    model.add(tf.keras.layers.Dense(10, activation='softmax'))
    return model


def get_sgd_optimizer():
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)  # Horovod's: SGD(lr=0.1), Keras 2's name
    return optimizer


@pytest.mark.parametrize('prefetch', [None, 1], ids=['test_fit_model', 'with_tensorflow_dataset_prefetch_buffer_size'])
def test_fit_model(spark, prefetch):
    model = create_xor_model()
    optimizer = get_sgd_optimizer()
    loss = 'binary_crossentropy'

    df = create_xor_data(spark)

    with local_store() as store:
        keras_estimator = hvd.KerasEstimator(
            num_proc=2,
            store=store,
            model=model,
            optimizer=optimizer,
            loss=loss,
            feature_cols=['features'],
            label_cols=['y'],
            batch_size=1,
            random_seed=1,
            epochs=3,
            verbose=2,
            use_gpu=False,
            mp_start_method='spawn',
            tensorflow_dataset_prefetch_buffer_size=prefetch)

        assert not keras_estimator.getUseGpu()
        assert 'spawn' == keras_estimator.getMpStartMethod()

        keras_estimator.setMpStartMethod('forkserver')
        assert 'forkserver' == keras_estimator.getMpStartMethod()

        keras_model = keras_estimator.fit(df)

        trained_model = keras_model.getModel()
        pred = trained_model.predict([np.ones([1, 2], dtype=np.float32)])
        assert len(pred) == 1
        assert pred.dtype == np.float32


def test_fit_model_multiclass(spark):
    model = create_mnist_model()
    optimizer = tf.keras.optimizers.Adadelta(1.0)
    loss = tf.keras.losses.categorical_crossentropy

    for num_cores in [2]:  # Horovod's: also TOTAL_BUFFER_MEMORY_CAP_GIB + 1 cores, a session of its own
        df = create_mnist_data(spark)

        with local_store() as store:
            keras_estimator = hvd.KerasEstimator(
                num_proc=num_cores,
                store=store,
                model=model,
                optimizer=optimizer,
                loss=loss,
                metrics=['accuracy'],
                feature_cols=['features'],
                label_cols=['label_vec'],
                batch_size=2,
                epochs=2,
                verbose=2)

            keras_model = keras_estimator.fit(df).setOutputCols(['label_prob'])
            pred_df = keras_model.transform(df)

            argmax = udf(lambda v: float(np.argmax(v)), returnType=T.DoubleType())
            pred_df = pred_df.withColumn('label_pred', argmax(pred_df.label_prob))

            preds = pred_df.collect()
            assert len(preds) == df.count()

            row = preds[0]
            label_prob = row.label_prob.toArray().tolist()
            assert label_prob[int(row.label_pred)] == max(label_prob)


def test_restore_from_checkpoint(spark):
    model = create_xor_model()
    optimizer = get_sgd_optimizer()
    loss = 'binary_crossentropy'

    df = create_xor_data(spark)

    backend = CallbackBackend()

    run_id = 'run01'
    with local_store() as store:
        keras_estimator = hvd.KerasEstimator(
            backend=backend,
            store=store,
            model=model,
            optimizer=optimizer,
            loss=loss,
            feature_cols=['features'],
            label_cols=['y'],
            batch_size=1,
            epochs=3,
            verbose=2,
            run_id=run_id)

        ckpt_path = store.get_checkpoint_path(run_id)
        assert not store.exists(ckpt_path)
        keras_model = keras_estimator.fit(df)

        trained_model = keras_model.getModel()
        pred = trained_model.predict([np.ones([1, 2], dtype=np.float64)])
        assert len(pred) == 1

        assert store.exists(ckpt_path)

        again = keras_estimator.fit(df)
        # Horovod's: _load_model_from_checkpoint was called. Here: the second fit went on from the first's 3 epochs.
        assert len(again.getHistory()['loss']) == 6
        assert again.getHistory()['loss'][:3] == keras_model.getHistory()['loss']


@pytest.mark.parametrize('validation', [None, 'val'])
def test_keras_direct_parquet_train(spark, validation):
    df = create_xor_data_with_val(spark)

    backend = CallbackBackend()
    with local_store() as store:
        store.get_train_data_path = lambda v=None: store._train_path
        store.get_val_data_path = lambda v=None: store._val_path

        # Make sure we cover val dataloader cases
        with horovod_spark_common.prepare_data(backend.num_processes(),
                                               store,
                                               df,
                                               feature_columns=['features'],
                                               label_columns=['y'],
                                               validation=validation):
            model = create_xor_model()
            optimizer = get_sgd_optimizer()
            loss = 'binary_crossentropy'

            for inmemory_cache_all in [False, True]:
                for reader_pool_type in ['process']:
                    est = hvd.KerasEstimator(
                        backend=backend,
                        store=store,
                        model=model,
                        optimizer=optimizer,
                        loss=loss,
                        feature_cols=['features'],
                        label_cols=['y'],
                        batch_size=1,
                        epochs=3,
                        reader_pool_type=reader_pool_type,
                        validation=validation,
                        inmemory_cache_all=inmemory_cache_all,
                        verbose=2)

                    transformer = est.fit_on_parquet()
                    predictions = transformer.transform(df)
                    assert predictions.count() == df.count()
