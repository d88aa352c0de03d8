"""The machines the tests and the benchmarks run on, built on this one: two network-namespace hosts
(:mod:`testbed.netns`). Not installed with hvdlite; ``tests/`` and ``bench/`` import it from the
repository's root."""
