"""Online tuning of the fusion threshold and the chunk size (``HVDLITE_AUTOTUNE=1``). Pure logic.

Runs on rank 0's engine thread. The score of a setting is the rate at which the job reduces
bytes, measured over wall-clock time: a training loop reduces the same bytes every step, so
bytes per second is proportional to steps per second, and it includes whatever a setting does
to the compute that overlaps the communication. No step boundaries are needed.

The search is coordinate descent over fixed grids, robust to noise by construction: first every
fusion threshold with the default chunk size, then every chunk size with the best threshold;
each candidate is scored ``samples`` times and keeps its median. The winner is then kept for
the rest of the job. A sample window opens and closes when one particular tensor (the first one
seen) is reduced, so it spans whole training steps: windows cut at arbitrary cycles were
measured to carry a +-15 % error on 1 s samples of a 200 ms step, more than the differences
between settings.

The tuner only proposes settings; the engine publishes them to every rank in a negotiation
round, so all ranks switch between the same two cycles (every rank must cut the same chunks and
fuse the same tensors).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from ..work.params import Params

if TYPE_CHECKING:
    from ...settings.config import Config

MIB = 1024 * 1024
FUSION_THRESHOLDS = (0, 512 * 1024, 1 * MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 64 * MIB)
CHUNK_SIZES = (1 * MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 64 * MIB)


@dataclasses.dataclass(frozen=True)
class Sample:
    """One measured window: ``nbytes`` reduced in ``seconds`` under ``params``."""

    params: Params
    nbytes: int
    seconds: float

    @property
    def score(self) -> float:
        """Bytes reduced per second."""
        return self.nbytes / self.seconds if self.seconds > 0 else 0.0


class Autotuner:
    """Feed it :meth:`record` after every cycle that reduced bytes; apply what it returns."""

    def __init__(self, start: Params, sample_seconds: float, samples: int = 3,
                 thresholds: Sequence[int] = FUSION_THRESHOLDS, chunks: Sequence[int] = CHUNK_SIZES,
                 log: Callable[[str], None] | None = None) -> None:
        self.current = start
        self._sample_seconds = sample_seconds
        self._samples_per_candidate = samples
        self._thresholds = list(dict.fromkeys(thresholds))
        self._chunks = list(dict.fromkeys(chunks))
        self._log = log or (lambda line: None)
        self._phase = "warmup"  # warmup -> thresholds -> chunks -> done
        self._queue: list[Params] = []
        self._scores: dict[Params, list[float]] = {}
        self._anchor: str | None = None  # a tensor name whose reappearance marks the same point of the next step
        self._anchor_lost = False  # the anchor did not come back: windows go by time alone
        self._window_start: float | None = None  # None: waiting for the next anchor to open a window
        self._window_bytes = 0
        self._origin: float | None = None  # time of the first record: the log's clock starts there
        self._last_close = 0.0  # when the last window closed (or the first record): for the anchor fallback
        self.best: Params | None = None
        self._log("time_s,phase,fusion_threshold,chunk_bytes,bytes,seconds,score_mb_per_s")

    @classmethod
    def from_config(cls, config: Config, start: Params) -> Autotuner:
        """The tuner ``HVDLITE_AUTOTUNE`` asks for, logging to ``HVDLITE_AUTOTUNE_LOG`` if set."""
        write = None
        if config.autotune_log:
            log_file = open(config.autotune_log, "w", buffering=1)  # noqa: SIM115 (open for the job's life)
            write = lambda line: print(line, file=log_file)  # noqa: E731
        return cls(start, config.autotune_sample_seconds, config.autotune_samples, log=write)

    @property
    def done(self) -> bool:
        return self._phase == "done"

    def record(self, nbytes: int, now: float, names: Collection[str] = ()) -> Params | None:
        """Account a cycle that reduced ``nbytes`` (tensors ``names``) and ended at ``now``.

        Returns settings to switch to, if any. Windows open and close at cycles holding the
        *anchor* (the first tensor name seen), so a training loop's window spans whole steps;
        without names (or if the anchor never returns) a window closes on time alone, after
        ``4 x sample_seconds``.
        """
        if self.done:
            return None
        if self._origin is None:
            self._origin = self._last_close = now
        if self._anchor is None and names and not self._anchor_lost:
            self._anchor = next(iter(names))
        at_anchor = self._anchor is None or self._anchor in names
        if self._window_start is None and not at_anchor and now - self._last_close > 4 * self._sample_seconds:
            self._anchor, self._anchor_lost, at_anchor = None, True, True
        if self._window_start is None:
            if at_anchor:
                self._window_start, self._window_bytes = now, 0
            return None
        self._window_bytes += nbytes
        elapsed = now - self._window_start
        closes = (at_anchor and elapsed >= self._sample_seconds) or elapsed >= 4 * self._sample_seconds
        if not closes or self._window_bytes == 0:
            return None
        self._last_close = now
        if not at_anchor:
            self._anchor, self._anchor_lost, at_anchor = None, True, True
        sample = Sample(self.current, self._window_bytes, elapsed)
        self._log_sample(sample, now)
        if self._phase == "warmup":
            self._phase = "thresholds"
            self._queue = self._candidates_for_thresholds()
        else:
            self._scores.setdefault(self.current, []).append(sample.score)
        return self._next(now, at_anchor)

    # ---- search --------------------------------------------------------------------------------
    def _candidates_for_thresholds(self) -> list[Params]:
        chunk = self.current.chunk_bytes
        return [Params(t, chunk) for t in self._thresholds for _ in range(self._samples_per_candidate)]

    def _candidates_for_chunks(self, threshold: int) -> list[Params]:
        return [Params(threshold, c) for c in self._chunks for _ in range(self._samples_per_candidate)]

    def _best_measured(self) -> Params:
        return max(self._scores, key=lambda p: statistics.median(self._scores[p]))

    def _next(self, now: float, at_anchor: bool) -> Params | None:
        if not self._queue and self._phase == "thresholds":
            self._phase = "chunks"
            self._queue = self._candidates_for_chunks(self._best_measured().fusion_threshold)
        if not self._queue:
            self._phase = "done"
            self.best = self._best_measured()
            median = statistics.median(self._scores[self.best]) / 1e6
            self._log(f"{now - self._origin:.3f},chosen,{self.best.fusion_threshold},{self.best.chunk_bytes},,,{median:.1f}")
            return self._switch(self.best, now, at_anchor)
        return self._switch(self._queue.pop(0), now, at_anchor)

    def _switch(self, params: Params, now: float, at_anchor: bool) -> Params | None:
        changed = params != self.current
        self.current = params
        # A new setting reaches the ranks in the next negotiation round: its window opens at the
        # next anchor after that. An unchanged one goes on from this anchor.
        self._window_start, self._window_bytes = (now if at_anchor and not changed else None), 0
        return params if changed else None

    def _log_sample(self, sample: Sample, now: float) -> None:
        phase = "warmup" if self._phase == "warmup" else "sample"
        self._log(f"{now - self._origin:.3f},{phase},{sample.params.fusion_threshold},{sample.params.chunk_bytes},"
                  f"{sample.nbytes},{sample.seconds:.4f},{sample.score / 1e6:.1f}")
