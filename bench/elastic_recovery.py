"""Recovery from a dead rank: hvdlite's survivors re-form the job, against torchrun restarting every
worker from a checkpoint, on the same MLP (1024-wide, 3 layers, Adam), in the same run.

Run:  python bench/elastic_recovery.py [--reps 3] [--plot docs/assets/bench/elastic_recovery.png]

Each rep runs ``bench/elastic_worker.py`` twice at np=3 on this host: under
``hvdliterun -np 3 --min-np 2`` (the last rank is SIGKILLed at step 6; the two survivors keep their
processes, restore the last commit and go on), and under ``torchrun --nproc-per-node 3
--max-restarts 1`` with gloo (the same kill; torchrun restarts all three workers, which reload the
checkpoint rank 0 saved every step). It reports the seconds from the kill to the first step
completed afterwards, their ratio, and the cost of hvdlite's ``state.commit()`` per MB of state.
Four more jobs per rep measure a join: np=2 under ``--host-discovery-script``, one slot
added mid-run, from the host list's change (and from hvdliterun's publication of it, after its 1 s
poll) to the first step of the grown world, and the longest pause of rank 0's steps meanwhile: filled
by a new process started while the job trains (the default), by a new process the job waits for
(``--cold-joins``), by a warm spare (``--warm-spares 1``, the slot added once the spare is ready), and
by a warm spare with the discovery script polled every 0.2 s. Another stops (SIGSTOP)
the last rank instead of killing it: a silent rank, in no list of the dead, found at the
communication deadline (SILENT_DEADLINE s) plus the probe window; reported beyond the deadline. Then torch, Keras and
JAX recover from the same kill in the tests' shrink scripts (a small model; Keras's ``fit`` over NumPy
arrays and over a ``tf.data.Dataset``), and a process of each framework is SIGKILLed alone, timed to
its death (the floor of every recovery: no peer can see a death before the process is gone). ``--plot PATH`` draws the
first two (hvdlite's survivors against torchrun's restart) from the same run as a bar chart (needs
matplotlib: ``pip install hvdlite[bench]``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "bench" / "elastic_worker.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       # Without it the restarted gloo workers' first connect fails here ("Connection refused") and
       # torchrun gives up: lazy init connects each pair on first use.
       "TORCH_GLOO_LAZY_INIT": "1"}


SILENT_DEADLINE = 4.0  # --comm-timeout-seconds of the silent-rank job
# The join jobs: a new process started while the job trains (the default), one the job waits for
# (--cold-joins), a warm spare, and a warm spare with the discovery script polled 5 times a second.
JOIN_FLAGS = {"join": [], "cold": ["--cold-joins"], "warm": ["--warm-spares", "1"],
              "warmfast": ["--warm-spares", "1", "--host-discovery-interval", "0.2"]}
JOIN_LABELS = {"join": "a new process, started while the job trains (default)",
               "cold": "a new process, the job waiting in MPI's spawn (--cold-joins)", "warm": "--warm-spares 1 (ready)",
               "warmfast": "--warm-spares 1, --host-discovery-interval 0.2"}


def run_once(mode: str) -> dict[str, float]:
    """One job; its results directory's numbers."""
    with tempfile.TemporaryDirectory(prefix=f"elastic-{mode}-") as results:
        hvdliterun = os.path.join(os.path.dirname(sys.executable), "hvdliterun")
        if mode in ("hvdlite", "silent"):
            deadline = ["--comm-timeout-seconds", str(SILENT_DEADLINE)] if mode == "silent" else []
            command = [hvdliterun, "-np", "3", "--min-np", "2", *deadline, sys.executable, WORKER, mode, results]
        elif mode in JOIN_FLAGS:
            with open(os.path.join(results, "hosts"), "w") as handle:
                handle.write("localhost:2\n")
            command = [hvdliterun, "--min-np", "2", *JOIN_FLAGS[mode], "--host-discovery-script",
                       f"cat {results}/hosts", sys.executable, WORKER, "warm" if "--warm-spares" in JOIN_FLAGS[mode] else "join",
                       results]
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                       "--max-restarts", "1", WORKER, mode, results]
        done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise SystemExit(f"{mode} job failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return {name: json.load(open(os.path.join(results, name)))
                for name in ("recovered", "commit_ms_per_mb", "joined", "joined_after_publish", "longest_pause")
                if os.path.exists(os.path.join(results, name))}


SCRIPTS = ROOT / "tests" / "multirank" / "scripts"
# The tests' shrink scripts, and their arguments after "kill"; Keras's fit reads NumPy arrays, or a
# tf.data.Dataset as Horovod's elastic Keras example passes.
SHRINK_RUNS = {"torch": ("elastic_shrink.py",), "keras": ("keras_elastic_shrink.py",),
               "keras, fit over a tf.data.Dataset": ("keras_elastic_shrink.py", "dataset"),
               "jax": ("jax_elastic_shrink.py",)}
# What each framework's process imports before it is SIGKILLed in exit_seconds().
IMPORTS = {"torch": "import torch; torch.ones(1)", "keras": "import keras, tensorflow as tf; tf.ones(1)",
           "jax": "import jax; jax.numpy.ones(1)"}


