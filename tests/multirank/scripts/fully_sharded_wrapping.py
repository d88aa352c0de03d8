"""Cases of fully_sharded.py whose models are built in other ways: one Parameter used by two modules
(an embedding's weight reused by the output layer) in every wrapping, blocks under activation
checkpointing, units whose parameters have different dtypes, outputs that hide their tensors, and a
deep copy of a sharded model; against one process training the plain model on the whole batch."""

import copy
import warnings

import torch
import torch.utils.checkpoint
from fully_sharded_common import BATCH, DEVICE, STEPS, assert_matches, batches, build, mine, shard, step_both

import hvdlite.torch as hvd

VOCABULARY, WIDTH = 11, 6  # 11 rows: no rank count here divides them


class TiedLanguageModel(torch.nn.Module):
    """Embedding, a block, and an output layer whose weight is the embedding's."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCABULARY, WIDTH)
        self.block = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
        self.head = torch.nn.Linear(WIDTH, VOCABULARY)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(tokens)))


WRAPPED = {  # the modules that get a unit of their own before the model's
    "tied_in_one_unit": ["block"],  # embedding and head both in the model's unit
    "tied_embedding_unit": ["embed", "block"],  # the model's unit takes it from the embedding's
    "tied_head_unit": ["block", "head"],  # ... from the head's
    "tied_sibling_units": ["embed", "block", "head"],  # neither can hold it: it waits for the model's
}


def tied(case: str) -> None:
    torch.manual_seed(0)
    with torch.device(DEVICE):
        reference = TiedLanguageModel()
    model = copy.deepcopy(reference)
    for name in WRAPPED[case]:
        hvd.fully_shard(getattr(model, name))
    hvd.fully_shard(model)
    assert model.head.weight is model.embed.weight, case  # still one Parameter: one shard
    local, rows = model.embed.weight.to_local(), -(-VOCABULARY // hvd.size())
    assert local.shape == (min(rows, max(0, VOCABULARY - hvd.rank() * rows)), WIDTH), local.shape
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(2)
    for _ in range(STEPS):
        tokens = torch.randint(0, VOCABULARY, (BATCH * hvd.size(),), generator=generator).to(DEVICE)
        targets = torch.randint(0, VOCABULARY, (BATCH * hvd.size(),), generator=generator).to(DEVICE)
        for opt in (reference_optimizer, optimizer):
            opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(tokens), targets).backward()
        torch.nn.functional.cross_entropy(model(mine(tokens)), mine(targets)).backward()
        reference_optimizer.step()
        optimizer.step()
    assert_matches(model, reference, case)
    state = hvd.full_optimizer_state_dict(model, optimizer, rank0_only=False)["state"]
    expected = reference_optimizer.state_dict()["state"]
    assert sorted(state) == sorted(expected), (case, sorted(state), sorted(expected))
    for index, entry in expected.items():
        for key, value in entry.items():
            error = (state[index][key].float() - value.cpu().float()).abs().max().item()
            assert error <= 1e-5, f"{case}: Adam's {key} of parameter {index} differs by {error}"


def tied_without_a_common_unit() -> None:
    """Embedding and head wrapped apart and no unit holding both: refused at the first forward."""
    with torch.device(DEVICE):
        model = TiedLanguageModel()
    hvd.fully_shard(model.embed)
    hvd.fully_shard(model.head)
    try:
        model(torch.zeros(2, dtype=torch.long, device=DEVICE))
    except ValueError as error:
        assert "belong to no unit that holds every module using them" in str(error), str(error)
        assert "Embedding.weight" in str(error) and "Linear.weight" in str(error), str(error)
        return
    raise AssertionError("a tie no unit can hold was accepted")


class Checkpointed(torch.nn.Module):
    """build()'s model with each block's activations recomputed in backward (torch.utils.checkpoint)."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.model, self.reentrant = build(), reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in list(self.model)[:-2]:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.reentrant)
        return self.model[-1](self.model[-2](x))


