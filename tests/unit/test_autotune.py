"""Autotune: the search finds the best setting of a synthetic job, logs every sample, then stops."""

from __future__ import annotations

import numpy as np

from hvdlite.core.pipeline.autotune import Autotuner, Params
from hvdlite.core.work.request import Handle, Request, RequestMeta
from hvdlite.ops import Collective, ReduceOp

from .fake_ranks import start_engines, stop_engines

MIB = 1024 * 1024


def drive(tuner: Autotuner, rate_of, step_bytes: int = 10 * MIB, max_steps: int = 100_000) -> float:
    """Feed the tuner 'training steps' of three cycles each; a step takes step_bytes / rate_of(params) seconds.

    A proposal takes effect one cycle later, as through the engine's negotiation round.
    """
    now, active, pending = 0.0, tuner.current, None
    for _ in range(max_steps):
        if tuner.done:
            return now
        for part, name in enumerate(("a", "b", "c")):
            if pending is not None:
                active, pending = pending, None
            now += step_bytes / 3 / rate_of(active, part)
            proposal = tuner.record(step_bytes // 3, now, [name])
            if proposal is not None:
                pending = proposal
    raise AssertionError("the tuner never finished")


def test_finds_the_best_threshold_then_the_best_chunk_and_stops() -> None:
    lines: list[str] = []
    start = Params(2 * MIB, 4 * MIB)
    tuner = Autotuner(start, sample_seconds=1.0, samples=2, thresholds=(1 * MIB, 2 * MIB, 8 * MIB),
                      chunks=(1 * MIB, 4 * MIB, 16 * MIB), log=lines.append)

    def rate(p: Params, part: int) -> float:  # best at threshold 8 MB, chunk 1 MB; each step reduces 10 MB
        return 100e6 * (1.0 + 0.2 * (p.fusion_threshold == 8 * MIB) + 0.1 * (p.chunk_bytes == 1 * MIB))

    drive(tuner, rate_of=rate)
    assert tuner.best == Params(8 * MIB, 1 * MIB)
    assert tuner.current == tuner.best
    assert tuner.record(10 * MIB, 1e6) is None  # done: no more proposals
    header, warmup, *samples, chosen = lines
    assert header.startswith("time_s,phase,fusion_threshold,chunk_bytes")
    assert ",warmup,2097152,4194304," in warmup
    assert len(samples) == (3 + 3) * 2  # every candidate twice
    assert chosen.split(",")[1:4] == ["chosen", str(8 * MIB), str(1 * MIB)]
    # Every window spans whole steps: it opens and closes at the same tensor ("a").
    assert {int(line.split(",")[4]) % (3 * (10 * MIB // 3)) for line in [warmup, *samples]} == {0}


def test_noise_does_not_fool_the_median() -> None:
    rng = np.random.default_rng(0)
    start = Params(2 * MIB, 4 * MIB)
    tuner = Autotuner(start, sample_seconds=1.0, samples=3, thresholds=(1 * MIB, 2 * MIB), chunks=(4 * MIB,))

    def rate(p: Params, part: int) -> float:  # 1 MB is 15 % better; one sample in ten is a 3x outlier either way
        base = 100e6 * (1.15 if p.fusion_threshold == 1 * MIB else 1.0)
        return base * (3.0 if rng.random() < 0.05 else 1 / 3 if rng.random() < 0.05 else rng.normal(1, 0.02))

    drive(tuner, rate_of=rate)
    assert tuner.best.fusion_threshold == 1 * MIB


def test_a_one_off_anchor_falls_back_to_time_windows() -> None:
    tuner = Autotuner(Params(1, 2), sample_seconds=1.0, samples=1, thresholds=(1,), chunks=(2,))
    now = 0.0
    tuner.record(100, now, ["once"])
    for _ in range(200):
        now += 0.1
        tuner.record(100, now, ["other"])
    assert tuner.done and tuner.best == Params(1, 2)


def test_no_traffic_keeps_the_tuner_waiting() -> None:
    tuner = Autotuner(Params(1, 2), sample_seconds=1.0)
    assert tuner.record(0, 0.0) is None
    assert tuner.record(0, 5.0) is None
    assert not tuner.done and tuner.current == Params(1, 2)


def test_every_rank_switches_to_the_published_settings() -> None:
    """In-process engines: rank 0 tunes, and every rank ends with the same settings it chose."""
    _, engines = start_engines(3, autotune=True, autotune_sample_seconds=0.02, autotune_samples=1)
    try:
        tuner = engines[0].pipeline.tuner
        assert tuner is not None and all(e.pipeline.tuner is None for e in engines[1:])
        step = 0
        while not tuner.done:
            step += 1
            assert step < 5000, "autotune did not finish"
            handles = []
            for rank, engine in enumerate(engines):
                x = np.full(1000, float(rank), np.float32)
                meta = RequestMeta(f"t{step % 7}", Collective.ALLREDUCE, "float32", x.shape, ReduceOp.SUM)
                request = Request(meta, x, Handle(meta.name))
                engine.submit([request])
                handles.append(request.handle)
            results = [h.wait(10) for h in handles]
            for result in results:
                np.testing.assert_array_equal(result, np.full(1000, 3.0, np.float32))  # 0 + 1 + 2
        for engine in engines:  # the last publication reaches every rank within a few cycles
            for _ in range(50):
                if engine.params == tuner.best:
                    break
                x = np.zeros(4, np.float32)
                handles = []
                for e in engines:
                    meta = RequestMeta("flush", Collective.ALLREDUCE, "float32", x.shape, ReduceOp.SUM)
                    request = Request(meta, x.copy(), Handle(meta.name))
                    e.submit([request])
                    handles.append(request.handle)
                [h.wait(10) for h in handles]
            assert engine.params == tuner.best
    finally:
        stop_engines(engines)
