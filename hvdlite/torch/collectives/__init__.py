"""Torch tensors' way into the core: their conversion to the core's arrays (:mod:`.tensors`) and the
asynchronous and in-place collectives on them (:mod:`.async_ops`). Everything else in
``hvdlite.torch`` (the optimizer wrappers, ``fully_shard``, the differentiable forms) builds on these.
"""
