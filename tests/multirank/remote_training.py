"""One small torch training job, for the Spark and Ray tests: run as ranks (``train_distributed``)
and as one process on every rank's batches together (``train_one_process``)."""

import numpy as np

STEPS, PER_RANK, FEATURES = 4, 3, 5


def batches(rank):
    rng = np.random.default_rng(rank)
    return [(rng.normal(size=(PER_RANK, FEATURES)).astype(np.float32),
             rng.normal(size=(PER_RANK, 1)).astype(np.float32)) for _ in range(STEPS)]


def model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


def train_distributed():
    import torch

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    net = model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    for x, y in batches(hvd.rank()):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        optimizer.step()
    return [p.detach().numpy() for p in net.parameters()]


def train_one_process(size):
    import torch

    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x = torch.from_numpy(np.concatenate([batches(rank)[step][0] for rank in range(size)]))
        y = torch.from_numpy(np.concatenate([batches(rank)[step][1] for rank in range(size)]))
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
    return [p.detach().numpy() for p in net.parameters()]
