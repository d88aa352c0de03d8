"""The TensorFlow job that several test files share: one job per size (together.py), so TensorFlow
starts once per rank for all of their scripts (its start is about 6 s of CPU a rank, most of a small
job's). Tests ask for it through the ``tensorflow_job`` fixture (tests/multirank/conftest.py), and
every test that does runs in the xdist group ``test_tensorflow`` (tests/conftest.py), on the worker
that ran the job. Each test checks the lines of its own script.

tf_training.py runs both of its loops, tf_api.py every API case (at np=2 also "state": it saves and
loads the model into the session's state folder); tf1_training.py disables eager execution for
good, so it goes last.
"""

from pathlib import Path

from .harness import JobResult, shared_script

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
API_CASES = ["gradients", "static_shapes", "sparse", "variables", "callbacks", "mixed_precision", "errors"]
KERAS_LOCAL_SGD_RUNS = {2: "adam:fit", 3: "sgd:eager,adam:fit"}
COLLECTIVES = "collectives.py tensorflow,tensorflow-graph"  # test_collectives.py's TensorFlow forms
# keras_diloco.py at np=3 in groups of one through model.fit (test_diloco.py; its np=4 job is its own).
KERAS_DILOCO_FIT_RUNS = "refusals,1/0,2/1/int8,2/1/bf16"
SYNTHETIC_BENCHMARK = (f"{EXAMPLES / 'tensorflow2_synthetic_benchmark.py'} --model mlp --fp16-allreduce "
                       "--num-iters 2 --num-batches-per-iter 2 --num-warmup-batches 1")
# test_tensorflow.py's scripts, test_collectives.py's TensorFlow forms, test_adasum.py's Keras optimizer, test_process_sets.py's TensorFlow sets,
# test_diloco.py's Keras DiLoCo through fit and test_elastic_frameworks.py's Keras state on a fixed world.
COMMANDS = {2: (COLLECTIVES, "tf_training.py fit,tape", "tf_api.py {api},state {state_dir}", SYNTHETIC_BENCHMARK,
                "tf_sync_batch_norm.py", "keras_partial.py", "tf_horovod_compat.py",
                f"keras_local_sgd.py {KERAS_LOCAL_SGD_RUNS[2]}", "keras_adasum_optimizer.py",
                "tf_process_sets.py dynamic", "keras_elastic_state.py", "tf1_training.py global"),
            3: (COLLECTIVES, "tf_training.py fit,tape", "tf_api.py {api} {state_dir}", "tf_sync_batch_norm.py",
                "tf_horovod_compat.py", f"keras_local_sgd.py {KERAS_LOCAL_SGD_RUNS[3]}", "keras_adasum_optimizer.py",
                "tf_process_sets.py static", f"keras_diloco.py 1 fit {KERAS_DILOCO_FIT_RUNS}", "keras_elastic_state.py",
                "tf1_training.py sets")}


def tensorflow_job(np: int, state_dir: str) -> JobResult:
    """The shared job at ``np`` ranks (run once per session, for the first test that asks)."""
    commands = [command.format(api=",".join(API_CASES), state_dir=state_dir) for command in COMMANDS[np]]
    return shared_script("together.py", np, *commands, timeout=480)
