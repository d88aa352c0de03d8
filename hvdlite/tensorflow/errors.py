"""hvdlite's errors as the TensorFlow error types Horovod's TensorFlow ops raise.

When ranks disagree on a collective (shape, dtype, number of dimensions, root rank, or the
sequence of unnamed collectives), Horovod's TensorFlow ops fail with
``tf.errors.FailedPreconditionError``. Eagerly, hvdlite raises an error that is both its own
:class:`~hvdlite.errors.TensorMismatchError` and that TensorFlow type, so code written for either
catches it. Inside a graph TensorFlow chooses the type itself (a Python error in a host callback
becomes ``InvalidArgumentError``), and no op lets a callback pick ``FailedPreconditionError``.
"""

from __future__ import annotations

import tensorflow as tf

from ..errors import TensorMismatchError


class TensorMismatchFailedPreconditionError(TensorMismatchError, tf.errors.FailedPreconditionError):
    """Ranks disagree on a collective: hvdlite's error, and the TensorFlow type Horovod raises."""


def as_tensorflow_error(error: TensorMismatchError) -> TensorMismatchFailedPreconditionError:
    """``error``, with its message and attributes, as the TensorFlow type Horovod raises."""
    converted = TensorMismatchFailedPreconditionError(*error.args)
    converted.__dict__.update(error.__dict__)
    tf.errors.FailedPreconditionError.__init__(converted, None, None, str(error))
    converted.args = error.args  # OpError's initialiser empties them
    return converted
