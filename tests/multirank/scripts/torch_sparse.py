"""Sparse gradients through DistributedOptimizer train like one process on the whole batch.

Usage: torch_sparse.py. The model is a sparse ``nn.Embedding`` (mean of a few ids per sample) and
a dense ``nn.Linear`` head. Every rank trains a reference copy on the whole batch locally, in
lockstep with the distributed copy trained on its own shard; each step compares the synchronized
gradients with the reference's (the embedding's must still be sparse on every rank, also with
``sparse_as_dense``, which reduces it dense), and at the end the weights. Rows are touched with different weights at
different steps, so a lost or doubled contribution shows in the gradients, where Adam's scale
invariance could hide it in the weights. Each case prints "ok <case>".
"""

import torch
from mpi4py import MPI

import hvdlite.torch as hvd

torch.set_num_threads(1)
VOCAB, DIM, CLASSES, IDS, PER_RANK, STEPS = 12, 4, 3, 3, 4, 5
SKIP_STEP = 2  # the last shard does not use the embedding: that rank's gradient never arrives
CASES = [  # optimizer, backward_passes_per_step, groups
    ("sparseadam", 1, None), ("sparseadam", 2, None), ("sparseadam", 1, 1), ("sgd", 1, 1), ("sgd", 2, None),
    ("dense", 1, None), ("dense", 2, 1),
]


class Model(torch.nn.Module):
    def __init__(self, sparse: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, DIM, sparse=sparse)
        self.head = torch.nn.Linear(DIM, CLASSES)

    def forward(self, ids: torch.Tensor, use_embedding: bool = True) -> torch.Tensor:
        features = self.emb(ids).mean(1) if use_embedding else torch.ones(len(ids), DIM)
        return self.head(features)


def batch(step: int, micro: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + micro)
    ids = torch.randint(0, VOCAB, (PER_RANK * size, IDS), generator=generator)
    return ids, torch.randint(0, CLASSES, (PER_RANK * size,), generator=generator)


def shard_loss(model: Model, step: int, micro: int, shard: int, size: int) -> torch.Tensor:
    """Mean loss over one shard; the mean of the shards' losses is the whole batch's mean loss."""
    ids, labels = batch(step, micro, size)
    rows = slice(shard * PER_RANK, (shard + 1) * PER_RANK)
    uses = not (step == SKIP_STEP and shard == size - 1 and size > 1)  # one rank alone: see no_rank_uses...
    return torch.nn.functional.cross_entropy(model(ids[rows], uses), labels[rows])


def optimizers(kind: str, model: Model) -> list[torch.optim.Optimizer]:
    # Horovod's recipe for sparse embeddings: SparseAdam for them, Adam for the rest. "dense" (sparse_as_dense)
    # reduces the embedding's gradient dense and hands it back sparse, as Horovod does, so SparseAdam too.
    if kind in ("sparseadam", "dense"):
        return [torch.optim.SparseAdam(model.emb.parameters(), lr=0.05), torch.optim.Adam(model.head.parameters(),
                                                                                          lr=0.05)]
    if kind == "sgd":  # one optimizer for sparse and dense gradients alike (so one group holds both)
        return [torch.optim.SGD(model.parameters(), lr=0.5)]


def wrap(opts: list[torch.optim.Optimizer], model: Model, kind: str, passes: int, groups: int | None,
         process_set: hvd.ProcessSet) -> list[torch.optim.Optimizer]:
    named = dict(model.named_parameters())
    wrapped = []
    for index, opt in enumerate(opts):
        mine = [(name, p) for name, p in named.items() if any(p is q for g in opt.param_groups for q in g["params"])]
        wrapped.append(hvd.DistributedOptimizer(opt, named_parameters=mine, backward_passes_per_step=passes,
                                                groups=groups if index == 0 else None,  # group names are per optimizer
                                                sparse_as_dense=kind == "dense", process_set=process_set))
    return wrapped


def close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    diff = (got.to_dense() - want.to_dense()).abs().max().item()
    assert diff <= tol, f"{what}: max |distributed - single process| = {diff} > {tol}"


