"""Several test scripts as one job: one after another in the same rank processes.

Usage: together.py "[VAR=value ...] [--cwd=DIR] script.py [arg ...]" ...

A rank's framework import is most of a small job's CPU (TensorFlow about 6 s, torch about 2.5 s,
per rank), so scripts that need nothing of their own from the launcher share one job and start
their framework once. Each runs as ``__main__`` (runpy) with its own ``sys.argv`` and, for its run
only, the environment variables written before its name and the working directory ``--cwd`` names.
Each initialises hvdlite itself, and hvdlite is shut down after each. A script that raises ends the
job (hvdliterun stops every rank) and the ones after it do not run; each test checks the lines its
own script prints (``JobResult.command_lines``: what a rank printed between the line "together:
running COMMAND" and the next command's), and the line "together: COMMAND took N s" each finished
script adds. A script that changes process-wide state for good (TF1's ``disable_eager_execution``)
goes last.
"""

import os
import runpy
import shlex
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STARTS = "together: running "  # tests/multirank/harness.py's JobResult.command_lines reads it (imports it)


def split_command(command: str) -> tuple[dict[str, str], str, list[str]]:
    """``"A=1 B=2 script.py x y"`` -> ``({"A": "1", "B": "2"}, "script.py", ["x", "y"])``; a
    ``--cwd=DIR`` before the script comes back as ``env["--cwd"]``."""
    words = shlex.split(command)
    env = {}
    while words and "=" in words[0] and not words[0].endswith(".py"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words:
        raise ValueError(f"no script in {command!r}")
    return env, words[0], words[1:]


def run(command: str) -> None:
    env, script, args = split_command(command)
    cwd, home = env.pop("--cwd", None), os.getcwd()
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    sys.argv = [str(HERE / script), *args]  # HERE / an absolute path is that path
    try:
        os.chdir(cwd or home)
        runpy.run_path(str(HERE / script), run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise
    finally:
        os.chdir(home)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def main() -> None:
    for command in sys.argv[1:]:
        start = time.perf_counter()
        print(f"{STARTS}{command}", flush=True)  # on stdout: the lines after it are this command's
        run(command)  # a script that raises ends the job here, through hvdlite's uncaught-error abort
        # The next script starts hvdlite afresh, as in a job of its own (init on a running hvdlite
        # registers nothing: it would refuse the process sets the next script passes to it).
        if "hvdlite" in sys.modules:
            sys.modules["hvdlite"].shutdown()
        # Where a shared job's time goes, for whoever shortens the suite next.
        print(f"together: {command} took {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
