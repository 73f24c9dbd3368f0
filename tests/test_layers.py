"""Imports only go downwards (DESIGN §1): each package of ``slatepy`` is a layer, and a module
imports its own layer and the layers declared below it, nothing else.

Every ``import`` counts wherever it is written: at module level, inside a function (lazy), or
under ``if TYPE_CHECKING:``. The few upward imports the design records are listed, with their
reason, in :data:`EXCEPTIONS`, each for one importing module and one kind of import.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

SLATEPY = Path(__file__).resolve().parents[1] / "slatepy"

Kind = Literal["module", "lazy", "typing"]
"""Where an import is written: run on import, inside a function, under ``TYPE_CHECKING``."""

_BASE = frozenset({"errors", "config", "closing", "facade"})
_KV = _BASE | {"store", "format", "manifest", "table"}
_LIBRARY = _KV | {"engine", "gc", "compactor", "persist"}

ALLOWED: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "closing": frozenset(),  # the context-manager protocol of every handle
    "facade": frozenset(),  # the asyncio facade mechanism of every handle (RFC 0033)
    "config": frozenset({"errors"}),
    # Siblings: the store knows no format, and the format does no I/O.
    "store": _BASE,
    "format": _BASE,
    "manifest": _BASE | {"store", "format"},
    # Not the manifest: persist reads SSTs, merges and lays out objects without the KV engine.
    "table": _BASE | {"store", "format"},
    "engine": _KV,
    "gc": _KV,
    "compactor": _KV | {"gc"},  # the background compactor runs GC between compactions
    "persist": _BASE | {"store", "format", "table"},
    # Upstream sources ingested into persist shards (RFC 0027): above persist, below the CLI
    # and Spark, never the KV engine.
    "sources": _BASE | {"store", "format", "table", "persist"},
    "aio": _KV | {"engine"},  # the asyncio facade of Db
    "slatepy": _LIBRARY,  # the package root re-exports the public API
    "testing": _LIBRARY,
    # `slatepy torture` runs the shipped torture harness, `slatepy catalog` the catalog,
    # `slatepy ingest --spark` the Spark sources.
    "cli": _LIBRARY | {"testing", "catalog", "sources", "spark"},
    # Spark data sources over the engine and persist (RFC 0016); catalog: option "catalog"
    # of the sinks records them there (RFC 0028 Addendum C).
    "spark": _LIBRARY | {"sources", "catalog"},
    # The durable catalog (RFC 0028): above persist, below the CLI.
    "catalog": _BASE | {"store", "format", "table", "persist"},
}
"""Layer -> the layers it may import (besides itself). A module ``slatepy/x.py`` or package
``slatepy/x/`` is layer ``x``; ``slatepy/__init__.py`` is layer ``slatepy``."""

EXCEPTIONS: dict[tuple[str, str, Kind], str] = {
    ("slatepy.engine.db", "compactor", "lazy"): (
        "RFC 0003: with Settings.compactor == 'in-process' the writer composes a"
        " BackgroundCompactor, imported only then"
    ),
    ("slatepy.engine.db", "gc", "lazy"): "RFC 0003: the in-process compactor's GarbageCollector",
    ("slatepy.engine.db", "compactor", "typing"): "RFC 0003: the type of Db._compactor",
    ("slatepy.engine.db_state", "compactor", "typing"): (
        "RFC 0003: the type of Db._compactor, declared with Db's other fields"
    ),
}
"""(importing module, imported layer, kind) -> why this upward import is allowed."""


@dataclass(frozen=True, slots=True)
class Import:
    """One module's import of another (both dotted names)."""

    importer: str
    imported: str
    line: int
    kind: Kind


