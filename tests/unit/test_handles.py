"""Handles: completion seen by waiters in other threads, errors, and the prepared allreduce's checks."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hvdlite import api
from hvdlite.core.work.request import Handle, MappedHandle
from hvdlite.errors import TensorMismatchError, UnsupportedOperationError
from hvdlite.ops import ReduceOp


def test_waiter_blocked_before_completion_is_released() -> None:
    handle = Handle("t")
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(handle.wait()))
    waiter.start()
    time.sleep(0.05)  # the waiter is blocked by now (or about to block: both paths must work)
    assert not handle.done() and not got
    started = time.monotonic()
    handle.set_result(42)
    waiter.join(2)
    assert got == [42]
    assert time.monotonic() - started < 0.4  # woken by the completion, not by its 0.5 s re-check


def test_many_waiters_and_late_waiters_all_see_the_result() -> None:
    handle = Handle("t")
    got: list[object] = []
    waiters = [threading.Thread(target=lambda: got.append(handle.wait())) for _ in range(4)]
    for w in waiters:
        w.start()
    handle.set_result("r")
    for w in waiters:
        w.join(2)
    assert got == ["r"] * 4
    assert handle.wait() == "r"  # after completion: no blocking


def test_error_is_raised_by_wait_not_by_join() -> None:
    handle = Handle("t")
    handle.set_error(TensorMismatchError("shapes differ"))
    handle.set_result("ignored")  # a later result does not hide the error
    handle.join()
    with pytest.raises(TensorMismatchError, match="shapes differ"):
        handle.wait()
    mapped = MappedHandle(handle, lambda value: value)
    mapped.join()
    with pytest.raises(TensorMismatchError):
        mapped.wait()


def test_a_second_completion_neither_changes_the_result_nor_fails() -> None:
    handle = Handle("t")
    waiter = threading.Thread(target=handle.join)
    waiter.start()
    time.sleep(0.05)
    handle.set_result(1)
    handle.set_result(2)  # releasing the waiter's lock twice would raise here
    handle.set_error(TensorMismatchError("late"))
    waiter.join(2)
    assert not waiter.is_alive() and handle.wait() == 1


def test_wait_timeout_names_the_operation() -> None:
    with pytest.raises(TimeoutError, match="'slow'"):
        Handle("slow").wait(timeout=0.05)


def test_prepared_allreduce_rejects_a_tensor_unlike_the_prepared_one() -> None:
    array = np.ones((3, 4), np.float32)
    meta = api.prepare_allreduce(array, "grad.w", ReduceOp.AVERAGE)
    assert (meta.name, meta.shape, meta.dtype, meta.op) == ("grad.w", (3, 4), "float32", ReduceOp.AVERAGE)
    with pytest.raises(UnsupportedOperationError, match=r"'grad.w' was prepared as float32\[3, 4\] on cpu, got float64\[3, 4\] on cpu"):
        api.allreduce_prepared_async(meta, np.ones((3, 4)))
    with pytest.raises(UnsupportedOperationError, match=r"float32\[3, 4\] on cpu, got float32\[4, 3\] on cpu"):
        api.allreduce_prepared_async(meta, np.ones((4, 3), np.float32))
    frozen = np.ones((3, 4), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(UnsupportedOperationError, match="'grad.w' must be C-contiguous and writable"):
        api.allreduce_prepared_async(meta, frozen)
