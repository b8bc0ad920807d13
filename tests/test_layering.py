"""The broker and the cluster meet in one place: the assembly at the top of cluster/
(cluster/assembly.py, and the `haremq` command that runs it, cluster/cli.py) is the only
module that imports the application (node/app.py's Node, the command's parts in node/); the
rest of the cluster uses the broker's pieces, never the node that assembles them, and no
module of node/ imports the cluster (tests/test_layers.py checks every layer). Read from the
source with `ast`, so an import inside a function counts too."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASSEMBLY = {"haremq.cluster.assembly", "haremq.cluster.cli"}
APPLICATION = {"haremq.node.app", "haremq.node.ctl", "haremq.node.local_cluster", "haremq.node.health"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["haremq", *parts])


def imports(path: Path) -> set[str]:
    """Every module `path` imports, relative imports resolved (`from . import x` names x too)."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + (node.module.split(".") if node.module else []))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def sources(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts)


def test_no_module_of_node_imports_the_cluster():
    importers = {module_name(path) for path in sources("node")
                 if any(name == "haremq.cluster" or name.startswith("haremq.cluster.") for name in imports(path))}
    assert not importers, f"node/ modules importing the cluster: {sorted(importers)}"


def test_only_the_assembly_imports_the_application():
    offenders = {module_name(path): sorted(imports(path) & APPLICATION) for path in sources("cluster")}
    assert not {name: found for name, found in offenders.items() if found and name not in ASSEMBLY}


def test_relative_imports_are_resolved():
    assert "haremq.node.tasks" in imports(ROOT / "node" / "alarms.py")
    assert "haremq.node.broker.ports" in imports(ROOT / "node" / "management" / "metrics.py")
