"""PowerSGD in process: the shared rules and configuration, and one step of the torch and jnp math
on N simulated ranks (threads whose 'allreduce' averages their tensors through a barrier)."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch

from hvdlite.errors import UnsupportedOperationError
from hvdlite.ops import Average, Sum
from hvdlite.torch.compression import Compression
from hvdlite.torch.slow_links.powersgd import PowerSGDState, orthogonalize_, powersgd_step
from hvdlite.training.powersgd import PowerSGD, check_powersgd_options, matrix_shape


class SimulatedRanks:
    """``size`` threads, each a rank; ``reduce(rank)`` is that rank's in-place averaging allreduce."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.names: list[str] = []  # request names, in order (as seen by rank 0)
        self._barrier = threading.Barrier(size, timeout=30)
        self._slots: list = [None] * size

    def exchange(self, rank: int, name: str, values: list) -> list:
        """Every rank's ``values`` averaged elementwise, in rank order (the same sum on every rank)."""
        self._slots[rank] = (name, values)
        self._barrier.wait()
        slots = list(self._slots)
        self._barrier.wait()
        assert len({n for n, _ in slots}) == 1, f"ranks disagree on the request: {[n for n, _ in slots]}"
        if rank == 0:
            self.names.append(name)
        return [_mean([vs[i] for _, vs in slots]) for i in range(len(values))]

    def torch_start(self, rank: int):
        def start(tensors: list[torch.Tensor], name: str):
            for tensor, mean in zip(tensors, self.exchange(rank, name, [t.clone() for t in tensors]), strict=True):
                tensor.copy_(mean)
            return lambda: None
        return start

    def run(self, body) -> list:
        """``body(rank)`` on every simulated rank at once; their results in rank order."""
        results: list = [None] * self.size
        errors: list = []

        def target(rank: int) -> None:
            try:
                results[rank] = body(rank)
            except BaseException as error:  # noqa: BLE001 - reported below, in the test's thread
                errors.append(error)
                self._barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results


def _mean(values: list):
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total / len(values)


# ---- the shared rules and configuration -------------------------------------------------------------
def test_matrices_are_first_dim_by_the_rest_and_small_or_1d_tensors_stay_uncompressed():
    config = PowerSGD(rank=2, start_step=0)
    assert matrix_shape((8, 3, 3, 3)) == (8, 27)
    assert config.plan((16, 12)) == (16, 12, 2)
    assert config.plan((8, 3, 3, 3)) == (8, 27, 2)
    for shape in [(16,), (), (3, 4), (0, 5)]:  # 1-D, scalar, too small to save 2x, empty
        assert config.plan(shape) is None, shape
    # The boundary: compressed only if n*m > (n+m)*r*rate (torch's powerSGD_hook rule).
    assert PowerSGD(rank=1).plan((4, 4)) is None and PowerSGD(rank=1).plan((5, 5)) == (5, 5, 1)
    assert PowerSGD(rank=1, min_compression_rate=4).plan((8, 8)) is None
    assert PowerSGD(rank=50, min_compression_rate=0).plan((16, 12)) == (16, 12, 12)  # rank capped at min(n, m)


