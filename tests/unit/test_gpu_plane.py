"""The GPU data plane's parts that run without a GPU: the NCCL binding, plane selection, dtype and
op mapping, the bfloat16 bit arithmetic, the pointer plumbing, fusion and negotiation of device
tensors. What needs a device is in tests/gpu (it skips here)."""

from __future__ import annotations

import ctypes
import importlib.metadata
import time
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from hvdlite import api, errors
from hvdlite.core import arguments
from hvdlite.core.pipeline import fuse as fusion
from hvdlite.core.pipeline.coordinator import find_mismatch
from hvdlite.core.pipeline.execute import Executor
from hvdlite.core.planes.host import HostPlane
from hvdlite.core.planes.host import scale_in_place as host_scale_in_place
from hvdlite.core.transport.shm import UFUNCS
from hvdlite.core.work.request import RequestMeta
from hvdlite.core.work.response import Response
from hvdlite.gpu import nccl, scaling, selection
from hvdlite.gpu.arrays import DEVICE, DeviceArray
from hvdlite.gpu.plans import in_place_launch, member_offsets, reduction_plan
from hvdlite.ops import Collective, ReduceOp
from hvdlite.settings.config import load_config
from hvdlite.utils import dtypes

needs_nccl = pytest.mark.skipif(nccl.library_path() is None, reason="nvidia-nccl-cu12 is not installed")


# ---- the NCCL binding ----------------------------------------------------------------------------
@needs_nccl
def test_nccl_version_is_the_installed_wheels_and_nccl_built_reports_it() -> None:
    import hvdlite

    wheel = importlib.metadata.version("nvidia-nccl-cu12")  # e.g. "2.32.3"
    code = nccl.version()
    assert selection.format_version(code) == ".".join(wheel.split(".")[:3])
    assert hvdlite.nccl_built() == code and isinstance(hvdlite.nccl_built(), int)


@needs_nccl
def test_unique_ids_are_fresh_128_byte_ids() -> None:
    first, second = nccl.unique_id(), nccl.unique_id()
    assert len(first) == len(second) == nccl.UNIQUE_ID_BYTES
    assert first != second and any(first)


@needs_nccl
def test_a_communicator_without_a_usable_gpu_fails_fast_with_the_rank_and_device() -> None:
    if nccl_device_present():
        pytest.skip("this machine has a GPU; tests/gpu covers communicators")
    start = time.monotonic()
    with pytest.raises(nccl.NcclError, match=r"rank 0, CUDA device 0") as caught:
        nccl.Communicator.create(nccl.unique_id(), 1, 0, 0, timeout=30)
    assert isinstance(caught.value, errors.DeviceError)
    assert time.monotonic() - start < 30


def test_a_unique_id_passed_to_nccl_keeps_every_byte_after_zero_bytes() -> None:
    # An id starts with a socket address (family, port, IPv4) full of zeros; a C-string copy
    # kept only the bytes before the first zero and NCCL then waited on a root that is not there.
    uid = bytes([2, 0, 0x1F, 0x90, 192, 0, 2, 2]) + bytes(range(1, nccl.UNIQUE_ID_BYTES - 7))
    assert bytes(nccl.unique_id_struct(uid)) == uid


def test_a_unique_id_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(nccl.NcclError, match="128 bytes, got 5"):
        nccl.Communicator.create(b"short", 2, 0, 0, timeout=1)


def nccl_device_present() -> bool:
    from hvdlite.gpu.arrays import device_count

    return device_count() > 0


def test_an_allreduce_launch_passes_pointers_and_the_communicator_and_names_nccls_error(monkeypatch) -> None:
    calls, results = [], [0, 1]

    class Library:  # stands in for libnccl: what the launch passes, and a failure's explanation
        def ncclAllReduce(self, *args) -> int:
            calls.append(args)
            return results.pop(0)

        def ncclGetErrorString(self, code: int) -> bytes:
            return b"unhandled cuda error"

        def ncclGetLastError(self, comm) -> bytes:
            return b"cudaErrorLaunchFailure"

    library = Library()
    monkeypatch.setattr(nccl, "_library", lambda: library)
    comm = nccl.Communicator(ctypes.c_void_p(0x5000), size=2, rank=0)
    comm.allreduce(0x1000, 0x2000, 3, "bfloat16", ReduceOp.MAX, stream=0x70)
    assert calls == [(0x1000, 0x2000, 3, nccl.NCCL_DTYPE["bfloat16"], nccl.NCCL_OP[ReduceOp.MAX], 0x5000, 0x70)]
    with pytest.raises(nccl.NcclError, match=r"ncclAllReduce failed: unhandled cuda error \(cudaErrorLaunchFailure\)"):
        comm.allreduce(0x1000, 0x1000, 3, "float32", ReduceOp.SUM, stream=0x70)


