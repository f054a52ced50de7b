"""Whose code a module name is: a known model library's, this project's, Python's own, another installed library's,
or the user's (their own files, a notebook's `__main__`). Read by the fold's policy (engine.trace.fold_known: only
known code folds) and by the copies of the user's callables (engine.core.callable_copy: a library's functions are
shared, the user's copied)."""

from __future__ import annotations

import site
import sys
import sysconfig
from pathlib import Path

# the model libraries, and those they build on or wrap a module's methods with (kernels, huggingface_hub, einops)
LIBRARIES = frozenset({"torch", "transformers", "peft", "bitsandbytes", "torchvision", "timm", "accelerate",
                       "torchao", "diffusers", "kernels", "huggingface_hub", "einops", "flash_attn", "xformers",
                       "typing_extensions", "safetensors", "numpy"})
_PROJECT = frozenset({"engine", "vramscope", "cli", "gui", "report", "render"})
_ROOT = Path(__file__).resolve().parents[2]  # (this project's checkout or bundle: engine/, vramscope/, … in it)
_STDLIB = tuple({str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("stdlib", "platstdlib")})
_SITE = tuple({str(Path(p).resolve()) for p in (*site.getsitepackages(), site.getusersitepackages(),
                                                sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])})
_BUNDLE = getattr(sys, "_MEIPASS", None) if getattr(sys, "frozen", False) else None
if isinstance(_BUNDLE, str):  # (the packaged app: the libraries and Python's own modules are in its folder)
    _STDLIB += (str(Path(_BUNDLE).resolve()),)
    _SITE += (str(Path(_BUNDLE).resolve()),)


def known_module(name: object) -> bool:
    """Is `name` (a module's `__name__`) a known library's, this project's or Python's own? A library by its
    top-level name; this project's and the standard library's by where the top-level module was loaded from (a
    user's own package may be called `engine` or `trace`)."""
    if not isinstance(name, str):
        return False
    top = name.partition(".")[0]
    if top in LIBRARIES or top in ("builtins", "__future__") or top in sys.builtin_module_names:
        return True
    if top not in _PROJECT and top not in sys.stdlib_module_names:
        return False
    path = _loaded_from(top)
    if path is None:  # (a frozen or built-in standard module)
        return top in sys.modules and top in sys.stdlib_module_names
    if top in _PROJECT:
        return path.startswith(str(_ROOT / top))
    return path.startswith(_STDLIB)


def installed(name: object) -> bool:
    """Is `name` (a module's `__name__`) known (known_module) or another installed library's (loaded from
    site-packages: tqdm, which a library's namespace holds)? Not: the user's own files, a notebook's `__main__`.
    Only a module class must be a known library's; a function or object is the user's where it is not installed."""
    if known_module(name):
        return True
    if not isinstance(name, str):
        return False
    top = name.partition(".")[0]
    if _BUNDLE is not None and top.startswith(("pyimod", "pyi_")):
        return True  # (the packaged app's own bootstrap: PyInstaller's importers)
    path = _loaded_from(top)
    return path is not None and path.startswith(_SITE)


def _loaded_from(top: str) -> str | None:
    """The resolved file the top-level module `top` was loaded from, or None (not loaded, frozen, built in)."""
    module = sys.modules.get(top)
    key = (top, id(module))
    if key not in _PLACES:
        where = getattr(module, "__file__", None)
        _PLACES[key] = None if where is None else str(Path(where).resolve())
    return _PLACES[key]


_PLACES: dict[tuple[str, int], str | None] = {}  # (top-level name, its module's id) -> _loaded_from's answer
