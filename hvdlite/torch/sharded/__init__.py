"""Sharded optimizer state, ZeRO stages 1 and 2 (``DistributedOptimizer(shard_optimizer_state=True)``):
where each rank's shard lies (:mod:`.layout`), the reducer that steps on it (:mod:`.reducer`) and
full checkpoints of it (:mod:`.checkpoint`). ZeRO-3 (``fully_shard``) is :mod:`hvdlite.torch.fully_sharded`."""