def test_premultiplied_sum_scalars_are_encoded_in_the_reduction_dtype() -> None:
    assert nccl.scalar_bytes("bfloat16", 0.5) == np.array([0.5], ml_dtypes.bfloat16).tobytes()
    assert nccl.scalar_bytes("float16", 0.25) == np.float16(0.25).tobytes()
    assert nccl.scalar_bytes("float64", 1 / 3) == np.float64(1 / 3).tobytes()


def test_every_core_dtype_has_an_nccl_wire_type() -> None:
    for name in dtypes.SUPPORTED:
        assert dtypes.wire_name(name, DEVICE) in nccl.NCCL_DTYPE, name
    assert dtypes.wire_name("bfloat16", DEVICE) == "bfloat16" and dtypes.wire_name("bfloat16", "cpu") == "float32"
    assert dtypes.wire_name("int16", DEVICE) == "int32" and dtypes.wire_name("bool", DEVICE) == "uint8"
    assert nccl.NCCL_DTYPE["bfloat16"] == 9 and nccl.NCCL_OP[ReduceOp.AVERAGE] == 4  # nccl.h's values


# ---- plane selection -----------------------------------------------------------------------------
def _row(version: int = 23203, wants_mpi: bool = False, multi: bool = False, gpu: str = "a") -> selection.RankGpu:
    return selection.RankGpu(version, wants_mpi, multi, selection.gpu_key("host", gpu))


def test_one_gpu_per_rank_uses_nccl() -> None:
    choice = selection.choose_plane([_row(gpu="0000:01:00.0"), _row(gpu="0000:02:00.0")])
    assert choice.plane == selection.PLANE_NCCL and "2.32.3" in choice.reason


def test_any_rank_asking_for_mpi_or_lacking_nccl_moves_the_whole_job_to_host_staging() -> None:
    choice = selection.choose_plane([_row(gpu="1"), _row(gpu="2", wants_mpi=True), _row(gpu="3")])
    assert choice.plane == selection.PLANE_MPI and "rank(s) [1]" in choice.reason
    choice = selection.choose_plane([_row(gpu="1"), _row(gpu="2"), _row(version=0, gpu="3")])
    assert choice.plane == selection.PLANE_MPI and "NCCL does not load on rank(s) [2]" in choice.reason


def test_ranks_sharing_a_gpu_need_nccl_multi_rank_mode_on_every_rank_and_nccl_2_30() -> None:
    shared = selection.choose_plane([_row(gpu="0"), _row(gpu="0"), _row(gpu="1")])
    assert shared.plane == selection.PLANE_MPI
    assert "ranks [0, 1] share one GPU" in shared.reason and "NCCL_MULTI_RANK_GPU_ENABLE=1" in shared.reason
    half = selection.choose_plane([_row(gpu="0", multi=True), _row(gpu="0")])
    assert half.plane == selection.PLANE_MPI
    enabled = selection.choose_plane([_row(gpu="0", multi=True), _row(gpu="0", multi=True)])
    assert enabled.plane == selection.PLANE_NCCL and "experimental" in enabled.reason
    old = selection.choose_plane([_row(version=22905, gpu="0", multi=True), _row(version=22905, gpu="0", multi=True)])
    assert old.plane == selection.PLANE_MPI and "2.29.5" in old.reason


def test_gpu_keys_are_stable_and_distinguish_hosts_and_buses() -> None:
    assert selection.gpu_key("h1", "0000:3B:00.0") == selection.gpu_key("h1", "0000:3b:00.0")
    assert len({selection.gpu_key(h, b) for h in ("h1", "h2") for b in ("0000:01:00.0", "0000:02:00.0")}) == 4
    row = _row(version=23203, wants_mpi=True, multi=True, gpu="x")
    assert selection.RankGpu.decode(row.encode()) == row


