"""The pipeline a tensor travels, one module a stage; :mod:`hvdlite.core.engine` only sequences them.

1. submit   -- :mod:`hvdlite.api` checks arguments and describes each tensor as a request
2. queue    -- :mod:`.queue` holds requests until a cycle takes them, and until they complete
3. negotiate -- :mod:`.negotiate` agrees with every rank on what runs now (:mod:`.cache`: the
   response cache's bit vector; :mod:`.coordinator`: rank 0's decisions and stall inspector)
4. fuse     -- :mod:`.fuse` packs small agreed responses into work items
5. execute  -- :mod:`.execute` runs work items on the first data plane enabled for them (:mod:`hvdlite.core.planes`)
6. complete -- :mod:`.complete` hands results and errors to the waiting handles

:class:`.communicator.Pipeline` is one communicator's stages (queue, negotiator, executor,
fusion threshold): the unit a process set or a rebuilt elastic world gets its own copy of.
"""
