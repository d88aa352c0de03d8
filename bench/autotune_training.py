"""Autotune on the PyTorch training step: does the setting it picks run within 5 % of the best hand-picked one?

Run:  hvdliterun -np 2 --autotune python bench/autotune_training.py [--update-readme]
      (HVDLITE_AUTOTUNE_SAMPLE_SECONDS / HVDLITE_AUTOTUNE_SAMPLES shorten or lengthen the search)

The model and step are ``torch_training_step.py``'s hvdlite mode (50 x Linear(704, 704), batch 32
per rank, SGD, one thread per rank). First the job trains until rank 0's autotuner has finished
its search. Then, in the same job, it steps under the autotuned setting and under each hand-picked
setting (every fusion threshold of the search with the default chunk size, and every chunk size
with the default threshold), interleaved rep by rep so drifting load affects all alike, in an
order rotated every rep. Rank 0
switches every rank to each setting through the same publication the tuner uses.
"""

from __future__ import annotations

import argparse
import statistics
import time

from readme import replace_block
from torch_training_step import make_mode

import hvdlite.torch as hvd
from hvdlite.core.pipeline.autotune import CHUNK_SIZES, FUSION_THRESHOLDS, Params
from hvdlite.core.runtime import current
from hvdlite.settings.config import Config

MIB = 1024 * 1024


def mib(nbytes: int) -> str:
    return f"{nbytes / MIB:g} MB"


def train_until_tuned(step, engine, deadline_s: float) -> tuple[int, float]:
    """Step until rank 0's tuner is done (every rank learns it in the same step)."""
    start, steps = time.perf_counter(), 0
    while True:
        step()
        steps += 1
        done = engine.pipeline.tuner.done if hvd.rank() == 0 else None
        if hvd.broadcast_object(done, root_rank=0, name=f"autotune.done.{steps}"):
            return steps, time.perf_counter() - start
        if time.perf_counter() - start > deadline_s:
            raise SystemExit(f"autotune did not finish within {deadline_s:g} s ({steps} steps)")


def switch_to(params: Params, step, engine) -> None:
    if hvd.rank() == 0:
        engine.publish_params(params)
    for _ in range(3):  # the next negotiation round carries it; these steps also warm the setting up
        step()
    seen = hvd.allgather_object(engine.params, name="autotune.switched")
    assert all(p == params for p in seen), f"ranks on different settings: {seen}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per setting per rep")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds allowed for the search")
    parser.add_argument("--update-readme", action="store_true")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    hvd.init()
    engine = current().engine
    if not current().config.autotune:
        raise SystemExit("run with hvdliterun --autotune (or HVDLITE_AUTOTUNE=1)")
    mode = make_mode("hvdlite", 32)
    steps, seconds = train_until_tuned(mode.step, engine, args.deadline)
    chosen = engine.params
    default = Params(Config.fusion_threshold, Config.chunk_bytes)
    hand = list(dict.fromkeys([Params(t, default.chunk_bytes) for t in FUSION_THRESHOLDS]
                              + [Params(default.fusion_threshold, c) for c in CHUNK_SIZES]))
    settings = [chosen] + [p for p in hand if p != chosen]
    per_rep: dict[Params, list[float]] = {p: [] for p in settings}
    for rep in range(args.reps):
        # A different order each rep (rotated), so no setting always runs first or after the same one.
        for params in settings[rep % len(settings):] + settings[:rep % len(settings)]:
            switch_to(params, mode.step, engine)
            times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                mode.step()
                times.append(time.perf_counter() - start)
            per_rep[params].append(max(hvd.allgather_object(statistics.median(times), name="autotune.time")))
    if hvd.rank() != 0:
        return
    medians = {p: statistics.median(v) for p, v in per_rep.items()}
    best_hand = min(hand, key=lambda p: medians[p])
    lines = [f"np={hvd.size()}, autotune search: {steps} steps in {seconds:.0f} s "
             f"(HVDLITE_AUTOTUNE_SAMPLE_SECONDS={current().config.autotune_sample_seconds:g}, "
             f"HVDLITE_AUTOTUNE_SAMPLES={current().config.autotune_samples}); then {args.reps} interleaved reps x "
             f"{args.steps} steps per setting, median [min-max] of per-rep medians (slowest rank)",
             "", "| setting | fusion threshold | chunk | step ms | vs best hand-picked |", "|---|---|---|---|---|"]
    for params in settings:
        values = per_rep[params]
        kind = "autotuned" if params == chosen else ("hand-picked, best" if params == best_hand else "hand-picked")
        if params == chosen and params in hand:
            kind += " (also hand-picked)"
        lines.append(f"| {kind} | {mib(params.fusion_threshold)} | {mib(params.chunk_bytes)} | "
                     f"{medians[params] * 1e3:.1f} [{min(values) * 1e3:.1f}-{max(values) * 1e3:.1f}] | "
                     f"{medians[params] / medians[best_hand]:.3f} |")
    ratio = medians[chosen] / medians[best_hand]
    lines += ["", f"Target: the autotuned setting within 5 % of the best hand-picked one: {ratio:.3f}x "
              f"({'met' if ratio <= 1.05 else 'NOT met'})"]
    print("\n".join(lines))
    if args.update_readme:
        replace_block(f"autotune_training np={hvd.size()}", "\n".join(lines))


if __name__ == "__main__":
    main()
