"""The shard arithmetic of fully_shard, in-process: every rank's rows, packing and unpacking, and
which survivor holds each committed rank's rows after a death."""

import pytest
import torch

from hvdlite.errors import HvdliteError
from hvdlite.torch.fully_sharded.elastic import _providers
from hvdlite.torch.fully_sharded.layout import UnitLayout

SHAPES = [("w", (7, 3)), ("b", (7,)), ("scale", ()), ("tiny", (1, 2)), ("wide", (2, 5, 2))]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_every_row_is_owned_by_exactly_one_rank_and_shards_have_one_shape(ranks):
    layout = UnitLayout.plan(SHAPES, ranks)
    for param in layout.params:
        owned = [row for rank in range(ranks) for row in param.owned_rows(rank)]
        # a 0-dim parameter (Shard(0) cannot cut it) is replicated: every rank holds it
        assert owned == ([0] * ranks if param.replicated else list(range(param.rows)))
        assert [param.local_shape(rank) for rank in range(ranks)] == [
            torch.Size((len(param.owned_rows(rank)), *param.shape[1:])) if param.shape else torch.Size(())
            for rank in range(ranks)]
        assert param.shard_shape[1:] == param.shape[1:]
        assert param.shard_shape[0] * ranks >= param.rows > (param.shard_shape[0] - 1) * ranks
    assert layout.shard_numel == sum(p.shard_numel for p in layout.params)


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_gathering_every_ranks_packed_shards_gives_back_the_full_tensors(ranks):
    layout = UnitLayout.plan(SHAPES, ranks)
    fulls = [torch.randn(shape) for _, shape in SHAPES]
    packed = [layout.pack_shards([p.shard_of(f, rank) for p, f in zip(layout.params, fulls, strict=True)]) for rank in range(ranks)]
    out = [torch.full(shape, float("nan")) for _, shape in SHAPES]
    layout.copy_full(torch.cat(packed), out)
    for got, want in zip(out, fulls, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_each_ranks_block_of_the_packed_gradients_is_its_shard_of_each_gradient(ranks):
    layout = UnitLayout.plan(SHAPES, ranks)
    grads = [torch.randn(shape) for _, shape in SHAPES]
    grads[2] = None  # no gradient this pass: zeros
    packed = layout.pack_gradients(grads, torch.float32, torch.device("cpu"))
    assert packed.shape == (ranks * layout.shard_numel,)
    for rank, block in enumerate(packed.view(ranks, -1)):
        for param, piece, grad in zip(layout.params, layout.split_shards(block), grads, strict=True):
            expected = param.shard_of(torch.zeros(param.shape) if grad is None else grad, rank)
            assert torch.equal(piece, expected), (param.name, rank)


def test_padding_rows_are_zero():
    layout = UnitLayout.plan([("w", (5, 2))], 4)  # 2 rows per rank: rank 2 holds one row, rank 3 none
    full = torch.ones(5, 2)
    assert torch.equal(layout.params[0].shard_of(full, 2), torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    assert torch.equal(layout.params[0].shard_of(full, 3), torch.zeros(2, 2))


@pytest.mark.parametrize(("saved_at", "loaded_at"), [(3, 2), (2, 3), (4, 3), (1, 4), (5, 1)])
def test_rows_saved_at_one_world_size_are_the_shards_of_another(saved_at, loaded_at):
    from hvdlite.torch.fully_sharded.checkpoint import read_rows

    full = torch.randn(7, 3)
    saved = UnitLayout.plan([("w", (7, 3))], saved_at).params[0]
    files = [{"params": {"w": saved.shard_of(full, r)[:len(saved.owned_rows(r))]}} for r in range(saved_at)]
    loaded = UnitLayout.plan([("w", (7, 3))], loaded_at).params[0]
    for rank in range(loaded_at):
        assert torch.equal(read_rows(files, ["params", "w"], loaded, rank, saved_at), loaded.shard_of(full, rank))


def test_each_committed_ranks_rows_come_from_itself_else_from_the_next_rank():
    # Old world of 4; old ranks 1 and 3 died: the survivors are now ranks 0 (old 0) and 1 (old 2).
    assert _providers([(0, 4), (2, 4)], 4) == {0: (0, True), 1: (1, False), 2: (1, True), 3: (0, False)}
    # A joining rank (no commit) holds nothing.
    assert _providers([(1, 2), None, (0, 2)], 2) == {0: (2, True), 1: (0, True)}


def test_rows_whose_two_copies_both_died_are_named_as_lost():
    with pytest.raises(HvdliteError, match=r"rank\(s\) \[1, 2\] of the last commit's 4 are lost"):
        _providers([(0, 4)], 4)  # old 1's copy lived on old 2, old 2's on old 3
    with pytest.raises(HvdliteError, match=r"rank\(s\) \[0\] of the last commit's 1 are lost"):
        _providers([None], 1)
