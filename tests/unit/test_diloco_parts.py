"""DiLoCo's schedule, fragments, int8 codec and argument checks, in one process."""

import pytest
import torch

from hvdlite.torch.slow_links.diloco_exchange import BLOCK, dequantize_int8, make_exchange, quantize_int8
from hvdlite.training.diloco import DiLoCoSchedule, describe_mismatch, split_fragments


def test_one_fragment_is_sent_every_sync_every_steps_and_lands_at_once_without_delay():
    schedule = DiLoCoSchedule(sync_every=4)
    assert [c for c in range(1, 13) if schedule.sent_after(c) is not None] == [4, 8, 12]
    assert [schedule.lands_after(c) for c in (4, 8)] == [0, 0]
    assert schedule.in_flight_after(4) is None


def test_fragments_are_sent_in_turn_every_h_over_f_steps_and_land_delay_steps_later():
    schedule = DiLoCoSchedule(sync_every=8, fragments=4, delay=1)
    sent = {c: schedule.sent_after(c) for c in range(1, 17) if schedule.sent_after(c) is not None}
    assert sent == {2: 0, 4: 1, 6: 2, 8: 3, 10: 0, 12: 1, 14: 2, 16: 3}
    landed = {c: schedule.lands_after(c) for c in range(1, 17) if schedule.lands_after(c) is not None}
    assert landed == {c + 1: f for c, f in sent.items() if c + 1 <= 16}
    assert schedule.in_flight_after(6) == (2, 6) and schedule.in_flight_after(7) is None


@pytest.mark.parametrize(("arguments", "message"), [
    ((6, 4, 0), "sync_every=6 must be a multiple of fragments=4"),
    ((8, 4, 2), "delay=2 must be smaller than sync_every / fragments = 2"),
    ((0, 1, 0), "sync_every must be a positive integer, got 0"),
    ((4, 1, -1), "delay must be an integer >= 0, got -1"),
])
def test_schedules_that_cannot_run_are_refused_naming_the_values(arguments, message):
    with pytest.raises(ValueError, match=message):
        DiLoCoSchedule(*arguments)


def test_fragments_are_runs_of_consecutive_parameters_with_about_equal_sizes():
    assert split_fragments([10, 10, 10, 10], 2) == [[0, 1], [2, 3]]
    assert split_fragments([100, 1, 1], 3) == [[0], [1], [2]]  # every fragment gets a parameter
    assert split_fragments([1, 1, 1, 97], 2) == [[0, 1, 2], [3]]
    with pytest.raises(ValueError, match=r"fragments=3 needs at least 3 parameters, the model has 2 \(w, b\)"):
        split_fragments([4, 2], 3, ["w", "b"])


def test_mismatches_name_the_ranks_and_their_values():
    assert describe_mismatch("the schedule", [1, 1], [0, 2]) is None
    message = describe_mismatch("the schedule", [(4, 1, 0), (8, 1, 0)], [1, 3])
    assert message == ("DiLoCo: the schedule differs across the process set [1, 3]: rank 1 has (4, 1, 0), "
                       "rank 3 has (8, 1, 0)")


def test_int8_blocks_round_each_value_to_its_blocks_scale_and_drop_the_padding():
    torch.manual_seed(0)
    flat = torch.randn(BLOCK + 7) * torch.linspace(0.01, 10, BLOCK + 7)
    values, scales = quantize_int8(flat)
    assert values.dtype == torch.int8 and values.numel() == 2 * BLOCK and scales.numel() == 2
    decoded = dequantize_int8(values, scales, flat.numel())
    assert decoded.shape == flat.shape
    per_block_bound = torch.repeat_interleave(scales / 2, BLOCK)[:flat.numel()]
    assert torch.all((decoded - flat).abs() <= per_block_bound * (1 + 1e-6))
    assert torch.equal(dequantize_int8(*quantize_int8(torch.zeros(5)), 5), torch.zeros(5))  # no 0/0


def test_unknown_compression_is_refused_naming_what_is_accepted():
    with pytest.raises(ValueError, match=r"compression must be None, 'bf16' or 'int8', got 'fp8'"):
        make_exchange("fp8", None)


def _model_and_optimizers():
    import hvdlite.torch as hvd

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    return hvd, model, inner


def test_optimizers_diloco_cannot_step_are_refused_before_init():
    hvd, model, inner = _model_and_optimizers()
    assert not hvd.is_initialized()
    with pytest.raises(TypeError, match="DiLoCo's outer_optimizer must be a torch.optim.Optimizer, got object"):
        hvd.DiLoCo(model, inner, object(), sync_every=4)
    partial = torch.optim.SGD(list(model.parameters())[:2], lr=0.7)
    with pytest.raises(ValueError, match=r"outer_optimizer does not hold parameter\(s\) 1.weight, 1.bias"):
        hvd.DiLoCo(model, inner, partial, sync_every=4)
    with pytest.raises(ValueError, match="sync_every=6 must be a multiple of fragments=4"):
        hvd.DiLoCo(model, inner, inner, sync_every=6, fragments=4)
    with pytest.raises(ValueError, match="DiLoCo was given no parameters"):
        hvd.DiLoCo([], inner, inner, sync_every=4)


def test_valid_diloco_arguments_still_need_init():
    hvd, model, inner = _model_and_optimizers()
    with pytest.raises(hvd.NotInitializedError):
        hvd.DiLoCo(model, inner, torch.optim.SGD(model.parameters(), lr=0.7), sync_every=4)


def test_numpy_codecs_round_as_torch_does_so_every_framework_sends_the_same_bytes():
    from hvdlite.training import diloco_exchange as numpy_codec

    values = torch.randn(3 * BLOCK + 17) * torch.logspace(-3, 3, 3 * BLOCK + 17)
    bits = numpy_codec.to_bf16_bits(values.numpy())
    assert (bits == values.to(torch.bfloat16).view(torch.int16).numpy()).all()
    assert (numpy_codec.from_bf16_bits(bits) == values.to(torch.bfloat16).float().numpy()).all()
    torch_values, torch_scales = quantize_int8(values)
    numpy_values, numpy_scales = numpy_codec.quantize_int8(values.numpy())
    assert (numpy_values == torch_values.numpy()).all() and (numpy_scales == torch_scales.numpy()).all()
    decoded = numpy_codec.dequantize_int8(numpy_values, numpy_scales, values.numel())
    assert decoded.shape == (values.numel(),) and abs(decoded - values.numpy()).max() <= numpy_scales.max() / 2


def test_numpy_exchange_refuses_unknown_compression_naming_what_it_accepts():
    from hvdlite.training.diloco_exchange import check_compression

    assert check_compression("none") is None and check_compression("int8") == "int8"
    with pytest.raises(ValueError, match="compression must be None, 'bf16' or 'int8', got 'int4'"):
        check_compression("int4")
