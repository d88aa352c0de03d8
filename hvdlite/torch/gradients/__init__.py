"""Averaging gradients across ranks: ``DistributedOptimizer`` (:mod:`.optimizer`), the per-parameter
hooks and buckets that turn backward's gradients into fused requests (:mod:`.grad_sync`,
:mod:`.buckets`), sparse gradients (:mod:`.sparse`), ``op=Adasum`` (:mod:`.adasum`) and the
``skip_synchronize`` rules every reducer shares (:mod:`.step_control`)."""
