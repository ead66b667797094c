"""Imports point down the layers: fragc.ir < fragc.passes < fragc.runtime < the rest of fragc (algorithms, API, CLI,
sinks). Read from the source, every import statement, function-local ones included; a package's face (its
__init__.py, which re-exports) is not a layer of its own. Also: no import circle between modules."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).parent.parent / "src" / "fragc"
LAYERS = {"ir": 0, "passes": 1, "runtime": 2}
"""Subpackage -> layer; every other module of fragc is above them (layer 3)."""


def modules() -> dict[str, pathlib.Path]:
    """Module name -> file, package faces (__init__.py) left out."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            out[".".join(("fragc", *path.relative_to(PACKAGE).with_suffix("").parts))] = path
    return out


def layer(module: str) -> int:
    return LAYERS.get(module.split(".")[1], 3)


def imported(name: str, path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """The fragc modules a module imports (a `from package import name` counts as the submodule where it is one)."""
    package = name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def test_the_layers_are_found():
    names = modules()
    assert {layer(n) for n in names} == {0, 1, 2, 3}
    assert "fragc.ir.frontend" in names and "fragc.algos.ppo" in names


def test_no_import_points_up():
    upward = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets if layer(b) > layer(a))
    assert not upward, upward


def test_no_import_circle():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not circles, circles
