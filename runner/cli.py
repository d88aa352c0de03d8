"""``hvdliterun``: Horovod's ``horovodrun`` flags on top of MPICH's Hydra ``mpiexec``.

Every tuning flag becomes the ``HVDLITE_*`` variable the ranks read (flag > environment >
default). Bad input gets one line on stderr and exit code 2 before anything starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile

from hvdlite.settings.config import SETTING_FLAGS, Config, ConfigError, environ, load_config
from hvdlite.utils.bootstrap import with_bootstrap

from .cluster.hosts import HostError, HostSlots, first_slots, parse_hostfile, parse_hosts, total_slots
from .cluster.slurm import SlurmError, allocation_hosts, describe, in_allocation
from .command import LaunchSpec, build_mpiexec_command, flag_environment, ssh_agent_script
from .elastic.launch import ElasticLaunchError, elastic_sizes, first_hosts, publish_hosts, wants_elastic
from .elastic.service import ElasticService, service_addresses
from .environment import forwarded_names, unmatched
from .mpi_job import MpiJobError
from .mpi_job import detect as detect_mpi_job

USAGE_ERROR = 2


class LaunchError(Exception):
    """Bad launcher input; printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one clear line instead of usage + message
        raise LaunchError(message)


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def make_parser() -> argparse.ArgumentParser:
    """The ``hvdliterun`` parser: launcher options written here, one option per flagged setting from the table."""
    p = _Parser(prog="hvdliterun", description="Launch an hvdlite job on MPI.")
    p.add_argument("-np", "--num-proc", dest="num_proc", type=int, help="number of processes")
    p.add_argument("-H", "--hosts", help="hosts and slots, e.g. host1:2,host2:2 (default: all on localhost)")
    p.add_argument("--hostfile", help="file of 'host slots=N' lines")
    p.add_argument("-x", "--env", dest="env", action="append", default=[], metavar="VAR[=VALUE]",
                   help="set VAR for every rank (or check that it is set here); repeatable")
    p.add_argument("--host-discovery-script", metavar="SCRIPT",
                   help="elastic: a program printing the available 'host:slots' lines; polled every second")
    p.add_argument("--host-discovery-interval", type=_positive_seconds, default=1.0, metavar="SECONDS",
                   help="elastic: seconds between two runs of the discovery script (default 1, as Horovod's)")
    p.add_argument("--slots-per-host", type=int, default=1, metavar="N",
                   help="elastic: slots of a discovered host printed without ':slots' (default 1)")
    p.add_argument("--check-build", action="store_true", help="show available frameworks and operations")
    p.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    _add_setting_flags(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program to run on every rank")
    return p


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One option per setting that has a flag, its help the setting's own (``hvdlite.settings.config.SETTINGS``)."""
    group = parser.add_argument_group(
        "settings", "each sets the HVDLITE_* variable in brackets for every rank (flag > environment > default)")
    for setting, flag in SETTING_FLAGS:
        # argparse %-formats help text; a literal % in a setting's help must not be read as a format.
        text = f"{setting.help}{flag.note}".replace("%", "%%")
        if flag.switch is not None:
            # default None, not False: "not given" leaves the variable to the environment.
            group.add_argument(*flag.names, dest=flag.dest, action="store_true", default=None,
                               help=f"{text} [{setting.env}={flag.switch}]")
        else:
            group.add_argument(*flag.names, dest=flag.dest, type=flag.type, nargs=flag.nargs,
                               metavar=("LOW", "HIGH") if flag.nargs == 2 else None,
                               help=f"{text} [{setting.env}]")


def find_mpiexec() -> str:
    """The Hydra ``mpiexec`` of the MPI that mpi4py uses (pip's mpich installs it beside Python)."""
    beside = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    found = beside or shutil.which("mpiexec")
    if not found:
        raise LaunchError("mpiexec not found; install hvdlite with pip (it brings the mpich package)")
    return found


def _hosts(args: argparse.Namespace) -> tuple[HostSlots, ...]:
    if args.hosts and args.hostfile:
        raise LaunchError("give either -H or --hostfile, not both")
    try:
        if args.hosts:
            return tuple(parse_hosts(args.hosts))
        if args.hostfile:
            try:
                with open(args.hostfile) as handle:
                    return tuple(parse_hostfile(handle.read(), args.hostfile))
            except OSError as exc:
                raise LaunchError(f"cannot read --hostfile {args.hostfile!r}: {exc.strerror}") from None
    except HostError as exc:
        raise LaunchError(str(exc)) from None
    return ()


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _forwarded_environment(items: list[str], env: dict[str, str]) -> dict[str, str]:
    """``-x VAR=VALUE`` sets VAR; ``-x VAR`` insists VAR is set here (Hydra forwards the whole environment)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not _ENV_NAME.fullmatch(name):
            raise LaunchError(f"-x {item!r}: {name!r} is not an environment variable name")
        if sep:
            out[name] = value
        elif name not in env:
            raise LaunchError(f"-x {name}: {name} is not set in hvdliterun's environment; use -x {name}=VALUE")
    return out


def _interface_environment(iface: str) -> dict[str, str]:
    """Transport variables that keep MPI's data on ``iface`` (UCX, and libfabric's TCP provider)."""
    if not re.fullmatch(r"[A-Za-z0-9_.:@-]+", iface):
        raise LaunchError(f"--network-interface {iface!r}: give one interface name, such as eth1")
    if not os.path.exists(os.path.join("/sys/class/net", iface)):
        have = ", ".join(sorted(os.listdir("/sys/class/net"))) if os.path.isdir("/sys/class/net") else "unknown"
        raise LaunchError(f"--network-interface {iface!r} does not exist on this host (it has: {have})")
    return {"UCX_NET_DEVICES": iface, "FI_TCP_IFACE": iface}


def all_hosts_local(hosts: tuple[HostSlots, ...]) -> bool:
    """True if every host is this machine by name (as Hydra decides, by name, where to use ssh)."""
    here = {"localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()}
    return all(h.host in here for h in hosts)


def _scheduler_hosts(args: argparse.Namespace, env: dict[str, str]) -> tuple[tuple[HostSlots, ...], bool]:
    """Hosts from the scheduler hvdliterun runs under, when the user named none: (hosts, through Slurm).

    A Slurm allocation's task slots, or a Kubernetes MPI job's hostfile (whose remote-start program
    becomes the launcher agent unless one was given); the first ``-np`` slots if given.
    """
    if args.host_discovery_script:
        return (), False
    if in_allocation(env):
        try:
            hosts = allocation_hosts(env)
        except SlurmError as exc:
            raise LaunchError(f"cannot read the Slurm allocation: {exc}") from None
        return _first(hosts, args.num_proc, describe(env), "ask Slurm for more tasks (-n) or give a smaller -np"), True
    try:
        job = detect_mpi_job(env)
    except MpiJobError as exc:
        raise LaunchError(str(exc)) from None
    if job is None:
        return (), False
    if job.agent and not args.launcher_agent and not env.get("HVDLITE_LAUNCHER_AGENT"):
        args.launcher_agent = job.agent
    return _first(job.hosts, args.num_proc, job.describe(), "give a smaller -np"), False


def _first(hosts: tuple[HostSlots, ...], num_proc: int | None, what: str, advice: str) -> tuple[HostSlots, ...]:
    """The first ``num_proc`` slots of ``hosts`` (all without it); more than there are is an error."""
    if num_proc is not None and num_proc > total_slots(list(hosts)):
        raise LaunchError(f"-np {num_proc} is more than the {total_slots(list(hosts))} task slots of {what}; {advice}")
    return first_slots(hosts, num_proc) if num_proc is not None else hosts


def _resolved_agent(config: Config) -> Config:
    """``config`` with ``--launcher-agent`` as an absolute path; ssh's own flags do not go with it."""
    if not config.launcher_agent:
        return config
    if config.ssh_port or config.ssh_identity_file:
        raise LaunchError("-p/--ssh-port and -i/--ssh-identity-file are ssh options; "
                          "--launcher-agent replaces ssh, so give them to the agent instead")
    agent = shutil.which(config.launcher_agent)
    if agent is None:
        raise LaunchError(f"--launcher-agent {config.launcher_agent!r} is not an executable program")
    return dataclasses.replace(config, launcher_agent=os.path.abspath(agent))


