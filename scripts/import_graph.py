"""The shape of meshd's import graph: cycles, the largest modules, lines per package.

    PYTHONPATH=. .venv/bin/python scripts/import_graph.py [--top N]

The graph is grimp's, with every import statement in it: those under ``if TYPE_CHECKING:`` and
those inside functions count as much as the ones at the top of a module (each is still an arrow
in the design). A cycle is a strongly connected component of more than one module; each is
printed with the imports that close it. ``tests/test_lint.py`` asserts there are none.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        # Tarjan's algorithm, iteratively (the graph is deep enough to hit the recursion limit).
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
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
    return sorted(found, key=lambda c: (-len(c), c))


def closing_imports(graph: grimp.ImportGraph, component: list[str]) -> list[str]:
    """The imports between the modules of one cycle, as "importer -> imported (line N)"."""
    members = set(component)
    out = []
    for importer in component:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
            details = graph.get_import_details(importer=importer, imported=imported)
            where = ", ".join(str(d["line_number"]) for d in details)
            out.append(f"{importer} -> {imported} (line {where})")
    return out


def _module_lines() -> dict[str, int]:
    lines = {}
    for path in sorted((ROOT / "meshd").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        lines[name] = len(path.read_text(encoding="utf-8").splitlines())
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=5, help="how many of the largest modules to list")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("meshd", cache_dir=None)

    found = cycles(graph)
    print(f"import cycles (strongly connected components of > 1 module): {len(found)}")
    for component in found:
        print(f"  {len(component)} modules: {', '.join(component)}")
        for line in closing_imports(graph, component):
            print(f"    {line}")

    lines = _module_lines()
    print("\nlargest modules (lines):")
    for name, count in sorted(lines.items(), key=lambda kv: (-kv[1], kv[0]))[:args.top]:
        print(f"  {count:6d}  {name}")

    per_package: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name, count in lines.items():
        parts = name.split(".")
        package = ".".join(parts[:2]) if len(parts) > 1 else name
        per_package[package][0] += count
        per_package[package][1] += 1
    print(f"\nlines per package (modules), {sum(lines.values())} lines in {len(lines)} modules:")
    for package, (count, modules) in sorted(per_package.items(), key=lambda kv: (-kv[1][0], kv[0])):
        print(f"  {count:6d}  {package} ({modules})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
