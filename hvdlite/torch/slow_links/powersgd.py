"""PowerSGD for the torch ``DistributedOptimizer``: the per-step math and its state.

With ``compression=Compression.powersgd(...)`` (see :mod:`hvdlite.training.powersgd` for the
algorithm and its rules) the gradient hooks start nothing: PowerSGD needs every gradient of the
step at once (its two rounds are each one grouped request over all compressed matrices), so
``synchronize()`` runs :func:`powersgd_step` over the whole step's gradients. The math takes the
allreduce as an argument, so the unit tests run it on simulated ranks in one process.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...ops import Average, ReduceOp
from ...process_sets import ProcessSet
from ...training.powersgd import P_NAME, Q_NAME, UNCOMPRESSED_NAME, VANILLA_NAME, PowerSGD, check_powersgd_options
from ..collectives import async_ops

# Starts averaging ``tensors`` in place across ranks as one request named ``name``; the returned
# callable waits for it.
Start = Callable[[list[torch.Tensor], str], Callable[[], None]]
Compressed = tuple[int, str, torch.Tensor, tuple[int, int, int]]  # (index, name, gradient, (n, m, r))


class PowerSGDState:
    """What PowerSGD carries between steps for one optimizer, by gradient name: ``qs`` (the warm-started
    right factors, the same on every rank) and ``errors`` (this rank's error feedback), and ``step``."""

    def __init__(self, config: PowerSGD) -> None:
        self.config = config
        self.step = 0  # steps so far; compression starts at config.start_step
        self.qs: dict[str, torch.Tensor] = {}
        self.errors: dict[str, torch.Tensor] = {}

    def reset(self) -> None:
        """Start over as a new optimizer does (elastic: a new world, where old errors and Qs mean nothing)."""
        self.step = 0
        self.qs.clear()
        self.errors.clear()


def orthogonalize_(matrix: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Gram-Schmidt on ``matrix``'s columns, in place (r is small, where this beats a QR)."""
    for i in range(matrix.shape[1]):
        column = matrix[:, i:i + 1]
        column /= torch.linalg.vector_norm(column) + epsilon
        if i + 1 < matrix.shape[1]:
            rest = matrix[:, i + 1:]
            rest -= (column * rest).sum(dim=0, keepdim=True) * column
    return matrix


def powersgd_step(state: PowerSGDState, grads: list[tuple[str, torch.Tensor]], start: Start,
                  scope: str = "") -> None:
    """Average ``grads`` (name, gradient) in place across ranks, as one PowerSGD step.

    Before ``start_step`` every gradient is averaged exactly; afterwards the compressed ones are
    replaced by their rank-r approximation of the average. ``scope`` suffixes the request names.
    """
    config = state.config
    compressing = state.step >= config.start_step
    plans = [config.plan(grad.shape) if compressing else None for _, grad in grads]
    plain = [grad for (_, grad), plan in zip(grads, plans, strict=True) if plan is None]
    # Started first, so the small uncompressed tensors travel while the factors are computed.
    wait_plain = start(plain, (UNCOMPRESSED_NAME if compressing else VANILLA_NAME) + scope) if plain else None
    compressed = [(index, name, grad, plan) for index, ((name, grad), plan) in enumerate(zip(grads, plans, strict=True))
                  if plan is not None]
    if compressed:
        _compressed_round(state, compressed, start, scope)
    if wait_plain is not None:
        wait_plain()
    state.step += 1


def _compressed_round(state: PowerSGDState, items: list[Compressed], start: Start, scope: str) -> None:
    """The two rounds for the compressed gradients: P = M Q averaged, orthogonalized; Q = M^T P averaged.

    Everything runs in place in long-lived memory: M is built in the error buffer, the approximation
    is written straight into the gradient: fresh temporaries per matrix cost page faults that made
    the math twice as slow. Q is kept transposed (r x m, contiguous) because the skinny products are
    about 3x faster in that layout with MKL on one thread (50 products of 704x704 by 704x4: 9 ms
    instead of 30).
    """
    config = state.config
    matrices, ps = [], []
    for index, name, grad, (n, m, r) in items:
        matrix = _with_error_(state, name, grad.reshape(n, m))
        q = state.qs.get(name)
        if q is None:
            q = torch.from_numpy(config.initial_q(index, m, r).T.copy()).to(dtype=grad.dtype, device=grad.device).t()
        matrices.append(matrix)
        ps.append(matrix @ q)  # q is a column-major m x r view: the fast layout for this product
    start(ps, P_NAME + scope)()
    for p in ps:
        orthogonalize_(p, config.epsilon)  # every rank orthogonalizes the same averaged P: same result
    q_rows = [p.t() @ matrix for matrix, p in zip(matrices, ps, strict=True)]  # Q^T = P^T M, r x m
    start(q_rows, Q_NAME + scope)()
    for (_, name, grad, (n, m, _)), matrix, p, q_row in zip(items, matrices, ps, q_rows, strict=True):
        in_place = grad.is_contiguous()
        approximation = torch.mm(p, q_row, out=grad.view(n, m)) if in_place else p @ q_row  # P Q^T
        matrix.sub_(approximation)  # the error buffer now holds M - approximation
        if not in_place:
            grad.copy_(approximation.view(grad.shape))
        state.qs[name] = q_row.t()


def _with_error_(state: PowerSGDState, name: str, grad: torch.Tensor) -> torch.Tensor:
    """M = gradient + the error earlier approximations left out, built in the error buffer."""
    error = state.errors.get(name)
    if error is None:
        error = state.errors[name] = grad.clone(memory_format=torch.contiguous_format)
        return error
    return error.add_(grad)


class PowerSGDReducer:
    """PowerSGD on a wrapped optimizer's gradients: kept on its ``GradientReducer`` as ``powersgd``."""

    def __init__(self, config: PowerSGD, names: dict[torch.Tensor, str], process_set: ProcessSet) -> None:
        self.state = PowerSGDState(config)
        self._names = names
        self._process_set = process_set
        # Request names are scoped by the first gradient's, so two optimizers' requests never collide.
        self._scope = f".{next(iter(names.values()))}" if names else ""

    def reduce(self) -> None:
        """Average this step's gradients; a gradient that never arrived counts as zeros, as without PowerSGD."""
        grads = [(name, self._dense_gradient(param)) for param, name in self._names.items()]
        if grads:
            powersgd_step(self.state, grads, self._start, self._scope)

    def restart(self) -> None:
        """Elastic: the world changed; start over from plain averaging, the same on every rank."""
        self.state.reset()

    @staticmethod
    def _dense_gradient(param: torch.Tensor) -> torch.Tensor:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        elif param.grad.is_sparse:  # the low-rank factors need the whole matrix
            param.grad = param.grad.to_dense()
        return param.grad

    def _start(self, tensors: list[torch.Tensor], name: str) -> Callable[[], None]:
        handle = async_ops.grouped_allreduce_async_(tensors, name=name, op=Average, process_set=self._process_set)
        return lambda: async_ops.synchronize(handle)


def powersgd_reducer(compression: object, names: dict[torch.Tensor, str], op: ReduceOp,
                     gradient_predivide_factor: float, local_sgd_period: int | None,
                     process_set: ProcessSet) -> PowerSGDReducer | None:
    """The PowerSGD reducer if ``compression`` is a :class:`PowerSGD` configuration (options checked), else None."""
    if not isinstance(compression, PowerSGD):
        return None
    check_powersgd_options(op, gradient_predivide_factor, local_sgd_period)
    return PowerSGDReducer(compression, names, process_set)


__all__ = ["PowerSGDReducer", "PowerSGDState", "orthogonalize_", "powersgd_reducer", "powersgd_step"]
