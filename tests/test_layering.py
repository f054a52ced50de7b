"""The project's import graph, read from the source with `ast` (nothing is imported): no loops, and the layers
import only downwards.

engine/ is the bottom: it never imports Qt, pyqtgraph, gui/, cli/, render/ or report/. render/ and report/
paint with QtGui but never import gui/ or cli/, so the CLI's report runs without the app. cli/ never imports
gui/. No module reaches into another one's private names. Imports inside functions count: a lazy import is
still a dependency.

Inside engine/, its subpackages are layers (ENGINE_LAYERS, bottom first): a module imports its own package's
modules and lower packages' only, so the packages never import each other in a circle, and every subpackage has
a place in the table and a docstring saying what it owns. Once engine/ is in subpackages no module sits
directly in engine/ (a new one goes in the package that owns what it does).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "render", "report", "gui", "cli", "benchmarks", "vramscope")
QT = ("PySide6", "pyqtgraph", "shiboken6")

# engine/'s subpackages, bottom layer first. Issue 25's move (a script run on the merged tree) puts every engine
# module in one of them and drops the lines marked "flat layout only".
ENGINE_LAYERS = (
    "core", "monitor", "config", "results", "sketch", "cuda", "parallel", "models",
    "finetune", "trace", "measure", "snapshots", "planning", "jobs",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {"main": ROOT / "main.py"}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found[_module_name(path)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, str, int]]:
    """(imported module, imported name or '', line) for every import statement in the file."""
    is_package = path.name == "__init__.py"
    out: list[tuple[str, str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.extend((a.name, "", node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                full = f"{mod}.{a.name}"
                # `from pkg import module` depends on the module; `from module import name` on the module
                out.append((full, "", node.lineno) if full in MODULES else (mod, a.name, node.lineno))
    return out


def _project(mod: str) -> str | None:
    """The project module `mod` names (itself or the nearest enclosing one), None for a third-party one."""
    while mod:
        if mod in MODULES:
            return mod
        mod = mod.rpartition(".")[0]
    return None


GRAPH: dict[str, set[str]] = {}
EDGES: list[tuple[str, str, str, int]] = []  # (importer, imported, name, line), third-party ones included
for _name, _path in MODULES.items():
    GRAPH[_name] = set()
    for _mod, _what, _line in _imports(_name, _path):
        EDGES.append((_name, _mod, _what, _line))
        target = _project(_mod)
        if target is not None and target != _name:
            GRAPH[_name].add(target)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _top(mod: str) -> str:
    return mod.split(".")[0]


def _violations(importer_pkg: str, forbidden: tuple[str, ...]) -> list[str]:
    return [f"{src} (line {line}) imports {mod}" for src, mod, _what, line in EDGES
            if _top(src) == importer_pkg and _top(mod) in forbidden]


def test_the_walk_sees_the_project():
    seen = {"engine.trace.tracer", "engine.measure.cpu_profiler", "engine.jobs.calls",
            "gui.main_window", "cli.report", "report"}
    assert seen <= set(GRAPH)
    # edges are resolved, relative imports included
    assert "engine.trace.recorded_step" in GRAPH["engine.trace.tracer"]


def test_no_import_loops():
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_loop():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_engine_imports_no_qt_gui_cli_or_painting():
    assert _violations("engine", QT + ("gui", "cli", "render", "report")) == []


def test_render_and_report_never_import_the_app_or_the_cli():
    assert _violations("render", ("gui", "cli", "report")) == []
    assert _violations("report", ("gui", "cli")) == []


def test_cli_never_imports_the_gui():
    assert _violations("cli", ("gui",)) == []


def test_no_private_names_cross_modules():
    crossing = [f"{src} (line {line}) imports {what} from {mod}" for src, mod, what, line in EDGES
                if what.startswith("_") and not what.startswith("__") and _project(mod) not in (None, src)]
    assert crossing == []


def _engine_package(mod: str) -> str | None:
    """The engine subpackage `mod` belongs to (engine.trace.tracer -> "trace"), None for a module directly in
    engine/ (or engine itself)."""
    parts = mod.split(".")
    if parts[0] != "engine" or len(parts) < 2:
        return None
    return parts[1] if (ROOT / "engine" / parts[1] / "__init__.py").exists() else None


def _upward(graph: dict[str, set[str]], layers: tuple[str, ...] = ENGINE_LAYERS,
            package: Callable[[str], str | None] = _engine_package) -> list[str]:
    """Imports of a higher layer's module from a lower one's (a package not in `layers` counts as the highest)."""
    rank = {p: i for i, p in enumerate(layers)}
    out = []
    for src, targets in sorted(graph.items()):
        sp = package(src)
        for dst in sorted(targets):
            dp = package(dst)
            if sp and dp and sp != dp and rank.get(dp, len(rank)) > rank.get(sp, len(rank)):
                out.append(f"{src} ({sp}) imports {dst} ({dp})")
    return out


ENGINE_PACKAGES = sorted(p.name for p in (ROOT / "engine").iterdir() if (p / "__init__.py").exists())


def test_every_engine_package_has_a_layer_and_says_what_it_owns():
    assert [p for p in ENGINE_PACKAGES if p not in ENGINE_LAYERS] == []
    undocumented = [p for p in ENGINE_PACKAGES
                    if not ast.get_docstring(ast.parse((ROOT / "engine" / p / "__init__.py").read_text("utf-8")))]
    assert undocumented == []


def test_engine_layers_import_only_downwards():
    assert _upward(GRAPH) == []


def test_engine_packages_import_each_other_in_no_circle():
    packages: dict[str, set[str]] = {}
    for src, targets in GRAPH.items():
        sp = _engine_package(src)
        if sp:
            packages.setdefault(sp, set()).update(
                dp for dp in map(_engine_package, targets) if dp and dp != sp)
    for targets in packages.values():
        for dp in targets:
            packages.setdefault(dp, set())
    assert _cycles(packages) == []


def test_the_layer_check_finds_an_upward_import():
    graph = {"engine.core.a": {"engine.trace.b"}, "engine.trace.b": {"engine.core.a"}}
    assert _upward(graph, ("core", "trace"), lambda m: m.split(".")[1]) == [
        "engine.core.a (core) imports engine.trace.b (trace)"]


def test_once_engine_has_layers_no_module_sits_directly_in_it():
    layered = len([p for p in ENGINE_PACKAGES if p not in ("monitor", "templates")]) >= 2  # false before the move
    direct = sorted(p.name for p in (ROOT / "engine").glob("*.py") if p.name != "__init__.py")
    assert not layered or direct == []


def test_the_tracer_and_the_recorder_never_call_a_real_run():
    # the data-dependent fallback is handed in (engine.measure.real_fallback);
    # the kernel probe is engine.cuda.kernel_probe
    assert "engine.measure.cpu_profiler" not in GRAPH["engine.trace.tracer"]
    assert "engine.measure.calibrate" not in GRAPH["engine.trace.recorder"]
    assert "engine.cuda.kernel_probe" in GRAPH["engine.trace.recorder"]