# ---- reductions on NCCL --------------------------------------------------------------------------
def test_sums_and_float_averages_fold_every_factor_into_one_premultiplied_sum() -> None:
    assert reduction_plan("float32", ReduceOp.AVERAGE, 1.0, 1.0, 4) == (ReduceOp.SUM, 0.25, 1.0, 1.0, 1)
    assert reduction_plan("bfloat16", ReduceOp.AVERAGE, 0.5, 3.0, 3) == (ReduceOp.SUM, 0.5, 1.0, 1.0, 1)
    assert reduction_plan("float16", ReduceOp.SUM, 2.0, 3.0, 8) == (ReduceOp.SUM, 6.0, 1.0, 1.0, 1)
    assert reduction_plan("int32", ReduceOp.AVERAGE, 1.0, 1.0, 3) == (ReduceOp.AVERAGE, 1.0, 1.0, 1.0, 1)
    assert reduction_plan("float32", ReduceOp.MAX, 2.0, 0.5, 3) == (ReduceOp.MAX, 1.0, 2.0, 0.5, 1)
    assert reduction_plan("bool", ReduceOp.SUM, 1.0, 1.0, 2)[0] is ReduceOp.MAX  # logical or


def test_scaled_integers_scale_around_the_reduction_since_nccl_premultiplies_only_floats() -> None:
    assert reduction_plan("int32", ReduceOp.SUM, 0.5, 3.0, 2) == (ReduceOp.SUM, 1.0, 0.5, 3.0, 1)
    assert reduction_plan("uint8", ReduceOp.AVERAGE, 2.0, 1.0, 3) == (ReduceOp.SUM, 1.0, 2.0, 1.0, 3)
    assert reduction_plan("int64", ReduceOp.AVERAGE, 1.0, 0.5, 4) == (ReduceOp.SUM, 1.0, 1.0, 0.5, 4)
    assert reduction_plan("int8", ReduceOp.PRODUCT, 1.0, 2.0, 2) == (ReduceOp.PRODUCT, 1.0, 1.0, 2.0, 1)


def _host_reduction(inputs: list[np.ndarray], dtype: str, op: ReduceOp, pre: float, post: float) -> np.ndarray:
    """What the host plane computes (its own scaling functions, the ranks' values reduced in rank order)."""
    host = HostPlane(transport=None, rank=0, size=len(inputs))
    wire = dtypes.wire_dtype(dtype)
    scaled = [x.astype(wire) for x in inputs]
    for buffer in scaled:
        if pre != 1.0:
            host_scale_in_place(buffer, pre)
    result = scaled[0].copy()
    for buffer in scaled[1:]:
        UFUNCS[dtypes.wire_op(dtype, op)](result, buffer, out=result)
    scale = host.postscaler(dtype, op, post)
    if scale is not None:
        scale(result)
    return result.astype(dtype)


def _nccl_reduction(inputs: list[np.ndarray], dtype: str, op: ReduceOp, pre: float, post: float) -> np.ndarray:
    """What the NCCL plane computes, with NumPy in cupy's place: its plan, its scaling, NCCL's integer ops."""
    wire = dtypes.wire_name(dtype, DEVICE)
    plan = reduction_plan(dtype, op, pre, post, len(inputs))
    assert plan.factor == 1.0, "NCCL pre-multiplies floats only"
    scaled = [x.astype(wire) for x in inputs]
    for buffer in scaled:
        scaling.scale_in_place(buffer, wire, plan.pre, np)
    total = scaled[0].copy()
    for buffer in scaled[1:]:
        UFUNCS[plan.op](total, buffer, out=total)
    if plan.op is ReduceOp.AVERAGE:  # ncclAvg on integers: the sum divided, truncated toward zero
        total = np.where(total < 0, -(-total // len(inputs)), total // len(inputs)).astype(wire)
    scaling.scale_in_place(total, wire, plan.post, np, plan.divisor)
    return total.astype(dtype)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "int64"])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT])
def test_integer_scaling_on_the_device_equals_the_host_plane_bit_for_bit(dtype: str, op: ReduceOp) -> None:
    rng = np.random.default_rng(7)
    # In range: int16 travels as int32 on NCCL, so only an overflow could tell the planes apart.
    high = 4 if op is ReduceOp.PRODUCT else 7
    low = 0 if dtype == "uint8" else 1 - high
    factors = [(1.0, 1.0), (0.5, 3.0), (2.5, 0.3), (1.0, 1 / 3), (0.7, 1.0), (1.0, 0.1)]
    if dtype != "uint8":
        factors.append((-1.5, 0.7))
    for size in (1, 2, 3) if op is ReduceOp.PRODUCT else (1, 2, 3, 7):
        inputs = [rng.integers(low, high, 40).astype(dtype) for _ in range(size)]
        for pre, post in factors:
            expected = _host_reduction(inputs, dtype, op, pre, post)
            got = _nccl_reduction(inputs, dtype, op, pre, post)
            assert np.array_equal(got, expected), (size, pre, post, got, expected)


