"""Averaging gradients across ranks: the optax ``DistributedOptimizer`` (:mod:`.optimizer`) and
``op=Adasum`` (:mod:`.adasum`)."""
