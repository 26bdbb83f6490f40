"""The package's import rule (docs/architecture.md): a module imports only from its own
layer or a lower one, and no modules import each other round a circle. Imports are read
from every module's source as installed (``import`` and ``from`` statements anywhere,
inside functions too; not those under ``if TYPE_CHECKING:``, which never run)."""

from __future__ import annotations

import ast
import importlib.util
import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import reshard

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core types", ("reshard.core", *(f"reshard.{m}" for m in (
        "errors", "choice", "dtypes", "spec", "mesh", "layout", "cluster", "bits", "casting",
        "lru", "helptext", "tables", "cliargs", "version", "packed", "darray", "gcpause", "lazy",
        "unique_ids", "presets", "kernels")))),
    ("planner", ("reshard.planner",)),
    ("data plane", ("reshard.comm",)),
    ("driver", ("reshard.runtime", "reshard.workers", "reshard.loaded_plans", "reshard.diagnosis",
                "reshard")),
    ("applications", ("reshard.adapters", "reshard.pipeline", "reshard.service",
                      "reshard.search", "reshard.model_sync", "reshard.version_gate")),
    ("test infrastructure", ("reshard.microbench.infra", "reshard.testbed")),
    ("tools", ("reshard.cli", "reshard.microbench")),
)
"""Lowest first; a module belongs to the layer of its longest listed prefix
(``reshard`` alone is the package's facade, ``reshard/__init__.py``). The core's short
paths (``reshard.errors``: the module in ``reshard/_moved/`` that makes the name
``reshard.core.errors``) are in the core's layer."""


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer (KeyError: none lists it)."""
    best = (-1, -1)
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if module == p or (p != "reshard" and module.startswith(p + ".")):
                best = max(best, (len(p), i))
    if best[1] < 0:
        raise KeyError(module)
    return best[1]


def modules() -> dict[str, Path]:
    """Every module of the installed package: ``{name: source file}``."""
    out: dict[str, Path] = {}

    def walk(name: str, folder: Path) -> None:
        for path in sorted(folder.iterdir()):
            if path.suffix == ".py" and path.stem != "__init__":
                out[f"{name}.{path.stem}"] = path
            elif path.name == "_moved":  # old paths, answered by the package's __path__
                out.update({f"{name}.{p.stem}": p for p in sorted(path.glob("*.py"))
                            if p.stem != "__init__"})
            elif path.is_dir() and (path / "__init__.py").exists():
                out[f"{name}.{path.name}"] = path / "__init__.py"
                walk(f"{name}.{path.name}", path)

    out["reshard"] = Path(reshard.__file__)
    walk("reshard", Path(reshard.__file__).parent)
    for sub in ("planner", "comm", "pipeline", "microbench"):
        spec = importlib.util.find_spec(f"reshard.{sub}")
        assert spec is not None and spec.origin is not None
        out[f"reshard.{sub}"] = Path(spec.origin)
        walk(f"reshard.{sub}", Path(spec.origin).parent)
    return out


def _runs(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node`` but those under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for other in child.orelse:
                yield other
                yield from _runs(other)
            continue
        yield child
        yield from _runs(child)


def _all(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node``, those under ``if TYPE_CHECKING:`` too."""
    return ast.walk(node)


