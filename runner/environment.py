"""Which of hvdliterun's environment variables travel to the ranks on other hosts (``--env-forward``).

Hydra sends forwarded variables, values included, over its control connection to every host's
proxy, in clear text. ``all`` (Horovod's and Hydra's default) sends the whole environment, secrets
included; ``none`` sends only what the job needs to run as hvdlite (:data:`ALWAYS`, every
``HVDLITE_*`` variable and Horovod's ``HOROVOD_*`` names for them) and what ``-x`` names; a list of names (``NAME`` or ``PREFIX*``) adds those.
Ranks on hvdliterun's own host start from its environment whatever the policy: nothing travels.
Pure functions: the caller passes the environment in; ``hvdlite.settings.config`` parses the policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Set by hvdliterun for the ranks, or transport settings every rank must share for MPI to connect.
ALWAYS = ("MPI4PY_RC_FINALIZE", "UCX_NET_DEVICES", "UCX_TLS", "FI_TCP_IFACE", "FI_PROVIDER",
          "MPIR_CVAR_CH4_NETMOD")
# Set by hvdliterun after the command is built (its run directory, the elastic control channel).
LAUNCHER_SET = ("HVDLITE_RUN_DIR", "HVDLITE_ELASTIC_SERVICE", "HVDLITE_ELASTIC_TOKEN")


def forwarded_names(policy: str, env: Mapping[str, str], named: Iterable[str]) -> tuple[str, ...] | None:
    """The variables to send to other hosts under ``policy`` (``None``: all of them).

    ``named``: the variables ``-x`` set or insisted on; they always travel.
    """
    if policy == "all":
        return None
    patterns = [] if policy == "none" else policy.split(",")
    chosen = {name for name in env if name.startswith(("HVDLITE_", "HOROVOD_")) or name in ALWAYS
              or _matches(name, patterns)}
    return tuple(sorted(chosen | set(named) | set(LAUNCHER_SET)))


def unmatched(policy: str, env: Mapping[str, str]) -> list[str]:
    """The names and patterns of a list ``policy`` that match nothing in ``env`` (to say so, not to refuse)."""
    if policy in ("all", "none"):
        return []
    return [item for item in policy.split(",") if not any(_matches(name, [item]) for name in env)]


def _matches(name: str, patterns: list[str]) -> bool:
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)
