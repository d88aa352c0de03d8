"""Elastic training, hvdliterun's side: which hosts the job may use, and watching it end.

- :mod:`.launch`: the flags that make a job elastic, its first hosts and sizes, publishing the host list;
- :mod:`.discovery`: ``--host-discovery-script`` (or a Slurm allocation's usable nodes), polled;
- :mod:`.service`: the control channel's server, where ranks anywhere report to the launcher;
- :mod:`.watch`: when the job is over (a rank died too early, only an unreachable host is left) and
  its exit code.

The ranks' side (state, ``run``, re-forming the world, the host book) is :mod:`hvdlite.elastic`.
"""
