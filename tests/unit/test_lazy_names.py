"""hvdlite's and hvdlite.elastic's names load on first use (hvdlite/utils/lazy_names.py), so that
hvdliterun, started for every job, imports neither NumPy nor the core."""

import ast
import importlib
import pkgutil
import subprocess
import sys

import pytest

import hvdlite
import hvdlite.elastic


def _modules_after(statement: str, prefixes: tuple[str, ...]) -> list[str]:
    code = f"import sys\n{statement}\nprint(sorted(m for m in sys.modules if m.startswith({prefixes!r})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def test_the_launcher_imports_neither_numpy_nor_the_core():
    heavy = ("numpy", "mpi4py", "hvdlite.core", "hvdlite.api", "hvdlite.common", "hvdlite.elastic.retry")
    assert _modules_after("import hvdlite.runner.cli", heavy) == []


def test_a_spark_rank_of_a_torch_fit_imports_no_pyspark():
    # The rank unpickles its training function from hvdlite.spark.torch.remote (a Spark task imports
    # pyspark, the rank it starts need not).
    assert _modules_after("import hvdlite.spark.torch.remote", ("pyspark", "pandas", "scipy")) == []
    assert "pyspark" in _modules_after("from hvdlite.spark.torch import TorchEstimator", ("pyspark",))


def test_the_first_use_of_a_name_loads_its_module():
    assert _modules_after("import hvdlite", ("numpy", "hvdlite.api")) == []
    loaded = _modules_after("import hvdlite\nhvdlite.allreduce", ("numpy", "hvdlite.api"))
    assert "numpy" in loaded and "hvdlite.api" in loaded


def test_hvd_elastic_is_there_on_a_fresh_import_as_in_horovod():
    # Scripts do `import hvdlite as hvd` and use hvd.elastic.run, hvd.elastic.ObjectState first thing.
    code = ("import hvdlite as hvd\nassert hvd.elastic.run.__module__ == 'hvdlite.elastic.retry'\n"
            "assert hvd.elastic.ObjectState.__name__ == 'ObjectState'\nprint('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize(("package", "homes"), [(hvdlite, ("hvdlite.common", "hvdlite.api", "hvdlite.core.work.request")),
                                                (hvdlite.elastic, ("hvdlite.elastic.state", "hvdlite.elastic.retry"))])
def test_every_public_name_is_its_modules_object(package, homes):
    assert package.__all__ and len(set(package.__all__)) == len(package.__all__)
    for name in package.__all__:
        owners = [module for module in map(importlib.import_module, homes) if name in vars(module)]
        assert owners and getattr(package, name) is getattr(owners[0], name), name
        assert name in dir(package)
    star: dict = {}
    exec(f"from {package.__name__} import *", star)
    assert set(package.__all__) <= set(star)


@pytest.mark.parametrize("package", [hvdlite, hvdlite.elastic])
def test_no_public_name_is_also_a_submodules_name(package):
    # Importing a submodule sets the package's attribute of its name: a public name that is also a
    # submodule's would become that module once something imports it (hvdlite.elastic.run did).
    submodules = {module.name for module in pkgutil.iter_modules(package.__path__)}
    assert sorted(set(package.__all__) & submodules) == []
    assert callable(hvdlite.elastic.run) and hvdlite.elastic.run.__module__ == "hvdlite.elastic.retry"


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="module 'hvdlite' has no attribute 'allreduc'"):
        hvdlite.allreduc  # noqa: B018 - the lookup is the test
    with pytest.raises(AttributeError, match="module 'hvdlite.elastic' has no attribute 'Stat'"):
        hvdlite.elastic.Stat  # noqa: B018
