"""The TensorFlow job that several test files share: one job per size (together.py), so TensorFlow
starts once per rank for all of their scripts (its start is about 6 s of CPU a rank, most of a small
job's). Tests ask for it through the ``tensorflow_job`` fixture (tests/multirank/conftest.py), and
every test that does runs in the xdist group ``test_tensorflow`` (tests/conftest.py), on the worker
that ran the job. Each test checks the lines of its own script.

tf_training.py runs both of its loops, tf_api.py every API case (at np=2 also "state": it saves and
loads the model into the session's state folder); the Keras example goes first, as in a process of its
own (no other script's Keras settings reach it), and tf1_training.py last: it disables eager
execution for good.
"""

import dataclasses
from pathlib import Path

from .harness import JobResult, shared_jobs_in_order

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
API_CASES = ["gradients", "static_shapes", "sparse", "variables", "callbacks", "mixed_precision", "errors"]
KERAS_LOCAL_SGD_RUNS = {2: "adam:fit", 3: "sgd:eager,adam:fit"}
COLLECTIVES = "collectives.py tensorflow,tensorflow-graph"  # test_collectives.py's TensorFlow forms
# The Keras example: one epoch at np=2, then resumed from its checkpoint for a second at np=3.
KERAS_EXAMPLE = {np: f"{EXAMPLES / 'keras_train.py'} --epochs {np - 1} --checkpoint-dir {{state_dir}}/keras_example"
                 for np in (2, 3)}
# keras_diloco.py at np=3 in groups of one through model.fit (test_diloco.py; its np=4 job is its own).
KERAS_DILOCO_FIT_RUNS = "refusals,1/0,2/1/int8,2/1/bf16"
SYNTHETIC_BENCHMARK = (f"{EXAMPLES / 'tensorflow2_synthetic_benchmark.py'} --model mlp --fp16-allreduce "
                       "--num-iters 2 --num-batches-per-iter 2 --num-warmup-batches 1")
# test_tensorflow.py's scripts and example, test_collectives.py's TensorFlow forms, test_adasum.py's
# Keras optimizer, test_process_sets.py's TensorFlow sets, test_diloco.py's Keras DiLoCo through fit
# and test_elastic_frameworks.py's Keras state on a fixed world.
COMMANDS = {2: (KERAS_EXAMPLE[2], COLLECTIVES, "tf_training.py fit,tape", "tf_api.py {api},state {state_dir}",
                SYNTHETIC_BENCHMARK, "tf_sync_batch_norm.py", "keras_partial.py", "tf_horovod_compat.py",
                f"keras_local_sgd.py {KERAS_LOCAL_SGD_RUNS[2]}", "keras_adasum_optimizer.py",
                "tf_process_sets.py dynamic", "keras_elastic_state.py", "tf1_training.py global"),
            3: (KERAS_EXAMPLE[3], COLLECTIVES, "tf_training.py fit,tape", "tf_api.py {api} {state_dir}",
                "tf_sync_batch_norm.py", "tf_horovod_compat.py", f"keras_local_sgd.py {KERAS_LOCAL_SGD_RUNS[3]}",
                "keras_adasum_optimizer.py", "tf_process_sets.py static",
                f"keras_diloco.py 1 fit {KERAS_DILOCO_FIT_RUNS}", "keras_elastic_state.py", "tf1_training.py sets")}


def tensorflow_job(np: int, state_dir: str) -> JobResult:
    """The shared job at ``np`` ranks (run once per session, for the first test that asks). The np=3
    job resumes the Keras example from the checkpoint the np=2 job saved: asking for it runs np=2 first."""
    jobs = [(size, [command.format(api=",".join(API_CASES), state_dir=state_dir) for command in COMMANDS[size]])
            for size in (2, 3)]
    return shared_jobs_in_order(jobs, [2, 3].index(np), timeout=480)


@dataclasses.dataclass(frozen=True)
class TensorFlowJobs:
    """``jobs(np)``: the shared job at ``np`` ranks; ``state_dir``: the folder its scripts save into."""

    state_dir: str

    def __call__(self, np: int) -> JobResult:
        return tensorflow_job(np, self.state_dir)
