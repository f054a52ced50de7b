"""Static checks of the desktop bundle's recipe (packaging/): no build here, the build takes minutes."""

from __future__ import annotations

import ast
import configparser
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core import resources as rp

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
SPEC = PACKAGING / "vramscope.spec"


def _spec_tree() -> ast.Module:
    return ast.parse(SPEC.read_text(encoding="utf-8"), filename=str(SPEC))


def _spec_strings() -> set[str]:
    return {n.value for n in ast.walk(_spec_tree()) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _spec_excludes() -> list[str]:
    """The spec's `excludes` list, evaluated from its (literal-only) assignments."""
    ns: dict = {}
    for node in _spec_tree().body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "excludes" for t in targets):
            exec(compile(ast.Module([node], []), str(SPEC), "exec"), ns)  # literals and a comprehension only
    return ns["excludes"]


def test_spec_parses_and_names_entry_resources_and_packages():
    strings = _spec_strings()
    assert "main.py" in strings
    assert "vramscope_launcher.py" in strings
    assert "resources" in strings
    assert "vramscope" in strings  # dist/vramscope/vramscope
    # main.py imports cli/<command>.py by name, so the packages must be collected explicitly.
    assert {"cli", "engine", "gui", "render", "report", "main"} <= strings
    calls = {n.func.id for n in ast.walk(_spec_tree()) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert {"Analysis", "PYZ", "EXE", "COLLECT", "collect_submodules"} <= calls


def test_spec_is_not_linux_only():
    src = SPEC.read_text(encoding="utf-8")
    assert 'sys.platform == "win32"' in src and 'sys.platform == "darwin"' in src
    assert "vramscope.ico" in src and "vramscope.icns" in src and "BUNDLE(" in src
    assert "os.path.join" in src and not re.search(r"['\"]/(usr|opt|home|work)/", src)


def test_excludes_keep_every_qt_module_the_app_imports():
    excluded = set(_spec_excludes())
    used = set()
    for path in [p for pkg in ("gui", "render", "report") for p in (ROOT / pkg).rglob("*.py")] + [ROOT / "main.py"]:
        used |= set(re.findall(r"PySide6\.(Qt\w+)", path.read_text(encoding="utf-8")))
    assert {"QtCore", "QtGui", "QtWidgets"} <= used
    assert not {f"PySide6.{m}" for m in used} & excluded
    # Nothing of the app itself, nor torch's or numpy's top level, may be left out.
    for name in ("engine", "gui", "render", "report", "cli", "main", "torch", "numpy", "pyqtgraph", "pynvml",
                 "PySide6"):
        assert name not in excluded
    assert {"tkinter", "pytest", "transformers", "pypdf", "PySide6.QtQuick", "PySide6.QtWebEngineCore"} <= excluded


def test_every_cli_command_is_a_module_in_the_collected_package():
    import main

    for command, _help in main.COMMANDS.values():
        pkg, _, name = command.__name__.partition(".")
        assert pkg == "cli" and (ROOT / pkg / f"{name}.py").is_file(), command


def test_launcher_runs_freeze_support_before_main():
    src = (PACKAGING / "vramscope_launcher.py").read_text(encoding="utf-8")
    ast.parse(src)
    assert src.index("multiprocessing.freeze_support()") < src.index("from main import main")


def test_desktop_entry_has_the_required_keys():
    cp = configparser.ConfigParser(interpolation=None)
    cp.optionxform = str  # keys are case-sensitive in the Desktop Entry spec
    cp.read(PACKAGING / "vramscope.desktop", encoding="utf-8")
    entry = cp["Desktop Entry"]
    for key in ("Type", "Name", "Exec", "Icon", "Categories", "Comment", "Terminal"):
        assert entry.get(key), key
    assert entry["Type"] == "Application"
    assert entry["Exec"].split()[0] == "vramscope"
    assert entry["Icon"] == "vramscope" and (ROOT / "resources" / "icons" / "vramscope.png").is_file()
    assert entry["Categories"].endswith(";")
    assert entry["Terminal"] in ("true", "false")


def test_png_icon_is_256_square():
    data = (ROOT / "resources" / "icons" / "vramscope.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (256, 256)
    assert (ROOT / "resources" / "icons" / "vramscope.svg").is_file()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("script", ["build.sh", "smoke.sh"])
def test_shell_scripts_parse(script):
    r = subprocess.run(["bash", "-n", str(PACKAGING / script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_resource_path_in_checkout_and_in_bundle(tmp_path, monkeypatch):
    assert rp.resource_path("gpus.json") == ROOT / "resources" / "gpus.json"
    assert rp.resource_path("gpus.json").is_file()
    (tmp_path / "resources" / "templates").mkdir(parents=True)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert rp.resource_path("templates", "mlp.json") == tmp_path / "resources" / "templates" / "mlp.json"
    # A bundle without resources/ (a broken build) falls back to the source tree rather than a dead path.
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path / "elsewhere"), raising=False)
    assert rp.resources_root() == ROOT / "resources"


def test_the_bundle_keeps_the_engines_sources():
    """The fold of a repeated stack reads the model's code (engine.trace.fold_loops): without the engine's sources
    in the bundle, the packaged app traced every block of every template (exact, but the speed lost)."""
    analysis = next(n for n in ast.walk(_spec_tree()) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                    and n.func.id == "Analysis")
    modes = next(ast.literal_eval(k.value) for k in analysis.keywords if k.arg == "module_collection_mode")
    assert modes["engine"] == "pyz+py"
