"""The house rules that the tree itself can check: no import cycle between modules nor between
folders, a top level that is only the public face, short functions, one place that reads the
environment (STYLE.md; issues #33 and #45)."""

import ast
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"hvdlite": ROOT / "hvdlite", "hvdlite.runner": ROOT / "runner"}  # runner/ installs as hvdlite.runner
MAX_FUNCTION_LINES = 50
MAX_TOP_LEVEL_MODULES = 10


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """Imports under ``if TYPE_CHECKING:`` cost nothing at run time: they are free."""
    free = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            free.update(id(inner) for inner in ast.walk(node))
    return free


def _imported(module: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    """The project modules ``node`` imports (``from pkg import mod`` names the module, else the package)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    targets = {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
    return {target for target in targets if target in modules}


def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    """Every import of every module, also those inside functions; ``TYPE_CHECKING`` imports are left
    out unless ``type_only`` (a layer that names an upper one's types still depends on it)."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        free = set() if type_only else _type_checking_nodes(tree)
        graph[module] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in free:
                graph[module] |= _imported(module, path, node, modules) - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = counter[0]
                    counter[0] += 1
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_cycles_are_found_in_a_graph_that_has_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_count_and_type_checking_ones_do_not(tmp_path):
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n"
                     "def f():\n    from .c import x\n")
    modules = {"p.a": tmp_path / "a.py", "p.b": tmp_path / "b.py", "p.c": tmp_path / "c.py"}
    free = _type_checking_nodes(tree)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and id(node) not in free:
            imported |= _imported("p.a", modules["p.a"], node, modules)
    assert imported == {"p.c"}


def test_the_package_has_no_import_cycle_even_for_types():
    # A module that names an upper one's types under TYPE_CHECKING still depends on it: the lower one
    # says what it uses as a Protocol instead (core.planes.device's ExecutorView, core.pipeline.lone's
    # PipelineView, torch.fully_sharded.param's Holder).
    graph = import_graph(type_only=True)
    assert "hvdlite.core.runtime" in graph and "hvdlite.elastic.joining" in graph["hvdlite.lifecycle"]
    assert cycles(graph) == [], "import cycles (a lower layer imports an upper one)"


def folder_graph(graph: dict[str, set[str]], modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """``graph`` with every module replaced by its folder (a subpackage, ``__init__`` included).

    A module at ``hvdlite/``'s top level stays a node of its own: the top level is the public face,
    not a layer, and a folder may use a top-level module that uses nothing of that folder (errors,
    ops). A folder and a module that import each other, in any direction, are a cycle.
    """
    modules = modules or _modules()

    def node(module: str) -> str:
        path = modules[module]
        if path.parent == PACKAGES["hvdlite"]:
            return module
        return module if path.name == "__init__.py" else module.rsplit(".", 1)[0]

    return merged(graph, node)


def merged(graph: dict[str, set[str]], node: Callable[[str], str]) -> dict[str, set[str]]:
    """``graph`` with every module replaced by ``node(module)``, without edges from a node to itself."""
    nodes: dict[str, set[str]] = {}
    for module, targets in graph.items():
        nodes.setdefault(node(module), set()).update(node(t) for t in targets)
    return {name: targets - {name} for name, targets in nodes.items()}


def test_folder_graph_merges_a_folder_and_keeps_top_level_modules():
    graph = {"hvdlite.api": {"hvdlite.core.engine"}, "hvdlite.core.engine": {"hvdlite.core.work.request"},
             "hvdlite.core.work.request": {"hvdlite.errors"}, "hvdlite.errors": set()}
    modules = {name: PACKAGES["hvdlite"].joinpath(*name.split(".")[1:]).with_suffix(".py") for name in graph}
    folders = folder_graph(graph, modules)
    assert folders == {"hvdlite.api": {"hvdlite.core"}, "hvdlite.core": {"hvdlite.core.work"},
                       "hvdlite.core.work": {"hvdlite.errors"}, "hvdlite.errors": set()}
    assert cycles({**folders, "hvdlite.errors": {"hvdlite.core.work"}}) == [["hvdlite.core.work", "hvdlite.errors"]]


def test_no_two_folders_import_each_other():
    folders = folder_graph(import_graph())
    assert "hvdlite.core.pipeline" in folders["hvdlite.core"], "the core's engine runs the pipeline"
    assert cycles(folders) == [], "folders that import each other (move what both need below both)"


def subpackage_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with every module replaced by its top-level subpackage, subfolders included
    (``hvdlite.core.work.request`` -> ``hvdlite.core``); top-level modules stay nodes of their own."""
    modules = _modules()

    def node(module: str) -> str:
        for package, folder in PACKAGES.items():
            if modules[module].is_relative_to(folder):
                parts = modules[module].relative_to(folder).parts
                return module if len(parts) == 1 else f"{package}.{parts[0]}"
        return module

    return merged(graph, node)


def test_subpackage_graph_merges_subfolders():
    graph = {"hvdlite.core.work.request": {"hvdlite.errors"}, "hvdlite.gpu.arrays": {"hvdlite.core.work.request"},
             "hvdlite.core.arguments": {"hvdlite.gpu.arrays"}, "hvdlite.errors": set()}
    packages = subpackage_graph(graph)
    assert packages["hvdlite.core"] == {"hvdlite.errors", "hvdlite.gpu"} and packages["hvdlite.gpu"] == {"hvdlite.core"}
    assert cycles(packages) == [["hvdlite.core", "hvdlite.gpu"]]


def test_no_two_subpackages_import_each_other_even_for_types():
    # core/ and gpu/ with all their subfolders are one layer each: "each folder imports only folders below it"
    packages = subpackage_graph(import_graph(type_only=True))
    assert "hvdlite.gpu" in packages["hvdlite.core"], "the core's device plane runs on gpu/"
    assert cycles(packages) == [], "subpackages that import each other (move what both need below both)"


def bench_graph() -> dict[str, set[str]]:
    """Which ``bench/`` scripts import which (by bare name: they run as scripts, their folder on the path)."""
    paths = {path.stem: path for path in (ROOT / "bench").glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                graph[name] |= {alias.name for alias in node.names if alias.name in paths}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module in paths:
                graph[name].add(node.module)
    return graph


def test_no_import_cycle_among_the_benchmarks():
    graph = bench_graph()
    assert "stage_timers" in graph["small_op_breakdown_gpu"], "the breakdowns share their timers"
    assert cycles(graph) == [], "benchmarks that import each other (move what both need into a helper)"


def test_the_top_level_is_the_public_face():
    top = sorted(path.stem for path in PACKAGES["hvdlite"].glob("*.py"))
    assert "api" in top and "errors" in top
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at hvdlite/'s top level: {top}"


def test_no_function_is_over_50_lines():
    long = []
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_only_the_settings_module_touches_the_environment():
    readers = []
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv", "environb"):
                if isinstance(node.value, ast.Name) and node.value.id == "os":
                    readers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module == "os":
                readers += [f"{path.relative_to(ROOT)}:{node.lineno}" for alias in node.names
                            if alias.name in ("environ", "getenv")]
    assert readers and all(reader.startswith("hvdlite/settings/config.py:") for reader in readers), readers


SHARED_ROOMS = {"collectives", "gradients", "slow_links", "sharded"}  # docs/how-it-works.md, "Inside an adapter"
OWN_ROOMS = {"torch": {"distributed", "fully_sharded", "bootstrap"}, "tensorflow": {"keras"}, "jax": set()}
MAX_ADAPTER_TOP_LEVEL_MODULES = 8


def test_every_adapter_keeps_its_modules_in_the_same_rooms():
    for adapter, own in OWN_ROOMS.items():
        folder = PACKAGES["hvdlite"] / adapter
        rooms = {path.name for path in folder.iterdir() if path.is_dir() and path.name != "__pycache__"}
        assert rooms - own <= SHARED_ROOMS, f"hvdlite/{adapter}/ has rooms the others lack: {rooms - own - SHARED_ROOMS}"
        assert {"collectives", "gradients", "slow_links"} <= rooms, f"hvdlite/{adapter}/ lacks a shared room"
        top = sorted(path.stem for path in folder.glob("*.py"))
        assert "optimizer" in top, "DistributedOptimizer picks among the rooms, so it sits above them"
        assert len(top) <= MAX_ADAPTER_TOP_LEVEL_MODULES, f"{len(top)} modules at hvdlite/{adapter}/'s top level: {top}"
