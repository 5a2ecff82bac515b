"""The repository's import graph: layer arrows and import circles.

    python3 scripts/import_graph.py            # print the arrows; exit 1 on an upward arrow or a circle
    python3 scripts/import_graph.py --modules  # also print every module-level edge

Layers, bottom to top (an import may only point to a lower layer or inside its own package):

    0  fa4         the kernels and their launch path
    0  dashboards  the page's static files (it reads the REST API; no Python of ours)
    1  store       the results store: models, migrations, the best-config rule
    2  providers   the implementations the tuner times and the service describes
    3  tuner       3  service   (peers: neither imports the other)

Every import counts, module level or inside a function (a lazy import is still an arrow), and
``importlib.import_module("literal")`` too. bench/, scripts/ and tests/ sit above everything.
Circles are strongly connected components of the module graph inside one package.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"fa4": 0, "dashboards": 0, "store": 1, "providers": 2, "tuner": 3, "service": 3}
TOP = 9  # bench/, scripts/, tests/: consumers nothing imports
CLIENT_DIRS = ("bench", "scripts", "tests")


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for the layered packages and the client directories."""
    out = {}
    for top in (*LAYERS, *CLIENT_DIRS):
        base = root / top
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve_relative(mod: str, is_pkg: bool, level: int, target: str | None) -> str:
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([target] if target else []))


def imports_of(mod: str, path: Path, known: set[str]) -> set[str]:
    """Project modules ``mod`` imports (the deepest known module each import names)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(mod, is_pkg, node.level, node.module) if node.level else node.module
            for a in node.names:
                names.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    out = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != mod:
            out.add(name)
    return out


def layer_of(mod: str) -> int:
    return LAYERS.get(mod.split(".")[0], TOP)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module (or a self loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def analyse(root: Path = ROOT) -> dict:
    """The module graph, the package arrows, the ones that break the layers, and the circles."""
    files = module_files(root)
    known = set(files)
    graph = {mod: imports_of(mod, path, known) for mod, path in files.items()}
    arrows: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for src, targets in graph.items():
        for dst in targets:
            a, b = src.split(".")[0], dst.split(".")[0]
            if a != b:
                arrows[(a, b)].append((src, dst))
    bad_arrows = {k: v for k, v in arrows.items() if layer_of(k[0]) != TOP and layer_of(k[1]) >= layer_of(k[0])}
    # Circles within a package; across packages the layer rule already forbids them.
    circles = []
    for top in LAYERS:
        sub = {m: {t for t in ts if t.split(".")[0] == top} for m, ts in graph.items() if m.split(".")[0] == top}
        circles += strongly_connected(sub)
    return {"graph": graph, "arrows": dict(arrows), "bad_arrows": bad_arrows, "circles": circles}


def report(result: dict, modules: bool = False) -> str:
    lines = ["layers: " + "  <  ".join(
        " ".join(sorted(p for p, n in LAYERS.items() if n == lvl)) for lvl in sorted(set(LAYERS.values())))]
    for (a, b), edges in sorted(result["arrows"].items(), key=lambda kv: (-layer_of(kv[0][0]), kv[0])):
        tag = "UPWARD" if (a, b) in result["bad_arrows"] else "ok"
        if tag == "UPWARD" and layer_of(a) == layer_of(b):
            tag = "PEER"
        lines.append(f"  {a:10s} -> {b:10s} {len(edges):3d} imports  {tag}")
        if tag != "ok" or modules:
            lines += [f"      {s} -> {d}" for s, d in sorted(edges)]
    if modules:
        for src, ts in sorted(result["graph"].items()):
            for t in sorted(ts):
                if t.split(".")[0] == src.split(".")[0]:
                    lines.append(f"      {src} -> {t}")
    lines.append(f"upward or peer arrows: {sum(len(v) for v in result['bad_arrows'].values())}")
    lines.append(f"import circles: {len(result['circles'])}")
    lines += ["  circle among: " + ", ".join(c) for c in result["circles"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modules", action="store_true", help="print every module edge too")
    args = ap.parse_args(argv)
    result = analyse()
    print(report(result, args.modules))
    return 1 if result["bad_arrows"] or result["circles"] else 0


if __name__ == "__main__":
    sys.exit(main())