def recovery_by_framework(run: str) -> float:
    """One of three ranks SIGKILLed in the tests' shrink script (a small model): the slower survivor's
    seconds from the kill to its first completed step."""
    hvdliterun = os.path.join(os.path.dirname(sys.executable), "hvdliterun")
    script, *args = SHRINK_RUNS[run]
    done = subprocess.run([hvdliterun, "-np", "3", "--min-np", "2", sys.executable, str(SCRIPTS / script), "kill", *args],
                          env=ENV, capture_output=True, text=True, timeout=300)
    seconds = [float(match.group(1)) for match in re.finditer(r"recovered (\S+)", done.stdout)]
    if done.returncode != 0 or len(seconds) != 2:
        raise SystemExit(f"{run} shrink failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return max(seconds)


def exit_seconds(framework: str) -> float:
    """Seconds from SIGKILL to the death of a process that imported ``framework``: no peer can see a
    death sooner (the kernel frees the process's memory first), so every recovery above includes it."""
    ready = "import time; print('ready', flush=True); time.sleep(600)"
    process = subprocess.Popen([sys.executable, "-c", f"{IMPORTS[framework]}\n{ready}"], env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    process.stdout.readline()
    start = time.perf_counter()
    process.kill()
    process.wait()
    return time.perf_counter() - start


def plot_recovery(ours: list[float], theirs: list[float], reps: int, out: str) -> None:
    """Draw the kill-to-next-step seconds of both jobs this run measured (bench/plots.py)."""
    import plots

    plots.recovery({"hvdlite\n(2 survivors re-form)": ours,
                    "torchrun --max-restarts 1\n(all 3 restart, reload checkpoint)": theirs},
                   title="One of 3 ranks SIGKILLed: seconds to the next completed step\n"
                         "(MLP 1024x3, Adam, one host, np=3 -> 2)",
                   note=f"Median of {reps} reps (each rep runs both jobs), dots reps.", out=out)


def print_joins(joins: dict[str, list[dict[str, float]]]) -> None:
    """The join table: a new process (cold) against a warm spare, from the discovery file's change and
    from hvdliterun's publication of the new list (after its 1 s poll), to the first step of 3 ranks."""
    print("\n| join 2 -> 3 under --host-discovery-script | file written -> first step at 3, s (median) | all reps "
          "| launcher published -> first step at 3, s (median) | all reps | longest pause of rank 0's steps "
          "meanwhile, s (median) | all reps |\n|---|---|---|---|---|---|---|")
    for mode, label in JOIN_LABELS.items():
        for_mode = joins[mode]
        cells = []
        for key in ("joined", "joined_after_publish", "longest_pause"):
            values = [run[key] for run in for_mode]
            cells += [f"{statistics.median(values):.3f}", ", ".join(f"{x:.3f}" for x in values)]
        print(f"| {label} | {' | '.join(cells)} |")
    for mode in ("warm", "warmfast"):
        warm = statistics.median(run["joined"] for run in joins[mode])
        print(f"{JOIN_LABELS[mode]}: target under 1 s from the change -> {'met' if warm < 1 else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--plot", metavar="PNG", help="draw hvdlite's and torchrun's recovery times into this file")
    args = parser.parse_args()
    ours, theirs, commits, silent = [], [], [], []
    joins: dict[str, list[dict[str, float]]] = {mode: [] for mode in JOIN_FLAGS}
    for _ in range(args.reps):  # interleaved, so both see the same state of the machine
        result = run_once("hvdlite")
        ours.append(result["recovered"])
        commits.append(result["commit_ms_per_mb"])
        theirs.append(run_once("torchrun")["recovered"])
        for mode in joins:
            joins[mode].append(run_once(mode))
        silent.append(run_once("silent")["recovered"] - SILENT_DEADLINE)
    hvd, torchrun = statistics.median(ours), statistics.median(theirs)
    print(f"| np=3 -> 2, MLP 1024x3, Adam | kill to next step, s (median of {args.reps}) | all reps |")
    print("|---|---|---|")
    print(f"| hvdlite (survivors re-form) | {hvd:.3f} | {', '.join(f'{x:.3f}' for x in ours)} |")
    print(f"| torchrun --max-restarts 1 (all restart, reload) | {torchrun:.3f} | {', '.join(f'{x:.3f}' for x in theirs)} |")
    print(f"\nhvdlite / torchrun: {hvd / torchrun:.3f}; target: under 2 s -> {'met' if hvd < 2 else 'NOT met'}")
    print(f"state.commit(): {statistics.median(commits):.2f} ms per MB of state (weights and Adam's moments)")
    if args.plot:
        plot_recovery(ours, theirs, args.reps, args.plot)
    by_framework = {name: [recovery_by_framework(name) for _ in range(args.reps)] for name in SHRINK_RUNS}
    exits = {name: [exit_seconds(name) for _ in range(args.reps)] for name in IMPORTS}
    print("\n| small model, np=3 -> 2 | kill to next step, s (median) | all reps |\n|---|---|---|")
    for name, values in by_framework.items():
        print(f"| {name} | {statistics.median(values):.3f} | {', '.join(f'{x:.3f}' for x in values)} |")
    print("\n| a process of the framework, SIGKILLed -> gone (no peer sees it sooner) | s (median) | all reps |"
          "\n|---|---|---|")
    for name, values in exits.items():
        print(f"| {name} | {statistics.median(values):.3f} | {', '.join(f'{x:.3f}' for x in values)} |")
    print_joins(joins)
    beyond = statistics.median(silent)
    print(f"silent rank (SIGSTOP), stop to next step beyond the {SILENT_DEADLINE:g} s deadline: median {beyond:.2f} s, "
          f"all {', '.join(f'{x:.2f}' for x in silent)}; target: within the deadline + 2 s -> "
          f"{'met' if beyond <= 2 else 'NOT met'}")


if __name__ == "__main__":
    main()