def layer(module: str) -> str:
    """The layer of a dotted module name (``slatepy.engine.db`` -> ``engine``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


class _Collector(ast.NodeVisitor):
    """The ``slatepy`` imports of one module, with where they are written."""

    def __init__(self, module: str, *, is_package: bool) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.kind: Kind = "module"
        self.found: list[Import] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer, self.kind = self.kind, "lazy"
        self.generic_visit(node)
        self.kind = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name != "TYPE_CHECKING" or self.kind == "lazy":
            self.generic_visit(node)
            return
        outer, self.kind = self.kind, "typing"
        for statement in node.body:
            self.visit(statement)
        self.kind = outer
        for statement in node.orelse:
            self.visit(statement)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join([*base, node.module] if node.module else base)
        else:
            target = node.module or ""
        if target == "slatepy":  # `from slatepy import engine` imports the layer
            for alias in node.names:
                self._add(f"slatepy.{alias.name}" if alias.name in ALLOWED else target, node)
        else:
            self._add(target, node)

    def _add(self, target: str, node: ast.stmt) -> None:
        if target == "slatepy" or target.startswith("slatepy."):
            self.found.append(Import(self.module, target, node.lineno, self.kind))


def imports_of(module: str, source: str, *, is_package: bool = False) -> list[Import]:
    """The ``slatepy`` imports in ``source``, the text of the module named ``module``."""
    collector = _Collector(module, is_package=is_package)
    collector.visit(ast.parse(source))
    return collector.found


def all_imports() -> Iterator[Import]:
    """The ``slatepy`` imports of every module of the package."""
    for path in sorted(SLATEPY.rglob("*.py")):
        parts = path.relative_to(SLATEPY.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        yield from imports_of(module, path.read_text(), is_package=is_package)


def violations(found: Iterable[Import]) -> list[str]:
    """The imports that go upward or sideways, and those of undeclared layers."""
    bad: list[str] = []
    for imp in found:
        src, dst = layer(imp.importer), layer(imp.imported)
        where = f"{imp.importer}:{imp.line} imports {imp.imported} ({imp.kind})"
        if src not in ALLOWED or dst not in ALLOWED:
            bad.append(f"{where}: declare the new layer in ALLOWED, in its DESIGN §1 place")
            continue
        excepted = (imp.importer, dst, imp.kind) in EXCEPTIONS
        if src != dst and dst not in ALLOWED[src] and not excepted:
            bad.append(f"{where}: {src} may import {sorted(ALLOWED[src])} only")
    return bad


def test_imports_only_go_down() -> None:
    found = list(all_imports())
    assert len({imp.importer for imp in found}) > 50  # the walk found the package
    assert violations(found) == []


def test_every_exception_is_still_used() -> None:
    used = {(imp.importer, layer(imp.imported), imp.kind) for imp in all_imports()}
    assert set(EXCEPTIONS) <= used, "drop the exceptions nothing needs any more"


def test_the_declared_layers_have_no_cycle() -> None:
    def below(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"cycle: {' -> '.join((*path, name))}"
        for lower in ALLOWED[name]:
            below(lower, (*path, name))

    for name in ALLOWED:
        below(name, ())


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("slatepy.table.reader", "from slatepy.engine.db import Db"),
        ("slatepy.table.reader", "import slatepy.engine.view as view"),
        ("slatepy.table.merge", "def f() -> None:\n    from slatepy.compactor import Compactor"),
        ("slatepy.table.merge", "if TYPE_CHECKING:\n    from slatepy.manifest import Manifest"),
        ("slatepy.table.merge", "from ..engine import db"),
        ("slatepy.compactor.executor", "from slatepy.engine.fencing import fence_wal"),
        ("slatepy.gc.rules", "from slatepy.compactor import Compactor"),
        ("slatepy.store.twophase", "from slatepy.format.checksum import checksum"),
        ("slatepy.format.sst", "from slatepy.store.base import ObjectStore"),
        ("slatepy.persist.state.spine", "from slatepy.manifest.record import Manifest"),
        ("slatepy.persist.state.spine", "from ...engine.table import TableReader"),
        ("slatepy.persist", "from slatepy import gc"),
        ("slatepy.engine.db", "from slatepy.compactor import Compactor"),  # not lazy
        ("slatepy.engine.db", "def f() -> None:\n    from slatepy.cli import main"),
        ("slatepy.engine.view", "def f() -> None:\n    from slatepy.compactor import plan"),
        ("slatepy.spark.kv", "from slatepy.cli import main"),
        ("slatepy.spark.kv", "def f() -> None:\n    from slatepy.testing import moto"),
        ("slatepy.table.merge", "from slatepy.spark import sink"),
        ("slatepy.catalog.state", "from slatepy.cli import main"),
        ("slatepy.catalog.persist", "from slatepy.engine.db import Db"),
        ("slatepy.persist.client", "from slatepy.catalog import open_catalog"),
        ("slatepy.sources.ingest", "from slatepy.engine.db import Db"),
        ("slatepy.persist.read", "from slatepy.sources import Ingest"),
    ],
)
def test_an_upward_or_sideways_import_is_caught(module: str, source: str) -> None:
    assert len(violations(imports_of(module, source))) == 1


@pytest.mark.parametrize(
    ("module", "source", "is_package"),
    [
        ("slatepy.persist.state.spine", "from slatepy.table.merge import merge_sum", False),
        ("slatepy.persist.state.spine", "from ..location import consensus", False),
        ("slatepy.persist", "from slatepy.persist.state import spine", True),
        ("slatepy.persist", "from . import location", True),
        ("slatepy.compactor.executor", "from slatepy.table.reader import TableReader", False),
        (
            "slatepy.engine.db",
            "def f() -> None:\n    from slatepy.gc import GarbageCollector",
            False,
        ),
        ("slatepy.engine.db", "if TYPE_CHECKING:\n    from slatepy.compactor import X", False),
        ("slatepy.cli.main", "def f() -> None:\n    from slatepy.testing import torture", False),
        ("slatepy.store.url", "import obstore\nimport xxhash", False),
        ("slatepy.cli.catalog", "from slatepy.catalog import open_catalog", False),
        ("slatepy.catalog.persist", "from slatepy.persist import PersistClient", False),
    ],
)
def test_a_downward_import_passes(module: str, source: str, is_package: bool) -> None:
    assert violations(imports_of(module, source, is_package=is_package)) == []


def module_graph() -> dict[str, set[str]]:
    """Module -> the ``slatepy`` modules its ``import`` statements name, of every kind.

    Counted: imports at module level, inside functions (lazy) and under ``TYPE_CHECKING``. A
    lazy import still makes the module depend on the other at run time (it only defers the
    circle to the first call), and a ``TYPE_CHECKING`` one is a dependency for the type
    checker and for whoever reads the code; the two circles of issue 34 each had one of them.
    ``from slatepy.engine import checkpoint`` names the submodule ``slatepy.engine.checkpoint``;
    ``from slatepy.engine import Db`` the package ``slatepy.engine`` (its ``__init__``). Not
    counted: the implicit import of a module's parent packages (Python runs a package's
    ``__init__`` first; re-exporting its submodules there is its job, not a circle).
    """
    modules: dict[str, Path] = {}
    for path in SLATEPY.rglob("*.py"):
        parts = path.relative_to(SLATEPY.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    named.add(sub if sub in modules else target)
        graph[name] = {other for other in named if other in modules and other != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one
    module, each sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = []
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work.append((root, iter(sorted(graph[root]))))
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_circle_among_modules() -> None:
    graph = module_graph()
    assert len(graph) > 50 and graph["slatepy.engine.db"]  # the walk found the package
    assert cycles(graph) == []


@pytest.mark.parametrize(
    "graph",
    [
        {"a": {"b"}, "b": {"a"}},
        {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}},
    ],
)
def test_an_import_circle_is_caught(graph: dict[str, set[str]]) -> None:
    assert len(cycles(graph)) == 1


ARCHITECTURE = SLATEPY.parent / "docs" / "architecture.md"
_SHORTHANDS = {"nothing": frozenset(), "base": _BASE, "kv": _KV, "library": _LIBRARY}


def documented_layers(text: str) -> dict[str, frozenset[str]]:
    """The table of docs/architecture.md's "The layer rules": layer -> what it may import
    (``base``, ``kv``, ``library`` and ``nothing`` spelled out as in :data:`ALLOWED`)."""
    section = text.split("### The layer rules", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, frozenset[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("layer", "---"):
            continue
        may: set[str] = set()
        for name in (name.strip() for name in cells[1].split(",")):
            may |= _SHORTHANDS.get(name, {name})
        rows[cells[0]] = frozenset(may)
    return rows


def test_the_architecture_page_states_the_layer_rules() -> None:
    assert documented_layers(ARCHITECTURE.read_text()) == ALLOWED


def test_every_module_the_architecture_page_names_exists() -> None:
    named = set(re.findall(r"slatepy/[\w/]+\.py", ARCHITECTURE.read_text()))
    assert len(named) > 30  # the paths of a put, a get, a compaction, an append, a listen, Spark
    root = SLATEPY.parent
    assert sorted(path for path in named if not (root / path).is_file()) == []


def test_a_layer_rule_the_page_gets_wrong_is_caught() -> None:
    page = "### The layer rules\n\n| layer | may import |\n|---|---|\n| table | base, engine |\n"
    assert documented_layers(page)["table"] == _BASE | {"engine"} != ALLOWED["table"]
