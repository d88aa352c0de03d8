"""Averaging gradients across ranks: ``DistributedGradientTape`` and the grouped reduction every
wrapper shares (:mod:`.tape`), the Keras 3 ``DistributedOptimizer`` (:mod:`.optimizer`), ``op=Adasum``
(:mod:`.adasum`) and TF1's ``tf.compat.v1.train.Optimizer`` wrapper (:mod:`.legacy`)."""
