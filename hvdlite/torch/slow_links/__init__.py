"""Training over slow links: fewer or smaller exchanges than one all-reduce a step. Local SGD
(:mod:`.local_sgd`), PowerSGD's low-rank gradients (:mod:`.powersgd`) and DiLoCo's outer steps
(:mod:`.diloco`, its exchange in :mod:`.diloco_exchange`, its elastic state in :mod:`.diloco_state`)."""
