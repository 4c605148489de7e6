"""The structure figures of apps/: how the domain apps import each other, measured with grimp.

    .venv/bin/python bench/structure.py            the figures, as text
    .venv/bin/python bench/structure.py --json     the same, as one JSON object

grimp is the graph library import-linter (the `imports` gate) is built on; the figures count what
the gate sees, at run time: imports under `if TYPE_CHECKING:` are left out, imports inside
functions count. An "import line" is one import statement of one module naming a module of
another app (grimp's import details), so two lines of one file importing two modules of an app
count two.

- pairs: of the folders under apps/, how many pairs are linked by an import either way;
- two-way app pairs: pairs of domain apps that import each other;
- up-pointing lines: over every order of the domain apps (top imports bottom), the fewest import
  lines that point up, and the order that achieves it (exact: a dynamic programme over subsets);
- module cycles: strongly connected groups of modules of apps/ (each group counted once), with
  the modules of each;
- largest modules: the ten longest files of apps/ by lines.

The domain apps are the ones the layering contract orders (pyproject.toml [tool.importlinter]);
interfaces (apps.expos, apps.dashboard) sit above them all and are not ordered here.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import Counter
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
INTERFACES = {"expos", "dashboard"}


def app_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def line_counts(graph: grimp.ImportGraph) -> Counter[tuple[str, str]]:
    """Import lines between distinct apps, keyed (importer app, imported app)."""
    lines: Counter[tuple[str, str]] = Counter()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = app_of(importer), app_of(imported)
            if a and b and a != b:
                details = graph.get_import_details(importer=importer, imported=imported)
                lines[(a, b)] += max(1, len({d["line_number"] for d in details}))
    return lines


def best_order(apps: list[str], lines: Counter[tuple[str, str]]) -> tuple[int, list[str]]:
    """The order (top first) with the fewest lines pointing up: a lower app importing a higher one.

    Minimum feedback arc set by dynamic programming over subsets: placing app x below the set S
    already placed above costs the lines x imports from S... reversed: we build from the bottom.
    best[S] = fewest up lines among the apps of S when S is the bottom of the order.
    """
    n = len(apps)
    index = {a: i for i, a in enumerate(apps)}
    # cost[x][y]: lines x -> y (x imports y).
    cost = [[0] * n for _ in range(n)]
    for (a, b), count in lines.items():
        if a in index and b in index:
            cost[index[a]][index[b]] = count
    full = (1 << n) - 1
    best = [0] + [sys.maxsize] * full
    choice = [-1] * (full + 1)
    for subset in range(1, full + 1):
        for x in range(n):
            if not subset >> x & 1:
                continue
            rest = subset & ~(1 << x)
            # x goes on top of `rest`: the lines from `rest` up into x point up.
            up = sum(cost[y][x] for y in range(n) if rest >> y & 1)
            if best[rest] + up < best[subset]:
                best[subset], choice[subset] = best[rest] + up, x
    order, subset = [], full
    while subset:
        x = choice[subset]
        order.append(apps[x])
        subset &= ~(1 << x)
    return best[full], order


def module_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups (Tarjan, iterative) of more than one module."""
    modules = sorted(graph.modules)
    succ = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = itertools.count()
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(succ[root]))]
        index[root] = low[root] = next(counter)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = next(counter)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(succ[child])))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return sorted(groups)


def figures() -> dict[str, object]:
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("apps", exclude_type_checking_imports=True, cache_dir=None)
    folders = sorted({app_of(m) for m in graph.modules if app_of(m)})
    lines = line_counts(graph)
    linked = {frozenset(pair) for pair in lines}
    domain = [a for a in folders if a not in INTERFACES]
    two_way = sorted(f"{a} <-> {b}" for a, b in itertools.combinations(domain, 2) if lines[(a, b)] and lines[(b, a)])
    domain_lines = sum(c for (a, b), c in lines.items() if a in domain and b in domain)
    up, order = best_order(domain, lines)
    position = {a: i for i, a in enumerate(order)}
    up_edges = sorted(
        f"{a} -> {b}: {c}"
        for (a, b), c in lines.items()
        if a in position and b in position and position[a] > position[b]
    )
    cycles = module_cycles(graph)
    sizes = sorted(
        (
            (sum(1 for _ in p.open()), str(p.relative_to(ROOT)))
            for p in (ROOT / "apps").rglob("*.py")
            if "migrations" not in p.parts
        ),
        reverse=True,
    )
    return {
        "folders": len(folders),
        "linked_pairs": f"{len(linked)} of {len(folders) * (len(folders) - 1) // 2}",
        "domain_apps": domain,
        "domain_import_lines": domain_lines,
        "two_way_pairs": len(two_way),
        "two_way": two_way,
        "up_lines": up,
        "best_order_top_first": order,
        "up_edges": up_edges,
        "module_cycles": len(cycles),
        "cycles": cycles,
        "largest_modules": [f"{n} {path}" for n, path in sizes[:10]],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = figures()
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"folders under apps/: {result['folders']}, linked pairs: {result['linked_pairs']}")
    print(f"domain apps: {len(result['domain_apps'])}, import lines between them: {result['domain_import_lines']}")
    print(f"two-way app pairs: {result['two_way_pairs']}")
    for pair in result["two_way"]:  # type: ignore[attr-defined]
        print(f"  {pair}")
    print(f"up-pointing lines (best order): {result['up_lines']} of {result['domain_import_lines']}")
    print(f"  best order, top first: {' > '.join(result['best_order_top_first'])}")  # type: ignore[arg-type]
    for edge in result["up_edges"]:  # type: ignore[attr-defined]
        print(f"  up: {edge}")
    print(f"module cycles: {result['module_cycles']}")
    for group in result["cycles"]:  # type: ignore[attr-defined]
        print(f"  {' , '.join(group)}")
    print("largest modules:")
    for entry in result["largest_modules"]:  # type: ignore[attr-defined]
        print(f"  {entry}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
