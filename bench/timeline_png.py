"""Draw the timeline of a few PyTorch training steps at np=2: compute on top, each gradient's allreduce below.

Run:  python bench/timeline_png.py [--out bench/timeline_torch_np2.png]   (needs matplotlib: pip install hvdlite[bench])

It launches ``hvdliterun -np 2 --timeline-filename ...`` on this script in worker mode, which trains
``torch_training_step.py``'s model with hvdlite's ``DistributedOptimizer`` and records, on rank 0,
when each step's forward, backward and ``optimizer.step()`` ran (on the timeline's own clock). The
driver then reads the timeline (rank 0's view) and draws one picture: the compute phases on the
top rows, and one row per gradient request below (a bucket of gradients, after the first step) with
its negotiation (grey) and its allreduce (red), so a reader sees which reductions run while
backward is still computing and which wait for step().
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from torch_training_step import NUM_CLASSES, RANK_ENV, WIDTH, build_model

PHASE_COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "step (wait + update)": "#55a868"}


def run_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F

    import hvdlite.torch as hvd
    from hvdlite.core.runtime import current

    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = build_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
                                         named_parameters=model.named_parameters())
    data, target = torch.randn(32, WIDTH), torch.randint(0, NUM_CLASSES, (32,))
    phases: list[tuple[str, float, float]] = []
    for step in range(args.warmup + args.steps):
        optimizer.zero_grad()
        t0 = time.monotonic()
        loss = F.cross_entropy(model(data)[:, :NUM_CLASSES], target)
        t1 = time.monotonic()
        loss.backward()
        t2 = time.monotonic()
        optimizer.step()
        t3 = time.monotonic()
        if step >= args.warmup:
            phases += [("forward", t0, t1), ("backward", t1, t2), ("step (wait + update)", t2, t3)]
    if hvd.rank() == 0:
        origin = current().engine.timeline.start_time
        with open(args.phases, "w") as handle:
            json.dump([(name, (a - origin) * 1e6, (b - origin) * 1e6) for name, a, b in phases], handle)
    hvd.shutdown()


def spans(trace: list[dict]) -> dict[str, list[tuple[str, float, float]]]:
    """tensor name -> [(activity, begin us, end us)] from the trace's B/E pairs."""
    names = {e["tid"]: e["args"]["name"] for e in trace if e.get("name") == "thread_name"}
    open_: dict[int, list[tuple[str, float]]] = {}
    result: dict[str, list[tuple[str, float, float]]] = {}
    for event in trace:
        tid = event.get("tid")
        if event["ph"] == "B":
            open_.setdefault(tid, []).append((event["name"], event["ts"]))
        elif event["ph"] == "E" and open_.get(tid):
            activity, begin = open_[tid].pop()
            result.setdefault(names[tid], []).append((activity, begin, event["ts"]))
    return result


def draw(trace: list[dict], phases: list[tuple[str, float, float]], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start, stop = phases[0][1], phases[-1][2]
    tensors = spans(trace)
    # The gradient requests (buckets, after the first step) reduced in the window, in the order their
    # allreduce started: backward order, last layer first.
    first_reduced = {name: min((b for a, b, e in tensors[name] if a == "ALLREDUCE" and start <= b <= stop),
                               default=None) for name in tensors if name.startswith("allreduce.grad.")}
    order = sorted((name for name, when in first_reduced.items() if when is not None), key=first_reduced.get)
    fig, (top, ax) = plt.subplots(2, 1, figsize=(12, 7.5), dpi=110, sharex=True,
                                  gridspec_kw={"height_ratios": [1, 7]})
    names = list(PHASE_COLOURS)
    for name, begin, end in phases:
        top.barh(names.index(name), (end - begin) / 1e3, left=(begin - start) / 1e3, height=0.8,
                 color=PHASE_COLOURS[name])
    top.set_yticks(range(len(names)))
    top.set_yticklabels(names, fontsize=8)
    top.invert_yaxis()
    top.set_title("hvdlite DistributedOptimizer, np=2, 50 x Linear(704, 704), batch 32/rank: compute (top), "
                  "each gradient bucket's negotiation (grey) / allreduce (red)", fontsize=9)
    for index, name in enumerate(order):
        for activity, begin, end in tensors[name]:
            if end < start or begin > stop:
                continue
            colour = "#d62728" if activity == "ALLREDUCE" else "#bbbbbb"
            ax.barh(index, max(end - begin, 50) / 1e3, left=(begin - start) / 1e3, height=0.9, color=colour, lw=0)
    ax.set_yticks([0, len(order) - 1])
    ax.set_yticklabels([f"{order[0]}\n(first reduced)", f"{order[-1]}\n(last)"], fontsize=8)
    ax.set_ylabel(f"{len(order)} requests", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, (stop - start) / 1e3)
    ax.set_xlabel("ms (rank 0)")
    fig.tight_layout()
    fig.savefig(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "timeline_torch_np2.png"))
    parser.add_argument("--steps", type=int, default=3, help="steps drawn")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--phases", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        timeline, phases = os.path.join(tmp, "timeline.json"), os.path.join(tmp, "phases.json")
        beside = os.path.join(os.path.dirname(sys.executable), "hvdliterun")
        command = [beside if os.path.exists(beside) else "hvdliterun", "-np", "2", "--timeline-filename", timeline,
                   sys.executable, os.path.abspath(__file__), "--worker", "--phases", phases,
                   "--steps", str(args.steps), "--warmup", str(args.warmup)]
        print("$ " + " ".join(command), flush=True)
        subprocess.run(command, env={**os.environ, **RANK_ENV}, check=True)
        with open(timeline) as handle:
            trace = json.load(handle)
        with open(phases) as handle:
            recorded = json.load(handle)
    draw(trace, recorded, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
