"""hvd.elastic's state objects on a fixed world (issue #22's first step): TorchState commits,
restores and syncs a model, an optimizer, an LR scheduler, an ElasticSampler and plain attributes;
ElasticSampler shards an epoch and resumes it from a commit; @hvd.elastic.run syncs before it runs
and restores the last commit on HorovodInternalError. Prints 'ok elastic state'.
"""

import torch

import hvdlite.torch as hvd


def build(rank):
    torch.manual_seed(rank)  # every rank starts different: sync() must make them equal
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return model, optimizer, scheduler


def step(model, optimizer, scheduler, x):
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
    scheduler.step()


def check_commit_restore_sync(rank, size):
    model, optimizer, scheduler = build(rank)
    sampler = hvd.elastic.ElasticSampler(list(range(20)), seed=3)
    state = hvd.elastic.TorchState(model, optimizer, scheduler=scheduler, sampler=sampler, epoch=0, history=[])
    state.sync()
    root = build(0)[0]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), root.parameters(), strict=True))
    step(model, optimizer, scheduler, torch.ones(1, 3))
    state.epoch, state.history = 1, [rank]
    sampler.record_batch(0, 2)
    state.commit()
    committed = [p.detach().clone() for p in model.parameters()]
    committed_lr, committed_adam = scheduler.get_last_lr(), optimizer.state_dict()["state"][0]["step"].item()
    step(model, optimizer, scheduler, torch.full((1, 3), 5.0))
    state.epoch, state.history = 7, ["lost"]
    sampler.record_batch(1, 2)
    state.restore()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), committed, strict=True))
    assert scheduler.get_last_lr() == committed_lr
    assert optimizer.state_dict()["state"][0]["step"].item() == committed_adam
    assert state.epoch == 1 and state.history == [rank] and sampler.processed_num == 2 * size
    return state


def check_sampler(rank, size):
    sampler = hvd.elastic.ElasticSampler(list(range(23)), seed=1)
    first = list(sampler)
    every = hvd.allgather_object(first)
    flat = [i for part in every for i in part]
    assert set(flat) == set(range(23)) and len(first) == len(sampler)  # the epoch is covered
    sampler.record_batch(0, 3)  # each rank processed 3 samples
    saved = sampler.state_dict()
    resumed = hvd.elastic.ElasticSampler(list(range(23)), seed=1)
    resumed.load_state_dict(saved)
    rest = hvd.allgather_object(list(resumed))
    seen = {i for part in every for i in part[:3]}
    remaining = {i for part in rest for i in part}
    assert not seen & remaining and seen | remaining == set(range(23)), (seen, remaining)  # nothing twice or skipped
    sampler.set_epoch(1)
    assert sampler.processed_num == 0 and list(sampler) != first


def check_run(rank, size):
    model, optimizer, scheduler = build(rank)
    state = hvd.elastic.TorchState(model, optimizer, batch=0)
    calls = []

    @hvd.elastic.run
    def train(state):
        calls.append(state.batch)
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), build(0)[0].parameters(), strict=True))
        state.batch = 5
        state.commit()
        state.batch = 9
        raise hvd.HorovodInternalError("a peer failed (simulated)")

    try:
        train(state)
        raise AssertionError("run must raise while the world cannot be re-formed")
    except hvd.HorovodInternalError:
        pass
    assert calls == [0] and state.batch == 5  # restored to the last commit


def main():
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check_commit_restore_sync(rank, size)
    check_sampler(rank, size)
    check_run(rank, size)
    hvd.shutdown()
    print("ok elastic state", flush=True)


if __name__ == "__main__":
    main()
