"""The package's layout rules (ARCHITECTURE.md): meson.build installs every
module of the source folder, and no two modules import each other, even
through imports inside functions."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "blochsim"

pytestmark = pytest.mark.skipif(not (PACKAGE / "__init__.py").is_file() or not (ROOT / "meson.build").is_file(),
                                reason="needs the source folder")


def _modules():
    """{dotted name: path} of the package's Python modules."""
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def test_meson_installs_every_module_of_the_package():
    text = (ROOT / "meson.build").read_text()
    block = text[text.index("python_sources = {"):text.index("}", text.index("python_sources = {"))]
    listed = set()
    for folder, names in re.findall(r"'([\w/]+)':\s*\[([^\]]*)\]", block):
        listed.update(f"{folder}/{n}" for n in re.findall(r"'([^']+)'", names))
    present = {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*") if p.suffix in (".py", ".pxd")
               and "__pycache__" not in p.parts}
    assert present - listed == set(), f"in the package but not installed by meson.build: {sorted(present - listed)}"
    assert listed - present == set(), f"installed by meson.build but absent: {sorted(listed - present)}"


def _imports(mods):
    """{module: modules of the package it imports}, counting imports inside
    functions; a module importing its own parent package is not counted."""

    def resolve(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: set() for m in mods}
    for m, path in mods.items():
        package = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for n in names:
                r = resolve(n) if n.startswith("blochsim") else None
                if r and r != m and not m.startswith(r + "."):
                    graph[m].add(r)
    return graph


def test_no_import_cycle_even_through_function_level_imports():
    graph = _imports(_modules())
    # Tarjan's strongly connected components
    index, low, on, stack, cycles, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == [], f"modules that import each other: {cycles}"


def test_private_modules_are_grouped():
    """Private modules live in their group's package (_engine, _arrays);
    the root keeps the simulators' own bookkeeping."""
    root_private = sorted(p.name for p in PACKAGE.glob("_*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert root_private == ["_closed_form.py", "_modifiers.py", "_protocol.py"]
