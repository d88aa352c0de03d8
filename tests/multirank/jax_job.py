"""The JAX job that several test files share: one job per size (together.py), so JAX and optax start
once per rank for all of their scripts. Tests ask for it through the ``jax_job`` fixture
(tests/multirank/conftest.py), and every test that does runs in the xdist group ``test_jax``
(tests/conftest.py), on the worker that ran the job. Each test checks the lines of its own script.
The job runs on JAX's CPU backend (``JAX_PLATFORMS=cpu``): the GPU's runs are tests/gpu's.
"""

import dataclasses
from pathlib import Path

from .harness import JobResult, shared_script

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jax_train.py"
TRAINING = ["host", "jit", "chain", "multisteps", "accumulate", "accumulate-jit"]
API = ["pytrees", "errors", "state", "sharding", "optimizer_options"]
# The runs of jax_local_sgd.py ("KIND MODE [sets]") and jax_sharded.py ("KIND MODE") by size.
LOCAL_SGD = {2: [("sgd", "jit"), ("adam", "eager"), ("sgd", "eager", "sets")],
             3: [("adam", "jit"), ("sgd", "eager"), ("adam", "jit", "sets")]}
SHARDED = {2: [("adam", "eager")], 3: [("adam", "jit"), ("sgd", "jit")]}
COLLECTIVES = "collectives.py jax,jax-jit"  # test_collectives.py's JAX forms
ADASUM = "jax_adasum_optimizer.py"  # test_adasum.py's optax optimizer
ELASTIC_STATE = "jax_elastic_state.py"  # test_elastic_frameworks.py's JAX state on a fixed world
EXAMPLE_COMMAND = f"{EXAMPLE} --epochs 2 --checkpoint {{state_dir}}/ckpt.npz"  # at np=2


def commands(np: int, state_dir: str) -> list[str]:
    """test_jax.py's scripts (and at np=2 the example), then the other files' scripts."""
    return [f"jax_training.py {','.join(TRAINING)}", f"jax_api.py {','.join(API)}",
            *(f"jax_local_sgd.py {' '.join(run)}" for run in LOCAL_SGD[np]),
            *(f"jax_sharded.py {' '.join(run)}" for run in SHARDED[np]), "jax_powersgd.py eager,jit",
            COLLECTIVES, ADASUM, ELASTIC_STATE, *([EXAMPLE_COMMAND.format(state_dir=state_dir)] if np == 2 else [])]


@dataclasses.dataclass(frozen=True)
class JaxJobs:
    """``jobs(np)``: the shared job at ``np`` ranks (run once per session, for the first test that
    asks); ``state_dir``: the folder its scripts save into."""

    state_dir: str

    def __call__(self, np: int) -> JobResult:
        return shared_script("together.py", np, *commands(np, self.state_dir), env={"JAX_PLATFORMS": "cpu"},
                             timeout=300)
