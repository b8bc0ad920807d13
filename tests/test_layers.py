"""The layers of the source tree, read with `ast` (nothing is imported, no sockets).

1. No import cycle among the modules of node/, cluster/, bench/ and pipeline/: a cycle makes
   what a module finds at import time depend on which module was imported first. An import
   inside a function counts like one at the top; one under `if TYPE_CHECKING:` never runs
   and is left out of the cycle check.
2. Imports go down the layers only: the broker (node/) imports nothing from the cluster
   (cluster/) or the benchmarks (bench/), and the cluster nothing from the benchmarks. Here
   every import counts, `TYPE_CHECKING` ones too.
3. The broker and the cluster meet in one place: the assembly at the top of cluster/
   (cluster/assembly.py, and the `haremq` command that runs it, cluster/cli.py) is the only
   module of the cluster that imports the application (node/app.py's Node, the command's
   parts in node/); the rest of the cluster uses the broker's pieces, never the node that
   assembles them.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("node", "cluster", "bench", "pipeline")

# Which layers each layer may not import.
BELOW_OF = {"node": {"cluster", "bench"}, "cluster": {"bench"}}

# Imports that go up a layer, allowed by name: none. The `haremq` command and the assembly of a
# node sit at the top of cluster/ (cluster/cli.py, cluster/assembly.py), and the load tool
# `haremq perf` with them (cluster/perf/). Nothing goes in.
ALLOWED_UP: set[tuple[str, str]] = set()


ASSEMBLY = {"haremq.cluster.assembly", "haremq.cluster.cli"}
APPLICATION = {"haremq.node.app", "haremq.node.ctl", "haremq.node.local_cluster", "haremq.node.health"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["haremq", *parts])


def source_files() -> dict[str, Path]:
    return {module_name(path): path for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
            if ".venv" not in path.parts}


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside `if TYPE_CHECKING:` blocks (their `else:` runs)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for statement in node.body:
                inside.update(id(n) for n in ast.walk(statement))
    return inside


def _known(name: str, modules: set[str]) -> str | None:
    """The longest prefix of a dotted name that is one of `modules` (a name in a module is the module)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def imports(module: str, path: Path, modules: set[str], runtime_only: bool) -> set[str]:
    """The modules among `modules` that `module` imports: relative imports resolved,
    `from package import submodule` naming the submodule."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree) if runtime_only else set()
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            origin = ".".join(base + (node.module.split(".") if node.module else []))
            names = [f"{origin}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(target for name in names if (target := _known(name, modules)) is not None)
    found.discard(module)
    return found


def import_graph(runtime_only: bool) -> dict[str, set[str]]:
    files = source_files()
    return {module: imports(module, path, set(files), runtime_only) for module, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it with the first repeated at the end; None if there is none."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, on_path = [start], {start}
        stack = [iter(sorted(graph[start]))]
        while stack:
            following = next(stack[-1], None)
            if following is None:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif following in on_path:
                return path[path.index(following):] + [following]
            elif following not in done:
                path.append(following)
                on_path.add(following)
                stack.append(iter(sorted(graph.get(following, ()))))
    return None


def layer(module: str) -> str:
    return module.split(".")[1]


def test_no_import_cycle():
    cycle = find_cycle(import_graph(runtime_only=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_imports_go_down_the_layers_only():
    upward = sorted((module, target) for module, targets in import_graph(runtime_only=False).items()
                    for target in targets
                    if layer(target) in BELOW_OF.get(layer(module), set())
                    and (module, layer(target)) not in ALLOWED_UP)
    assert not upward, f"imports up a layer (importer, imported): {upward}"


def test_the_allow_list_holds_only_what_exists():
    """An entry of ALLOWED_UP goes once its import is gone, so the list only shrinks."""
    graph = import_graph(runtime_only=False)
    stale = {(module, up) for module, up in ALLOWED_UP if not any(layer(t) == up for t in graph.get(module, ()))}
    assert not stale, f"ALLOWED_UP names imports that no longer exist: {sorted(stale)}"


def test_only_the_assembly_imports_the_application():
    offenders = {module: sorted(targets & APPLICATION) for module, targets in import_graph(runtime_only=False).items()
                 if layer(module) == "cluster" and module not in ASSEMBLY}
    assert not {module: found for module, found in offenders.items() if found}


def test_a_cycle_is_found_and_reported():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) is None


def test_the_reader_sees_what_an_import_names():
    modules = set(source_files())
    metrics = ROOT / "node" / "management" / "metrics.py"
    found = imports("haremq.node.management.metrics", metrics, modules, runtime_only=False)
    # `from ..broker.ports import QueuePort` (relative), `from ..store import store` (in a function:
    # the submodule), and ClusterView under TYPE_CHECKING
    assert {"haremq.node.broker.ports", "haremq.node.store.store", "haremq.node.management.cluster_view"} <= found
    assert "haremq.node.management.cluster_view" not in imports(
        "haremq.node.management.metrics", metrics, modules, runtime_only=True)
