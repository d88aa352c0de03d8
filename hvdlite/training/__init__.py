"""Training logic written once for every framework adapter.

What a ``DistributedOptimizer`` and the differentiable collectives mean does not depend on the
framework, so it lives here, and the adapters (``hvdlite.torch``, ``hvdlite.tensorflow``,
``hvdlite.jax``) only convert tensors and wrap optimizers. Where the logic needs a framework
operation (a cast, a slice, a collective on the framework's tensors), the adapter passes it in,
as :func:`hvdlite.compression.build_compression` does for compression:

- :mod:`.options`: the checks of optimizer options (``backward_passes_per_step``,
  ``gradient_predivide_factor``) and the Average / prescale / postscale arithmetic;
- :mod:`.gradients`: the gradient of each collective;
- :mod:`.sparse`: sparse gradients reduced as an allgather of their rows;
- :mod:`.broadcast`: several arrays broadcast as one group;
- :mod:`.powersgd`: PowerSGD's configuration and rules (which tensors are compressed, as what
  matrix, the seeded starting factors); torch and JAX each write the math in their own ops.
"""