def _elastic_environment(rank_env: dict[str, str], may_span_hosts: bool) -> dict[str, str]:
    """The variables an elastic job's ranks need on top of ``rank_env``."""
    rank_env = {**rank_env, "MPI4PY_RC_FINALIZE": "0"}  # MPI_Finalize waits for ever on a dead peer
    if may_span_hosts and "MPIR_CVAR_CH4_NETMOD" not in rank_env:
        # Across hosts UCX crashed in 7 of 48 MPI_Comm_create_group calls after a death, libfabric's
        # TCP provider in none of 28 (docs/design/elastic-mpi.md); the user's own choice wins.
        rank_env.update(MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER=rank_env.get("FI_PROVIDER", "tcp"))
    return rank_env


def _torch_mode(config: Config, rank_env: dict[str, str], named: list[str]) -> tuple[dict[str, str], list[str]]:
    """The ranks' environment and the variables that must travel, with ``--torch-backend``'s bootstrap
    leading ``PYTHONPATH`` (each rank's Python starts the mode: hvdlite.torch.distributed.torchrun)."""
    if not config.torch_backend:
        return rank_env, named
    return {**rank_env, "PYTHONPATH": with_bootstrap(rank_env.get("PYTHONPATH", ""))}, [*named, "PYTHONPATH"]


def _check_program(command: list[str]) -> None:
    if not command:
        raise LaunchError("no program given; usage: hvdliterun -np N [options] program [args ...]")
    program = command[0]
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise LaunchError(f"program {program!r} does not exist or is not executable")
    elif shutil.which(program) is None:
        raise LaunchError(f"program {program!r} not found on PATH")


