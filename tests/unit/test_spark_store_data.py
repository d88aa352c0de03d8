"""The Spark estimators' store layout and Parquet data path, in process (pyarrow, fsspec; no Spark)."""

import pickle

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from hvdlite.spark.common.data import Batches, DataError, row_groups, share, to_numpy  # noqa: E402
from hvdlite.spark.common.store import (  # noqa: E402
    DBFSLocalStore,
    FilesystemStore,
    LocalStore,
    Store,
    StoreError,
)


def test_create_picks_the_store_from_the_prefix_and_keeps_horovods_layout(tmp_path):
    store = Store.create(str(tmp_path / "store"))
    assert type(store) is LocalStore
    assert store.get_train_data_path() == f"{tmp_path}/store/intermediate_train_data"
    assert store.get_val_data_path(2) == f"{tmp_path}/store/intermediate_val_data.2"
    assert store.get_checkpoint_path("run1") == f"{tmp_path}/store/runs/run1/checkpoint"
    assert store.get_logs_path("run1") == f"{tmp_path}/store/runs/run1/logs"
    assert store.spark_path(store.get_train_data_path()) == f"file://{tmp_path}/store/intermediate_train_data"
    assert type(Store.create("file:///tmp/x")) is LocalStore
    assert type(Store.create("memory://bucket/x")) is FilesystemStore
    dbfs = Store.create("dbfs:/team/x")
    assert type(dbfs) is DBFSLocalStore and dbfs.prefix_path == "/dbfs/team/x"
    assert dbfs.spark_path(dbfs.get_train_data_path()) == "dbfs:/team/x/intermediate_train_data"
    assert Store.create(str(tmp_path), save_runs=False).get_checkpoint_path("run1") is None


def test_write_read_delete_and_pickling_reopen_the_filesystem(tmp_path):
    store = Store.create(str(tmp_path / "s"))
    path = store.get_checkpoint_path("r")
    store.write(path, b"weights")
    assert store.read(path) == b"weights" and store.exists(path)
    assert sorted(p.name for p in (tmp_path / "s" / "runs" / "r").iterdir()) == ["checkpoint"]  # no temporary left
    again = pickle.loads(pickle.dumps(store))
    assert again.read(path) == b"weights"
    store.delete(store.get_run_path("r"))
    assert not store.exists(path)


def test_an_fsspec_url_is_the_same_code_path():
    store = Store.create("memory://hvdlite-test/prefix")
    store.check_writable()
    store.write(store.get_checkpoint_path("a"), b"x")
    assert store.read(store.get_checkpoint_path("a")) == b"x"


def test_a_store_that_cannot_be_written_names_its_prefix(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match=f"cannot write .* in the store at '{blocker}/sub'"):
        Store.create(str(blocker / "sub")).check_writable()


def write_parquet(folder, files, rows_per_group):
    """``files`` Parquet files of consecutive ids, each in row groups of ``rows_per_group``."""
    folder.mkdir()
    start = 0
    for index, rows in enumerate(files):
        ids = np.arange(start, start + rows)
        table = pa.table({"id": ids, "x": [[float(i), float(-i)] for i in ids], "y": ids.astype(np.float32)})
        pq.write_table(table, folder / f"part-{index:05d}.parquet", row_group_size=rows_per_group)
        start += rows
    return Store.create(str(folder.parent)).get_parquet_dataset(str(folder))


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_shares_cover_every_row_once_and_differ_by_one_row_at_most(tmp_path, size):
    dataset = write_parquet(tmp_path / "d", [10, 3, 8], rows_per_group=4)
    groups = row_groups(dataset)
    assert [rows for _, _, rows in groups] == [4, 4, 2, 3, 4, 4]
    counts = [sum(piece.count for piece in share(groups, rank, size)) for rank in range(size)]
    assert sum(counts) == 21 and max(counts) - min(counts) <= 1
    seen = []
    for rank in range(size):
        batches = iter(Batches(dataset, ["id"], rank, size, batch_size=1))
        seen += [int(next(batches)["id"][0]) for _ in range(counts[rank])]
    assert seen == list(range(21))  # contiguous ranges, in order, without a shuffle buffer


def test_shuffled_batches_visit_the_whole_share_each_pass_and_repeat_with_the_seed(tmp_path):
    dataset = write_parquet(tmp_path / "d", [40, 24], rows_per_group=8)

    def first_rows(seed):
        batches = iter(Batches(dataset, ["id", "x", "y"], rank=1, size=2, batch_size=4, shuffle_buffer_size=16, seed=seed))
        taken = [next(batches) for _ in range(8)]  # one pass over the share's 32 rows
        for batch in taken:
            assert batch["x"].shape == (4, 2) and batch["y"].dtype == np.float32
            np.testing.assert_array_equal(batch["x"][:, 0], batch["id"])
        return np.concatenate([batch["id"] for batch in taken])

    rows = first_rows(seed=3)
    assert sorted(rows.tolist()) == list(range(32, 64))
    assert rows.tolist() != list(range(32, 64))
    np.testing.assert_array_equal(first_rows(seed=3), rows)


def test_ragged_arrays_and_missing_values_are_named(tmp_path):
    table = pa.table({"ragged": [[1.0], [1.0, 2.0]], "gaps": pa.array([1.0, None])})
    with pytest.raises(DataError, match="column 'ragged' holds arrays of different lengths"):
        to_numpy(table, "ragged")
    with pytest.raises(DataError, match="column 'gaps' has 1 missing values"):
        to_numpy(table, "gaps")
    nested = pa.table({"image": [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]})
    assert to_numpy(nested, "image").shape == (2, 2, 2)


def test_more_ranks_than_rows_is_a_clear_error(tmp_path):
    dataset = write_parquet(tmp_path / "d", [2], rows_per_group=2)
    for rank in range(3):
        with pytest.raises(DataError, match="the dataset holds 2 rows, fewer than the 3 ranks"):
            Batches(dataset, ["id"], rank=rank, size=3, batch_size=1)


def test_estimator_params_have_horovods_accessors_and_refuse_unknown_keywords():
    pytest.importorskip("pyspark")
    from hvdlite.spark.common.params import ParamsError
    from hvdlite.spark.torch import TorchEstimator

    est = TorchEstimator(batch_size=64, feature_cols=["f"])
    assert est.getBatchSize() == 64 and est.getEpochs() == 1 and est.getFeatureCols() == ["f"]
    assert est.setEpochs(3) is est and est.getEpochs() == 3
    est.setParams(run_id="r1", validation=0.2)
    assert (est.getRunId(), est.getValidation()) == ("r1", 0.2)
    assert est.copy().getBatchSize() == 64  # what a Pipeline does with its stages
    with pytest.raises(ParamsError, match="TorchEstimator has no parameter 'batchsize'"):
        TorchEstimator(batchsize=64)
    with pytest.raises(ParamsError, match="loss or loss_constructors, not both"):
        TorchEstimator(loss=abs, loss_constructors=[lambda: abs])
