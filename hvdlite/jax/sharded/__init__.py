"""Sharded optimizer state, ZeRO stage 1 (``DistributedOptimizer(shard_optimizer_state=True)``): the
optax transformation that keeps 1/N of the wrapped state on each rank (:mod:`.transform`)."""
