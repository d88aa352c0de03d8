"""Elastic training, the ranks' side: what happens when a rank dies or hosts come and go.

In elastic mode (``hvdliterun --min-np N``, ``--max-np``, ``--host-discovery-script``) the
survivors of a rank's death re-form the job without it, and at a commit the job grows into free
slots or lets ranks go whose host left the list. The README's "Elastic training" says what is
tested. The modules, in the order a failure meets them:

- :mod:`.state`: Horovod's ``State`` / ``ObjectState`` (commit, restore, sync) and the base of the
  adapters' framework states (``hvdlite.torch.elastic.TorchState``, ...);
- :mod:`.retry`: Horovod's ``hvd.elastic.run``, the retry loop around the training function;
- :mod:`.reform`: re-forming the world on MPI (shrink without the dead; spawn, merge and remove);
- :mod:`.agreement`: the survivors ask hvdliterun for the one decision on the new world
  (``hvdlite.runner.elastic.membership`` decides), and :mod:`.forming` creates its communicator
  without hanging on a member that dies meanwhile;
- :mod:`.hosts`: the job's host book (slots, blacklist, the plan rank 0 decides), pure logic;
- :mod:`.channel`: the control channel to hvdliterun (``hvdlite.runner.elastic.service`` is its
  other end), and :mod:`.wrapper`, the shell every rank runs under that reports its exit.

Who died is found by :mod:`hvdlite.utils.failed_peers`, below the engine's waits. The launcher's
side (discovery, the channel's server, the job's watch) is :mod:`hvdlite.runner.elastic`.
"""

from typing import TYPE_CHECKING

from ..utils.lazy_names import lazy_names

if TYPE_CHECKING:
    from .retry import run  # noqa: F401
    from .state import FrameworkState, ObjectState, State  # noqa: F401

__all__ = ["State", "ObjectState", "FrameworkState", "run"]
# Loaded on first use: hvdliterun imports .wrapper and .channel, which need none of the rest. (The
# retry loop's module is not called ``run``: importing a submodule sets the package's attribute of
# its name, which would hide the function.)
__getattr__, __dir__ = lazy_names(globals(), {"State": ".state", "ObjectState": ".state",
                                              "FrameworkState": ".state", "run": ".retry"})
