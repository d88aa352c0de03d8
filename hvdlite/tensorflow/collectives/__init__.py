"""TensorFlow tensors' way into the core: their conversion (:mod:`.tensors`), the collectives as
graph ops without gradients (:mod:`.host_ops`, :mod:`.topology_ops`) and with them
(:mod:`.differentiable`), and hvdlite's errors as TensorFlow's (:mod:`.errors`)."""
