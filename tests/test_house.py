"""The house rules of engine/ and app/, read from the code's import statements (nothing is imported or run):

- no import circles and no private name (`_x`) imported from another module (the project owner's tool,
  ../shared/tools/import_cycles.py, beside the checkout on developers' machines and in CI);
- no Python file over MAX_LINES lines;
- an import inside a function defers an optional heavy dependency (DEFERRABLE) and says so in a comment
  ("deferred: ...") between the `def` line and the import; every other import sits at the top of its file.
"""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "app")
TOOL = ROOT.parent / "shared" / "tools" / "import_cycles.py"
MAX_LINES = 650
# Optional or platform-bound modules an import may wait for until a function needs them.
DEFERRABLE = {"cupy", "cupyx", "cupy_backends", "torch", "triton", "playwright", "ray", "music21", "scipy", "flashrnn", "fcntl", "msvcrt"}


def python_files():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "node_modules" not in path.parts:
                yield path


def load_tool():
    if not TOOL.is_file():
        pytest.skip(f"{TOOL} is not beside this checkout (it comes with the project's shared/ folder)")
    spec = importlib.util.spec_from_file_location("import_cycles", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_no_import_circles_and_no_private_imports():
    tool = load_tool()
    modules = tool.modules(str(ROOT), ["engine", "app", "presets"])
    graph, private = tool.edges(modules)
    circles = tool.circles(graph, sorted(modules))
    assert not circles, "import circles: " + "; ".join(", ".join(c) for c in circles)
    assert not private, "private names imported across modules: " + "; ".join(private)


def test_no_long_files():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in python_files()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert not long, f"files over {MAX_LINES} lines (split them on their seams): {long}"


def function_imports(tree: ast.Module):
    """(function, import node) for every import inside a function body, nested functions included once."""
    seen = set()
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in seen:
                    seen.add(id(node))
                    yield function, node


def imported_roots(node) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name.split(".")[0] for alias in node.names]
    return ["." if node.level else (node.module or "").split(".")[0]]


def test_imports_inside_functions_only_defer_heavy_dependencies():
    wrong, silent = [], []
    for path in python_files():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for function, node in function_imports(ast.parse(text, str(path))):
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            roots = imported_roots(node)
            if not set(roots) <= DEFERRABLE:
                wrong.append(f"{where} ({', '.join(roots)})")
            elif not any("deferred" in line for line in lines[function.lineno - 1:node.lineno]):
                silent.append(where)
    assert not wrong, f"imports inside functions that belong at the top of the file: {wrong}"
    assert not silent, f"deferred imports without a '# deferred: <why>' comment: {silent}"


def test_the_rules_can_fail(tmp_path):
    """The checks above find what they look for: a circle, a private import, a late import of the project."""
    tool = load_tool()
    package = tmp_path / "engine"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from engine.b import _hidden\n")
    (package / "b.py").write_text("def f():\n    from engine import a\n_hidden = 1\n")
    modules = tool.modules(str(tmp_path), ["engine"])
    graph, private = tool.edges(modules)
    assert tool.circles(graph, sorted(modules)) == [["engine.a", "engine.b"]]
    assert private == ["engine.a imports private _hidden from engine.b"]
    function, node = next(function_imports(ast.parse((package / "b.py").read_text())))
    assert imported_roots(node) == ["engine"] and function.name == "f"


def test_every_benchmark_script_is_in_the_benchmarks_readme():
    """benchmarks/README.md is where a reader finds what each script measures and where its results went: a new
    probe or suite script gets its row there."""
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh"))
    missing = [name for name in scripts if f"`{name}`" not in readme]
    assert not missing, f"benchmarks/README.md has no row for {missing}; hint: add one to its table"