def test_integer_scaling_is_the_hosts_float64_product_truncated_also_for_large_int64() -> None:
    values = np.array([2**62 + 1, -(2**53) - 3, 7, -7, 2**40 + 5], np.int64)
    for factor in (1.0000001, 0.3, -1.5):
        expected = values.copy()
        host_scale_in_place(expected, factor)
        got = values.copy()
        scaling.scale_in_place(got, "int64", factor, np)
        assert np.array_equal(got, expected), (factor, got, expected)
    halves = np.array([5, -5], np.int32)
    scaling.scale_in_place(halves, "int32", 1.0, np, divisor=2)
    assert halves.tolist() == [2, -2]  # an Average truncates toward zero, as the host's


def test_only_an_integer_average_cannot_be_split_into_hierarchical_stages() -> None:
    from hvdlite.core.planes.hierarchical import supports

    assert not supports("int32", ReduceOp.AVERAGE) and not supports("uint8", ReduceOp.AVERAGE)
    assert supports("float32", ReduceOp.AVERAGE) and supports("bfloat16", ReduceOp.AVERAGE)
    assert supports("int64", ReduceOp.SUM) and supports("bool", ReduceOp.SUM) and supports("int8", ReduceOp.MAX)


def test_device_fusion_offsets_are_aligned_and_hold_every_member() -> None:
    starts = member_offsets([3, 17, 0, 64], 2)
    assert all(s * 2 % 64 == 0 for s in starts)
    assert all(b - a >= n for a, b, n in zip(starts, starts[1:], [3, 17, 0, 64], strict=False))