def test_initial_q_is_seeded_by_seed_and_index_only():
    config = PowerSGD(rank=2)
    assert np.array_equal(config.initial_q(3, 12, 2), PowerSGD(rank=2).initial_q(3, 12, 2))
    assert not np.array_equal(config.initial_q(3, 12, 2), config.initial_q(4, 12, 2))
    assert not np.array_equal(config.initial_q(3, 12, 2), PowerSGD(rank=2, seed=1).initial_q(3, 12, 2))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rank": 0}, "Compression.powersgd rank must be a positive integer, got 0"),
    ({"rank": 1.5}, "Compression.powersgd rank must be a positive integer, got 1.5"),
    ({"rank": True}, "Compression.powersgd rank must be a positive integer, got True"),
    ({"start_step": -1}, "Compression.powersgd start_step must be an integer >= 0, got -1"),
    ({"min_compression_rate": -2}, "Compression.powersgd min_compression_rate must be a finite number >= 0, got -2"),
    ({"min_compression_rate": float("nan")}, "min_compression_rate must be a finite number >= 0, got nan"),
    ({"seed": -1}, "Compression.powersgd seed must be an integer >= 0, got -1"),
])
def test_configuration_errors_name_the_argument_and_value(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        Compression.powersgd(**kwargs)


def test_the_configuration_is_a_frozen_value_that_refuses_to_act_as_a_compressor():
    config = Compression.powersgd(rank=np.int64(4), start_step=3)
    assert config == PowerSGD(rank=4, start_step=3) and type(config.rank) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.rank = 2
    with pytest.raises(UnsupportedOperationError, match="only as DistributedOptimizer"):
        config.compress(torch.ones(2))
    with pytest.raises(UnsupportedOperationError, match="only as DistributedOptimizer"):
        config.decompress(torch.ones(2), None)


def test_optimizer_options_powersgd_cannot_combine_with_are_refused_by_name():
    check_powersgd_options(Average, 1.0, None)
    with pytest.raises(ValueError, match="needs op=Average, got op=SUM"):
        check_powersgd_options(Sum, 1.0, None)
    with pytest.raises(ValueError, match="gradient_predivide_factor=2.0"):
        check_powersgd_options(Average, 2.0, None)
    with pytest.raises(ValueError, match="local_sgd_period=3"):
        check_powersgd_options(Average, 1.0, 3)


# ---- the torch math ---------------------------------------------------------------------------------
def _gradients(rank: int, step: int) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(100 * step + rank)
    return [("w", torch.randn(16, 12, generator=generator)), ("b", torch.randn(16, generator=generator)),
            ("conv", torch.randn(8, 3, 2, 2, generator=generator)), ("small", torch.randn(3, 4, generator=generator))]


def _torch_steps(config: PowerSGD, size: int, steps: int) -> list[list[dict]]:
    """Per step and rank: the gradients given, their M (with the error carried in), and the results."""
    ranks = SimulatedRanks(size)
    states = [PowerSGDState(config) for _ in range(size)]
    history = []
    for step in range(steps):
        def body(rank: int, step: int = step) -> dict:
            grads = _gradients(rank, step)
            given = {name: g.clone() for name, g in grads}
            with_error = {name: g + states[rank].errors[name].view(g.shape) if name in states[rank].errors
                          else g.clone() for name, g in grads}
            powersgd_step(states[rank], grads, ranks.torch_start(rank))
            return {"given": given, "m": with_error, "out": dict(grads),
                    # Copies: the state's buffers are updated in place by the next step.
                    "errors": {k: v.clone() for k, v in states[rank].errors.items()},
                    "qs": {k: v.clone() for k, v in states[rank].qs.items()}}
        history.append(ranks.run(body))
    history.append(ranks.names)  # type: ignore[arg-type]
    return history


def test_before_start_step_every_gradient_is_the_exact_average():
    *steps, names = _torch_steps(PowerSGD(rank=2, start_step=2), size=3, steps=2)
    for per_rank in steps:
        for name in ("w", "b", "conv", "small"):
            mean = _mean([r["given"][name] for r in per_rank])
            for r in per_rank:
                assert torch.allclose(r["out"][name], mean, atol=1e-6) and not r["errors"] and not r["qs"]
    assert names == ["powersgd.vanilla", "powersgd.vanilla"]


def test_one_compressed_step_keeps_the_error_feedback_identity_and_agrees_bit_for_bit():
    *steps, names = _torch_steps(PowerSGD(rank=2, start_step=0), size=3, steps=3)
    assert names == ["powersgd.uncompressed", "powersgd.P", "powersgd.Q"] * 3
    for per_rank in steps:
        for name in ("w", "conv"):  # compressed
            for r in per_rank:
                assert torch.equal(r["out"][name], per_rank[0]["out"][name])  # the same on every rank
                assert torch.equal(r["qs"][name], per_rank[0]["qs"][name])
                # M (gradient + carried error) == approximation + new error.
                rebuilt = r["out"][name].reshape(r["errors"][name].shape) + r["errors"][name]
                assert torch.allclose(rebuilt, r["m"][name].reshape(rebuilt.shape), atol=1e-5)
            approximation = per_rank[0]["out"][name].reshape(per_rank[0]["errors"][name].shape)
            assert torch.linalg.matrix_rank(approximation) <= 2
        for name in ("b", "small"):  # uncompressed: the exact average, no state
            mean = _mean([r["given"][name] for r in per_rank])
            for r in per_rank:
                assert torch.equal(r["out"][name], per_rank[0]["out"][name])
                assert torch.allclose(r["out"][name], mean, atol=1e-6) and name not in r["errors"]


def test_at_full_rank_the_approximation_is_the_average():
    config = PowerSGD(rank=12, start_step=0, min_compression_rate=0)
    *steps, _ = _torch_steps(config, size=2, steps=2)
    for per_rank in steps:
        for name in ("w", "conv", "small"):  # now all compressed, at full rank
            mean = _mean([r["m"][name] for r in per_rank])
            for r in per_rank:
                assert torch.allclose(r["out"][name], mean, atol=1e-4), (name, (r["out"][name] - mean).abs().max())
            # Nothing of the average is left out: each rank's error is its own deviation from it.
            assert _mean([r["errors"][name] for r in per_rank]).abs().max() < 1e-4


def test_a_non_contiguous_gradient_gets_the_same_result_as_its_contiguous_copy():
    """The approximation is written into the gradient in place; a transposed gradient takes the copy path."""
    config = PowerSGD(rank=2, start_step=0)
    results = []
    for make in (lambda t: t.contiguous(), lambda t: t.t().contiguous().t()):
        state = PowerSGDState(config)
        for step in range(2):
            generator = torch.Generator().manual_seed(step)
            grad = make(torch.randn(16, 12, generator=generator))
            powersgd_step(state, [("w", grad)], SimulatedRanks(1).torch_start(0))
        results.append((grad.clone(), state.errors["w"].clone()))
    assert not make(torch.zeros(16, 12)).is_contiguous()
    (out, error), (out_t, error_t) = results
    assert torch.allclose(out, out_t, atol=1e-6) and torch.allclose(error, error_t, atol=1e-6)
    assert torch.linalg.matrix_rank(out) <= 2


def test_orthogonalize_gives_orthonormal_columns_and_survives_zeros():
    matrix = torch.randn(10, 3, generator=torch.Generator().manual_seed(0))
    orthogonalize_(matrix, 1e-8)
    assert torch.allclose(matrix.t() @ matrix, torch.eye(3), atol=1e-5)
    zeros = orthogonalize_(torch.zeros(4, 2), 1e-8)
    assert torch.equal(zeros, torch.zeros(4, 2))


# ---- the jnp math -----------------------------------------------------------------------------------
def test_the_jax_round_matches_the_torch_step_and_agrees_across_ranks():
    jnp = pytest.importorskip("jax.numpy")
    from hvdlite.jax.slow_links.powersgd import init_factors, powersgd_round

    config = PowerSGD(rank=2, start_step=0)
    size = 3
    ranks = SimulatedRanks(size)
    torch_ranks = SimulatedRanks(size)
    params = [jnp.asarray(g.numpy()) for _, g in _gradients(0, 0)]
    qs0, errors0 = init_factors(config, params)
    assert [q.shape for q in qs0] == [(12, 2), (12, 2)] and [e.shape for e in errors0] == [(16, 12), (8, 12)]

    def body(rank: int) -> tuple:
        leaves = [jnp.asarray(g.numpy()) for _, g in _gradients(rank, 0)]
        out, qs, errors = powersgd_round(config, leaves, qs0, errors0,
                                         lambda arrays, name: ranks.exchange(rank, name, list(arrays)))
        grads = _gradients(rank, 0)
        powersgd_step(PowerSGDState(config), grads, torch_ranks.torch_start(rank))
        return out, errors, [g for _, g in grads]

    results = ranks.run(body)
    for out, errors, torch_out in results:
        for leaf, first, reference in zip(out, results[0][0], torch_out, strict=True):
            assert np.array_equal(np.asarray(leaf), np.asarray(first))  # the same on every rank
            # Same seeds and rule as torch (leaf i = parameter i): the same result, to float rounding.
            assert np.allclose(np.asarray(leaf), reference.numpy(), atol=1e-5)
        assert len(errors) == 2
