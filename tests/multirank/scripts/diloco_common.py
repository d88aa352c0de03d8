"""What the DiLoCo scripts of the three frameworks share: the process sets, the replay's schedule, refusals.

Ranks form groups of GROUP_SIZE consecutive ranks (synchronous inside); DiLoCo's pseudo-gradients
are averaged over the ranks holding the same place in each group.
"""

import os
import signal
import time
from collections.abc import Callable

import numpy as np

from hvdlite.training.diloco_exchange import dequantize_int8, from_bf16_bits, quantize_int8, to_bf16_bits


def make_sets(hvd, size: int, group_size: int) -> dict:
    """``hvd.init`` with every group's and every place's set; returns {"group": [...], "cross": [...]}
    (a set of every rank being the global set)."""
    sets = {"group": [hvd.ProcessSet(range(g, g + group_size)) for g in range(0, size, group_size)],
            "cross": [hvd.ProcessSet(range(place, size, group_size)) for place in range(group_size)]}
    unique = {tuple(s.ranks): s for s in sets["group"] + sets["cross"] if len(s.ranks) < size}
    hvd.init(process_sets=list(unique.values()))
    return {kind: [unique.get(tuple(s.ranks), hvd.global_process_set) for s in every] for kind, every in sets.items()}


def register_dynamic_sets(hvd, group_size: int) -> tuple:
    """This world's group (consecutive ranks) and place (the same index in every group) sets,
    registered on every rank with ``hvd.add_process_set`` (``init(process_sets="dynamic")``), as an
    elastic job does again after every re-form; a set of every rank is the global set."""
    size, rank = hvd.size(), hvd.rank()
    groups = [list(range(g, g + group_size)) for g in range(0, size, group_size)]
    places = [list(range(p, size, group_size)) for p in range(group_size)]
    registered = {}
    for ranks in groups + places:
        if len(ranks) < size and tuple(ranks) not in registered:
            registered[tuple(ranks)] = hvd.add_process_set(ranks)
    mine = [next(r for r in every if rank in r) for every in (groups, places)]
    return tuple(registered.get(tuple(ranks), hvd.global_process_set) for ranks in mine)


# The elastic scripts: every rank of the last group dies before step KILL_AT; new ranks join after the
# host's cooldown, and the job ends once the full world has run STEPS_AFTER_JOIN steps again.
KILL_AT, MAX_STEPS = 5, 400


def die_on_schedule(first_rank: int, step: int, group_size: int, full: int, size: int) -> None:
    """SIGKILL this process if it started in the last group and ``step`` is KILL_AT (joining ranks
    start after it); then pace the step, so that the host's cooldown ends, and the new ranks (which
    start while the shrunk world, of ``size`` ranks, trains) are ready, within a bounded number of
    steps: the float32 replay drifts from the ranks' sums (summed in another order) by about 1e-4
    after 130 steps at the smaller size."""
    if first_rank >= full - group_size and step == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05 if size == full else 1.0)


def record_step(hvd, state, full: int) -> None:
    """Record the world size of the step just taken (``state.sizes``, for the replay), count the
    steps of the full world after a shrink (``state.joined_steps``) and commit."""
    state.sizes = [*state.sizes, hvd.size()]
    state.joined_steps += state.shrunk and hvd.size() == full
    state.step += 1
    state.commit()


def note_reform(hvd, state, full: int) -> None:
    """A reset callback's bookkeeping: whether the world has shrunk, saved so the sync carries it to joining ranks."""
    state.shrunk = state.shrunk or hvd.size() < full
    state.save()


def elastic_steps(hvd, state, group_size: int, full: int, steps_after_join: int, one_step: Callable[[int], None]):
    """Run ``one_step(step)`` under ``hvd.elastic.run`` until the full world has run ``steps_after_join``
    steps after a shrink, dying on schedule and recording every step."""
    first_rank = hvd.rank()

    @hvd.elastic.run
    def train(state):
        for step in range(state.step, MAX_STEPS):
            if state.joined_steps >= steps_after_join:
                return
            die_on_schedule(first_rank, step, group_size, full, hvd.size())
            one_step(step)
            record_step(hvd, state, full)

    train(state)


class ReplaySchedule:
    """A replay's sends and landings after each step; the replay defines ``schedule``, ``send(fragment)``
    and ``land()``."""

    def after_step(self, step: int) -> None:
        count = step + 1
        if self.schedule.delay and self.schedule.lands_after(count) is not None:
            self.land()
        fragment = self.schedule.sent_after(count)
        if fragment is not None:
            self.send(fragment)
            if not self.schedule.delay:
                self.land()


def rounded(compression: str, residuals: dict, key: tuple, delta: np.ndarray) -> np.ndarray:
    """A group's pseudo-gradient ``delta`` as the library's NumPy codec delivers it: bf16, or int8 with
    error feedback (``residuals[key]``: what the group's last rounding dropped)."""
    flat = np.asarray(delta, dtype=np.float32).reshape(-1)
    if compression == "bf16":
        return from_bf16_bits(to_bf16_bits(flat)).reshape(np.shape(delta))
    if compression != "int8":
        return delta
    corrected = flat + residuals.get(key, 0)
    decoded = dequantize_int8(*quantize_int8(corrected), corrected.size)
    residuals[key] = corrected - decoded
    return decoded.reshape(np.shape(delta))


def expect_refusal(message: str, build_it: Callable[[], object]) -> None:
    """``build_it()`` raises a ValueError whose message contains ``message``."""
    try:
        build_it()
    except ValueError as error:
        assert message in str(error), (message, str(error))
        return
    raise AssertionError(f"not refused: {message}")


def parse_run(run: str, rank: int, group_size: int, sets: dict) -> tuple:
    """``FRAGMENTS/DELAY[/COMPRESSION]`` as (fragments, delay, compression or None, this rank's group
    set, its cross set)."""
    fragments, delay, *codec = run.split("/")
    return (int(fragments), int(delay), codec[0] if codec else None,
            sets["group"][rank // group_size], sets["cross"][rank % group_size])


def run_checks(hvd, check: Callable[[str, int, str, dict], None]) -> None:
    """The JAX and Keras scripts' main: ``GROUP_SIZE MODE RUN,...`` from the command line, the sets
    registered, ``check(run, group_size, mode, sets)`` for each run, then shutdown."""
    import sys

    from mpi4py import MPI

    size, group_size, mode = MPI.COMM_WORLD.Get_size(), int(sys.argv[1]), sys.argv[2]
    sets = make_sets(hvd, size, group_size)
    for run in sys.argv[3].split(","):
        check(run, group_size, mode, sets)
    hvd.shutdown()
