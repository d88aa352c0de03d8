"""``jax.Array``s' way into the core: their conversion (:mod:`.arrays`) and the collectives on arrays
and pytrees, outside ``jax.jit`` and inside it (:mod:`.calls`)."""