def prepare(argv: list[str], env: dict[str, str]) -> tuple[LaunchSpec, dict[str, str], argparse.Namespace]:
    """Validate ``argv``; return the launch spec, the ranks' environment, and the parsed flags."""
    args = make_parser().parse_args(argv)
    if args.check_build:
        return LaunchSpec(0, ()), env, args
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    hosts = _hosts(args)
    slurm = False
    if not hosts:
        hosts, slurm = _scheduler_hosts(args, env)
        if hosts and args.num_proc is None and not wants_elastic(args):  # one rank per task slot
            args.num_proc = total_slots(list(hosts))
    if args.min_np is None and env.get("HVDLITE_ELASTIC_MIN_NP", "").isdigit():  # the variable instead of the flag
        args.min_np = int(env["HVDLITE_ELASTIC_MIN_NP"])
    elastic = wants_elastic(args)
    if elastic:
        try:
            hosts = first_hosts(args, hosts)
            args.num_proc, args.min_np = elastic_sizes(args, hosts)
        except ElasticLaunchError as exc:
            raise LaunchError(str(exc)) from None
    if args.num_proc is None:
        raise LaunchError("-np is required")
    if args.num_proc < 1:
        raise LaunchError(f"-np must be at least 1, got {args.num_proc}")
    if hosts and args.num_proc > total_slots(hosts):
        raise LaunchError(f"-np {args.num_proc} needs more processes than the {total_slots(hosts)} slots in "
                          f"{', '.join(f'{h.host}:{h.slots}' for h in hosts)}")
    _check_program(command)
    rank_env = {**env, **flag_environment(vars(args)), **_forwarded_environment(args.env, env)}
    try:
        config = load_config(rank_env)
    except ConfigError as exc:
        raise LaunchError(str(exc)) from None
    config = _resolved_agent(config)
    if config.network_interface:
        # The user's own transport settings win over the ones the interface implies.
        rank_env = {**_interface_environment(config.network_interface), **rank_env}
    if elastic:
        rank_env = _elastic_environment(rank_env, bool(args.host_discovery_script) or not all_hosts_local(hosts))
    for item in unmatched(config.env_forward, rank_env):
        print(f"hvdliterun: warning: --env-forward {item}: no such variable here; nothing forwarded for it",
              file=sys.stderr)
    rank_env, named = _torch_mode(config, rank_env, [item.partition("=")[0] for item in args.env])
    spec = LaunchSpec(args.num_proc, tuple(command), hosts, config.mpi_args, config.output_filename,
                      launcher_agent=config.launcher_agent, network_interface=config.network_interface,
                      elastic=elastic, env_forward=forwarded_names(config.env_forward, rank_env, named),
                      slurm=slurm and not config.launcher_agent)
    return spec, rank_env, args


def main(argv: list[str] | None = None) -> int:
    """Console entry point of ``hvdliterun``."""
    from . import process
    from .check_build import report

    try:
        spec, rank_env, args = prepare(sys.argv[1:] if argv is None else argv, environ())
        if args.check_build:
            print(report(environ()))
            return 0
        mpiexec = find_mpiexec()
    except LaunchError as exc:
        print(f"hvdliterun: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    config = load_config(rank_env)
    with tempfile.TemporaryDirectory(prefix="hvdliterun-") as run_dir:
        if config.ssh_port or config.ssh_identity_file:
            agent = os.path.join(run_dir, "ssh-agent.sh")
            with open(agent, "w") as handle:
                handle.write(ssh_agent_script(config.ssh_port, config.ssh_identity_file))
            os.chmod(agent, 0o755)
            spec = dataclasses.replace(spec, launcher_agent=agent)
        if spec.output_dir:
            for rank in range(spec.num_proc):
                os.makedirs(os.path.join(spec.output_dir, f"rank.{rank}"), exist_ok=True)
        argv_out = build_mpiexec_command(spec, mpiexec)
        if args.dry_run or config.verbose:
            print(shlex.join(argv_out), flush=True)
        if args.dry_run:
            return 0
        try:  # elastic: the ranks' channel to this launcher, wherever they run
            service = ElasticService(run_dir, *service_addresses(all_hosts_local(spec.hosts),
                                                                 config.network_interface)) if spec.elastic else None
        except OSError as exc:
            print(f"hvdliterun: error: cannot listen for the elastic job's ranks: {exc}", file=sys.stderr)
            return USAGE_ERROR
        poller = publish_hosts(run_dir, args, spec.hosts, spec.num_proc, spec.slurm) if spec.elastic else None
        rank_env = {**rank_env, "HVDLITE_RUN_DIR": run_dir, **(service.environment() if service else {})}
        try:
            return process.run(argv_out, rank_env, run_dir, all_hosts_local(spec.hosts),
                               spec.num_proc if spec.elastic else 0)
        finally:
            if poller is not None:
                poller.stop()
            if service is not None:
                service.stop()

if __name__ == "__main__":
    sys.exit(main())
