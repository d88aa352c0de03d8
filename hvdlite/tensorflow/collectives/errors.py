"""hvdlite's errors as the TensorFlow error types Horovod's TensorFlow ops raise.

When ranks disagree on a collective (shape, dtype, number of dimensions, root rank, or the
sequence of unnamed collectives), Horovod's TensorFlow ops fail with
``tf.errors.FailedPreconditionError``; for a bad argument that the op checks on its own rank
(alltoall splits that do not fit the tensor, a scalar to allgather), with
``tf.errors.InvalidArgumentError``, as for a process set this rank is not in. Eagerly, hvdlite
raises an error that is both its own (:class:`~hvdlite.errors.TensorMismatchError`,
:class:`~hvdlite.errors.UnsupportedOperationError`, :class:`~hvdlite.errors.ProcessSetError`) and
that TensorFlow type, so code written for either catches it. Inside a graph TensorFlow chooses
the type itself (a Python error in a host callback becomes ``InvalidArgumentError``), and no op
lets a callback pick ``FailedPreconditionError``.
"""

from __future__ import annotations

import tensorflow as tf

from ...errors import ProcessSetError, TensorMismatchError, UnsupportedOperationError


class TensorMismatchFailedPreconditionError(TensorMismatchError, tf.errors.FailedPreconditionError):
    """Ranks disagree on a collective: hvdlite's error, and the TensorFlow type Horovod raises."""


class UnsupportedOperationInvalidArgumentError(UnsupportedOperationError, tf.errors.InvalidArgumentError):
    """A bad argument to a collective on this rank: hvdlite's error, and the TensorFlow type Horovod raises."""


class ProcessSetInvalidArgumentError(ProcessSetError, tf.errors.InvalidArgumentError):
    """A process set that is unknown, removed or does not include this rank: hvdlite's error, and the
    TensorFlow type Horovod raises."""


# hvdlite's error -> (the error raised instead, its TensorFlow base)
_AS_TENSORFLOW: dict[type[Exception], tuple[type[Exception], type[tf.errors.OpError]]] = {
    TensorMismatchError: (TensorMismatchFailedPreconditionError, tf.errors.FailedPreconditionError),
    UnsupportedOperationError: (UnsupportedOperationInvalidArgumentError, tf.errors.InvalidArgumentError),
    ProcessSetError: (ProcessSetInvalidArgumentError, tf.errors.InvalidArgumentError),
}
CONVERTED = tuple(_AS_TENSORFLOW)  # the hvdlite errors raised with a TensorFlow type too


def as_tensorflow_error(error: TensorMismatchError | UnsupportedOperationError | ProcessSetError) -> tf.errors.OpError:
    """``error``, with its message and attributes, as the TensorFlow type Horovod raises."""
    converted_type, tf_type = next(pair for base, pair in _AS_TENSORFLOW.items() if isinstance(error, base))
    if isinstance(error, converted_type):  # converted already (a nested call)
        return error
    converted = converted_type(*error.args)
    converted.__dict__.update(error.__dict__)
    tf_type.__init__(converted, None, None, str(error))
    converted.args = error.args  # OpError's initialiser empties them
    return converted
