"""The "hvdlite" torch.distributed backend against gloo, call by call, in one job.

Usage: torch_conformance.py [SEED]

Every rank starts hvdlite's default group and, over the same ranks, gloo groups of the same shape:
the world; ``head`` (ranks 0 and 1) and ``tail`` (every rank but 0: non-zero ``group_src`` /
``group_dst``, and at np=3 a group overlapping ``head``, the two used alternately); and the groups
of ``new_subgroups_by_enumeration``. Each case of conformance_cases.py runs on each group kind it
names, first on hvdlite's group and then on gloo's, from the same seeded inputs; what it returns
(tensors, lists, objects, futures' values, ranks) or the built-in type of what it raised must be
equal. The cases run in an order shuffled by SEED (the same on every rank; printed), so calls of
every kind follow each other in many orders; the error cases run last, in a fixed order.

Cases marked ``hvdlite_only`` are where hvdlite deliberately differs: gloo aborts the process,
hangs, or is wrong; they check hvdlite's side against what the case computes.

Prints 'MISMATCH <case> on <group>: ...' for each difference and 'conformance: N checks, M mismatches'.
"""

import random
import sys
import traceback

import torch
import torch.distributed as dist

import hvdlite.torch as hvd

torch.set_num_threads(1)
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from conformance_cases import CASES, ERROR_CASES, Ctx  # noqa: E402


def groups(rank, size):
    """{kind: (hvdlite group, gloo group, its job ranks)}; every rank makes every group, in one order."""
    made = {"world": (None, dist.new_group(backend="gloo"), list(range(size)))}
    for kind, ranks in (("head", [0, 1]), ("tail", list(range(1, size)))):
        made[kind] = (dist.new_group(ranks), dist.new_group(ranks, backend="gloo"), ranks)
    parts = [[0, 2], [1]] if size == 3 else [[0], [1]]
    mine = next(p for p in parts if rank in p)
    ours, _ = dist.new_subgroups_by_enumeration(parts)
    theirs, _ = dist.new_subgroups_by_enumeration(parts, backend="gloo")
    made["enum"] = (ours, theirs, mine)
    return made


def outcome(call):
    """("ok", value) or ("raised", the exception's type, its message)."""
    try:
        return ("ok", call())
    except Exception as error:  # noqa: BLE001 - compared with the other backend's
        return ("raised", type(error), f"{type(error).__name__}: {error}"[:400])


def builtin(error_type):
    """The built-in exception type ``error_type`` derives from first (torch's DistBackendError: RuntimeError)."""
    return next(t for t in error_type.__mro__ if t.__module__ == "builtins")


def differences(ours, theirs, where="value"):
    """Where ``ours`` and ``theirs`` differ (a list of sentences; empty if equal)."""
    if isinstance(theirs, torch.Tensor):
        if not isinstance(ours, torch.Tensor):
            return [f"{where}: hvdlite {type(ours).__name__}, gloo a tensor"]
        if theirs.is_sparse:
            ours, theirs = ours.coalesce().to_dense(), theirs.coalesce().to_dense()
        if ours.dtype != theirs.dtype or ours.shape != theirs.shape or not torch.equal(ours, theirs):
            return [f"{where}: hvdlite {ours} != gloo {theirs}"]
        return []
    if isinstance(theirs, (list, tuple)):
        if not isinstance(ours, (list, tuple)) or len(ours) != len(theirs):
            return [f"{where}: hvdlite {ours!r} != gloo {theirs!r}"]
        return [d for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) for d in differences(a, b, f"{where}[{i}]")]
    if isinstance(theirs, dict):
        if not isinstance(ours, dict) or set(ours) != set(theirs):
            return [f"{where}: hvdlite {ours!r} != gloo {theirs!r}"]
        return [d for k in theirs for d in differences(ours[k], theirs[k], f"{where}[{k!r}]")]
    return [] if ours == theirs else [f"{where}: hvdlite {ours!r} != gloo {theirs!r}"]


def compare(ours, theirs):
    """Equal values, or errors alike: hvdlite's is an instance of the built-in type gloo's derives from."""
    if ours[0] == theirs[0] == "raised" and issubclass(ours[1], builtin(theirs[1])):
        return []
    if ours[0] == "raised" or theirs[0] == "raised":
        return [f"hvdlite {ours[0]} {ours[-1]!r}, gloo {theirs[0]} {theirs[-1]!r}"]
    return differences(ours[1], theirs[1])


def run_case(case, made, rank, seed):
    """The case on every group kind it names; the differences found, as lines."""
    found = []
    for kind in case.groups:
        ours, theirs, ranks = made[kind]
        if rank not in ranks and not case.non_members:
            continue
        contexts = [Ctx(ours, ranks, rank, "hvdlite", seed)] + ([] if case.hvdlite_only else
                                                                   [Ctx(theirs, ranks, rank, "gloo", seed)])
        results = [outcome(lambda ctx=ctx: case.fn(ctx)) for ctx in contexts]
        if case.hvdlite_only:
            problems = [] if results[0][0] == "ok" else [f"hvdlite raised {results[0][2]}"]
        else:
            problems = compare(*results)
        found += [f"MISMATCH {case.name} on {kind}: {p}" for p in problems]
    return found


def main():
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    hvd.init()
    dist.init_process_group("hvdlite")
    rank, size = dist.get_rank(), dist.get_world_size()
    made = groups(rank, size)
    order = list(CASES)
    random.Random(seed).shuffle(order)
    print(f"conformance: seed {seed}, {len(order)} cases then {len(ERROR_CASES)} error cases", flush=True)
    checks, mismatches = 0, []
    for index, case in enumerate(order + list(ERROR_CASES)):
        try:
            mismatches += run_case(case, made, rank, seed * 100003 + index)
        except Exception:  # noqa: BLE001 - a case's own failure is a mismatch, not the end
            mismatches.append(f"MISMATCH {case.name}: the case failed: {traceback.format_exc()}")
        checks += len(case.groups)
        dist.barrier(made["world"][1])  # gloo's: no case's calls run into the next one's
    for line in mismatches:
        print(line, flush=True)
    print(f"conformance: {checks} checks, {len(mismatches)} mismatches", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
