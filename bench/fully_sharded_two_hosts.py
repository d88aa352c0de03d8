"""Hybrid sharding against full sharding, across two hosts joined by a rate-limited link.

Run (root):  python bench/fully_sharded_two_hosts.py [--rate 1gbit] [--per-host 2] [--reps 3] [--steps 3]
             [--blocks 8] [--width 1024] [--update-readme]

Two network-namespace "hosts" (``testbed/netns.py``) joined by a veth shaped to ``--rate``
(``tc ... tbf``), ``--per-host`` ranks on each (``hvdliterun -H hostA:K,hostB:K``, UCX over TCP, as
``bench/two_hosts.py``). One job runs both modes of ``bench/fully_sharded.py``'s worker, interleaved
rep by rep, on its residual ``Linear`` model with Adam:

- ``fully``: ``fully_shard`` over all 2K ranks: each unit's all-gathers and reduce-scatter cross the link;
- ``hybrid``: ``fully_shard`` within each host (``process_set``: the all-gathers stay on the host's
  shared memory) and each shard averaged across the hosts (``replicate_process_set``): per step only
  an all-reduce of each rank's 1/K of the gradients crosses the link.

Reported: each mode's step time (the slowest rank's mean; median of reps), hybrid / fully, the bytes
both hosts sent over the link per step (read from the link's counters around each mode's steps), and
the model state per rank (hybrid holds 1/K of it, fully 1/2K).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jobs import launch_worker  # noqa: E402
from torch_training_step import RANK_ENV  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from testbed.netns import IFACE, make_two_hosts, unavailable  # noqa: E402

MODES = ("fully", "hybrid")
TAG = "FULLY_SHARDED_RESULT "  # bench/fully_sharded.py's worker


def measure(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="two-hosts-") as workdir:
        hosts = make_two_hosts(Path(workdir))
        try:
            hosts.rate_limit(args.rate)
            launcher = ["-H", f"hostA:{args.per_host},hostB:{args.per_host}", "--launcher-agent", hosts.agent,
                        "--network-interface", IFACE, "-x", "UCX_TLS=tcp,self"]
            worker = ["--modes", ",".join(MODES), "--reps", str(args.reps), "--steps", str(args.steps),
                      "--warmup", "1", "--blocks", str(args.blocks), "--width", str(args.width),
                      "--count-link", IFACE]
            return launch_worker(str(ROOT / "bench" / "fully_sharded.py"), 2 * args.per_host, worker, TAG, RANK_ENV,
                                 prefix=hosts.command_on("hostA", []), launcher_args=launcher)
        finally:
            hosts.close()


def report(args: argparse.Namespace, result: dict) -> list[str]:
    params = args.blocks * (args.width * args.width + args.width)
    base = statistics.median(result["rep_s"]["fully"])
    lines = [f"Adam, {args.blocks} x residual Linear({args.width}) ({params / 1e6:.1f} M parameters), batch 8 per "
             f"rank, {args.per_host} ranks on each of two hosts (np={2 * args.per_host}), link shaped to {args.rate}, "
             f"{os.cpu_count()} cores for all ranks; {args.reps} reps x {args.steps} steps interleaved, median "
             "[min-max] of per-rep means", "",
             "| mode | step s | step / fully | MB over the link per step | model state MB per rank |",
             "|---|---|---|---|---|"]
    for mode in MODES:
        values = result["rep_s"][mode]
        link = statistics.median(result["link_bytes"][mode])
        lines.append(f"| {mode} | {statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}] | "
                     f"{statistics.median(values) / base:.2f} | {link / 1e6:.0f} | {result['state'][mode] / 1e6:.0f} |")
    print("\n" + "\n".join(lines), flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit", help="link rate for tc tbf (e.g. 1gbit, 10gbit)")
    parser.add_argument("--per-host", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--update-readme", action="store_true", help="write the table into bench/README.md")
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        raise SystemExit(f"fully_sharded_two_hosts.py needs network namespaces: {reason}")
    lines = report(args, measure(args))
    if args.update_readme:
        from readme import replace_block

        replace_block(f"fully_sharded two_hosts {args.rate}", "\n".join(lines))


if __name__ == "__main__":
    main()
