"""A training script written for torchrun, with no hvdlite line in it. Usage:
torchrun_ddp.py BACKEND OUT   (BACKEND: gloo, nccl, cpu:gloo,cuda:nccl, none; or single: one process)

Starts torch.distributed from torchrun's variables, trains DDP on each rank's shard of a global batch
for a few steps, makes a sub-group of the backend asked for, and on rank 0 saves the parameters to OUT.
Each rank prints the backend it runs on, the torchrun variables it was given, and its result.
Under ``hvdliterun --torch-backend hvdlite`` the groups run on hvdlite; under torchrun on gloo;
``single`` trains one process on the whole batch (the reference within float rounding).
"""

import os
import subprocess
import sys

import torch
import torch.distributed as dist

TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
            "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE")
GLOBAL_BATCH, STEPS = 12, 4
# A child Python process (a DataLoader worker, a helper): it inherits the rank's variables, not the mode.
CHILD = ("import os, sys; print('child', 'RANK=' + os.environ.get('RANK', '<unset>'), "
         "'mode=' + os.environ.get('HVDLITE_TORCH_BACKEND', '<unset>'), "
         "'bootstrap=' + str(any('bootstrap' in p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep))), "
         "'hvdlite=' + str('hvdlite' in sys.modules))")


def batches(rank, world):
    generator = torch.Generator().manual_seed(7)
    for _ in range(STEPS):
        data, target = torch.randn(GLOBAL_BATCH, 6, generator=generator), torch.randn(GLOBAL_BATCH, 3, generator=generator)
        share = GLOBAL_BATCH // world
        yield data[rank * share:(rank + 1) * share], target[rank * share:(rank + 1) * share]


def train(rank, world, wrap):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    net = wrap(model)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for data, target in batches(rank, world):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(data), target).backward()
        optimizer.step()
    return model


def main(backend, out):
    torch.set_num_threads(1)
    if backend == "single":
        torch.save(train(0, 1, lambda m: m).state_dict(), out)
        return
    dist.init_process_group(None if backend == "none" else backend)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert (dist.get_rank(), dist.get_world_size()) == (rank, world), (dist.get_rank(), rank)
    model = train(rank, world, lambda m: torch.nn.parallel.DistributedDataParallel(m))
    pair = dist.new_group([0, world - 1], backend=None if backend == "none" else backend.split(",")[0].split(":")[-1])
    if rank in (0, world - 1):
        flag = torch.tensor([rank + 1.0])
        dist.all_reduce(flag, group=pair)
        assert flag.item() == world + 1.0, flag
    say(f"backend {dist.get_backend()} sub-group {dist.get_backend(pair) if rank in (0, world - 1) else '-'}")
    say("variables " + " ".join(f"{name}={os.environ.get(name, '<unset>')}" for name in TORCHRUN))
    if rank == 0:
        torch.save(model.state_dict(), out)
        child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
        say(child.stdout.strip())
    dist.barrier()
    dist.destroy_process_group()
    say("torchrun script ok")


def say(line: str) -> None:
    """One write per line: torchrun's workers share its stdout, and under PYTHONUNBUFFERED print's
    separate write of the newline let another worker's line run into this one."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
