"""memstream's import graph: imports between its top-level packages, and import cycles.

    python scripts/import_graph.py           # the counts (the closing notes quote them)
    python scripts/import_graph.py --check   # exit 1 if any import cycle exists

Packages: contract, core, topics, memory, jobs, streams, web, sealing, client, consumer, ops,
dev, and
"top" for the modules directly under memstream (cli, worker). The layer contracts themselves are
import-linter's (pyproject.toml, ``lint-imports``); this adds the cycle check among modules
(two modules of one package importing each other is no layer violation, still a cycle).
"""

from __future__ import annotations

import argparse
import collections
import sys

import grimp

PACKAGES = {"contract", "core", "topics", "memory", "jobs", "streams", "web", "client",
            "consumer", "ops", "dev", "sealing"}


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in PACKAGES else "top"


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 on any import cycle")
    args = ap.parse_args(argv)
    graph = grimp.build_graph("memstream", include_external_packages=False)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    arrows = collections.Counter((package(a), package(b)) for a, bs in edges.items()
                                 for b in bs if package(a) != package(b))
    print(f"modules {len(edges)}, imports {sum(map(len, edges.values()))}")
    print(f"imports between packages: {sum(arrows.values())} over {len(arrows)} package pairs")
    for (a, b), n in sorted(arrows.items()):
        print(f"  {a} -> {b}: {n}")
    both = sorted({tuple(sorted(p)) for p in arrows if (p[1], p[0]) in arrows})
    print(f"package pairs importing each other: {len(both)} {both if both else ''}")
    found = cycles(edges)
    print(f"module import cycles: {len(found)}")
    for comp in found:
        print(f"  {' <-> '.join(comp)}")
    return 1 if args.check and (found or both) else 0


if __name__ == "__main__":
    sys.exit(main())