def imports_of(name: str, path: Path, known: Mapping[str, Path],
               types_too: bool = False) -> set[str]:
    """The package's modules that ``name`` (source at ``path``) imports (with
    ``types_too``, those it imports for type checking only as well)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    nodes = _all if types_too else _runs
    for node in nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)  # and each name, in case it is a submodule
            found.update(f"{module}.{a.name}" for a in node.names)
    out = set()
    for m in found:
        while m and m not in known:
            m = m.rpartition(".")[0]
        if m and m != name:
            out.add(m)
    return out


def graph() -> dict[str, set[str]]:
    """``{module: the package's modules it imports}``."""
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def back_edges(g: Mapping[str, set[str]]) -> list[str]:
    """Imports from a lower layer to a higher one, as text."""
    return [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
            for a, targets in sorted(g.items()) for b in sorted(targets)
            if layer_of(b) > layer_of(a)]


def circles(g: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of two or more modules (Tarjan's algorithm)."""
    counter = itertools.count()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = next(counter)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def package_graph() -> dict[str, set[str]]:
    return graph()


def test_every_module_has_a_layer(package_graph):
    missing = []
    for m in package_graph:
        try:
            layer_of(m)
        except KeyError:
            missing.append(m)
    assert not missing, f"modules in no layer of LAYERS (add them): {missing}"
    assert len(package_graph) > 120  # the walk found the package, not a stub of it


def test_no_import_runs_from_a_lower_layer_to_a_higher_one(package_graph):
    bad = back_edges(package_graph)
    assert not bad, "imports against the layers (docs/architecture.md):\n" + "\n".join(bad)


def test_no_import_circles(package_graph):
    found = circles(package_graph)
    assert not found, f"modules importing each other round a circle: {found}"


def test_no_import_circles_even_for_types():
    """Imports made for type checking only close no circle either (a lower module
    names what it reads of a higher one as a protocol of its own)."""
    known = modules()
    g = {n: imports_of(n, p, known, types_too=True) for n, p in known.items()}
    found = circles(g)
    assert not found, f"modules importing each other round a circle (types included): {found}"


def test_the_checks_find_what_they_look_for(tmp_path):
    """The reader and both checks catch a planted back-edge and circle."""
    known = {"reshard.planner.a": tmp_path / "a.py", "reshard.comm.b": tmp_path / "b.py"}
    known["reshard.planner.a"].write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from reshard.runtime import Runtime\n"
        "def f():\n    from reshard.comm import b\n")
    known["reshard.comm.b"].write_text("from reshard.planner.a import f\n")
    g = {n: imports_of(n, p, known) for n, p in known.items()}
    assert g == {"reshard.planner.a": {"reshard.comm.b"}, "reshard.comm.b": {"reshard.planner.a"}}
    assert back_edges(g) == ["reshard.planner.a (planner) imports reshard.comm.b (data plane)"]
    assert circles(g) == [["reshard.comm.b", "reshard.planner.a"]]
    assert layer_of("reshard") == layer_of("reshard.runtime")
    assert layer_of("reshard.testbed") < layer_of("reshard.microbench.cli")


PLANNER_STAGES: tuple[tuple[str, ...], ...] = (
    ("reshard.planner.values",),
    ("reshard.planner.cells",),
    ("reshard.planner.schedule", "reshard.planner.costing"),
    ("reshard.planner.ir",),
    ("reshard.planner.passes",),
)
"""The planner's stages, lowest first (docs/architecture.md); the entry points
(``plan``, ``estimates``, ``share``) and the old paths' aliases sit above them all."""


def planner_stage(module: str) -> int:
    """The index in :data:`PLANNER_STAGES` of a planner module's stage (above them all
    for the entry points)."""
    for i, prefixes in enumerate(PLANNER_STAGES):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return len(PLANNER_STAGES)


def test_the_planner_stages_import_only_downwards(package_graph):
    """A planner stage imports from its own stage or a lower one: the value types know
    nothing of cells, the cells nothing of the cost model, the cost model nothing of
    the search."""
    planner = {m: t for m, t in package_graph.items() if m.startswith("reshard.planner.")}
    assert len(planner) > 30
    bad = [f"{a} imports {b}" for a, targets in sorted(planner.items()) for b in sorted(targets)
           if b.startswith("reshard.planner.") and planner_stage(b) > planner_stage(a)]
    assert not bad, "imports against the planner's stages:\n" + "\n".join(bad)


def test_task_types_come_from_one_place():
    """The plan IR's value types are imported from :mod:`reshard.planner.values.tasks`,
    not through :mod:`reshard.planner.ir` (which re-exports them for callers outside the
    package only)."""
    from reshard.planner import ir

    own = {n for n, v in vars(ir).items()
           if getattr(v, "__module__", None) == ir.__name__} | {"plan_header"}
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "reshard.planner.ir":
                found += [f"{name}: {a.name}" for a in node.names if a.name not in own]
    assert not found, "import these from reshard.planner.values.tasks:\n" + "\n".join(found)


def test_the_version_is_the_one_setup_py_installs():
    setup = (Path(__file__).parents[2] / "setup.py").read_text()
    assert f'version="{reshard.__version__}"' in setup
