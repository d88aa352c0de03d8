"""Training over slow links: Local SGD (:mod:`.local_sgd`) and DiLoCo's outer steps (:mod:`.diloco`,
its elastic state in :mod:`.diloco_state`)."""
