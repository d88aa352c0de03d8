"""The collectives suite and the PyTorch training step across two hosts joined by a rate-limited link.

Run (root):  python bench/two_hosts.py [--rate 1gbit] [--reps 5] [--update-readme]

It makes two network-namespace "hosts" joined by a veth pair (see ``testbed/netns.py``),
shapes the link with a token bucket (``tc ... tbf rate RATE``), and runs one rank per host through
``hvdliterun -H hostA:1,hostB:1 --network-interface eth1 -x UCX_TLS=tcp,self`` (without that,
UCX would use shared memory between namespaces of one machine). It then runs, over that link:

1. ``allreduce_vs_mpi4py.py --sections sweep,mix``: the size sweep and the 220-tensor mix, hvdlite
   against raw mpi4py in the same job, interleaved.
2. ``torch_training_step.py --modes single,nocomm,mpi4py,hvdlite,sharded,local8,local8o,powersgd``: the
   training step alone, on both hosts at once with no communication (``nocomm``: what sharing this
   machine's cores costs, the ceiling of every efficiency here), hvdlite's ``DistributedOptimizer``
   against the plain mpi4py loop, and with the remedies for
   scarce bandwidth: sharded optimizer state, local SGD (K=8, plain and with overlapped
   averages) and PowerSGD (rank 4), each with the
   bytes it sends over the link per step (DDP is left out: its gloo rendezvous uses 127.0.0.1,
   which is another "host" here).

This is where fusion and negotiation cost is seen when bandwidth, not the CPU, is scarce.

``--layout hybrid`` runs ``hybrid_step.py`` instead: two ranks on each host (``-H hostA:2,hostB:2``),
synchronous averaging, PowerSGD and local SGD over all four ranks against DiLoCo (synchronous inside
a host, H=16 across hosts; one and four fragments, with and without int8), each with its step
efficiency against ``nocomm`` and the bytes on the link per step.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from readme import replace_block

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testbed.netns import IFACE, make_two_hosts, unavailable  # noqa: E402

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def run(command: list[str]) -> str:
    print("$ " + shlex.join(command), flush=True)
    proc = subprocess.run(command, env={**os.environ, **ONE_THREAD}, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"failed with exit code {proc.returncode}")
    return proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit", help="link rate for tc tbf (e.g. 1gbit, 10gbit)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16, help="timed training steps per mode per rep (a multiple of 8)")
    parser.add_argument("--modes", default="single,nocomm,mpi4py,hvdlite,sharded,local8,local8o,powersgd",
                        help="torch_training_step.py modes")
    parser.add_argument("--sections", default="sweep,mix", help="allreduce_vs_mpi4py.py sections ('' for none)")
    parser.add_argument("--update-readme", action="store_true", help="write the tables into bench/README.md")
    parser.add_argument("--layout", choices=("one", "hybrid"), default="one",
                        help="one rank per host, or two per host with hybrid_step.py's modes")
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        raise SystemExit(f"two_hosts.py needs network namespaces: {reason}")
    hvdliterun = os.path.join(os.path.dirname(sys.executable), "hvdliterun")
    with tempfile.TemporaryDirectory(prefix="two-hosts-") as workdir:
        hosts = make_two_hosts(Path(workdir))
        try:
            hosts.rate_limit(args.rate)
            if args.layout == "hybrid":
                return hybrid(hosts, args, hvdliterun)
            launch = ["-H", "hostA:1,hostB:1", "--launcher-agent", hosts.agent, "--network-interface", IFACE,
                      "-x", "UCX_TLS=tcp,self"]
            wrap = hosts.command_on("hostA", [])
            collectives = run(wrap + [hvdliterun, "-np", "2", *launch, sys.executable,
                                      str(ROOT / "bench" / "allreduce_vs_mpi4py.py"), "--sections", args.sections,
                                      "--reps", str(args.reps)]) if args.sections else ""
            training = run([sys.executable, str(ROOT / "bench" / "torch_training_step.py"),
                            "--modes", args.modes, "--reps", str(args.reps), "--steps", str(args.steps),
                            "--wrap", shlex.join(wrap), "--hvdliterun-args", shlex.join(launch)])
        finally:
            hosts.close()
    tables = "\n".join(line.removeprefix("[0]: ") for line in collectives.splitlines() if line.startswith("[0]: "))
    step = "\n".join(line for line in training.splitlines() if not line.startswith("$ "))
    text = (f"np=2, one rank per host, veth shaped to {args.rate} (tc tbf), UCX over TCP, {os.cpu_count()} cores, "
            f"{args.reps} reps, median [min-max]\n\n" + (f"{tables}\n\n" if tables else "") + f"```\n{step.strip()}\n```")
    print(text, flush=True)
    if args.update_readme:
        # Without the collectives sections only the training table is written, beside the full run's block.
        replace_block(f"two_hosts {args.rate}" + ("" if args.sections else " training"), text)


def hybrid(hosts: object, args: argparse.Namespace, hvdliterun: str) -> None:
    """Run hybrid_step.py with two ranks per host and print (and with --update-readme write) its table."""
    import json
    import statistics

    output = run(hosts.command_on("hostA", []) + [
        hvdliterun, "-np", "4", "-H", "hostA:2,hostB:2", "--launcher-agent", hosts.agent, "--network-interface",
        IFACE, "-x", "UCX_TLS=tcp,self", sys.executable, str(ROOT / "bench" / "hybrid_step.py"),
        "--reps", str(args.reps), "--steps", str(args.steps)])
    rows = [json.loads(line.split("TRAINSTEP_RESULT ", 1)[1]) for line in output.splitlines() if "TRAINSTEP_RESULT " in line]
    medians = {row["mode"]: statistics.median(row["rep_s"]) for row in rows}
    lines = [f"np=4, two ranks on each of two hosts, veth shaped to {args.rate} (tc tbf), UCX over TCP, "
             f"{os.cpu_count()} cores, {args.reps} reps, median [min-max]", "",
             "| mode | step ms | efficiency vs nocomm | link MB sent/step |", "|---|---|---|---|"]
    for row in rows:
        values = row["rep_s"]
        lines.append(f"| {row['mode']} | {medians[row['mode']] * 1e3:.1f} [{min(values) * 1e3:.1f}-"
                     f"{max(values) * 1e3:.1f}] | {medians['nocomm'] / medians[row['mode']]:.2f} | "
                     f"{row['sent'] / 1e6:.2f} |")
    text = "\n".join(lines)
    print(text, flush=True)
    if args.update_readme:
        replace_block(f"two_hosts hybrid {args.rate}", text)


if __name__ == "__main__":
    main()
