"""The package's imports form no circle.

Every ``import``/``from … import`` in every module of ``gauge_audit`` is read with :mod:`ast` —
module-level ones and those inside functions alike (a function-level import that closes a circle
only hides it until the function runs) — and resolved to the modules it loads.  The graph is then
searched for strongly connected components; any with more than one module (or a module importing
itself) is a circle, named in the failure.

Edges:  ``import a.b.c`` → ``a.b.c``;  ``from P import x`` → ``P.x`` where that is a module of the
package, else ``P`` (its ``__init__``, which defines ``x``).  The implicit import of a module's
parent packages is not an edge: every module has it, and it only forms a circle through an
explicit import that this graph already holds.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "python" / "gauge_audit"


def package_modules(root: Path) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` file under the package directory ``root``."""
    mods = {}
    for f in sorted(root.rglob("*.py")):
        parts = list(f.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = f
    return mods


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package → the package modules its import statements load."""
    mods = package_modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                src = _resolve_relative(mod, is_package, node.level, node.module) if node.level else node.module or ""
                targets = [f"{src}.{alias.name}" if f"{src}.{alias.name}" in mods else src for alias in node.names]
            else:
                continue
            for t in targets:
                # `import a.b.c` loads a.b.c (and its parents, not counted; see the docstring).
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and (t in mods) and t.split(".")[0] == root.name:
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph``: its strongly connected components with more than one module, or one
    module importing itself (Tarjan's algorithm, iterative so that deep packages cannot overflow
    the stack), each sorted, listed in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1 or node in graph.get(node, ()):
                    found.append(sorted(comp))
    return sorted(found)


def _describe(graph: dict[str, set[str]], comp: list[str]) -> str:
    inside = set(comp)
    edges = [f"{a} → {b}" for a in comp for b in sorted(graph[a]) if b in inside]
    return f"{{{', '.join(comp)}}}: {'; '.join(edges)}"


def test_package_has_no_import_circle():
    graph = import_graph(PACKAGE_ROOT)
    assert len(graph) > 50, f"only {len(graph)} modules found under {PACKAGE_ROOT}"  # the walk found the package
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n".join(_describe(graph, c) for c in found)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        f = root / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text, encoding="utf-8")


def test_detects_a_function_level_circle(tmp_path):
    """A synthetic package whose circle closes only through a function-level relative import,
    plus one through ``from pkg.sub import name`` (resolved to the package, then its module)."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from . import b\n",
            "pkg/b.py": "def f():\n    from .c import g\n    return g\n",
            "pkg/c.py": "import pkg.a\n",
            "pkg/sub/__init__.py": "from .x import name\n",
            "pkg/sub/x.py": "def h():\n    from pkg.sub import name\n",
            "pkg/clean.py": "import os\nfrom . import a\nfrom .sub import x\n",
        },
    )
    graph = import_graph(tmp_path / "pkg")
    assert graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    found = cycles(graph)
    assert found == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.sub", "pkg.sub.x"]], found


def test_acyclic_package_passes(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .a import f\n",
            "pkg/a.py": "from .b import g\nfrom ..pkg import b as _b\n",
            "pkg/b.py": "import sys\ndef g():\n    import pkg.c\n",
            "pkg/c.py": "",
        },
    )
    graph = import_graph(tmp_path / "pkg")
    assert graph["pkg"] == {"pkg.a"} and graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"}
    assert cycles(graph) == []


def test_self_import_is_a_circle(tmp_path):
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "def f():\n    from . import a\n"})
    assert cycles(import_graph(tmp_path / "pkg")) == [["pkg.a"]]


if __name__ == "__main__":  # list the circles: python tests/test_imports.py
    g = import_graph(PACKAGE_ROOT)
    cs = cycles(g)
    print("\n".join(_describe(g, c) for c in cs) or "no import circles")
    sys.exit(1 if cs else 0)


def test_sympy_cache_is_sized_for_the_symbolic_checkers_unless_set():
    """Importing the package sizes SymPy's expression cache before SymPy is first imported (20 000
    entries, not SymPy's 1000: the symbolic checkers rebuild the same identities for every candidate
    rule); a size the user set is kept."""
    import os
    import subprocess

    code = "import gauge_audit, sympy.core.cache as c; print(c.SYMPY_CACHE_SIZE)"
    env = {k: v for k, v in os.environ.items() if k != "SYMPY_CACHE_SIZE"}
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT.parent), env.get("PYTHONPATH", "")])
    sizes = []
    for given in (None, "500"):
        run_env = env if given is None else {**env, "SYMPY_CACHE_SIZE": given}
        p = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        sizes.append(int(p.stdout))
    assert sizes == [20000, 500]