@pytest.mark.parametrize("seed", [0, 1])
def test_bfloat16_bit_arithmetic_matches_ml_dtypes_rounding(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = np.concatenate([
        rng.standard_normal(10_000).astype(np.float32) * 10.0 ** rng.integers(-40, 38, 10_000),
        np.array([0.0, -0.0, np.inf, -np.inf, 1.00390625, 1.01171875, 3.4e38, 1e-45], np.float32),
    ]).astype(np.float32)
    expected = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(scaling.float32_to_bfloat16(values, np), expected)
    nan = scaling.float32_to_bfloat16(np.array([np.nan], np.float32), np).view(ml_dtypes.bfloat16)
    assert np.isnan(nan.astype(np.float32)).all()
    back = scaling.bfloat16_to_float32(expected, np)
    assert np.array_equal(back, expected.view(ml_dtypes.bfloat16).astype(np.float32))


def test_scaling_bfloat16_bits_in_place_rounds_once() -> None:
    values = np.array([1.0, 3.0, -7.5, 0.1], np.float32).astype(ml_dtypes.bfloat16)
    bits = values.view(np.uint16).copy()
    scaling.scale_in_place(bits, "bfloat16", 1 / 3, np)
    expected = (values.astype(np.float32) * np.float32(1 / 3)).astype(ml_dtypes.bfloat16)
    assert np.array_equal(bits.view(ml_dtypes.bfloat16), expected)
    halves = np.array([1.0, 2.0], np.float16)
    scaling.scale_in_place(halves, "float16", 0.5, np)
    assert halves.tolist() == [0.5, 1.0]


# ---- device tensors in the core ------------------------------------------------------------------
def _meta(name: str, dtype: str, device: str, count: int = 10) -> RequestMeta:
    return RequestMeta(name, Collective.ALLREDUCE, dtype, (count,), ReduceOp.SUM, device=device)


def test_host_and_device_tensors_never_share_a_fusion_buffer() -> None:
    responses = [Response(_meta(f"t{i}", dtype, device)) for i, (dtype, device) in enumerate(
        [("float32", "cpu"), ("float32", "cuda"), ("float32", "cpu"), ("float32", "cuda"),
         ("bfloat16", "cuda"), ("bfloat16", "cpu")])]
    groups = [{r.meta.name for r in item.responses} for item in fusion.plan(responses, 1 << 20)]
    # On the host bfloat16 widens into float32's buffer; on the device it travels as itself.
    assert groups == [{"t0", "t2", "t5"}, {"t1", "t3"}, {"t4"}]
    assert responses[4].wire_nbytes == 20 and responses[5].wire_nbytes == 40


def test_ranks_that_disagree_on_device_get_an_error_naming_each_ranks_memory() -> None:
    message = find_mismatch("w", {0: _meta("w", "float32", "cpu"), 1: _meta("w", "float32", "cuda"),
                                  2: _meta("w", "float32", "cuda")})
    assert message == "Mismatched device for allreduce of tensor 'w': rank 0: cpu, rank 1: cuda, rank 2: cuda"


def _group(device_of_member: list[str]) -> list[tuple[RequestMeta, None]]:
    return [(_meta(f"g.{i}", "float32", device), None) for i, device in enumerate(device_of_member)]


def _set(rank: int, size: int) -> SimpleNamespace:
    """The parts of a communicator that the device check reads (this rank's place in a set of job ranks)."""
    return SimpleNamespace(rank=rank, size=size, process_set=SimpleNamespace(ranks=[10 + r for r in range(size)]))


def test_a_group_mixing_devices_fails_on_every_rank_whatever_the_peers_groups_hold() -> None:
    uniform = _group(["cuda", "cuda"])
    assert arguments.one_device(uniform, _set(0, 2)) is uniform
    mixed = [arguments.one_device(_group(["cpu", "cuda"]), _set(rank, 3)) for rank in range(3)]
    assert {meta.device for meta, _ in mixed[0]} == {
        "mixed ('g.0' on cpu, 'g.1' on cuda; a group's tensors must share one device) on rank 10"}
    # Every rank mixed, or only some: each member's descriptions disagree, so negotiation fails it everywhere.
    for groups in (mixed, [mixed[0], uniform, uniform], [_group(["cpu", "cpu"]), mixed[1], uniform]):
        for member in range(2):
            message = find_mismatch(f"g.{member}", {r: groups[r][member][0] for r in range(3)})
            assert message.startswith(f"Mismatched device for allreduce of tensor 'g.{member}': rank 0: "), message
            assert "'g.0' on cpu, 'g.1' on cuda" in message, message
    with pytest.raises(errors.UnsupportedOperationError,
                       match="a group mixes devices \\('g.0' on cpu, 'g.1' on cuda; a group's tensors must share"):
        arguments.one_device(_group(["cpu", "cuda", "cpu"]), _set(0, 1))  # alone: no peer waits, so raise at once


def test_a_mixed_group_that_no_peer_contradicted_is_refused_by_the_device_plane_on_every_rank() -> None:
    executor = Executor(transport=None, rank=0, size=2, choose_gpu_plane=lambda *args: pytest.fail("no plane"))
    (meta, _), _ = arguments.one_device(_group(["cpu", "cuda"]), _set(0, 2))
    item = fusion.WorkItem((Response(meta),))
    with pytest.raises(errors.UnsupportedOperationError, match=r"allreduce of \['g.0'\]: tensors on mixed \("):
        executor.run(item, {})


def test_a_device_array_is_described_with_its_device() -> None:
    array = DeviceArray(0x1000, (2, 3), ml_dtypes.bfloat16, 0, owner=None)
    meta = api.prepare_allreduce(array, "grad.x")
    assert (meta.device, meta.dtype, meta.shape) == ("cuda", "bfloat16", (2, 3))
    with pytest.raises(errors.UnsupportedOperationError, match=r"on cuda, got float32\[2, 3\] on cpu"):
        api.allreduce_prepared_async(meta, np.zeros((2, 3), np.float32))


def test_device_outputs_must_be_device_arrays_that_do_not_overlap_the_input() -> None:
    array = DeviceArray(0x1000, (4,), np.float32, 0, owner=None)
    with pytest.raises(errors.UnsupportedOperationError, match=r"same memory \(cuda\)"):
        arguments.check_outputs([np.zeros(4, np.float32)], [array], ["t"])
    with pytest.raises(errors.UnsupportedOperationError, match="overlaps its input"):
        arguments.check_outputs([DeviceArray(0x1008, (4,), np.float32, 0, owner=None)], [array], ["t"])
    arguments.check_outputs([array], [array], ["t"])  # in place: the very same array
    arguments.check_outputs([DeviceArray(0x1010, (4,), np.float32, 0, owner=None)], [array], ["t"])


def test_device_items_go_to_the_gpu_plane_chosen_once_and_never_to_the_host_path() -> None:
    seen = []

    class Chosen:
        def dispatch(self, responses, local):
            seen.append([r.meta.name for r in responses])
            return ["result"] * len(responses)

        def close(self) -> None:
            seen.append("closed")

    class HostBackend:  # the host path: only closed
        def close(self) -> None:
            seen.append("host closed")

    built = []
    executor = Executor(transport=HostBackend(), rank=0, size=1,
                        choose_gpu_plane=lambda host, item, local: built.append(host) or Chosen())
    item = fusion.WorkItem((Response(_meta("d", "float32", "cuda")),))
    assert [result for _, result, _ in executor.run(item, {})] == ["result"]
    executor.run(item, {})
    executor.close()
    assert built == [executor] and seen == [["d"], ["d"], "closed", "host closed"]
    with pytest.raises(errors.DeviceError, match="without a GPU data plane"):
        Executor(transport=None, rank=0, size=1).run(item, {})


def test_gpu_settings_are_parsed_and_checked() -> None:
    config = load_config({"HVDLITE_GPU_OPERATIONS": "mpi", "NCCL_MULTI_RANK_GPU_ENABLE": "1",
                          "HVDLITE_HIERARCHICAL_ALLREDUCE": "1"})
    assert (config.gpu_operations, config.nccl_multi_rank_gpu, config.hierarchical_allreduce) == ("MPI", True, True)
    assert load_config({}).gpu_operations == "NCCL" and not load_config({}).nccl_multi_rank_gpu
    with pytest.raises(errors.ConfigError, match="HVDLITE_GPU_OPERATIONS='GLOO' is invalid: must be NCCL or MPI"):
        load_config({"HVDLITE_GPU_OPERATIONS": "GLOO"})


# ---- pointer plumbing with cupy's host-side objects (no GPU call) -------------------------------
def test_cupy_views_address_the_right_bytes_in_the_right_storage_type() -> None:
    pytest.importorskip("cupy")
    from hvdlite.gpu.arrays import cupy_view, from_cupy

    array = DeviceArray(0x7F00_0000_1000, (4, 8), ml_dtypes.bfloat16, 0, owner="keeps-it-alive")
    view = cupy_view(array, 3, 5)
    assert (view.data.ptr, view.shape, view.dtype) == (0x7F00_0000_1000 + 6, (5,), np.dtype(np.uint16))
    assert view.data.mem._owner == "keeps-it-alive" and view.data.mem.size == array.nbytes
    with pytest.raises(ValueError, match=r"elements \[30, 35\) are outside"):
        cupy_view(array, 30, 5)
    result = from_cupy(view, "bfloat16", (5,))
    assert (result.ptr, result.dtype, result.shape, result.device_id) == (view.data.ptr, dtypes.bfloat16, (5,), 0)
    assert cupy_view(result).data.ptr == view.data.ptr and result.owner is view
    ints = cupy_view(DeviceArray(0x2000, (3,), np.int16, 1, owner=None))
    assert ints.dtype == np.int16 and ints.data.device_id == 1


def test_the_lean_in_place_path_takes_exactly_the_allreduces_that_are_one_nccl_call() -> None:
    def meta(dtype: str, op: ReduceOp = ReduceOp.SUM, pre: float = 1.0, post: float = 1.0) -> RequestMeta:
        return RequestMeta("g", Collective.ALLREDUCE, dtype, (3, 4), op, pre, post, device="cuda")

    assert in_place_launch(meta("float32"), 2) == (12, ReduceOp.SUM, 1.0)
    assert in_place_launch(meta("bfloat16", ReduceOp.AVERAGE, pre=0.5), 4) == (12, ReduceOp.SUM, 0.125)
    assert in_place_launch(meta("int32", ReduceOp.AVERAGE), 2) == (12, ReduceOp.AVERAGE, 1.0)  # ncclAvg
    assert in_place_launch(meta("int32", ReduceOp.SUM, post=2.0), 2) == ()  # scaled around NCCL
    assert in_place_launch(meta("float32", ReduceOp.MAX, pre=2.0), 2) == ()
    assert in_place_launch(meta("int16"), 2) == ()  # travels as int32
    assert in_place_launch(RequestMeta("b", Collective.BROADCAST, "float32", (3,), device="cuda"), 2) == ()
