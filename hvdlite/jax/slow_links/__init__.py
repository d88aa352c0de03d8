"""Training over slow links: Local SGD (:mod:`.local_sgd`), PowerSGD's low-rank gradients
(:mod:`.powersgd`) and DiLoCo's outer steps (:mod:`.diloco`)."""
