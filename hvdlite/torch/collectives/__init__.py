"""Torch tensors' way into the core: their conversion to the core's arrays (:mod:`.tensors`), the
asynchronous and in-place collectives on them (:mod:`.async_ops`) and the blocking ones, differentiable
as in Horovod (:mod:`.differentiable`). Everything else in ``hvdlite.torch`` (the optimizer wrappers,
``fully_shard``) builds on these.
"""
