"""PowerSGD with real ranks: each step's gradients against a replay of every rank in one process.

Rank r trains a weight matrix W (16x12, compressed at rank 2), a bias (1-D: uncompressed) and a
small matrix S (3x4: too small to be worth compressing) on its own data for STEPS steps with
``Compression.powersgd(rank=RANK, start_step=START)``. After every step it checks that the
gradients and parameters are bit-identical on every rank, that they equal the replay (the
algorithm written plainly in float64, with QR for the orthogonalization, averaging by hand) and,
before START, that they are the plain average. Prints 'ok torch powersgd <rank>'.
"""

import numpy as np
import torch

import hvdlite.torch as hvd

STEPS, START, RANK, LR = 6, 2, 2, 0.1
COMPRESSED = "w"  # the only tensor the rule compresses: (16 + 12) * 2 * 2 < 16 * 12, but not (3 + 4) * 2 * 2 < 12


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(16, 12, generator=generator) * 0.3)
        self.b = torch.nn.Parameter(torch.zeros(16))
        self.s = torch.nn.Parameter(torch.randn(3, 4, generator=generator) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.w.t() + self.b
        return y[:, :4] @ self.s.t() + 0.1 * y[:, 4:7]


def loss_of(model: Model, rank: int, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 12, generator=generator) * (rank + 1)
    target = torch.randn(8, 3, generator=generator)
    dtype = model.w.dtype  # float32 when training, float64 in the replay
    return ((model(x.to(dtype)) - target.to(dtype)) ** 2).mean()


def replay(size: int) -> list[dict[str, dict[str, torch.Tensor]]]:
    """Per step: the gradient every rank should end with, and the plain average of the raw ones."""
    model = Model().double()
    names = [name for name, _ in model.named_parameters()]
    shape = model.w.shape
    q = torch.from_numpy(np.random.default_rng([0, names.index(COMPRESSED)]).standard_normal((shape[1], RANK)))
    errors = [torch.zeros(shape, dtype=torch.float64) for _ in range(size)]
    history = []
    for step in range(STEPS):
        raw = []
        for rank in range(size):
            model.zero_grad()
            loss_of(model, rank, step).backward()
            raw.append({name: p.grad.clone() for name, p in model.named_parameters()})
        mean = {name: sum(r[name] for r in raw) / size for name in names}
        final = dict(mean)
        if step >= START:
            matrices = [raw[rank][COMPRESSED] + errors[rank] for rank in range(size)]
            p, _ = torch.linalg.qr(sum(m @ q for m in matrices) / size)
            q = sum(m.t() @ p for m in matrices) / size
            final[COMPRESSED] = p @ q.t()
            errors = [m - final[COMPRESSED] for m in matrices]
        with torch.no_grad():
            for name, param in model.named_parameters():
                param -= LR * final[name]
        history.append({"final": final, "mean": mean})
    return history


def check_step(model: Model, optimizer: torch.optim.Optimizer, expected: dict, step: int, rank: int) -> None:
    grads = {name: p.grad for name, p in model.named_parameters()}
    mine = torch.cat([t.detach().flatten() for t in [*grads.values(), *model.parameters()]])
    every = hvd.allgather(mine.unsqueeze(0), name=f"check.{step}")
    for other in range(every.shape[0]):  # (a) bit-identical on every rank
        assert torch.equal(every[other], mine), (rank, step, other, (every[other] - mine).abs().max())
    for name, grad in grads.items():  # (b) the replay
        want = expected["final"][name].float()
        assert torch.allclose(grad, want, atol=1e-5), (rank, step, name, (grad - want).abs().max())
    w_off = (grads[COMPRESSED] - expected["mean"][COMPRESSED].float()).abs().max()
    if step < START:  # (c) plain averaging before start_step
        assert all(torch.allclose(g, expected["mean"][n].float(), atol=1e-6) for n, g in grads.items()), (rank, step)
    else:  # compressing: W is no longer the exact average; the others still are
        assert w_off > 1e-3, (rank, step, w_off)
        assert torch.allclose(grads["b"], expected["mean"]["b"].float(), atol=1e-6), (rank, step)
    state = optimizer._hvdlite_reducer.powersgd.state
    assert state.step == step + 1 and sorted(state.qs) == (["grad.w"] if step >= START else []), (rank, state.qs)


def main() -> None:
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    model = Model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.powersgd(rank=RANK, start_step=START))
    try:  # options PowerSGD is not built to combine with are refused by name
        hvd.DistributedOptimizer(torch.optim.SGD(Model().parameters(), lr=LR), op=hvd.Sum,
                                 compression=hvd.Compression.powersgd(rank=RANK))
        raise AssertionError("op=Sum was accepted")
    except ValueError as error:
        assert "needs op=Average" in str(error), error
    expected = replay(size)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, rank, step).backward()
        optimizer.step()
        check_step(model, optimizer, expected[step], step, rank)
    reducer = optimizer._hvdlite_reducer
    reducer.world_changed()  # elastic: a new world starts PowerSGD over, from plain averaging
    assert reducer.powersgd.state.step == 0 and not reducer.powersgd.state.errors
    print(f"ok torch powersgd {rank}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
