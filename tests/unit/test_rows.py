"""The one reducescatter row split that the host plane, the NCCL plane and the adapters share."""

import pytest

from hvdlite.utils.rows import scatter_rows


@pytest.mark.parametrize("rows,size,want", [(6, 3, [2, 2, 2]), (7, 3, [3, 2, 2]), (8, 3, [3, 3, 2]), (1, 3, [1, 0, 0]),
                                            (0, 2, [0, 0])])
def test_equal_shares_with_the_remainder_on_the_first_ranks(rows, size, want):
    assert scatter_rows(rows, size) == want


def test_every_user_imports_the_same_function():
    from hvdlite.core.planes import host, nccl_moves
    from hvdlite.jax.collectives import calls as jax_collectives
    from hvdlite.tensorflow.collectives import host_ops

    assert host.scatter_rows is nccl_moves.scatter_rows is jax_collectives.scatter_rows is host_ops.scatter_rows
