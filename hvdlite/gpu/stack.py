"""Which CUDA stack is installed: the cupy and NCCL wheels, and the CUDA each was built for.

``hvdlite[gpu]`` brings CUDA 12's wheels (``cupy-cuda12x``, ``nvidia-nccl-cu12``) and
``hvdlite[gpu-cu13]`` CUDA 13's (``cupy-cuda13x``, ``nvidia-nccl-cu13``). Both NCCL wheels put
``libnccl.so.2`` under ``nvidia/nccl/lib``, so the library is chosen here by its wheel, deliberately:
the one built for cupy's CUDA when both are installed. What does not fit together (cupy for one CUDA,
torch or NCCL for another; two cupy wheels at once) is named with the fix. Read from the installed
distributions' metadata: no GPU, driver or import of cupy needed.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
import sys

NCCL_WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12")
CUPY_WHEELS = ("cupy-cuda13x", "cupy-cuda12x")
EXTRA = {12: "hvdlite[gpu]", 13: "hvdlite[gpu-cu13]"}  # the extra that installs each CUDA's wheels


@dataclasses.dataclass(frozen=True)
class Wheel:
    """An installed distribution and the CUDA major version its name says it was built for."""

    name: str
    version: str
    cuda: int

    def __str__(self) -> str:
        return f"{self.name} {self.version} (CUDA {self.cuda})"


def cuda_of(name: str) -> int:
    """The CUDA major version in a wheel's name: ``cupy-cuda13x`` -> 13, ``nvidia-nccl-cu12`` -> 12."""
    match = re.search(r"cu(?:da)?(\d+)", name)
    if match is None:
        raise ValueError(f"{name!r} names no CUDA version")
    return int(match.group(1))


def installed(names: tuple[str, ...]) -> list[Wheel]:
    """The wheels among ``names`` that are installed, in the order given."""
    found = []
    for name in names:
        try:
            found.append(Wheel(name, importlib.metadata.version(name), cuda_of(name)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def choose_nccl(nccl: list[Wheel], cupy: list[Wheel]) -> Wheel | None:
    """The NCCL wheel to load: the one built for cupy's CUDA, else the first (newest CUDA) installed."""
    for wheel in nccl:
        if cupy and wheel.cuda == cupy[0].cuda:
            return wheel
    return nccl[0] if nccl else None


def library_in(wheel: Wheel) -> str | None:
    """The path of ``libnccl.so.2`` among the files ``wheel`` installed, if its record lists it."""
    distribution = importlib.metadata.distribution(wheel.name)
    for file in distribution.files or ():
        if file.name == "libnccl.so.2":
            return str(distribution.locate_file(file))
    return None


def mismatches(cupy: list[Wheel], nccl: list[Wheel], torch_cuda: str | None) -> list[str]:
    """What does not fit together, each with its fix (empty when nothing is wrong)."""
    problems = []
    if len(cupy) > 1:
        problems.append(f"both {cupy[0].name} and {cupy[1].name} are installed; cupy needs exactly one: "
                        f"uninstall the one that does not match your CUDA")
    torch_major = int(torch_cuda.split(".")[0]) if torch_cuda else None
    if cupy and torch_major and cupy[0].cuda != torch_major:
        problems.append(f"{cupy[0]} beside torch built for CUDA {torch_cuda}: install {EXTRA.get(torch_major, 'the')} "
                        f"wheels for CUDA {torch_major} instead")
    chosen = choose_nccl(nccl, cupy)
    if cupy and chosen and chosen.cuda != cupy[0].cuda:
        problems.append(f"NCCL comes from {chosen} but cupy from {cupy[0]}: install "
                        f"{EXTRA.get(cupy[0].cuda, 'the NCCL wheel for CUDA ' + str(cupy[0].cuda))}")
    return problems


def loaded_torch_cuda() -> str | None:
    """The CUDA version of the torch this process imported (None: no torch imported, or a CPU build)."""
    torch = sys.modules.get("torch")
    return getattr(getattr(torch, "version", None), "cuda", None)


def describe(torch_cuda: str | None) -> list[str]:
    """``hvdliterun --check-build``'s lines about the CUDA stack."""
    cupy, nccl = installed(CUPY_WHEELS), installed(NCCL_WHEELS)
    chosen = choose_nccl(nccl, cupy)
    lines = [f"torch built for CUDA {torch_cuda or '- (a CPU build, or no torch)'}",
             f"cupy: {', '.join(map(str, cupy)) or '- (install hvdlite[gpu] or hvdlite[gpu-cu13])'}",
             f"NCCL: {chosen or '-'}" + (" (loaded)" if chosen and len(nccl) > 1 else "")]
    return lines + [f"[!] {problem}" for problem in mismatches(cupy, nccl, torch_cuda)]