def activation_checkpointing() -> None:
    """Reentrant, non-reentrant, and non-reentrant without early stop: that recomputation runs a
    unit's whole forward inside its backward, which must not reshard the parameters backward needs."""
    for reentrant, early_stop in ((True, True), (False, True), (False, False)):
        reference = Checkpointed(reentrant)
        model = copy.deepcopy(reference)
        for block in list(model.model)[:-2]:
            hvd.fully_shard(block)
        hvd.fully_shard(model)
        optimizers = tuple(torch.optim.Adam(m.parameters(), lr=0.01) for m in (reference, model))
        with torch.utils.checkpoint.set_checkpoint_early_stop(early_stop):
            for x, y in batches():
                x.requires_grad_(reentrant)  # reentrant checkpointing computes gradients only for such inputs
                step_both(reference, model, optimizers, x, y)
        assert_matches(model, reference, f"activation checkpointing, reentrant {reentrant}, early stop {early_stop}")


def mixed_dtypes() -> None:
    """Units holding bf16 Linears and fp32 LayerNorms (as models that keep their norms in fp32): each
    parameter is gathered exactly, in its own dtype, and the norms' gradients are averaged in fp32."""
    torch.manual_seed(0)
    with torch.device(DEVICE):
        reference = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH).to(torch.bfloat16),
                                                              torch.nn.LayerNorm(WIDTH)) for _ in range(2)])
    with torch.no_grad():
        for block in reference:
            block[1].weight.add_(torch.randn(WIDTH, device=DEVICE) * 1e-3)  # values bf16 cannot hold
    model = copy.deepcopy(reference)
    for block in model:
        hvd.fully_shard(block)
    hvd.fully_shard(model)
    full = hvd.full_state_dict(model, rank0_only=False)
    for key, value in reference.state_dict().items():
        assert full[key].dtype == value.dtype and torch.equal(full[key], value.cpu()), key
    x = torch.randn(BATCH * hvd.size(), WIDTH, generator=torch.Generator().manual_seed(5)).to(DEVICE, torch.bfloat16)
    assert torch.equal(model(mine(x)), reference(mine(x)))  # the same weights, bit for bit
    model(mine(x)).float().square().mean().backward()
    # The reference: each rank's own computation (bf16 upstream of the norms, so not the whole
    # batch's), its fp32 norm gradients averaged in fp32.
    per_rank = []
    for rank in range(hvd.size()):
        plain = copy.deepcopy(reference)
        plain(x[rank * BATCH:(rank + 1) * BATCH]).float().square().mean().backward()
        per_rank.append([block[1].weight.grad for block in plain])
    rows = -(-WIDTH // hvd.size())
    for index, sharded in enumerate(model):
        expected = (sum(grads[index] for grads in per_rank) / hvd.size())[hvd.rank() * rows:(hvd.rank() + 1) * rows]
        error = (sharded[1].weight.grad.to_local() - expected).abs().max().item()
        assert error <= 1e-6 * expected.abs().max().item(), f"fp32 norm gradient off by {error}"


class Holder:
    """An output class torch.utils._pytree does not know: the tensor in it is hidden from the hooks."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class HiddenOutputs(torch.nn.Module):
    """Blocks that return Holders (a forward hook wraps their outputs), and a model that returns one."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(2))
        self.head = torch.nn.Linear(WIDTH, 3)

    def forward(self, x: torch.Tensor) -> Holder:
        for block in self.blocks:
            x = torch.tanh(block(x).tensor)
        return Holder(self.head(x))


def hold(model: HiddenOutputs) -> None:
    for block in model.blocks:  # prepended: the fully_shard hook after it sees the Holder
        block.register_forward_hook(lambda _module, _args, output: Holder(output), prepend=True)


def hidden_outputs() -> None:
    """Units whose outputs hide their tensors keep their parameters until backward (with a warning)
    instead of freeing memory their backward then reads, and still reduce their gradients."""
    torch.manual_seed(0)
    with torch.device(DEVICE):
        reference = HiddenOutputs()
    model = copy.deepcopy(reference)
    for block in model.blocks:
        hvd.fully_shard(block)
    hvd.fully_shard(model)
    hold(reference)
    hold(model)
    reference_optimizer, optimizer = (torch.optim.SGD(m.parameters(), lr=0.05) for m in (reference, model))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in batches(WIDTH):
            for opt in (reference_optimizer, optimizer):
                opt.zero_grad()
            torch.nn.functional.mse_loss(reference(x).tensor, y).backward()
            torch.nn.functional.mse_loss(model(mine(x)).tensor, mine(y)).backward()
            reference_optimizer.step()
            optimizer.step()
    assert any("returned a Holder, in which no tensor is visible" in str(w.message) for w in caught), caught
    assert all(m._hvdlite_unit.state.name == "SHARDED" for m in (model, *model.blocks))
    assert_matches(model, reference, "hidden_outputs")


def copies() -> None:
    """copy.deepcopy of a sharded model (an EMA): its own shards, the same outputs, and updated shard
    by shard it matches the same EMA of the plain model."""
    reference = build()
    model = shard(copy.deepcopy(reference))
    optimizers = tuple(torch.optim.SGD(m.parameters(), lr=0.05) for m in (reference, model))
    average_of_reference, average = None, None
    for step, (x, y) in enumerate(batches()):
        step_both(reference, model, optimizers, x, y)
        if step == 1:
            average_of_reference, average = copy.deepcopy(reference), copy.deepcopy(model)
            assert not {id(p) for p in average.parameters()} & {id(p) for p in model.parameters()}
            with torch.no_grad():
                assert torch.equal(average(x), model(x))
        elif step > 1:
            with torch.no_grad():
                for pairs in (zip(average_of_reference.parameters(), reference.parameters(), strict=True),
                              zip(average.parameters(), model.parameters(), strict=True)):
                    for kept, current in pairs:
                        kept.lerp_(current, 0.5)
    assert_matches(average, average_of_reference, "copies")
    assert_matches(model, reference, "copies")


WRAPPING_CASES = {case: (lambda case=case: tied(case)) for case in WRAPPED}
WRAPPING_CASES["tied_without_a_common_unit"] = tied_without_a_common_unit
WRAPPING_CASES["activation_checkpointing"] = activation_checkpointing
WRAPPING_CASES["mixed_dtypes"] = mixed_dtypes
WRAPPING_CASES["hidden_outputs"] = hidden_outputs
WRAPPING_CASES["copies"] = copies


def sharded_tied(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        model = TiedLanguageModel()
    for name in WRAPPED["tied_sibling_units"]:
        hvd.fully_shard(getattr(model, name))
    hvd.fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def save_tied(directory: str) -> None:
    """A sharded checkpoint of a model with a tied weight (stored once), and the full state it must give back."""
    model, optimizer = sharded_tied(seed=3)
    torch.nn.functional.cross_entropy(model(mine(torch.arange(BATCH * hvd.size(), device=DEVICE) % VOCABULARY)),
                                      torch.zeros(BATCH, dtype=torch.long, device=DEVICE)).backward()
    optimizer.step()
    hvd.save_sharded_state(directory, model, optimizer)
    full = hvd.full_state_dict(model), hvd.full_optimizer_state_dict(model, optimizer)
    if hvd.rank() == 0:
        torch.save(full, f"{directory}/expected.pt")


def load_tied(directory: str) -> None:
    """save_tied's checkpoint at this job's size: the same tied weight, biases and Adam state."""
    model, optimizer = sharded_tied(seed=4)
    hvd.load_sharded_state(directory, model, optimizer)
    expected_model, expected_optimizer = torch.load(f"{directory}/expected.pt", weights_only=True)
    full = hvd.full_state_dict(model, rank0_only=False)
    assert list(full) == list(expected_model) and all(torch.equal(full[k], v) for k, v in expected_model.items())
    state = hvd.full_optimizer_state_dict(model, optimizer, rank0_only=False)["state"]
    assert sorted(state) == sorted(expected_optimizer["state"])
    for index, entry in expected_optimizer["state"].items():
        assert all(torch.equal(state[index][k], v) for k, v in entry.items()), index