def train_case(kind: str, passes: int, groups: int | None, process_set: hvd.ProcessSet) -> None:
    shard, size = process_set.rank(), process_set.size()
    model, reference = Model(sparse=True), Model(sparse=True)
    opts = wrap(optimizers(kind, model), model, kind, passes, groups, process_set)
    ref_opts = optimizers(kind, reference)
    what = f"{kind} passes={passes} groups={groups}"
    if process_set is not hvd.global_process_set:
        what += f" process_set={process_set.ranks}"
    for step in range(STEPS):
        for opt in opts + ref_opts:
            opt.zero_grad()
        for micro in range(passes):
            shard_loss(model, step, micro, shard, size).backward()
            (sum(shard_loss(reference, step, micro, s, size) for s in range(size)) / size).backward()
        for opt in opts:
            opt.synchronize()
        grad = model.emb.weight.grad
        assert grad.is_sparse, f"{what} step {step}: the embedding's gradient is {grad.layout}"
        for (name, got), want in zip(model.named_parameters(), reference.parameters(), strict=True):
            close(got.grad, want.grad, 1e-6, f"{what} step {step} gradient of {name}")
        for opt in opts:
            with opt.skip_synchronize():
                opt.step()
        for opt in ref_opts:
            opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    close(flat, torch.cat([p.detach().reshape(-1) for p in reference.parameters()]), 1e-5, what)
    everyone = hvd.allgather(flat.unsqueeze(0), name=f"weights {what}", process_set=process_set)
    assert torch.equal(everyone, everyone[:1].expand_as(everyone)), f"{what}: parameters differ across ranks"
    print(f"ok {what}", flush=True)


def no_rank_uses_the_embedding(process_set: hvd.ProcessSet) -> None:
    """Missing everywhere after sparse steps: a sparse zero with no entries, which SparseAdam skips."""
    model = Model(sparse=True)
    opts = wrap(optimizers("sparseadam", model), model, "sparseadam", 1, None, process_set)
    for step in (0, SKIP_STEP + 1):
        before = model.emb.weight.detach().clone()
        for opt in opts:
            opt.zero_grad()
        ids, labels = batch(step, 0, 1)
        torch.nn.functional.cross_entropy(model(ids, use_embedding=step == 0), labels).backward()
        for opt in opts:
            opt.step()
    grad = model.emb.weight.grad
    assert grad.is_sparse and grad._nnz() == 0, grad
    assert torch.equal(model.emb.weight, before)
    print("ok no rank uses the embedding", flush=True)


def rows_change_under_one_name(rank: int, size: int) -> None:
    """What the sparse path rests on: one name allgathered every step, each rank's row count
    changing (nnz does), must never reuse the sizes of an earlier step from the response cache."""
    for step, base in enumerate([(1, 2, 1), (2, 1, 2), (2, 2, 2), (1, 1, 3), (2, 2, 2)]):
        counts = [base[r % 3] for r in range(size)]
        got = hvd.allgather(torch.full((counts[rank], 2), float(rank)), name="rows")
        want = torch.cat([torch.full((counts[r], 2), float(r)) for r in range(size)])
        assert torch.equal(got, want), f"step {step}: {got.tolist()} != {want.tolist()}"
    print("ok rows change under one name", flush=True)


def different_rows_per_rank(rank: int, size: int, as_dense: bool) -> None:
    """Horovod's SparseAdam scenario: a sparse embedding alone, no named_parameters, each rank looking up
    a different number of rows. With sparse_as_dense the gradient is reduced dense and reaches the
    optimizer sparse again, as in Horovod (SparseAdam refuses dense gradients)."""
    torch.manual_seed(0)
    emb, ref = torch.nn.Embedding(VOCAB, DIM, sparse=True), torch.nn.Embedding(VOCAB, DIM, sparse=True)
    ref.load_state_dict(emb.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(emb.parameters(), lr=0.1), sparse_as_dense=as_dense)
    ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.1)
    what = f"different rows per rank sparse_as_dense={as_dense}"
    for step in range(3):
        ids = [torch.arange(step, step + r + 2) % VOCAB for r in range(size)]  # rank r: r + 2 rows
        opt.zero_grad()
        ref_opt.zero_grad()
        (emb(ids[rank]) * (rank + 1)).sum().backward()
        (sum((ref(ids[r]) * (r + 1)).sum() for r in range(size)) / size).backward()
        opt.step()
        ref_opt.step()
        assert emb.weight.grad.is_sparse, f"{what} step {step}: the optimizer got a {emb.weight.grad.layout} gradient"
        close(emb.weight.grad, ref.weight.grad, 1e-6, f"{what} step {step} gradient")
        close(emb.weight.detach(), ref.weight.detach(), 1e-6, f"{what} step {step} weights")
    print(f"ok {what}", flush=True)


def main() -> None:
    world = MPI.COMM_WORLD.Get_size()
    subset = hvd.ProcessSet(list(range(world - 1)))  # every rank but the last: Average divides by its size
    hvd.init(process_sets=[subset])
    rows_change_under_one_name(hvd.rank(), hvd.size())
    for as_dense in (False, True):
        different_rows_per_rank(hvd.rank(), hvd.size(), as_dense)
    for kind, passes, groups in CASES:
        train_case(kind, passes, groups, hvd.global_process_set)
    no_rank_uses_the_embedding(hvd.global_process_set)
    if subset.included():
        train_case("sparseadam", 2, None, subset)
    hvd.shutdown()


if __name__ == "__main__":
    main()
