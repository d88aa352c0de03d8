"""hvdliterun's elastic mode: which flags turn it on, the first host list, and publishing the list to the ranks."""

from __future__ import annotations

import argparse
import os

from hvdlite.elastic.hosts import HOSTS_FILE, write_hosts_file

from ..cluster.hosts import DiscoveryError, HostSlots, total_slots
from ..cluster.slurm import usable_nodes
from .discovery import DiscoveryPoller, discover, published


class ElasticLaunchError(ValueError):
    """An elastic flag that cannot be used; the message says which and why."""


def wants_elastic(args: argparse.Namespace) -> bool:
    """Horovod's rule: any of --min-np, --max-np, --host-discovery-script makes the job elastic."""
    return bool(args.min_np or args.max_np or args.host_discovery_script)


def first_hosts(args: argparse.Namespace, hosts: tuple[HostSlots, ...]) -> tuple[HostSlots, ...]:
    """The hosts to launch on: the discovery script's first answer, or ``hosts`` (-H / --hostfile)."""
    if not args.host_discovery_script:
        return hosts
    if hosts:
        raise ElasticLaunchError("give either -H/--hostfile or --host-discovery-script, not both")
    try:
        found = tuple(discover(args.host_discovery_script, args.slots_per_host))
    except DiscoveryError as exc:
        raise ElasticLaunchError(str(exc)) from None
    if not found:
        raise ElasticLaunchError(f"--host-discovery-script {args.host_discovery_script!r} printed no hosts")
    return found


def elastic_sizes(args: argparse.Namespace, hosts: tuple[HostSlots, ...]) -> tuple[int, int]:
    """(-np, --min-np) of an elastic job: -np defaults to the slots found (up to --max-np), --min-np to -np."""
    num_proc = args.num_proc
    if num_proc is None and hosts:
        num_proc = min(total_slots(list(hosts)), args.max_np or total_slots(list(hosts)))
    if num_proc is None:
        raise ElasticLaunchError("-np is required")
    min_np = args.min_np or num_proc
    if args.max_np and args.max_np < num_proc:
        raise ElasticLaunchError(f"--max-np {args.max_np} is less than -np {num_proc}")
    if min_np > num_proc:
        raise ElasticLaunchError(f"--min-np {min_np} is more than -np {num_proc}")
    return num_proc, min_np


def publish_hosts(run_dir: str, args: argparse.Namespace, hosts: tuple[HostSlots, ...],
                  num_proc: int, slurm: bool = False) -> DiscoveryPoller | None:
    """Write the ranks' host list; keep it current (the caller stops the poller) with a discovery
    script, or in a Slurm allocation, whose drained or down nodes leave the list."""
    path = os.path.join(run_dir, HOSTS_FILE)
    if args.host_discovery_script:
        script, slots = args.host_discovery_script, args.slots_per_host
        return DiscoveryPoller(lambda: discover(script, slots), path, list(hosts), args.host_discovery_interval)
    if slurm:
        return DiscoveryPoller(lambda: usable_nodes(hosts), path, list(hosts))
    write_hosts_file(path, published(list(hosts) or [HostSlots("localhost", num_proc)]), discovery=False)
    return None
