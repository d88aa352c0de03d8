"""hvdlite: Horovod-style data-parallel training for PyTorch, TensorFlow/Keras and JAX.

This package is the framework-free core; its tensors are NumPy arrays. Framework adapters live
in ``hvdlite.torch``, ``hvdlite.tensorflow`` and ``hvdlite.jax``. Its names load on first use
(:mod:`hvdlite.utils.lazy_names`), so that ``hvdliterun`` does not import the core.
"""

from typing import TYPE_CHECKING

from .utils.lazy_names import lazy_names

if TYPE_CHECKING:  # the names, for type checkers, editors and the docs' reference (griffe reads __all__ here)
    from .api import *  # noqa: F403 - the collectives on NumPy arrays
    from .api import __all__ as _api_names  # noqa: F401
    from .common import *  # noqa: F403 - the names every adapter shares
    from .common import __all__ as _common_names  # noqa: F401
    from .core.work.request import Handle  # noqa: F401

    __all__ = [*_common_names, *_api_names, "Handle"]

__version__ = "0.1.0"

# At run time, each name comes from its module when first used: common.__all__, api.__all__, Handle,
# and hvd.elastic (Horovod's hvd.elastic.run, State, ...).
__getattr__, __dir__ = lazy_names(globals(), {"Handle": ".core.work.request"}, rest=(".common", ".api"),
                                  submodules=("elastic",))
