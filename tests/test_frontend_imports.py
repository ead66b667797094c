"""The frontend's own files import at their top, and src/fragc/ir/sweep.py never imports the frontend that builds on it (the
cycle src/fragc/ir/frontend.py <-> src/fragc/ir/sweep.py hid behind a function-local import; issue 42). Read from the source, so that
an import inside a function counts too."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).parent.parent
FRONTEND_FILES = ["src/fragc/ir/frontend.py", "src/fragc/ir/graph_builder.py", "src/fragc/ir/types.py", "src/fragc/ir/sweep.py", "src/fragc/ir/traps.py",
                  "src/fragc/ir/replicas.py"]


def imports(path):
    """Every import statement of a file, with whether it is at the module's top level."""
    tree = ast.parse((ROOT / path).read_text())
    top = {id(node) for node in tree.body}
    return [(node, id(node) in top) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def names(node):
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return [f"{'.' * node.level}{node.module or ''}.{a.name}" for a in node.names]


@pytest.mark.parametrize("path", FRONTEND_FILES)
def test_imports_are_at_the_top(path):
    inside = [f"{path}:{node.lineno}" for node, at_top in imports(path) if not at_top]
    assert not inside, f"imports inside functions: {inside}"


def test_sweep_does_not_import_the_frontend():
    imported = [name for node, _ in imports("src/fragc/ir/sweep.py") for name in names(node)]
    assert not [name for name in imported if "frontend" in name], imported
