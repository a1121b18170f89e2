"""Package-level import graph of `autotune/`, read from the source with `ast` (nothing is imported).

A node is a subpackage (`trials`, `costmodel`, ...) or a top-level module (`search`, `specs`, ...); an edge
A -> B means some module of A imports some module of B, at any depth (function-local imports count: they
are still arrows between layers). Imports under `if TYPE_CHECKING:` only name types for annotations and
never run, so they are listed apart and left out of the graph. Cycles are the strongly connected
components with more than one node. `autotune/__main__.py` is the CLI's entry point and counts as `cli`.

    python benchmarks/import_graph.py [--root DIR/autotune]   # edges, then cycles
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "autotune"


def _node(module: str) -> str | None:
    """`autotune.trials.runner` -> `trials`; `autotune.search` -> `search`; non-autotune -> None."""
    parts = module.split(".")
    if parts[0] != "autotune":
        return None
    if len(parts) == 1:
        return "autotune"
    return "cli" if parts[1] == "__main__" else parts[1]


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_only(tree: ast.AST) -> set[ast.AST]:
    """Import statements under ``if TYPE_CHECKING:``."""
    found: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                found.update(n for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return found


def _imported(tree: ast.AST, module: str, is_package: bool, *, type_only: bool = False) -> Iterable[str]:
    """Absolute names of the modules one file imports at run time (or, with ``type_only``, only for
    annotations); relative imports resolved."""
    package = module if is_package else module.rpartition(".")[0]
    skipped = _type_only(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and (node in skipped) is not type_only:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)


def module_imports(root: Path = ROOT, *, type_only: bool = False) -> dict[str, set[str]]:
    """Every autotune module -> the autotune modules (or names in them) it imports."""
    paths = sorted(root.rglob("*.py"))
    modules = {_module_name(path, root) for path in paths}
    graph = {}
    for path in paths:
        module = _module_name(path, root)
        tree = ast.parse(path.read_text(), filename=str(path))
        names = _imported(tree, module, path.name == "__init__.py", type_only=type_only)
        graph[module] = {_owner(name, modules) for name in names if name.split(".")[0] == "autotune"}
    return graph


def _owner(name: str, modules: set[str]) -> str:
    """The module that defines ``name`` (``autotune.__version__`` -> ``autotune``)."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def package_graph(root: Path = ROOT, *, type_only: bool = False) -> dict[str, set[str]]:
    """Node -> the other nodes it imports (self-edges dropped)."""
    edges: dict[str, set[str]] = {}
    for module, names in module_imports(root, type_only=type_only).items():
        src = _node(module)
        assert src is not None
        targets = {_node(name) for name in names}
        edges.setdefault(src, set()).update(t for t in targets if t and t not in (src, "autotune"))
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found, key=lambda c: (-len(c), c))


def importers_of(target: str, root: Path = ROOT) -> list[str]:
    """Modules outside node `target` that import it (e.g. who imports `cli`)."""
    return sorted(
        module
        for module, names in module_imports(root).items()
        if _node(module) != target and any(_node(name) == target for name in names)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the autotune package directory")
    root = parser.parse_args().root.resolve()
    sys.setrecursionlimit(10_000)
    edges = package_graph(root)
    for src in sorted(edges):
        print(f"{src} -> {', '.join(sorted(edges[src])) or '(nothing)'}")
    found = cycles(edges)
    typed = {src: dsts for src, dsts in package_graph(root, type_only=True).items() if dsts}
    print("\ntype-only (if TYPE_CHECKING) edges, left out:")
    for src in sorted(typed):
        print(f"  {src} -> {', '.join(sorted(typed[src]))}")
    print(f"\ncycles between packages: {len(found)}")
    for component in found:
        print("  " + " <-> ".join(component))
    print(f"modules outside cli importing autotune.cli: {importers_of('cli', root) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
