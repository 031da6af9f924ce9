"""The package's layout: its imports form a DAG, data flows one way through its layers, no module is too long.

Every ``.py`` file under ``spectral_optax/`` is parsed with ``ast``; every import in it (at module level and
inside functions, ``import x.y``, ``from x import y`` where ``y`` may be a submodule, relative imports) that names
a module of the package is an edge. The implicit edge from a module to the packages above it (importing
``spectral_optax._geometry.types`` runs ``spectral_optax/_geometry/__init__.py`` first) is not one: a package's
``__init__`` that imports its own submodules is the normal case, and Python finishes it in any order.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "spectral_optax"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
MAX_LINES = 600

#: The layers, lowest first: a module may import only from its own layer or a lower one. Keyed by the module name
#: below the package, the longest key that is the name or a package above it deciding (``_geometry`` holds for
#: ``spectral_optax._geometry.resolve``; the package root is ``spectral_optax``). Geometry -> dual maps -> the
#: distributed plan -> transforms -> named optimizers; the public modules beside one another above them; the
#: root's public API above those; ``nn`` and ``lab`` on top.
RANKS = {
    # the lowest package: mesh and layout helpers and the symmetric psum; imports nothing of the package
    "_mesh": -2,
    # helpers over it
    "_numerics": -1,  # overflow-safe norms, power iteration (reads the auto axes from _mesh)
    "_callables": -1,  # signature checks of user callables
    # what a parameter is
    "_geometry": 0,
    # dual maps on (slices, d_in, d_out)
    "_duals": 1,
    # who orthogonalizes what on a mesh: the plan (reads the Newton-Schulz cost) and its execution
    "_distributed": 2,
    # GradientTransformations
    "_transforms": 3,
    # named optimizers
    "_optimizers": 4,
    # public modules and the private ones behind the root's API, beside one another
    "_depth": 5,
    "_describe": 5,
    "_tied": 5,
    "initializers": 5,
    "diagnostics": 5,
    "transfer": 5,
    "expert": 5,
    # the public API (spectral_optax/__init__.py)
    PACKAGE: 6,
    # Flax blocks and the transfer lab, on top
    "nn": 7,
    "lab": 7,
}

#: Imports against the order of RANKS that exist today, ``(importer, imported): reason``; an entry that is no
#: longer an import against the order fails the test (drop it).
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {}


# ----------------------------------------------------------------------------- the graph
def module_name(path: Path, root: Path = ROOT, package: str = PACKAGE) -> str:
    """``spectral_optax/_geometry/types.py`` -> ``spectral_optax._geometry.types`` (a package is its ``__init__``)."""
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package by name."""
    return {module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}


