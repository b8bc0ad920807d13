"""The broker and the cluster meet in one place: node/cli.py, the application's assembly, is
the only module in node/ that imports the cluster, and the cluster never imports the
application (it uses the broker's pieces, never the node that assembles them). Read from
the source with `ast`, so an import inside a function counts too."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASSEMBLY = {"haremq.node.cli"}
APPLICATION = {"haremq.node.app", "haremq.node.cli", "haremq.node.ctl", "haremq.node.local_cluster"}


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


def test_only_the_assembly_in_node_imports_the_cluster():
    importers = {module_name(path) for path in sources("node")
                 if any(name == "haremq.cluster" or name.startswith("haremq.cluster.") for name in imports(path))}
    assert importers <= ASSEMBLY, f"node/ modules importing the cluster: {sorted(importers - ASSEMBLY)}"


def test_the_cluster_never_imports_the_application():
    offenders = {module_name(path): sorted(imports(path) & APPLICATION) for path in sources("cluster")}
    assert not {name: found for name, found in offenders.items() if found}


def test_relative_imports_are_resolved():
    assert "haremq.node.tasks" in imports(ROOT / "node" / "alarms.py")
    assert "haremq.node.broker.ports" in imports(ROOT / "node" / "management" / "metrics.py")
