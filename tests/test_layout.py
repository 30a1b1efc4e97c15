"""The package's layout rules: no import cycle, in-package imports at the top of modules.

The import graph is read from the source (AST), so a cycle hidden in a function-level import is
found as well. Only ``forcedweight.cli`` may import the library inside functions (each command
loads what it runs, so ``forcedweight --help`` answers without importing torch).
"""

from __future__ import annotations

import ast
from pathlib import Path

import forcedweight

ROOT = Path(forcedweight.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The package module an imported name lives in (``a.b.c`` → ``a.b.c`` or ``a.b``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(path: Path, modname: str, modules: dict[str, Path]):
    """Yield ``(target_module, top_level)`` for every in-package import of a module."""
    tree = ast.parse(path.read_text())
    package = modname if path.name == "__init__.py" else modname.rpartition(".")[0]
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for n in names:
            if n.startswith("forcedweight"):
                target = _resolve(n, modules)
                if target and target != modname:
                    yield target, id(node) in top


def _graph():
    modules = _modules()
    return modules, {m: {t for t, _ in _imports(p, m, modules)} for m, p in modules.items()}


def test_no_import_cycle():
    modules, graph = _graph()
    # a package's __init__ re-exporting its submodules is not a cycle with them
    edges = {m: {t for t in ts if not (m.startswith(t + ".") and modules[t].name == "__init__.py")}
             for m, ts in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)


def test_a_cycle_is_detected(tmp_path, monkeypatch):
    """The walker itself: a function-level import that closes a cycle is found."""
    modules = {"forcedweight.a": tmp_path / "a.py", "forcedweight.b": tmp_path / "b.py"}
    modules["forcedweight.a"].write_text("from forcedweight.b import f\n")
    modules["forcedweight.b"].write_text("def f():\n    from forcedweight.a import g\n")
    targets = {m: {t for t, _ in _imports(p, m, modules)} for m, p in modules.items()}
    assert targets == {"forcedweight.a": {"forcedweight.b"}, "forcedweight.b": {"forcedweight.a"}}


def test_in_package_imports_are_at_the_top():
    modules = _modules()
    late = []
    for m, p in modules.items():
        if m.startswith("forcedweight.cli"):
            continue
        late += [f"{m} imports {t} inside a function" for t, top in _imports(p, m, modules) if not top]
    assert not late, "\n".join(late)
