import subprocess
import sys

import numpy as np
import pytest

from hvdlite.core.work.naming import NameGenerator, clashing_names, group_member_names
from hvdlite.errors import UnsupportedOperationError
from hvdlite.ops import Collective, ReduceOp, resolve_op


def test_generated_names_are_counted_per_collective():
    names = NameGenerator()
    assert names.next(Collective.ALLREDUCE) == "allreduce.noname.1"
    assert names.next(Collective.ALLGATHER) == "allgather.noname.1"
    assert names.next(Collective.ALLREDUCE) == "allreduce.noname.2"
    assert names.resolve("grad.w", Collective.ALLREDUCE) == "grad.w"
    with pytest.raises(ValueError, match="non-empty string"):
        names.resolve("", Collective.ALLREDUCE)


def test_two_generators_agree():
    a, b = NameGenerator(), NameGenerator()
    calls = [Collective.ALLREDUCE, Collective.BROADCAST, Collective.ALLREDUCE]
    assert [a.next(c) for c in calls] == [b.next(c) for c in calls]


def test_group_member_names():
    assert group_member_names("g", 3) == ["g.0", "g.1", "g.2"]


def test_clashing_names_are_those_in_flight_or_repeated():
    assert clashing_names(["a", "b"], {"c"}) == []
    assert clashing_names(["b", "a"], {"a", "b", "c"}) == ["a", "b"]
    assert clashing_names(["a", "b", "a"], set()) == ["a"]
    assert clashing_names(["a", "a", "x"], {"x"}) == ["a", "x"]
    assert clashing_names([], {"a"}) == []


def test_resolve_op():
    assert resolve_op(None) is ReduceOp.AVERAGE
    assert resolve_op(None, average=False) is ReduceOp.SUM
    assert resolve_op(ReduceOp.MAX) is ReduceOp.MAX
    assert resolve_op(4) is ReduceOp.MAX  # Horovod scripts may pass the plain integer
    assert resolve_op(ReduceOp.SUM, average=None) is ReduceOp.SUM
    with pytest.raises(ValueError, match="not both"):
        resolve_op(ReduceOp.SUM, average=True)
    assert resolve_op(ReduceOp.ADASUM) is ReduceOp.ADASUM and resolve_op(2) is ReduceOp.ADASUM
    with pytest.raises(ValueError, match="unknown reduction op 42"):
        resolve_op(42)


def test_dtype_names_come_from_the_table_and_reject_byte_swapped_arrays():
    import ml_dtypes  # noqa: I001

    from hvdlite.utils import dtypes
    from hvdlite.errors import UnsupportedOperationError

    for name, dtype in dtypes.SUPPORTED.items():
        assert dtypes.dtype_name(np.zeros(1, dtype), "t") == name
    assert dtypes.dtype_name(np.zeros(1, ml_dtypes.bfloat16), "t") == "bfloat16"
    assert [n for n in dtypes.SUPPORTED if dtypes.is_floating(n)] == ["float16", "bfloat16", "float32", "float64"]
    assert dtypes.wire_dtype("bfloat16") == np.float32 and dtypes.WIRE_NAME["bool"] == "uint8"
    with pytest.raises(UnsupportedOperationError, match="'swapped' has dtype >f4 in non-native byte order"):
        dtypes.dtype_name(np.zeros(2, ">f4"), "swapped")


def test_ml_dtypes_loads_only_when_bfloat16_is_first_used():
    # Its import costs about 0.9 s of CPU in every rank; a torch job without bfloat16 never needs it.
    script = ("import sys, numpy as np, torch, hvdlite.torch\n"
              "from hvdlite.torch.collectives import tensors\n"
              "from hvdlite.utils import dtypes\n"
              "assert 'ml_dtypes' not in sys.modules, 'imported with hvdlite'\n"
              "assert dtypes.NUMPY_DTYPE['float32'] == np.float32 and 'ml_dtypes' not in sys.modules\n"
              "array = tensors.to_numpy(torch.ones(3, dtype=torch.bfloat16))\n"
              "assert dtypes.dtype_name(array, 't') == 'bfloat16' and dtypes.NAME_OF.get(array.dtype) == 'bfloat16'\n"
              "print('ok', 'ml_dtypes' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert result.stdout.strip() == "ok True", result.stdout + result.stderr


def test_a_bfloat16_array_made_elsewhere_is_named_at_its_first_lookup():
    import ml_dtypes

    from hvdlite.utils import dtypes

    name_of = dtypes._NameOf({np.dtype(np.float32): "float32"})
    assert name_of.get(np.dtype(ml_dtypes.bfloat16)) is None  # dict's own get, at C speed: not looked up
    assert name_of[np.dtype(ml_dtypes.bfloat16)] == "bfloat16"
    with pytest.raises(KeyError):
        name_of[np.dtype(np.complex64)]
    by_name = dtypes._ByName({"float32": np.dtype(np.float32)})
    assert by_name["bfloat16"] == np.dtype(ml_dtypes.bfloat16) and dtypes.NUMPY_DTYPE["bfloat16"] == by_name["bfloat16"]
    with pytest.raises(KeyError):
        by_name["complex64"]


def test_integer_scale_factors_are_accepted_on_the_host_and_on_a_gpu_but_not_for_bool():
    from hvdlite.utils import dtypes

    dtypes.check_reduction("int32", ReduceOp.SUM, 0.5, 2.0, "t")  # scaled as Horovod does (any device)
    with pytest.raises(UnsupportedOperationError, match="'t': prescale_factor/postscale_factor need a numeric "
                                                        "tensor, got bool"):
        dtypes.check_reduction("bool", ReduceOp.SUM, 1.0, 2.0, "t")
