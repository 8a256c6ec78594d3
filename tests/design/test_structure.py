"""The codebase's shape: no import circle among toolrl's modules, counted honestly (every import: at module
level, inside functions, under `if TYPE_CHECKING:`), and no module over the size a reader takes in at once."""

import ast
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "toolrl"
MAX_LINES = 420


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every toolrl module `path` imports, wherever the import statement is."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in tree.body:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Import):
                found |= {a.name for a in sub.names if a.name.startswith("toolrl")}
            elif isinstance(sub, ast.ImportFrom):
                base = sub.module or ""
                if sub.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - sub.level + 1] + ([base] if base else [])
                    )
                if base.startswith("toolrl"):
                    found.add(base)
                    found |= {f"{base}.{a.name}" for a in sub.names}
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        edges[name] = {m for m in imports(path) if m in modules and m != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), ignoring a package's imports of its
    own submodules (a package re-exporting what it contains is not a circle)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w.startswith(v + "."):
                continue
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
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_in_toolrl():
    found = cycles(graph())
    assert found == [], f"import circles: {found}"


def test_no_module_is_longer_than_a_reader_takes_in():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these modules: {long}"
