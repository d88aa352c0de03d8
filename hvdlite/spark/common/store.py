"""Where a Spark estimator keeps its data and its runs: Horovod's ``Store``, on fsspec.

The layout is Horovod's, under one prefix::

    PREFIX/intermediate_train_data[.IDX]   the training DataFrame, as Parquet (written by Spark)
    PREFIX/intermediate_val_data[.IDX]     the validation rows, if any
    PREFIX/runs/RUN_ID/checkpoint          the model and optimizer after the last finished epoch
    PREFIX/runs/RUN_ID/logs/               what the run logs (its history, per epoch)

Every path goes through fsspec, so a local folder, ``hdfs://``, ``s3://``, ``gs://`` and
Databricks' ``/dbfs`` are one code path; the store itself holds only the prefix and the storage
options (it is pickled to the ranks, which open the filesystem again).
"""

from __future__ import annotations

import os
import posixpath
import uuid
from typing import Any

from ...errors import HvdliteError


class StoreError(HvdliteError):
    """A store path that cannot be read or written."""


class Store:
    """A prefix that holds an estimator's intermediate data and its runs (Horovod's ``Store``).

    Create one with :meth:`create`, which picks the class from the prefix. Any fsspec URL works;
    ``storage_options`` go to fsspec (credentials, endpoints).
    """

    def __init__(self, prefix_path: str, train_path: str | None = None, val_path: str | None = None,
                 test_path: str | None = None, runs_path: str | None = None, save_runs: bool = True,
                 storage_options: dict[str, Any] | None = None, checkpoint_filename: str | None = None) -> None:
        self.prefix_path = self._normalized(prefix_path)
        self.storage_options = dict(storage_options or {})
        self._train_path = train_path or self._join(self.prefix_path, "intermediate_train_data")
        self._val_path = val_path or self._join(self.prefix_path, "intermediate_val_data")
        self._test_path = test_path or self._join(self.prefix_path, "intermediate_test_data")
        self._runs_path = runs_path or self._join(self.prefix_path, "runs")
        self._save_runs = save_runs
        self._checkpoint_filename = checkpoint_filename or "checkpoint"

    @staticmethod
    def create(prefix_path: str, *args: Any, **kwargs: Any) -> Store:
        """The store for ``prefix_path``: :class:`DBFSLocalStore` for Databricks' ``dbfs:/`` and
        ``/dbfs/``, :class:`HDFSStore` for ``hdfs://``, :class:`LocalStore` for a local path or
        ``file://``, else a :class:`FilesystemStore` on whatever fsspec makes of the URL."""
        for kind in (DBFSLocalStore, HDFSStore, LocalStore):
            if kind.matches(prefix_path):
                return kind(prefix_path, *args, **kwargs)
        return FilesystemStore(prefix_path, *args, **kwargs)

    @classmethod
    def matches(cls, path: str) -> bool:
        """Whether this kind of store serves ``path``."""
        return "://" in path

    # Horovod's layout.

    def get_train_data_path(self, idx: int | str | None = None) -> str:
        return self._train_path if idx is None else f"{self._train_path}.{idx}"

    def get_val_data_path(self, idx: int | str | None = None) -> str:
        return self._val_path if idx is None else f"{self._val_path}.{idx}"

    def get_test_data_path(self, idx: int | str | None = None) -> str:
        return self._test_path if idx is None else f"{self._test_path}.{idx}"

    def saving_runs(self) -> bool:
        return self._save_runs

    def get_runs_path(self) -> str:
        return self._runs_path

    def get_run_path(self, run_id: str) -> str:
        return self._join(self._runs_path, run_id)

    def get_checkpoint_filename(self) -> str:
        return self._checkpoint_filename

    def get_checkpoint_path(self, run_id: str) -> str | None:
        """The run's checkpoint file, or None if the store does not save runs."""
        return self._join(self.get_run_path(run_id), self._checkpoint_filename) if self._save_runs else None

    def get_logs_subdir(self) -> str:
        return "logs"

    def get_logs_path(self, run_id: str) -> str | None:
        return self._join(self.get_run_path(run_id), self.get_logs_subdir()) if self._save_runs else None

    # Files.

    @property
    def fs(self) -> Any:
        """The fsspec filesystem of the prefix (opened on first use, in each process)."""
        if getattr(self, "_fs", None) is None:
            import fsspec

            self._fs = fsspec.core.url_to_fs(self.prefix_path, **self.storage_options)[0]
        return self._fs

    def __getstate__(self) -> dict[str, Any]:
        return {name: value for name, value in vars(self).items() if name != "_fs"}  # reopened where unpickled

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def read(self, path: str) -> bytes:
        try:
            with self.fs.open(path, "rb") as file:
                return file.read()
        except OSError as exc:
            raise StoreError(f"cannot read {path!r} from the store at {self.prefix_path!r}: {exc}") from exc

    def write(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` whole: into a temporary file beside it, then renamed, so that a
        reader (a resumed run) never sees half a checkpoint."""
        parent = posixpath.dirname(path)
        temporary = self._join(parent, f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")
        try:
            self.fs.makedirs(parent, exist_ok=True)
            with self.fs.open(temporary, "wb") as file:
                file.write(data)
            self.fs.mv(temporary, path)
        except OSError as exc:
            raise StoreError(f"cannot write {path!r} in the store at {self.prefix_path!r}: {exc}") from exc

    def delete(self, path: str) -> None:
        """Remove ``path`` (a file or a folder) if it exists."""
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def check_writable(self) -> None:
        """A StoreError now, naming the prefix, if files cannot be created under it."""
        probe = self._join(self.prefix_path, f".hvdlite-write-check-{uuid.uuid4().hex}")
        self.write(probe, b"")
        self.delete(probe)

    def is_parquet_dataset(self, path: str) -> bool:
        """Whether ``path`` holds Parquet files (what Spark wrote there)."""
        try:
            return bool(self.exists(path) and self.get_parquet_dataset(path).files)
        except (OSError, ValueError):
            return False

    def get_parquet_dataset(self, path: str) -> Any:
        """``path`` as a ``pyarrow.dataset.Dataset``."""
        import pyarrow.dataset as ds

        return ds.dataset(self._strip_protocol(path), filesystem=self.fs, format="parquet", exclude_invalid_files=True)

    def spark_path(self, path: str) -> str:
        """``path`` as Spark's readers and writers name it."""
        return path

    def _strip_protocol(self, path: str) -> str:
        return self.fs._strip_protocol(path)

    @staticmethod
    def _join(parent: str, name: str) -> str:
        return posixpath.join(parent, name)

    @staticmethod
    def _normalized(prefix_path: str) -> str:
        return prefix_path.rstrip("/") or "/"


class FilesystemStore(Store):
    """A store on any fsspec URL (``s3://bucket/prefix``, ``gs://...``, ``memory://...``)."""


class LocalStore(Store):
    """A store in a local folder (or ``file://`` URL), which every rank must see at the same path:
    a shared file system on a cluster."""

    @classmethod
    def matches(cls, path: str) -> bool:
        return "://" not in path or path.startswith("file://")

    @staticmethod
    def _normalized(prefix_path: str) -> str:
        return os.path.abspath(prefix_path.removeprefix("file://"))

    def spark_path(self, path: str) -> str:
        return "file://" + path


class HDFSStore(Store):
    """A store on HDFS (``hdfs://namenode:port/prefix``), through fsspec's pyarrow HDFS driver
    (it needs Hadoop's ``libhdfs`` and ``CLASSPATH`` on every host)."""

    @classmethod
    def matches(cls, path: str) -> bool:
        return path.startswith(("hdfs://", "viewfs://"))


class DBFSLocalStore(LocalStore):
    """Databricks' file system through its local ``/dbfs`` mount (``dbfs:/x`` is ``/dbfs/x``)."""

    @classmethod
    def matches(cls, path: str) -> bool:
        return path.startswith(("dbfs:/", "/dbfs/", "file:///dbfs/"))

    @staticmethod
    def _normalized(prefix_path: str) -> str:
        if prefix_path.startswith("dbfs:/"):
            prefix_path = "/dbfs/" + prefix_path.removeprefix("dbfs:").lstrip("/")
        return LocalStore._normalized(prefix_path)

    def spark_path(self, path: str) -> str:
        return "dbfs:/" + path.removeprefix("/dbfs/")


__all__ = ["Store", "StoreError", "FilesystemStore", "LocalStore", "HDFSStore", "DBFSLocalStore"]
