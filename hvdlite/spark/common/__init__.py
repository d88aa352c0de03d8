"""What the Spark estimators share: the :class:`~hvdlite.spark.common.store.Store` and the Parquet data path."""
