"""The benchmark plots of the documentation (docs/assets/bench/), drawn from the numbers a bench run measured.

Each bench script passes what it measured (per-rep values, in seconds) to one function here when run
with ``--plot PATH``. matplotlib (``pip install hvdlite[bench]``) is imported only when a plot is drawn,
so the scripts run without it otherwise. Every figure names the machine and the date it was measured on.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

HVDLITE, BASELINE, OTHER = "#d62728", "#4c72b0", "#8c8c8c"


def machine() -> str:
    """This machine in a few words, e.g. ``2-core x86_64, no GPU``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = "NVIDIA GPU" if os.path.exists("/dev/nvidia0") else "no GPU"
    return f"{cores}-core {platform.machine()}, {gpu}"


def caption(note: str) -> str:
    """The line under every figure: the machine, today's date (UTC, the day of the run) and ``note``."""
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return f"{machine()}, measured {today} (UTC). {note}".strip()


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, imported on first use."""
    try:
        import matplotlib
    except ImportError as exc:
        raise SystemExit("--plot needs matplotlib: pip install hvdlite[bench]") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, note: str, out: str) -> None:
    """Put the caption under ``fig`` (wrapped to its width) and write it to ``out`` (its directory made if missing)."""
    lines = textwrap.wrap(caption(note), width=int(fig.get_figwidth() * 15))
    fig.text(0.5, 0.01, "\n".join(lines), ha="center", va="bottom", fontsize=8, color="#444444")
    fig.tight_layout(rect=(0, 0.03 + 0.03 * len(lines), 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out)
    _pyplot().close(fig)
    print(f"wrote {out}", flush=True)


def _spread(values: Sequence[float], scale: float) -> tuple[float, float, float]:
    """Median, and its distance to the minimum and the maximum, each times ``scale``."""
    median = statistics.median(values) * scale
    return median, median - min(values) * scale, max(values) * scale - median


def _size_label(nbytes: int) -> str:
    """4 B, 16 KB, 64 MB."""
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _size_lines(ax: Any, sizes: Sequence[int], series: dict[str, tuple[list[list[float]], str]],
                value: Callable[[int, float], float]) -> None:
    """One line with min-max bars per series on ``ax``; ``value(nbytes, seconds)`` turns a time into what is plotted."""
    for name, (reps, colour) in series.items():
        points = [_spread([value(n, t) for t in per_size], 1.0) for n, per_size in zip(sizes, reps, strict=True)]
        medians = [p[0] for p in points]
        errors = [[p[1] for p in points], [p[2] for p in points]]
        ax.errorbar(sizes, medians, yerr=errors, label=name, color=colour, marker="o", ms=4, capsize=3)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(sizes))
    ax.set_xticklabels([_size_label(n) for n in sizes], fontsize=7, rotation=45)
    ax.set_xlabel("message size (float32)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)


def allreduce_sweep(sizes: Sequence[int], hvdlite: list[list[float]], mpi4py: list[list[float]], nranks: int,
                    title: str, note: str, out: str) -> None:
    """Latency (log-log) and bus bandwidth against message size, hvdlite and mpi4py.

    ``hvdlite[i]`` and ``mpi4py[i]`` are the per-rep seconds per call at ``sizes[i]`` bytes; busbw is
    nccl-tests' allreduce figure, bytes / time x 2(n-1)/n.
    """
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6), dpi=110)
    series = {"hvdlite allreduce": (hvdlite, HVDLITE), "mpi4py Allreduce": (mpi4py, BASELINE)}
    _size_lines(left, sizes, series, lambda n, t: t * 1e6)
    left.set_yscale("log")
    left.set_ylabel("latency, us per call (log)")
    left.set_title("latency", fontsize=10)
    factor = 2 * (nranks - 1) / nranks
    _size_lines(right, sizes, series, lambda n, t: n / t / 1e9 * factor)
    right.set_ylabel("bus bandwidth, GB/s")
    right.set_title(f"bus bandwidth (bytes / time x 2(n-1)/n, n={nranks})", fontsize=10)
    fig.suptitle(title, fontsize=11)
    _save(fig, note, out)


def _bars(ax: Any, labels: Sequence[str], reps: Sequence[Sequence[float]], colours: Sequence[str],
          scale: float, fmt: str) -> None:
    """Bars of the medians with min-max whiskers, each rep a dot, the median written above its bar."""
    for index, (values, colour) in enumerate(zip(reps, colours, strict=True)):
        median, low, high = _spread(values, scale)
        ax.bar(index, median, yerr=[[low], [high]], color=colour, capsize=4, width=0.6)
        ax.plot([index] * len(values), [v * scale for v in values], "k.", ms=4)
        ax.annotate(fmt.format(median), (index, median + high), textcoords="offset points", xytext=(0, 4),
                    ha="center", fontsize=8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def training_step(modes: dict[str, list[float]], single: list[float] | None, title: str, note: str,
                  out: str) -> None:
    """Step time per mode (bars: median, whiskers: min-max of the per-rep seconds in ``modes``).

    ``single``: the per-rep step of one rank alone in the same job, drawn as a dashed line.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.6), dpi=110)
    colours = [HVDLITE if name.startswith("hvdlite") else BASELINE if name.startswith("DDP") else OTHER
               for name in modes]
    _bars(ax, list(modes), list(modes.values()), colours, 1e3, "{:.1f} ms")
    if single:
        ax.axhline(statistics.median(single) * 1e3, color="k", ls="--", lw=1,
                   label=f"one rank alone: {statistics.median(single) * 1e3:.1f} ms")
        ax.legend(fontsize=8, loc="upper left")
    ax.set_ylabel("step time, ms (lower is better)")
    ax.set_title(title, fontsize=10)
    _save(fig, note, out)


def recovery(modes: dict[str, list[float]], title: str, note: str, out: str) -> None:
    """Seconds from the kill to the first step after it, per way of recovering (median bar, each rep a dot)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.6), dpi=110)
    colours = [HVDLITE if name.startswith("hvdlite") else BASELINE for name in modes]
    _bars(ax, list(modes), list(modes.values()), colours, 1.0, "{:.3f} s")
    ax.set_ylabel("kill to next completed step, s (lower is better)")
    ax.set_title(title, fontsize=10)
    _save(fig, note, out)
