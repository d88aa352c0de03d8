"""The training step of torch_training_step.py in a hybrid layout: two hosts, two ranks on each.

Run it through ``python bench/two_hosts.py --layout hybrid`` (which makes the namespace hosts,
shapes their link and launches this script with ``-H hostA:2,hostB:2``). Modes, interleaved rep by
rep in one job, each with its own model (24.8 M parameters, SGD, batch 32 per rank):

- ``nocomm``   every rank trains alone: the ceiling of every efficiency here (sharing the cores).
- ``hostsync`` a ``DistributedOptimizer`` inside each host only (no exchange across hosts): the
               ceiling of every hybrid mode here, where the in-host all-reduce (hvdlite's shared-memory
               window) runs on the same two cores as the compute.
- ``sync``     ``DistributedOptimizer`` over all four ranks: gradients averaged every step.
- ``powersgd`` as ``sync``, with PowerSGD rank 4.
- ``local8o``  as ``sync``, with local SGD K=8, overlapped averages.
- ``diloco*``  a ``DistributedOptimizer`` inside each host (its two ranks), ``hvd.DiLoCo`` with H=16
               across hosts (the ranks holding the same place on each host): ``diloco`` one
               fragment, blocking (delay 0); ``diloco_f4`` four fragments, each exchanged during the
               next 3 inner steps; ``_int8`` with int8 pseudo-gradients (error feedback).
- ``diloco_solo_f4_int8``  no synchronous group: every rank is its own DiLoCo group, the four
               average over all ranks (four fragments, delay 3, int8).

A rep is ``--steps`` steps (a multiple of 16, so every DiLoCo rep holds the same exchanges;
``--sync-steps`` for the modes that communicate every step, which a slow link makes slow); an
rep starts at a fragment's send (untimed steps up to it), so that with a delay an exchange is in
flight as it starts, and the one still in flight at its end lands in untimed steps. Reported per mode: the slowest
rank's mean step (median [min-max] of reps), the step efficiency against ``nocomm`` measured in the
same job, and the bytes hostA's link interface sent per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from torch_training_step import (
    NUM_CLASSES,
    RESULT_TAG,
    WIDTH,
    build_model,
    link_bytes_sent,
    plain_step,
    time_steps,
)

SYNC_EVERY = 16
DILOCO = {"diloco": {}, "diloco_f4": {"fragments": 4, "delay": 3},
          "diloco_int8": {"compression": "int8"}, "diloco_f4_int8": {"fragments": 4, "delay": 3, "compression": "int8"}}
MODES = ("nocomm", "hostsync", "sync", "powersgd", "local8o", *DILOCO, "diloco_solo_f4_int8")
EVERY_STEP = ("sync", "powersgd")


def make_mode(name: str, sets: dict[str, Any], batch: int) -> tuple[Any, Any, Any]:
    """(step, before a rep, after a rep) of mode ``name``, with its own model, optimizer and fixed batch."""
    import torch

    import hvdlite.torch as hvd

    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    data, target = torch.randn(batch, WIDTH), torch.randint(0, NUM_CLASSES, (batch,))
    before = after = lambda: None  # noqa: E731
    if name in ("sync", "powersgd", "local8o"):
        options = {"powersgd": {"compression": hvd.Compression.powersgd(rank=4, start_step=0)},
                   "local8o": {"local_sgd_period": 8, "local_sgd_overlap": True}}.get(name, {})
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), **options)
        if name == "local8o":
            after = optimizer._hvdlite_reducer.local_sgd.finish
    elif name == "hostsync":
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             process_set=sets["host"])
    elif name in DILOCO or name == "diloco_solo_f4_int8":
        solo = name == "diloco_solo_f4_int8"
        inner = optimizer if solo else hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), process_set=sets["host"])
        outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
        optimizer = hvd.DiLoCo(model, inner, outer, sync_every=SYNC_EVERY,
                               process_set=hvd.global_process_set if solo else sets["place"],
                               **DILOCO["diloco_f4_int8" if solo else name])
        step = lambda: plain_step(model, optimizer, data, target)  # noqa: E731
        return step, lambda: to_send_boundary(optimizer, step), lambda: land_in_flight(optimizer, step)
    return (lambda: plain_step(model, optimizer, data, target)), before, after


def to_send_boundary(diloco: Any, step: Any) -> None:
    """Untimed steps up to a fragment's send, so that a rep is in the steady state: an exchange in
    flight as it starts (with a delay), and as many sends as landings in it."""
    while diloco.inner_steps % diloco.schedule.stride:
        step()


def land_in_flight(diloco: Any, step: Any) -> None:
    """Untimed steps until no exchange is in flight, so none spills into another mode's rep."""
    while diloco._in_flight is not None:
        step()


def main() -> None:
    import torch
    from mpi4py import MPI

    import hvdlite.torch as hvd

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--sync-steps", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    hosts = [hvd.ProcessSet(range(start, start + 2)) for start in range(0, size, 2)]
    places = [hvd.ProcessSet(range(place, size, 2)) for place in range(2)]
    hvd.init(process_sets=hosts + places)
    sets = {"host": hosts[rank // 2], "place": places[rank % 2]}
    names = [name.strip() for name in args.modes.split(",") if name.strip()]
    modes = {name: make_mode(name, sets, args.batch_size) for name in names}
    for step, _, after in modes.values():  # warm-up: one untimed step each
        step()
        after()
    times: dict[str, list[float]] = {name: [] for name in names}
    sent: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.reps):
        for name, (step, before, after) in modes.items():
            steps = args.sync_steps if name in EVERY_STEP else args.steps
            before()
            comm.Barrier()
            sent_before = link_bytes_sent()
            mean = statistics.fmean(time_steps(step, steps))
            sent[name].append((link_bytes_sent() - sent_before) / steps)
            after()
            times[name].append(max(comm.allgather(mean)))
    if rank == 0:
        for name in names:
            print(RESULT_TAG + json.dumps({"mode": name, "rep_s": times[name], "sent": statistics.median(sent[name])}),
                  flush=True)
    comm.Barrier()
    hvd.shutdown()


if __name__ == "__main__":
    main()