def _imported(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of the package that one import statement names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = importer.split(".")
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            stem = ".".join(base + ([node.module] if node.module else []))
        else:
            stem = node.module or ""
        # ``from x import y``: y is the submodule x.y if there is one, else a name defined in x.
        names = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names]
    out = set()
    for name in names:
        # ``import x.y.z`` names x.y.z; a name that is not a module is looked up in the package above it.
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}`` (module-level and function-level imports)."""
    mods = modules(root, package)
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(node, name, path.name == "__init__.py", known)
        # The implicit edge to the packages above (and a module's own name) is not an import.
        graph[name] = {m for m in edges if not (name == m or name.startswith(m + "."))}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as a chain ``[a, b, ..., a]``, or ``None`` if it is a DAG."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def long_modules(root: Path = ROOT, package: str = PACKAGE, limit: int = MAX_LINES) -> dict[str, int]:
    """``{module: line count}`` of the modules over ``limit`` lines."""
    counts = {name: len(p.read_text().splitlines()) for name, p in modules(root, package).items()}
    return {name: n for name, n in counts.items() if n > limit}


def layer(module: str, ranks: dict[str, int], package: str = PACKAGE) -> int | None:
    """The layer of a module: ``ranks`` of the longest key that is its name below ``package`` or a package above
    it (``None`` if no key is)."""
    parts = module.split(".")[1:] or [package]
    for k in range(len(parts), 0, -1):
        key = ".".join(parts[:k])
        if key in ranks:
            return ranks[key]
    return None


def against_the_layers(graph: dict[str, set[str]], ranks: dict[str, int], package: str = PACKAGE) -> list:
    """The imports of a module from a higher layer than its own: sorted ``(importer, imported)`` pairs."""
    rank = lambda m: layer(m, ranks, package)
    return sorted((a, b) for a, bs in graph.items() for b in bs if rank(a) < rank(b))  # type: ignore[operator]


# ----------------------------------------------------------------------------- the package
def test_imports_form_a_dag():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def package_graph(graph: dict[str, set[str]], package: str = PACKAGE) -> dict[str, set[str]]:
    """The import graph one level below the root: every module counts as its top-level package (or module)
    below ``package``; edges inside one unit are dropped. The root's ``__init__`` (the public API, which
    re-exports the submodules above it) is left out: it is the one module that sits above some of its own
    subpackages."""
    unit = lambda m: ".".join(m.split(".")[:2])
    out: dict[str, set[str]] = {}
    for a, bs in graph.items():
        if a == package:
            continue
        out.setdefault(unit(a), set()).update(unit(b) for b in bs if unit(b) != unit(a) and b != package)
    return out


def test_packages_form_a_dag():
    """Not only the modules: the packages (``_mesh``, ``_geometry``, ``_duals``, ``_distributed``, ...) form a DAG,
    so no package needs another that needs it back."""
    cycle = find_cycle(package_graph(import_graph()))
    assert cycle is None, "package-level import cycle: " + " -> ".join(cycle or [])


def test_mesh_package_imports_nothing_of_the_package():
    graph = import_graph()
    bad = {m: deps for m, deps in graph.items() if m.startswith(f"{PACKAGE}._mesh") and
           any(not d.startswith(f"{PACKAGE}._mesh") for d in deps)}
    assert not bad, bad


def test_no_function_level_import_of_a_sibling_in_geometry():
    """Inside the geometry package a function-level import is only for Flax (kept off ``import spectral_optax``)."""
    bad = []
    for name, path in modules().items():
        if not name.startswith(f"{PACKAGE}._geometry"):
            continue
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(PACKAGE)):
                        bad.append(f"{name}.{fn.name}: from {'.' * node.level}{node.module or ''} import ...")
    assert not bad, "function-level imports of package modules:\n  " + "\n  ".join(bad)


def test_geometry_modules_import_siblings_not_the_package():
    """A module of ``_geometry`` importing ``spectral_optax._geometry`` (its own ``__init__``) would be a cycle."""
    graph = import_graph()
    bad = [m for m, deps in graph.items() if m.startswith(f"{PACKAGE}._geometry.") and f"{PACKAGE}._geometry" in deps]
    assert not bad, f"import the sibling module directly, not spectral_optax._geometry: {bad}"


def test_no_module_over_600_lines():
    long = long_modules()
    assert not long, f"modules over {MAX_LINES} lines (split them):\n  " + "\n  ".join(
        f"{name}: {n} lines" for name, n in sorted(long.items())
    )


def test_data_flows_one_way_through_the_layers():
    graph = import_graph()
    unranked = sorted(m for m in graph if layer(m, RANKS) is None)
    assert not unranked, f"give these modules a layer in RANKS (tests/test_layout.py): {unranked}"
    found = against_the_layers(graph, RANKS)
    new = [
        f"{a} (layer {layer(a, RANKS)}) imports {b} (layer {layer(b, RANKS)})"
        for a, b in found
        if (a, b) not in KNOWN_VIOLATIONS
    ]
    stale = [edge for edge in KNOWN_VIOLATIONS if edge not in found]
    assert not new, "imports against the layers (a module imports only from its own layer or below):\n  " + "\n  ".join(
        new
    )
    assert not stale, f"KNOWN_VIOLATIONS entries that are no longer imports against the layers (drop them): {stale}"


# ----------------------------------------------------------------------------- the checks can fail
def test_find_cycle_on_small_graphs():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond is no cycle
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"y"}}) == ["y", "y"]
    assert find_cycle({"r": {"a"}, "a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_checks_fail_on_a_scratch_package(tmp_path):
    """A cycle hidden in a function-level relative import, a ``from pkg import submodule`` edge, an import
    against the layers and a long file are all found."""
    root = _write(
        tmp_path / "pkg",
        {
            "__init__.py": "from pkg import low\nfrom pkg.high import f\n",
            "low/__init__.py": "",
            "low/a.py": "import numpy\nfrom pkg.low.b import g\n",
            "low/b.py": "def g():\n    from . import a\n    return a\n",
            "high.py": "from pkg.low import a\n\ndef f():\n    import pkg.low.b\n" + "x = 1\n" * 700,
            "mid.py": "from .low import b\n",
        },
    )
    graph = import_graph(root, "pkg")
    assert graph["pkg"] == {"pkg.low", "pkg.high"}  # `from pkg import low` names the subpackage
    assert graph["pkg.low.a"] == {"pkg.low.b"}  # numpy is not the package's
    assert graph["pkg.low.b"] == {"pkg.low.a"}  # the function-level relative import is an edge
    assert graph["pkg.high"] == {"pkg.low.a", "pkg.low.b"}
    assert find_cycle(graph) == ["pkg.low.a", "pkg.low.b", "pkg.low.a"]
    assert graph["pkg.mid"] == {"pkg.low.b"}  # a relative `from .low import b`
    assert find_cycle(graph) == ["pkg.low.a", "pkg.low.b", "pkg.low.a"]
    assert set(long_modules(root, "pkg")) == {"pkg.high"}
    ranks = {"low": 1, "low.b": 1, "high": 0, "mid": 0, "pkg": 2}
    assert layer("pkg.low.b", ranks, "pkg") == 1 and layer("pkg", ranks, "pkg") == 2
    assert layer("pkg.low.a", {"pkg": 0}, "pkg") is None
    assert against_the_layers(graph, ranks, "pkg") == [
        ("pkg.high", "pkg.low.a"),
        ("pkg.high", "pkg.low.b"),
        ("pkg.mid", "pkg.low.b"),
    ]
    del graph["pkg.low.b"]  # without b's import of a: no cycle
    assert find_cycle(graph) is None


def test_package_graph_finds_a_cycle_between_packages(tmp_path):
    """Two packages whose modules import each other without a module-level cycle (a.x -> b.y, b.z -> a.w)
    form a package-level cycle."""
    root = _write(
        tmp_path / "pkg",
        {
            "__init__.py": "from pkg import a, b\n",
            "a/__init__.py": "",
            "a/x.py": "from pkg.b import y\n",
            "a/w.py": "",
            "b/__init__.py": "",
            "b/y.py": "",
            "b/z.py": "from pkg.a import w\n",
        },
    )
    graph = import_graph(root, "pkg")
    assert find_cycle(graph) is None  # no module-level cycle
    packages = package_graph(graph, "pkg")
    assert packages == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert find_cycle(packages) == ["pkg.a", "pkg.b", "pkg.a"]


def test_geometry_modules_at_most_600_lines():
    geometry = [m for m in modules() if m.startswith(f"{PACKAGE}._geometry.")]
    assert len(geometry) >= 8, geometry  # the package, split by idea
    long = {m: n for m, n in long_modules().items() if m in geometry}
    assert not long, long


#: What the top layer (``nn``, ``lab``) may import from the rest of the package: the public modules, and the
#: helpers that depend on nothing.
PUBLIC = {"spectral_optax", "spectral_optax.initializers", "spectral_optax.diagnostics", "spectral_optax.expert",
          "spectral_optax.transfer", "spectral_optax._callables", "spectral_optax._numerics"}


def test_nn_and_lab_use_the_public_api():
    """``nn`` and ``lab`` sit on top: they import the package through its public modules only."""
    graph = import_graph()
    wrong = sorted(
        (importer, imported)
        for importer, targets in graph.items()
        if importer.startswith(("spectral_optax.nn", "spectral_optax.lab"))
        for imported in targets
        if not imported.startswith(("spectral_optax.nn", "spectral_optax.lab")) and imported not in PUBLIC
    )
    assert not wrong, wrong
